"""Tool calls (OpenAI's ``tools``): a request's functions checked, the grammar that holds a reply to calls of them
in the checkpoint's own format, and the calls read back out of the reply's text.

A chat template that takes tools teaches its model one way to write a call; ``format_of`` reads which off the
template's text:

- ``hermes`` (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro and 3, and models tuned from them): any text, then one or more
  ``<tool_call>``, a line ``{"name": "f", "arguments": {...}}``, ``</tool_call>``, one after another;
- ``llama3_json`` (Llama 3.1, 3.2 and 3.3): the whole reply is one call, ``{"name": "f", "parameters": {...}}``,
  or it is text (which then does not start with ``{``);
- ``mistral`` (Mistral 7B Instruct v0.3, Mistral Nemo and the models of their tokenizer): any text, then the
  ``[TOOL_CALLS]`` token and a JSON list of calls, ``[{"name": "f", "arguments": {...}}]``, to the end of the reply.
  Its templates take only ids of 9 letters and digits for the calls a conversation carries: the ids given are so.

A server that reads calls out of free text after the fact hands a malformed call back as text (a name that is
no tool's, arguments that are not JSON or miss a required key). Here the reply is held by a grammar
(``runtime/grammar.py``) to what the request allows: text that does not begin a call, and once the model begins
one, a name among the tools' and arguments that follow that tool's ``parameters`` schema (JSON laid out as the
templates write it). ``tool_choice``: ``auto`` (text, or text then calls), ``required`` (calls only), a named
function (calls of it only); ``parallel_tool_calls: false``: one call at most. ``none``: the tools are not shown to
the model at all (it cannot call what it does not know).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import CallError
from .grammar import LAYOUT, Lark

CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's function names


@dataclass(frozen=True)
class Format:
    """How a checkpoint writes a tool call: ``open`` and ``close`` around each call's JSON line (hermes), ``open``
    before a JSON list of the calls (``listed``: mistral), or no mark (the reply is the call's JSON: llama3_json);
    ``arguments``: the key of the arguments in that JSON; ``many``: whether a reply may hold several calls;
    ``short_ids``: the template takes call ids of 9 letters and digits only; ``lead``: a special token the model
    may write before a call, which decoding drops (Llama 3's ``<|python_tag|>``)."""

    name: str
    open: str
    close: str
    arguments: str
    many: bool
    listed: bool = False
    short_ids: bool = False
    lead: str = ""


HERMES = Format("hermes", "<tool_call>", "</tool_call>", "arguments", True)
LLAMA3_JSON = Format("llama3_json", "", "", "parameters", False, lead="<|python_tag|>")
MISTRAL = Format("mistral", "[TOOL_CALLS]", "", "arguments", True, listed=True, short_ids=True)


def format_of(template: str | None) -> Format | None:
    """The tool-call format a chat template teaches (``HERMES``, ``LLAMA3_JSON``, ``MISTRAL``); None where it shows
    the model no tools or writes calls some other way."""
    if not template or not re.search(r"\btools\b", template):
        return None
    if "<tool_call>" in template and "<function=" not in template:  # Qwen3-Coder's <function=...> XML calls: not JSON
        return HERMES
    if '"parameters": ' in template and "<|start_header_id|>" in template:
        return LLAMA3_JSON
    if "[TOOL_CALLS]" in template and "[AVAILABLE_TOOLS]" in template and "[ARGS]" not in template:  # v11's: name[ARGS]
        return MISTRAL
    return None


class Tools:
    """A request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked: ``definitions`` (what the chat
    template is given, as the request sent them), ``choice`` (``none``, ``auto``, ``required``, or ``function``:
    calls of ``named`` only) and ``parallel``."""

    def __init__(self, tools: Any, choice: Any = None, parallel: Any = None):
        if not isinstance(tools, list) or not tools:
            raise CallError(f"tools={str(tools)[:60]}: a non-empty list of "
                            '{"type": "function", "function": {"name": ..., "parameters": {...}}}.')
        self.parameters: dict[str, dict[str, Any]] = {}
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
                raise CallError(f"tools[{i}]={str(tool)[:60]}: a tool is "
                                '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}.')
            name, parameters = function.get("name"), function.get("parameters", {"type": "object"})
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise CallError(f"tools[{i}].function.name={str(name)[:70]!r}: 1 to 64 letters, digits, '_', '.' or '-'.")
            if name in self.parameters:
                raise CallError(f"tools[{i}]: a second function named {name!r}; each tool's name is its own.")
            if not isinstance(parameters, dict):
                raise CallError(f"tools[{i}].function.parameters={str(parameters)[:60]}: a JSON schema (an object) of "
                                "the function's arguments.")
            self.parameters[name] = parameters
        self.definitions = tools
        self.choice, self.named = _choice(choice, list(self.parameters))
        if parallel is not None and not isinstance(parallel, bool):
            raise CallError(f"parallel_tool_calls={str(parallel)[:40]}: true or false.")
        self.parallel = parallel is not False

    @property
    def active(self) -> bool:
        """Whether the model is shown the tools and may call them (``tool_choice`` other than ``none``)."""
        return self.choice != "none"

    def grammar(self, fmt: Format, tags: dict[str, int], words: list[int] = ()) -> Lark:
        """The Lark grammar (llguidance's) of a reply in ``fmt``: text or calls as ``choice`` allows, each call
        one of the allowed functions with arguments to its schema. ``tags``: the call marks that are tokens of
        their own, ``words``: the other added tokens the text may hold (``tokens_of``); the grammar names both by
        id (llguidance takes every added token for a special one): the model writes them as it was trained to,
        one token each, not spelt out (Qwen3's ``<think>``)."""
        names = [self.named] if self.choice == "function" else list(self.parameters)
        one = {"anyOf": [{
            "type": "object", "properties": {"name": {"const": n}, fmt.arguments: {"$ref": f"#/$defs/{n}"}},
            "required": ["name", fmt.arguments], "additionalProperties": False} for n in names]}
        # each tool's schema under $defs/NAME, its own references moved with it (Pydantic's schemas use "#/$defs/...")
        defs = {"$defs": {n: _moved(self.parameters[n], f"#/$defs/{n}") for n in names}, "x-guidance": LAYOUT}
        call = json.dumps({**one, **defs})
        if not fmt.open:
            lead = f"<[{tags[fmt.lead]}]>? " if fmt.lead in tags else ""
            rule = f"call: {lead}%json {call}\n"
            return Lark(f"start: call\n{rule}" if self.choice != "auto" else f"start: TEXT | call\n{rule}TEXT: /[^{{](?s:.*)/\n")

        def mark(text: str) -> str:
            return f"<[{tags[text]}]>" if text in tags else json.dumps(text)
        if fmt.listed:
            listed = {"type": "array", "items": one, "minItems": 1, **({} if self.parallel else {"maxItems": 1}), **defs}
            rules = f"calls: WS? %json {json.dumps(listed)}\nWS: /[ \\t\\n]+/\n"
        else:
            rules = (f'call: "\\n" %json {call} "\\n" {mark(fmt.close)}\n'
                     f'more: "\\n" {mark(fmt.open)} call\n'
                     f"calls: call{' more*' if self.parallel and fmt.many else ''}\n")
        text = f"TEXT: /(?s:.+)/ & ~/(?s:.*){re.escape(fmt.open)}(?s:.*)/\n"
        if words:
            text += f"text: (TEXT | <[{','.join(map(str, words))}]>)+\n"
        if self.choice != "auto":
            return Lark(f"start: {mark(fmt.open)} calls\n{rules}")
        if fmt.open in tags:  # text cannot hold the token: the call starts where it comes
            prose = "text" if words else "TEXT"
            return Lark(f"start: {prose} | {prose}? {mark(fmt.open)} calls\n{rules}{text}")
        # spelt out, the text before a call ends lazily, at the first open mark
        return Lark(f"start: TEXT | head calls\nhead[lazy]: /(?s:.*)/ {mark(fmt.open)}\n{rules}{text}")


def _moved(schema: Any, base: str) -> Any:
    """``schema`` with each of its own references (``"$ref": "#/..."``) pointing under ``base``, where it is put."""
    if isinstance(schema, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _moved(v, base))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_moved(v, base) for v in schema]
    return schema


def tokens_of(tokenizer: Any, fmt: Format) -> tuple[dict[str, int], list[int]]:
    """``fmt``'s call marks (and ``lead``) that are single tokens in ``tokenizer`` (Qwen's ``<tool_call>`` is token
    151657), by text; and the other added tokens that are text (``Tokenizer.text_tokens``), which a reply's prose
    may hold."""
    found = {t: tokenizer.token_id(t) for t in (fmt.open, fmt.close, fmt.lead) if t}
    tags = {t: i for t, i in found.items() if i is not None}
    return tags, [i for i in tokenizer.text_tokens() if i not in tags.values()]


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    """``tool_choice`` read: the mode, and the function named where it names one."""
    if choice is None:
        return "auto", None
    if isinstance(choice, str) and choice in CHOICES:
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise CallError(f"tool_choice={str(choice)[:60]}: none, auto, required or "
                        '{"type": "function", "function": {"name": ...}}.')
    if name not in names:
        raise CallError(f"tool_choice names function {name[:64]!r}, which is not among the tools: {', '.join(names)}.")
    return "function", name


class Calls:
    """A reply's text read as it comes (``feed``) into its content (returned) and its tool calls in ``fmt``
    (``calls``, OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``; ``new()`` gives those made since
    the last call). Text that could begin a call is held back until it does not; a call that never closed (the
    reply was cut at ``max_tokens``) or does not read as one is given back as text, never dropped."""

    def __init__(self, fmt: Format):
        self.fmt = fmt
        self.calls: list[dict[str, Any]] = []
        self._new = 0
        self._held = ""
        self._open = False  # inside a call's text
        self._started = False  # some text has come (llama3_json: a reply is a call when it starts with "{")

    def feed(self, text: str) -> str:
        self._held += text
        if not self.fmt.open:
            return self._feed_whole()
        out = []
        while True:
            if self._open and self.fmt.listed:  # the list runs to the reply's end: read there
                break
            if self._open:
                end = self._held.find(self.fmt.close)
                if end < 0:
                    break
                body, self._held = self._held[:end], self._held[end + len(self.fmt.close):]
                self._open = False
                if not self._call(body):
                    out.append(self.fmt.open + body + self.fmt.close)
                continue
            tag = self.fmt.open
            start = self._held.find(tag)
            if start >= 0:
                out.append(self._content(self._held[:start]))
                self._held, self._open = self._held[start + len(tag):], True
                continue
            keep = unfinished(self._held, (tag,))
            out.append(self._content(self._held[:len(self._held) - keep]))
            self._held = self._held[len(self._held) - keep:]
            break
        return "".join(out)

    def end(self) -> str:
        """The content left once the reply is whole."""
        held, self._held = self._held, ""
        if not self.fmt.open:
            return held if not self._call(held) else ""
        if self._open and not (self._listed(held) if self.fmt.listed else self._call(held)):
            return self.fmt.open + held
        return "" if self._open else self._content(held)

    def new(self) -> list[dict[str, Any]]:
        """The calls made since the last ``new``, each with its ``index`` among the reply's calls."""
        made = [{"index": self._new + i, **c} for i, c in enumerate(self.calls[self._new:])]
        self._new = len(self.calls)
        return made

    def _feed_whole(self) -> str:
        """llama3_json: a reply that starts with ``{`` is held whole (read at ``end``); any other is text."""
        if not self._started:
            if not self._held.strip():
                return ""
            self._started, self._open = True, self._held.lstrip().startswith("{")
        if self._open:
            return ""
        held, self._held = self._held, ""
        return held

    def _content(self, text: str) -> str:
        """Text outside calls: the blank lines between and after calls are not content."""
        return "" if self.calls and not text.strip() else text

    def _call(self, body: str | dict) -> bool:
        """Whether ``body`` reads as a call (then kept): a JSON object with a ``name`` and its arguments."""
        try:
            call = json.loads(body) if isinstance(body, str) else body
        except ValueError:
            return False
        arguments = call.get(self.fmt.arguments, call.get("arguments")) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            return False
        self.calls.append(openai_call(call["name"], arguments, self.fmt.short_ids))
        return True

    def _listed(self, body: str) -> bool:
        """Whether ``body`` reads as a list of calls (then all kept), as mistral writes them."""
        try:
            calls = json.loads(body)
        except ValueError:
            return False
        if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls):
            return False
        kept = len(self.calls)
        if not all(self._call(c) for c in calls):
            del self.calls[kept:]
            return False
        return True


def openai_call(name: str, arguments: dict[str, Any], short_id: bool = False) -> dict[str, Any]:
    """A call as OpenAI's answer gives it: a new id (``call_`` and 24 hex digits, or, ``short_id``, 9 letters and
    digits where the template takes no other: mistral's), the name, the arguments as a JSON string."""
    if short_id:
        made = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    else:
        made = "call_" + uuid.uuid4().hex[:24]
    return {"id": made, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def unfinished(text: str, marks: tuple[str, ...]) -> int:
    """How many characters at the end of streamed ``text`` could still begin one of ``marks`` (and so are held back
    until the next text says whether they do): the longest such suffix shorter than its mark."""
    return next((k for k in range(min(max(map(len, marks)) - 1, len(text)), 0, -1)
                 if any(m.startswith(text[-k:]) for m in marks)), 0)


def messages_for_template(messages: list[Any]) -> list[Any]:
    """OpenAI's messages as chat templates read them: an assistant message's ``tool_calls`` carry their
    ``arguments`` as a JSON string, which the templates write out with ``tojson``; they get the object (as
    vLLM and transformers' own examples hand them)."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls is None:
            out.append(m)
            continue
        if not isinstance(calls, list):
            raise CallError(f"messages[{i}].tool_calls: a list of the assistant's calls, got {str(calls)[:60]}.")
        read = []
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    raise CallError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: "
                                    f"{arguments[:60]!r}.") from None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                    or not isinstance(arguments, dict):
                raise CallError(f"messages[{i}].tool_calls[{j}]={str(call)[:60]}: a call is "
                                '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}.')
            read.append({**call, "function": {**function, "arguments": arguments}})
        out.append({**m, "tool_calls": read})
    return out
