"""A reasoning model's thinking (Qwen3, QwQ, DeepSeek-R1 and the models distilled from it): the text between
``<think>`` and ``</think>`` at the start of a reply, kept apart from the answer, as DeepSeek's API and vLLM's
reasoning parsers return it (OpenAI's chat answer's ``reasoning_content``).

Whether a checkpoint thinks is read off its chat template (``thinks``): it writes the marks. Where the template's
generation prompt opens the block itself (DeepSeek-R1's ends with ``<think>\\n``), the reply starts inside it; where
it closes an empty one (Qwen3's ``enable_thinking=False``), the reply has none and is all answer.

A grammar a request holds its reply to (a JSON schema, tool calls) applies to the answer: ``after_thinking`` lets
the model think first, as it was trained to, and holds what follows ``</think>``.
"""

from __future__ import annotations

import json
from typing import Any

from .grammar import LAYOUT, Lark
from .tools import unfinished

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template writes a reasoning model's thinking marks."""
    return bool(template) and OPEN in template and CLOSE in template


def opened(prompt: str) -> bool:
    """Whether a rendered chat prompt leaves the reply inside the thinking block (it ends with ``<think>``)."""
    return prompt.rstrip().endswith(OPEN)


class Thoughts:
    """A reply's text read as it comes (``feed``) into its thinking and its answer: ``(reasoning, content)`` that
    may be sent now. Text that could begin or end the block is held back until it cannot; the whitespace between
    a mark and the text is neither. A reply cut inside the block (``max_tokens``) is all thinking."""

    def __init__(self, inside: bool):
        self._state = "inside" if inside else "start"
        self._held = ""
        self._lead = inside  # whitespace right after a mark is dropped
        self.thought = False  # whether the text last fed was (in part) inside the block: a reasoning token's

    def feed(self, text: str) -> tuple[str, str]:
        self.thought = self._state == "inside"
        self._held += text
        thinking, answer = [], []
        while self._held:
            if self._state == "start":
                head = self._held.lstrip()
                if OPEN.startswith(head) and len(head) < len(OPEN):
                    break  # could still be the block's start
                if head.startswith(OPEN):
                    self._held, self._state, self._lead = head[len(OPEN):], "inside", True
                    self.thought = True
                    continue
                self._state = "after"
                continue
            if self._lead:
                self._held = self._held.lstrip()
                if not self._held:
                    break
                self._lead = False
            if self._state == "after":
                answer.append(self._held)
                self._held = ""
                break
            end = self._held.find(CLOSE)
            if end >= 0:
                thinking.append(self._held[:end].rstrip())
                self._held, self._state, self._lead = self._held[end + len(CLOSE):], "after", True
                continue
            keep = unfinished(self._held, (CLOSE,))
            body = self._held[:len(self._held) - keep]
            stripped = body.rstrip()  # trailing whitespace waits: it may be the block's last
            thinking.append(stripped)
            self._held = body[len(stripped):] + self._held[len(self._held) - keep:]
            break
        return "".join(thinking), "".join(answer)

    def end(self) -> tuple[str, str]:
        """What is left once the reply is whole."""
        held, self._held = self._held, ""
        if self._state == "inside":
            return held.rstrip(), ""
        return "", (held.lstrip() if self._lead else held)


def after_thinking(grammar: dict[str, Any] | Lark, marks: tuple[int, int], inside: bool) -> Lark:
    """``grammar`` (a JSON schema, or a ``Lark`` grammar such as ``runtime/tools.Tools.grammar``'s) held after a
    thinking block, which the reply may open (or, ``inside``, is in from its start): free text between the marks
    (``marks``: their token ids), the whitespace after them, then the grammar."""
    if isinstance(grammar, dict):
        body = f"answer: %json {json.dumps({**grammar, 'x-guidance': LAYOUT})}\n"
    else:
        body = grammar.replace("start:", "answer:", 1)
    rules = f"THOUGHT: /(?s:.+)/\nWS: /[ \\t\\n]+/\n{body}"
    start, end = marks
    if inside:
        return Lark(f"start: THOUGHT? <[{end}]> WS? answer\n{rules}")
    return Lark(f"start: (<[{start}]> THOUGHT? <[{end}]> WS?)? answer\n{rules}")
