"""gpt-oss's harmony format: a reply written as messages, each on a channel, read apart into the thinking, the
answer and the tool calls; and the grammar that holds a reply to a schema or to calls in it.

The chat template's generation prompt ends with ``<|start|>assistant``, and the model writes one or more messages::

    <|channel|>analysis<|message|>The user greets. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hi!

ending at ``<|return|>`` (an end id), or, to call a tool, a message whose header names a recipient, ending at
``<|call|>`` (an end id too)::

    <|channel|>commentary to=functions.wx <|constrain|>json<|message|>{"city": "Paris"}

The marks are special tokens (decoding leaves them out: ``generation.Reply`` is given them as ``marks``). The
``analysis`` channel is the model's chain of thought (OpenAI's ``reasoning_content``, not to be shown as the
answer); ``final`` is the answer; ``commentary`` without a recipient is a preamble the user may see (content);
a message to ``functions.NAME`` is a call of tool NAME, its body the arguments. The recipient may stand in the
role part of the header (``<|start|>assistant to=functions.wx<|channel|>commentary json``), as gpt-oss's own
template writes past calls. A reply that does not open with a header is read as plain content, as any model's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .grammar import LAYOUT, Lark
from .tools import openai_call, unfinished

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
RETURN, CALL = "<|return|>", "<|call|>"  # the end ids a reply stops at (generation_config.json's eos_token_id)
MARKS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
FUNCTIONS = "functions."  # the namespace the chat template declares the request's tools in
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


def speaks(template: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's)."""
    return bool(template) and all(mark in template for mark in (START, CHANNEL, MESSAGE, END))


def messages_for_template(messages: list[Any]) -> list[Any]:
    """OpenAI's messages as gpt-oss's template reads them: an assistant message's thinking, which this server
    answers as ``reasoning_content`` (and vLLM's clients send back as ``reasoning``), in ``thinking``, where the
    template writes a past tool call's chain of thought back into the prompt, as the model was trained to see it."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("thinking") is None:
            thought = m.get("reasoning_content", m.get("reasoning"))
            if isinstance(thought, str):
                m = {k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning")} | {"thinking": thought}
        out.append(m)
    return out


class Messages:
    """A reply's text read as it comes (``feed``) into its thinking and its content, ``(reasoning, content)`` that
    may be sent now, and its tool calls (``calls``, OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``;
    ``new()``: those made since the last ``new``). A message's header is held until its ``<|message|>``; text that
    could begin a mark is held until it cannot. A call's arguments that do not read as a JSON object are given back
    as content, never dropped; so is a call cut at ``max_tokens``. ``thought``: how many of the tokens fed so far
    have just been found to be thinking (an analysis message's, its header and end mark with it: OpenAI's
    ``reasoning_tokens``), one ``feed`` being one token. ``calls``: whether the request offered tools (else a
    message to one is read as content, its arguments' text and all)."""

    def __init__(self, calls: bool = True):
        self._calls_taken = calls  # the request offered tools: else a message to one is content
        self.calls: list[dict[str, Any]] = []
        self.thought = 0
        self._new = 0
        self._state = "start"  # start | header | body | plain
        self._held = ""
        self._kind = ""  # the message's: reasoning | content | call
        self._recipient = ""
        self._body: list[str] = []  # a call's arguments so far
        self._header_feeds = 0  # the tokens fed since this header began, the current one with them
        self._touched = False  # whether the current token is (in part) thinking
        self._fresh = False  # no text of the message given yet
        self._said = {"reasoning": False, "content": False}  # whether a message of the kind has given text

    def feed(self, text: str) -> tuple[str, str]:
        self.thought, self._touched = 0, False
        self._held += text
        if self._state == "header":
            self._header_feeds += 1
        out = {"reasoning": [], "content": []}
        while self._held:
            if self._state == "start":
                head = self._held.lstrip()
                if any(m.startswith(head) and len(head) < len(m) for m in (CHANNEL, START)) or not head:
                    break  # could still be a header's start
                if head.startswith(START) or head.startswith(CHANNEL):
                    self._held, self._state, self._header_feeds = head, "header", 1
                    continue
                self._state = "plain"
                continue
            if self._state == "plain":
                out["content"].append(self._held)
                self._held = ""
                break
            if self._state == "header":
                at = self._held.find(MESSAGE)
                if at < 0:
                    break
                self._open(self._held[:at])
                self._held, self._state = self._held[at + len(MESSAGE):], "body"
                continue
            ends = [(at, mark) for mark in (END, RETURN, CALL) if (at := self._held.find(mark)) >= 0]
            if ends:  # <|end|>; <|return|> and <|call|> too, where a request's end ids leave them in the text
                at, mark = min(ends)
                self._give(self._held[:at], out)
                self._touched |= self._kind == "reasoning"
                self._close(out)
                self._held, self._state, self._header_feeds = self._held[at + len(mark):], "header", 0
                continue
            keep = unfinished(self._held, MARKS)
            self._give(self._held[:len(self._held) - keep], out)
            self._held = self._held[len(self._held) - keep:]
            self._touched |= self._kind == "reasoning"
            break
        self.thought += self._touched
        return "".join(out["reasoning"]), "".join(out["content"])

    def end(self) -> tuple[str, str]:
        """What is left once the reply is whole (its last message ends at an end id, which is not text; a header
        cut short, at ``max_tokens``, is the format's, not text, and gives nothing)."""
        out = {"reasoning": [], "content": []}
        held, self._held = self._held, ""
        if self._state == "plain" or (self._state == "start" and held.strip()):
            out["content"].append(held)
        elif self._state == "body":
            self._give(held, out)
            self._close(out)
        self._state = "done"
        return "".join(out["reasoning"]), "".join(out["content"])

    def new(self) -> list[dict[str, Any]]:
        """The calls made since the last ``new``, each with its ``index`` among the reply's calls."""
        made = [{"index": self._new + i, **c} for i, c in enumerate(self.calls[self._new:])]
        self._new = len(self.calls)
        return made

    def _open(self, header: str) -> None:
        """A message's header read: its channel and recipient, hence where its body goes."""
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._recipient = recipient.group(1) if recipient else ""
        name = channel.group(1) if channel else ""
        if self._recipient.startswith(FUNCTIONS):
            self._kind = "call" if self._calls_taken else "content"
        elif name == "final" or (name == "commentary" and not self._recipient):
            self._kind = "content"
        else:  # analysis, and a built-in tool's call (python, browser.*): the model's own working
            self._kind = "reasoning"
        self._body = []
        if self._kind == "reasoning":  # the header's tokens before this one are thinking too
            self.thought += self._header_feeds - 1
            self._touched = True
        self._fresh = True

    def _give(self, text: str, out: dict[str, list[str]]) -> None:
        if not text:
            return
        if self._kind == "call":
            self._body.append(text)
            return
        if self._fresh and self._said[self._kind]:
            text = "\n" + text  # a second message of the kind, on a line of its own
        self._fresh, self._said[self._kind] = False, True
        out[self._kind].append(text)

    def _close(self, out: dict[str, list[str]]) -> None:
        """A message ended: a call's arguments read (or, not JSON, given back as content)."""
        if self._kind != "call":
            return
        body = "".join(self._body)
        try:
            arguments = json.loads(body)
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            self.calls.append(openai_call(self._recipient[len(FUNCTIONS):], arguments))
        elif body:
            self._kind, self._fresh = "content", True
            self._give(body, out)


class Calls:
    """``Messages``' calls as ``serve/openai.Choice`` reads a reply's (``runtime/tools.Calls``' interface): the
    text has been read apart already, so ``feed`` gives it back whole."""

    def __init__(self, messages: Messages):
        self._messages = messages

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self._messages.calls

    def feed(self, text: str) -> str:
        return text

    def end(self) -> str:
        return ""

    def new(self) -> list[dict[str, Any]]:
        return self._messages.new()


def grammar(tags: dict[str, int], schema: dict[str, Any] | None = None, tools: Any = None) -> Lark:
    """The Lark grammar (llguidance's) of a reply in harmony: any analysis messages, then the answer: a ``final``
    message held to ``schema`` (OpenAI's ``response_format``), or, with ``tools`` (``runtime/tools.Tools``), a
    call of one of them, its arguments to its ``parameters`` schema (``tool_choice``: ``auto`` lets the model
    answer in ``final`` instead; a named function is the only one it may call), after any preamble. ``tags``: the
    marks' token ids, by text (every mark a token of its own, as gpt-oss's tokenizer has them)."""
    t = {mark: f"<[{tags[mark]}]>" for mark in (START, END, MESSAGE, CHANNEL, CONSTRAIN)}
    rules = [f"start: {t[CHANNEL]} reply",
             f'next: {t[END]} {t[START]} "assistant" {t[CHANNEL]} reply',
             f'reply: "analysis" {t[MESSAGE]} BODY? next | answer',
             "BODY: /(?s:.+)/"]
    if tools is None:
        held = "BODY?" if schema is None else f"%json {json.dumps({**schema, 'x-guidance': LAYOUT})}"
        rules.append(f'answer: "final" {t[MESSAGE]} {held}')
    else:
        names = [tools.named] if tools.choice == "function" else list(tools.parameters)
        calls = " | ".join(
            f'"commentary to={FUNCTIONS}{n} " {t[CONSTRAIN]} "json" {t[MESSAGE]} %json '
            f"{json.dumps({**tools.parameters[n], 'x-guidance': LAYOUT})}" for n in names)
        preamble = f'"commentary" {t[MESSAGE]} BODY? next'
        final = f' | "final" {t[MESSAGE]} BODY?' if tools.choice == "auto" else ""
        rules.append(f"answer: {preamble} | {calls}{final}")
    return Lark("\n".join(rules) + "\n")
