"""OpenAI's chat and completions API over the artifacts built with ``task=generate`` that store a tokenizer: the
requests and answers, without the transport (``app.py`` runs them on ``generation.Generator``).

- ``GET /v1/models``: the models that take text (``{"object": "list", "data": [{"id": NAME, ...}]}``);
- ``POST /v1/chat/completions``: ``{"model": NAME, "messages": [{"role": "user", "content": "Hi"}], ...}``: the
  messages in the checkpoint's chat template, the reply as ``choices[0].message.content``;
- ``POST /v1/completions``: ``{"model": NAME, "prompt": "Once upon a time", ...}``: the continuation as
  ``choices[0].text``.

Options, as OpenAI names them: ``max_tokens`` (or ``max_completion_tokens``; default: what the cache has room
for), ``temperature`` (OpenAI's default 1: sampling; 0: greedy), ``seed``, ``stream`` (server-sent events of
``chat.completion.chunk``/``text_completion`` objects, then ``data: [DONE]``; ``stream_options.include_usage``
adds the token counts), and this server's ``top_k`` and ``eos_token_id``. What the model here cannot do is
refused by name rather than ignored: ``top_p`` below 1, ``n`` above 1, ``stop`` strings, penalties, log
probabilities, tools. ``finish_reason`` is ``stop`` where the reply ended at one of the model's end ids, else
``length``; ``usage`` counts the prompt's tokens and the reply's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..errors import CallError

# Keys clients send at their neutral values (the OpenAI SDK leaves out what is not set; others send these):
# accepted at that value, refused otherwise, naming what this server does instead.
NEUTRAL = {"n": 1, "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0, "logprobs": False,
           "parallel_tool_calls": None, "tool_choice": "none", "user": None, "stop": None, "logit_bias": None,
           "top_logprobs": None, "tools": None, "response_format": None}
TAKEN = ("model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "seed", "stream",
         "stream_options", "top_k", "eos_token_id")


class Request:
    """A parsed chat or completion request."""

    def __init__(self, body: Any, chat: bool):
        if not isinstance(body, dict):
            raise CallError('the request is a JSON object: {"model": NAME, "messages": [{"role": "user", "content": '
                            '"Hi"}]}.')
        self.chat = chat
        what = "messages" if chat else "prompt"
        for key, value in body.items():
            if key in TAKEN:
                continue
            if key not in NEUTRAL:
                raise CallError(f"{key!r} is not an option of this server's /v1/{'chat/' if chat else ''}completions; "
                                f"it takes {', '.join(k for k in TAKEN if k != ('prompt' if chat else 'messages'))}.")
            if value is not None and value != NEUTRAL[key] and not (key == "user" and isinstance(value, str)):
                raise CallError(f"{key}={str(value)[:60]}: not supported here (the model samples from its logits with "
                                "temperature, top_k and seed; rows stop at its end ids or max_tokens); leave it out.")
        if (other := "prompt" if chat else "messages") in body:
            raise CallError(f"{other!r} belongs to /v1/{'' if chat else 'chat/'}completions; this route takes {what!r}.")
        model = body.get("model")
        if not isinstance(model, str):
            raise CallError(f'"model" must name a served model (GET /v1/models lists them), got {str(model)[:60]}.')
        self.model = model
        self.prompt = body.get(what)
        if chat:
            if not isinstance(self.prompt, list) or not self.prompt:
                raise CallError('"messages" must be a non-empty list such as [{"role": "user", "content": "Hi"}].')
        elif not isinstance(self.prompt, str) or not self.prompt:
            raise CallError(f'"prompt" must be a non-empty string, got {str(self.prompt)[:60]}.')
        self.max_tokens = self._int(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens")
        temperature = body.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise CallError(f"temperature={str(temperature)[:40]}: must be a number in [0, 2] (0: greedy).")
        self.options: dict[str, Any] = {"temperature": float(temperature)}
        for key in ("seed", "top_k"):
            if (n := self._int(body, key)) is not None:
                self.options[key] = n
        if body.get("eos_token_id") is not None:
            stops = body["eos_token_id"]
            self.options["eos_token_id"] = stops if isinstance(stops, list) else [stops]
        self.stream = body.get("stream", False)
        if not isinstance(self.stream, bool):
            raise CallError(f"stream={str(self.stream)[:40]}: must be true or false.")
        extra = body.get("stream_options") or {}
        if not isinstance(extra, dict) or set(extra) - {"include_usage"}:
            raise CallError(f'stream_options={str(extra)[:60]}: this server takes {{"include_usage": true}}.')
        self.include_usage = bool(extra.get("include_usage", False))
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    @staticmethod
    def _int(body: dict[str, Any], key: str) -> int | None:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (1 if "max" in key else 0)):
            raise CallError(f"{key}={str(value)[:40]}: must be an integer of at least {1 if 'max' in key else 0}.")
        return value

    def _object(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" + (".chunk" if chunk else "")) if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def answer(self, text: str, finish: str, prompt_tokens: int, tokens: int) -> dict[str, Any]:
        """The whole answer (``stream`` false)."""
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text})
        return {**self._object(False), "choices": [{**choice, "finish_reason": finish, "logprobs": None}],
                "usage": usage(prompt_tokens, tokens)}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict[str, Any]:
        """One server-sent event of a stream: the first names the assistant's role, the last has ``finish``."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        return {**self._object(True), "choices": [{**choice, "finish_reason": finish, "logprobs": None}]}

    def usage_chunk(self, prompt_tokens: int, tokens: int) -> dict[str, Any]:
        """The stream's last event with ``stream_options.include_usage``: no choices, the counts."""
        return {**self._object(True), "choices": [], "usage": usage(prompt_tokens, tokens)}


def usage(prompt_tokens: int, tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}


def models(names: list[str]) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "tripy_build"}
                                       for n in names]}
