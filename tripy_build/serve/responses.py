"""OpenAI's Responses API (``POST /v1/responses``, what the Agents SDK and Codex call by default) over the chat
completions' generation: a request is turned into the chat request it means (``chat_body``: its ``input`` items
as messages, its flat function tools as chat tools, ``text.format`` as ``response_format``), run as one
(``openai.Request``, ``Plan``, ``Choice``: the same prompt, grammar, thinking and tool calls), and answered as a
Response: a reasoning item for the model's thinking, a message for its text, a ``function_call`` item per tool
call; streamed as the API's events (``Events``).

Stateless, as the server keeps nothing between requests: a conversation is sent whole in ``input`` (a
``function_call`` item and its ``function_call_output``, as the client got and ran them); ``previous_response_id``
and ``store: true`` are refused by name, as are tools other than functions and input that is not text.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..errors import CallError
from ..runtime.sampling import NAMES

TAKEN = ("model", "input", "instructions", "max_output_tokens", "tools", "tool_choice", "parallel_tool_calls",
         "stream", "text", "store", "user", "metadata", *NAMES, "seed", "chat_template_kwargs", "eos_token_id",
         "reasoning")
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def chat_body(body: Any) -> dict[str, Any]:
    """The chat completions request a Responses request means; what it cannot mean here refused by name."""
    if not isinstance(body, dict):
        raise CallError('the request is a JSON object: {"model": NAME, "input": "Hi"}.')
    unknown = [k for k in body if k not in TAKEN]
    if "previous_response_id" in unknown:
        raise CallError("previous_response_id: this server keeps no responses; send the whole conversation in input "
                        "(the items a response gave you, and your function_call_output items).")
    if unknown:
        raise CallError(f"{unknown[0]!r} is not an option of this server's /v1/responses; it takes {', '.join(TAKEN)}.")
    if body.get("store"):
        raise CallError("store: true: this server keeps no responses; send store: false, or leave it out.")
    if body.get("metadata") not in (None, {}):
        raise CallError("metadata: this server keeps no responses to label; leave it out.")
    chat = {k: body[k] for k in ("model", *NAMES, "seed", "user", "chat_template_kwargs", "eos_token_id", "parallel_tool_calls",
                                 "stream") if k in body}
    chat["messages"] = _messages(body.get("input"), body.get("instructions"))
    most = body.get("max_output_tokens")
    if most is not None:
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise CallError(f"max_output_tokens={str(most)[:40]}: must be an integer of at least 1.")
        chat["max_tokens"] = most
    if body.get("tools"):
        chat["tools"] = [_tool(i, t) for i, t in enumerate(body["tools"])] if isinstance(body["tools"], list) \
            else body["tools"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        chat["tool_choice"] = choice
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict) or set(reasoning) - {"effort"}:
            raise CallError(f'reasoning={str(reasoning)[:60]}: this server takes {{"effort": "low"}} (or medium, high).')
        if reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
    fmt = _format(body)
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def _format(body: dict[str, Any]) -> Any:
    """``text.format``: the reply's format (``{"type": "text"}``, ``json_object``, ``json_schema``), or None."""
    text = body.get("text") or {}
    if not isinstance(text, dict):
        raise CallError(f'text={str(text)[:60]}: an object such as {{"format": {{"type": "json_object"}}}}.')
    return text.get("format")


def _tool(i: int, tool: Any) -> Any:
    """A Responses function tool (``{"type": "function", "name": ..., "parameters": ...}``) as a chat tool."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise CallError(f"tools[{i}] of type {str(kind)[:40]!r}: this server runs function tools only "
                        '({"type": "function", "name": ..., "parameters": {...}}).')
    return {"type": "function", "function": {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}}


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or its text parts joined by newlines (input_text, output_text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CallError(f"{where}.content: a string or a list of input_text parts, got {str(content)[:60]}.")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise CallError(f"{where}.content[{j}] of type {str(kind)[:40]!r}: this model takes text only "
                            '({"type": "input_text", "text": "..."}).')
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(given: Any, instructions: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or a list of items: messages, function calls and their outputs, reasoning) as chat
    messages, after ``instructions`` as the system message."""
    if instructions is not None and not isinstance(instructions, str):
        raise CallError(f"instructions={str(instructions)[:60]}: a string (the system message).")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, list) or not items:
        raise CallError(f'"input" must be a non-empty string or list of items, got {str(given)[:60]}.')
    out = [{"role": "system", "content": instructions}] if instructions else []
    thought = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise CallError(f"{where}={str(item)[:60]}: an item is an object such as "
                            '{"role": "user", "content": "Hi"}.')
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise CallError(f"{where}.role={str(item.get('role'))[:30]!r}: user, system, developer or assistant.")
            message = {"role": role, "content": _text(item.get("content"), where)}
            if role == "assistant" and thought is not None:
                message["reasoning_content"], thought = thought, None
            out.append(message)
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and thought is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call],
                            **({"reasoning_content": thought} if thought is not None else {})})
                thought = None
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            thought = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
        else:
            raise CallError(f"{where} of type {str(kind)[:40]!r}: this server takes message, function_call, "
                            "function_call_output and reasoning items.")
    return out


class Answer:
    """A Response being made for one ``openai.Choice``: its output items as they come (``feed``), the events that
    stream them (``events``: each a dict with its ``type`` and ``sequence_number``), and the whole (``response``)."""

    def __init__(self, body: dict[str, Any], chat: dict[str, Any]):
        self.id, self.created = _id("resp"), int(time.time())
        self.model = chat["model"]
        self.echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                     "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
                     "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                     "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                     "text": {"format": _format(body) or {"type": "text"}}}
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the reasoning or message item text is going into
        self.sequence = 0

    def response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Response; ``usage``: the chat route's (``openai.usage``), under the Responses API's names."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model, "status": status,
               "error": None, "incomplete_details": incomplete, "output": self.output, **self.echo}
        if usage is not None:
            out["usage"] = {"input_tokens": usage["prompt_tokens"], "input_tokens_details": usage["prompt_tokens_details"],
                            "output_tokens": usage["completion_tokens"],
                            "output_tokens_details": usage["completion_tokens_details"],
                            "total_tokens": usage["total_tokens"]}
        return out

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def feed(self, thought: str, text: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events of what one step let out: thinking, text, then whole tool calls."""
        events = []
        for kind, delta in (("reasoning", thought), ("message", text)):
            if not delta:
                continue
            if self.open is None or self.open["type"] != kind:
                events += self._close()
                events += self._open(kind)
            part = self.open["content"][0]
            part["text"] += delta
            events.append(self.event("response.reasoning_text.delta" if kind == "reasoning" else
                                     "response.output_text.delta", item_id=self.open["id"],
                                     output_index=len(self.output) - 1, content_index=0, delta=delta,
                                     **({} if kind == "reasoning" else {"logprobs": []})))
        for call in calls:
            events += self._close()
            item = {"type": "function_call", "id": _id("fc"), "call_id": call["id"], "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"], "status": "completed"}
            self.output.append(item)
            index = len(self.output) - 1
            events += [self.event("response.output_item.added", output_index=index,
                                  item={**item, "arguments": "", "status": "in_progress"}),
                       self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=item["arguments"]),
                       self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  arguments=item["arguments"]),
                       self.event("response.output_item.done", output_index=index, item=item)]
        return events

    def end(self, finish: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
        """The last events: the open item closed, then the whole response in ``response.completed`` (``usage``: the
        chat route's, ``openai.usage``), its ``status`` ``incomplete`` where the reply ran out of
        ``max_output_tokens`` (as vLLM sends it: OpenAI's client waits for ``response.completed`` to hand over the
        final response)."""
        status = "incomplete" if finish == "length" else "completed"
        events = self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            events += self._open("message") + self._close(status)  # a reply with nothing to say still says it
        return events + [self.event("response.completed", response=self.response(status, usage))]

    def _open(self, kind: str) -> list[dict[str, Any]]:
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else \
            {"type": "output_text", "text": "", "annotations": []}
        self.open = ({"type": "reasoning", "id": _id("rs"), "summary": [], "content": [part], "status": "in_progress"}
                     if kind == "reasoning" else
                     {"type": "message", "id": _id("msg"), "role": "assistant", "content": [part], "status": "in_progress"})
        self.output.append(self.open)
        index = len(self.output) - 1
        return [self.event("response.output_item.added", output_index=index, item={**self.open, "content": []}),
                self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                           content_index=0, part=dict(part))]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        if self.open is None:
            return []
        item, index, self.open = self.open, self.output.index(self.open), None
        item["status"] = status
        part = item["content"][0]
        done = ("response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done")
        return [self.event(done, item_id=item["id"], output_index=index, content_index=0, text=part["text"]),
                self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=item)]
