"""OpenAI's chat and completions API over the artifacts built with ``task=generate`` that store a tokenizer: the
requests and answers, without the transport (``app.py`` runs them on ``generation.Generator``).

- ``GET /v1/models``: the models that take text (``{"object": "list", "data": [{"id": NAME, ...}]}``);
- ``POST /v1/chat/completions``: ``{"model": NAME, "messages": [{"role": "user", "content": "Hi"}], ...}``: the
  messages in the checkpoint's chat template, the reply as ``choices[0].message.content``;
- ``POST /v1/completions``: ``{"model": NAME, "prompt": "Once upon a time", ...}``: the continuation as
  ``choices[0].text``;
- ``POST /v1/embeddings``: ``{"model": NAME, "input": ["a text", ...]}`` (or token ids) over an encoder built with
  ``model.pooling`` (its ``sentence_embedding``) or a CLIP text tower with its projection (``text_embeds``): each
  text's embedding as floats, or base64 of little-endian float32 (``encoding_format``, which OpenAI's client asks
  for).

Options, as OpenAI names them: ``max_tokens`` (or ``max_completion_tokens``; default: what the cache has room
for), ``temperature`` (0: greedy), ``top_p``, ``frequency_penalty``, ``presence_penalty``, ``seed``, ``stop`` (up
to 4 strings: the reply ends before the first, and its generation stops there), ``stream`` (server-sent events of
``chat.completion.chunk``/``text_completion`` objects, then ``data: [DONE]``; ``stream_options.include_usage``
adds the token counts; text that could begin a stop string is held back until it cannot), and, as vLLM takes
them, ``top_k``, ``min_p``, ``repetition_penalty`` and this server's ``eos_token_id``. The sampling options a
request leaves out take the artifact's defaults, as vLLM takes them from the checkpoint's
``generation_config.json`` (``runtime/sampling.py``: Qwen2.5-Instruct's temperature 0.7, top_p 0.8, top_k 20,
repetition_penalty 1.05); where the checkpoint does not sample, OpenAI's temperature 1. A chat request's
``chat_template_kwargs`` (vLLM's) are variables for the chat template: Qwen3's ``{"enable_thinking": false}``;
``reasoning_effort`` (``low``, ``medium``, ``high``) is the template's variable of that name (gpt-oss's), refused
where the template has none.
``logit_bias`` (token ids to [-100, 100]) is added to their logits first. ``n`` replies (up to 128) run as rows
of the batch, choice i sampled with ``seed + i``. ``response_format``
(``json_object``, ``json_schema``) holds the reply to JSON (``runtime/grammar.py``).
``logprobs`` (chat: ``logprobs: true`` with ``top_logprobs`` up to 20; a completion: ``logprobs: N``) gives
each generated token's log probability under the model (its logits' ``log_softmax``, before the sampling options,
as vLLM's default) and the N most likely alternatives, every token but an end id, with its ``bytes``. What the
model here cannot do is refused by name rather than ignored: image parts (a message's
``content`` may be a list of text parts: joined by newlines, as vLLM joins them). ``tools``, ``tool_choice`` and
``parallel_tool_calls``: the reply held to calls in the chat template's own format and read back as
``message.tool_calls`` (``runtime/tools.py``). A reasoning model's thinking (a chat template that writes
``<think>``) comes apart from the answer, as ``reasoning_content`` (``runtime/reasoning.py``); so does gpt-oss's
analysis channel, and its calls are read off its messages' recipients (``runtime/harmony.py``). ``finish_reason``
is ``stop`` where the reply ended at one of the model's end ids or a stop string, else ``length``; ``usage``
counts the prompt's tokens and those generated.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..errors import CallError
from ..runtime.grammar import schema_of
from ..runtime.sampling import NAMES
from ..runtime.tools import Tools, messages_for_template

SAMPLING = NAMES  # temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty
# a beam search (runtime/beams.py), as vLLM's extra parameters take it; checked where read
BEAMS = ("num_beams", "length_penalty", "early_stopping")
TAKEN = ("model", "messages", "prompt", "max_tokens", "max_completion_tokens", *SAMPLING, "seed", "stop", "stream",
         "stream_options", "eos_token_id", "chat_template_kwargs", "logprobs", "top_logprobs", "response_format", "n",
         "tools", "tool_choice", "parallel_tool_calls", "logit_bias", "user", "reasoning_effort", *BEAMS)
CHAT_ONLY = ("messages", "chat_template_kwargs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
             "reasoning_effort")
EFFORTS = ("low", "medium", "high")  # OpenAI's reasoning_effort, as gpt-oss's template takes it
MAX_STOPS = 4  # OpenAI's bound on stop strings
MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs (vLLM's on a completion's logprobs too)
MAX_N = 128  # OpenAI's bound on n


class Request:
    """A parsed chat or completion request."""

    def __init__(self, body: Any, chat: bool):
        if not isinstance(body, dict):
            raise CallError('the request is a JSON object: {"model": NAME, "messages": [{"role": "user", "content": '
                            '"Hi"}]}.')
        self.chat = chat
        what = "messages" if chat else "prompt"
        for key in body:
            if key not in TAKEN:
                raise CallError(f"{key!r} is not an option of this server's /v1/{'chat/' if chat else ''}completions; "
                                f"it takes {', '.join(k for k in TAKEN if k != 'prompt' if chat or k not in CHAT_ONLY)}.")
        if not isinstance(body.get("user", ""), str | None):
            raise CallError(f"user={str(body['user'])[:40]}: a string identifying the end user (OpenAI's clients send "
                            "it; this server has no use for it).")
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
            self.prompt = messages_for_template([_flat(m) for m in self.prompt])
        elif not isinstance(self.prompt, str) or not self.prompt:
            raise CallError(f'"prompt" must be a non-empty string, got {str(self.prompt)[:60]}.')
        self.template_kwargs = body.get("chat_template_kwargs") or {}
        if (not isinstance(self.template_kwargs, dict) or (self.template_kwargs and not chat)
                or "add_generation_prompt" in self.template_kwargs):
            raise CallError(f"chat_template_kwargs={str(self.template_kwargs)[:60]}: an object of the chat template's "
                            'variables, such as {"enable_thinking": false}, on /v1/chat/completions.')
        if "tools" in self.template_kwargs:
            raise CallError("the chat template's variable 'tools' is set by the call itself: send the request's tools.")
        self.effort = body.get("reasoning_effort")
        if self.effort is not None and (self.effort not in EFFORTS or not chat):
            raise CallError(f"reasoning_effort={str(self.effort)[:40]}: one of {', '.join(EFFORTS)}, on "
                            "/v1/chat/completions (the chat template writes it into the prompt).")
        self.max_tokens = self._int(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens")
        temperature = body.get("temperature")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not 0 <= temperature <= 2):
            raise CallError(f"temperature={str(temperature)[:40]}: must be a number in [0, 2] (0: greedy).")
        self.options: dict[str, Any] = {k: body[k] for k in (*SAMPLING, *BEAMS) if body.get(k) is not None}
        stop = body.get("stop")
        self.stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if (not isinstance(self.stop, list) or len(self.stop) > MAX_STOPS
                or not all(isinstance(s, str) and s for s in self.stop)):
            raise CallError(f"stop={str(stop)[:60]}: must be a non-empty string or a list of at most {MAX_STOPS}.")
        if (seed := self._int(body, "seed")) is not None:
            self.options["seed"] = seed
        if body.get("eos_token_id") is not None:
            stops = body["eos_token_id"]
            self.options["eos_token_id"] = stops if isinstance(stops, list) else [stops]
        self.logprobs = self._logprobs(body, chat)
        self.logit_bias = self._logit_bias(body.get("logit_bias"))
        self.n = body.get("n", 1) if body.get("n") is not None else 1
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise CallError(f"n={str(self.n)[:40]}: the number of replies, an integer in [1, {MAX_N}].")
        self.schema = schema_of(body.get("response_format"))
        self.tools = self._tools(body, chat)
        self.stream = body.get("stream", False)
        if not isinstance(self.stream, bool):
            raise CallError(f"stream={str(self.stream)[:40]}: must be true or false.")
        extra = body.get("stream_options") or {}
        if not isinstance(extra, dict) or set(extra) - {"include_usage"}:
            raise CallError(f'stream_options={str(extra)[:60]}: this server takes {{"include_usage": true}}.')
        self.include_usage = bool(extra.get("include_usage", False))
        self.offset = 0  # a completion's text_offset: where the next scored token's text starts in the reply
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _tools(self, body: dict[str, Any], chat: bool) -> Tools | None:
        """The request's tools (``runtime/tools.Tools``); None where it has none, or ``tool_choice`` is ``none``
        (the model is not shown them)."""
        tools, choice = body.get("tools"), body.get("tool_choice")
        if not chat and any(body.get(k) is not None for k in ("tools", "tool_choice", "parallel_tool_calls")):
            raise CallError("tools belong to /v1/chat/completions (a chat template shows the model its tools).")
        if tools in (None, []):
            if choice not in (None, "none"):
                raise CallError(f"tool_choice={str(choice)[:60]} needs tools: the functions the model may call.")
            return None
        read = Tools(tools, choice, body.get("parallel_tool_calls"))
        if read.active and self.schema is not None:
            raise CallError("response_format and tools together: a reply is either held to the JSON schema or may call "
                            'the tools; leave one out (or send tool_choice: "none").')
        return read if read.active else None

    def generation(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """The options the request is generated with: its own, over OpenAI's default temperature 1 where the
        artifact records no default temperature (its checkpoint does not sample); the rest left to the artifact's
        ``recorded`` defaults."""
        return {**({} if "temperature" in recorded else {"temperature": 1.0}), **self.options}

    @staticmethod
    def _logit_bias(given: Any) -> dict[int, float] | None:
        """OpenAI's ``logit_bias``: token ids (as strings, JSON's keys) to a number in [-100, 100] added to the
        token's logit before it is picked (-100 bans it, 100 all but forces it)."""
        if given in (None, {}):
            return None
        if not isinstance(given, dict):
            raise CallError(f"logit_bias={str(given)[:60]}: an object of token ids to biases, such as "
                            '{"50256": -100}.')
        out = {}
        for key, value in given.items():
            if not key.isdigit() or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not -100 <= value <= 100:
                raise CallError(f"logit_bias[{key[:20]!r}]={str(value)[:20]}: a token id (a string of digits) to a "
                                "number in [-100, 100].")
            out[int(key)] = float(value)
        return out

    @staticmethod
    def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
        """How many alternatives each token's log probability comes with; None: no log probabilities. Chat asks with
        ``logprobs: true`` and ``top_logprobs: n``, a completion with ``logprobs: n``."""
        want, top = body.get("logprobs"), body.get("top_logprobs")
        if chat:
            if want is not None and not isinstance(want, bool):
                raise CallError(f"logprobs={str(want)[:40]}: true or false (top_logprobs: how many alternatives).")
            if top is not None and not want:
                raise CallError(f"top_logprobs={str(top)[:40]} needs logprobs: true.")
            want, top = (top or 0) if want else None, "top_logprobs"
        else:
            if top is not None:
                raise CallError("top_logprobs belongs to /v1/chat/completions; a completion asks with logprobs: N.")
            top = "logprobs"
        if want is not None and (isinstance(want, bool) or not isinstance(want, int) or not 0 <= want <= MAX_LOGPROBS):
            raise CallError(f"{top}={str(want)[:40]}: an integer in [0, {MAX_LOGPROBS}] (the alternatives per token).")
        return want

    def scores(self, tok: Any, scored: list[tuple[float, list[tuple[int, float]]]], tokens: list[int]) -> Any:
        """The ``logprobs`` of a choice or chunk for ``tokens`` and their ``scored`` (``generation.scored``), in
        OpenAI's shape: chat's ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``, a completion's
        ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; None where the request asked for none."""
        if self.logprobs is None:
            return None

        def text(t: int) -> str:
            return tok.token_bytes(t).decode("utf-8", errors="replace")

        if self.chat:
            def entry(t: int, logprob: float) -> dict[str, Any]:
                return {"token": text(t), "logprob": logprob, "bytes": list(tok.token_bytes(t))}
            return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                                for t, (lp, top) in zip(tokens, scored)], "refusal": None}
        offsets, at = [], self.offset
        for t in tokens:
            offsets.append(at)
            at += len(text(t))
        self.offset = at
        return {"tokens": [text(t) for t in tokens], "token_logprobs": [lp for lp, _ in scored],
                "top_logprobs": [{text(a): alp for a, alp in top} for _, top in scored], "text_offset": offsets}

    @staticmethod
    def _int(body: dict[str, Any], key: str) -> int | None:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (1 if "max" in key else 0)):
            raise CallError(f"{key}={str(value)[:40]}: must be an integer of at least {1 if 'max' in key else 0}.")
        return value

    def _object(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" + (".chunk" if chunk else "")) if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def answer(self, choices: list[Choice], tok: Any, prompt_tokens: int) -> dict[str, Any]:
        """The whole answer (``stream`` false): per choice its text, ``finish_reason``, ``logprobs`` (``scores``'),
        a reasoning model's thinking (``reasoning_content``) and tool calls (a message with calls and no text has
        ``content`` null); the ``usage`` of them all."""
        def choice(c: Choice) -> dict[str, Any]:
            if not self.chat:
                return {"text": c.text}
            message = {"role": "assistant", "content": c.text}
            if c.reasoning is not None:
                message["reasoning_content"] = c.reasoning or None
            if calls := c.all_calls():
                message.update(content=c.text.strip() or None, tool_calls=calls)
            return {"message": message}
        return {**self._object(False), "usage": usage(prompt_tokens, choices), "choices": [
            {"index": c.index, **choice(c), "finish_reason": c.reply.finish, "logprobs": c.scores(self, tok)}
            for c in choices]}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False, logprobs: Any = None,
              index: int = 0, calls: list[Any] = (), reasoning: str = "") -> dict[str, Any]:
        """One server-sent event of choice ``index``'s stream: the first names the assistant's role, the last has
        ``finish``; ``logprobs``: ``scores``' of the tokens since the last event; ``calls``: the tool calls made
        since (each whole, with its ``index`` among the reply's calls); ``reasoning``: the thinking since."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {} if text is None else {"content": text}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["tool_calls"] = list(calls)
            choice = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        return {**self._object(True), "choices": [{**choice, "finish_reason": finish, "logprobs": logprobs}]}

    def usage_chunk(self, prompt_tokens: int, choices: list[Choice]) -> dict[str, Any]:
        """The stream's last event with ``stream_options.include_usage``: no choices, the counts."""
        return {**self._object(True), "choices": [], "usage": usage(prompt_tokens, choices)}


class Plan:
    """How a request is generated, from its ``Request`` and the model's tokenizer: its prompt's ``ids`` (the chat
    template given the tools, where the request has any), the ``grammar`` its replies are held to (a JSON schema,
    the tools' calls; after a reasoning model's thinking), the special tokens whose text a reply keeps (``marks``,
    for ``generation.Reply``), and each reply's ``choice``."""

    def __init__(self, req: Request, tok: Any):
        from ..runtime import harmony, reasoning
        from ..runtime.tools import tokens_of

        self.harmony = req.chat and harmony.speaks(tok.chat_template)  # gpt-oss: channels, not <think> and tags
        self.fmt = None if req.tools is None or self.harmony else _tool_format(tok, req.model)
        self.tools = req.tools is not None
        tools = None if req.tools is None else req.tools.definitions
        self.thinking = req.chat and (self.harmony or reasoning.thinks(tok.chat_template))
        prompt = harmony.messages_for_template(req.prompt) if self.harmony else req.prompt
        kwargs = dict(req.template_kwargs)
        if req.effort is not None:
            if "reasoning_effort" not in (tok.chat_template or ""):
                raise CallError(f"reasoning_effort={req.effort}: model {req.model!r}'s chat template takes no reasoning "
                                "effort (gpt-oss's does), so it would change nothing; leave it out.")
            kwargs["reasoning_effort"] = req.effort
        rendered = tok.render(prompt, tools=tools, **kwargs) if req.chat else None
        self.inside = self.thinking and not self.harmony and reasoning.opened(rendered)
        self.ids = tok.encode_rendered(rendered) if req.chat else tok.encode(req.prompt)
        self.ends: list[int] = []  # end ids the format has beside the build's
        if self.harmony:
            self.grammar, self.marks = _harmony(req, tok)
            self.ends = [i for i in map(tok.token_id, (harmony.RETURN, harmony.CALL)) if i is not None]
            return
        tags, words = ({}, []) if self.fmt is None else tokens_of(tok, self.fmt)
        self.grammar = req.schema if self.fmt is None else req.tools.grammar(self.fmt, tags, words)
        thought = (tok.token_id(reasoning.OPEN), tok.token_id(reasoning.CLOSE))
        if self.grammar is not None and self.thinking and None not in thought:  # the model thinks, then the grammar
            self.grammar = reasoning.after_thinking(self.grammar, thought, self.inside)
        lead = None if self.fmt is None else self.fmt.lead
        named = {t: i for t, i in tags.items() if t != lead}  # a lead token is dropped from the text, as decoding does
        named.update({reasoning.OPEN: thought[0], reasoning.CLOSE: thought[1]} if self.thinking else {})
        self.marks = {i: t for t, i in named.items() if i is not None and not tok.decode([i])}  # special: not decoded

    def stop_at(self, req: Request, built: tuple[int, ...]) -> None:
        """The replies' end ids, where the request sets none: the build's (``built``), and harmony's ``<|return|>``
        and ``<|call|>`` with them: a gpt-oss checkpoint whose ``generation_config.json`` leaves ``<|call|>`` out
        (some fine-tunes' do) would otherwise write on past a call, inventing the tool's output."""
        if self.ends and req.options.get("eos_token_id") is None:
            req.options["eos_token_id"] = [*built, *(i for i in self.ends if i not in built)]

    def choice(self, index: int, seq: Any, reply: Any) -> Choice:
        """Reply ``index``'s ``Choice`` over its ``Sequence`` and ``Reply``."""
        from ..runtime import harmony
        from ..runtime.reasoning import Thoughts
        from ..runtime.tools import Calls

        if self.harmony:
            messages = harmony.Messages(calls=self.tools)
            return Choice(index, seq, reply, harmony.Calls(messages) if self.tools else None, messages)
        return Choice(index, seq, reply, None if self.fmt is None else Calls(self.fmt),
                      Thoughts(self.inside) if self.thinking else None)


def _harmony(req: Request, tok: Any) -> tuple[Any, dict[int, str]]:
    """A harmony reply's grammar (a schema or tools held in the answer, after any thinking; else none) and the
    marks its text keeps (``runtime/harmony.py``); a ``CallError`` where a grammar needs a mark the tokenizer does
    not have as a token of its own."""
    from ..runtime import harmony

    tags = {mark: tok.token_id(mark) for mark in harmony.MARKS}
    grammar = None
    if req.schema is not None or req.tools is not None:
        missing = [mark for mark, i in tags.items() if i is None]
        if missing:
            raise CallError(f"model {req.model!r}: its chat template writes gpt-oss's harmony format, but its tokenizer "
                            f"has no token {missing[0]}, so a reply cannot be held to "
                            f"{'tools' if req.tools is not None else 'response_format'}; leave it out.")
        grammar = harmony.grammar(tags, req.schema, req.tools)
    return grammar, {i: t for t, i in tags.items() if i is not None and not tok.decode([i])}


def _tool_format(tok: Any, model: str) -> Any:
    """The tool-call format ``model``'s chat template teaches (``runtime/tools.format_of``); a ``CallError`` naming
    the formats this server reads where it teaches none of them."""
    from ..runtime.tools import format_of

    fmt = format_of(tok.chat_template)
    if fmt is None:
        raise CallError(f"model {model!r}: its chat template shows the model no tools in a format this server reads "
                        "(hermes' <tool_call> as Qwen2.5 and Qwen3 write it; Llama 3.1's JSON; Mistral v0.3's "
                        "[TOOL_CALLS] list), so tools cannot be offered to it; leave tools out.")
    return fmt


class Choice:
    """One of a request's ``n`` replies as its tokens come: its ``Sequence``, its text (``Reply``), split into a
    reasoning model's thinking (``runtime/reasoning.Thoughts``, where the chat template thinks) and the answer, the
    tool calls read out of the answer (``runtime/tools.Calls``, where the request has tools), and the tokens whose
    log probabilities are still to go out."""

    def __init__(self, index: int, seq: Any, reply: Any, calls: Any = None, thoughts: Any = None):
        self.index, self.seq, self.reply, self.calls, self.thoughts = index, seq, reply, calls, thoughts
        self.pieces: list[str] = []
        self.thinking: list[str] = []
        self.scored: list[int] = []  # positions in seq.tokens
        self.finished = False
        self.text = ""
        self.reasoning_tokens = 0  # the tokens of the thinking, its marks with it

    def take(self, token: int, scoring: bool) -> tuple[str, str]:
        """The thinking and the content ``token`` lets out now (``Reply.take``, less what is a tool call's), the
        token kept for its log probability (an end id not)."""
        thought, text = self._split(self.reply.take(token))
        self.reasoning_tokens += 0 if self.thoughts is None else int(self.thoughts.thought)
        if scoring and token not in self.seq.eos_token_id:
            self.scored.append(self.reply.tokens - 1)
        return thought, text

    def end(self) -> tuple[str, str]:
        """Done: what is left of the thinking and the content; the whole are ``reasoning`` and ``text``. A reply its
        grammar held whole ended well; one that ended well after calling tools ends with ``tool_calls``."""
        self.finished = True
        raw = self.reply.end()
        thought, text = ("", raw) if self.thoughts is None else self.thoughts.feed(raw)
        if self.thoughts is not None:
            more, rest = self.thoughts.end()
            thought, text = thought + more, text + rest
        if self.calls is not None:
            text = self.calls.feed(text) + self.calls.end()
        self.thinking.append(thought)
        self.pieces.append(text)
        if self.seq.ended:
            self.reply.finish = "stop"
        if self.calls is not None and self.calls.calls and self.reply.finish == "stop":
            self.reply.finish = "tool_calls"
        self.text = "".join(self.pieces)
        return thought, text

    @property
    def reasoning(self) -> str | None:
        """The whole thinking; None where the model does not think."""
        return None if self.thoughts is None else "".join(self.thinking)

    def _split(self, text: str) -> tuple[str, str]:
        thought = ""
        if self.thoughts is not None:
            thought, text = self.thoughts.feed(text)
        if self.calls is not None:
            text = self.calls.feed(text)
        self.thinking.append(thought)
        self.pieces.append(text)
        return thought, text

    def new_calls(self) -> list[Any]:
        """The tool calls made since the last call (``Calls.new``)."""
        return [] if self.calls is None else self.calls.new()

    def all_calls(self) -> list[Any]:
        return [] if self.calls is None else self.calls.calls

    def scores(self, req: Request, tok: Any) -> Any:
        """``req.scores`` of the tokens kept since the last call."""
        out = req.scores(tok, [self.seq.scored[i] for i in self.scored], [self.seq.tokens[i] for i in self.scored])
        self.scored.clear()
        return out


class Embeddings:
    """A parsed ``/v1/embeddings`` request: its texts (or token ids) and how the answer writes the vectors."""

    def __init__(self, body: Any):
        if not isinstance(body, dict):
            raise CallError('the request is a JSON object: {"model": NAME, "input": ["a text", "another"]}.')
        unknown = [k for k in body if k not in ("model", "input", "encoding_format", "dimensions", "user")]
        if unknown:
            raise CallError(f"{unknown[0]!r} is not an option of /v1/embeddings; it takes model, input, "
                            "encoding_format, dimensions and user.")
        self.model = body.get("model")
        if not isinstance(self.model, str):
            raise CallError(f'"model" must name a served model (GET /v1/models lists them), got {str(self.model)[:60]}.')
        given = body.get("input")
        one = isinstance(given, str) or (isinstance(given, list) and given and all(_token(t) for t in given))
        self.input = [given] if one else given
        if (not isinstance(self.input, list) or not self.input
                or not all((isinstance(x, str) and x) or (isinstance(x, list) and x and all(map(_token, x)))
                           for x in self.input)):
            raise CallError('"input" must be a non-empty text, a list of them, or token ids (a list of integers, or a '
                            f"list of such lists), got {str(given)[:80]}.")
        self.format = body.get("encoding_format") or "float"
        if self.format not in ("float", "base64"):
            raise CallError(f"encoding_format={str(self.format)[:40]}: float or base64.")
        self.dimensions = body.get("dimensions")

    def answer(self, vectors: Any, tokens: int) -> dict[str, Any]:
        import base64

        import numpy as np

        width = vectors.shape[-1]
        if self.dimensions is not None and self.dimensions != width:
            raise CallError(f"dimensions={str(self.dimensions)[:20]}: model {self.model!r} embeds in {width} "
                            "dimensions only; leave dimensions out.")
        rows = np.ascontiguousarray(vectors, dtype="<f4")
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(row.tobytes()).decode() if self.format == "base64" else row.tolist()}
                for i, row in enumerate(rows)]
        return {"object": "list", "data": data, "model": self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _flat(message: Any) -> Any:
    """A message whose ``content`` is OpenAI's list of parts, with the text parts joined by newlines (as vLLM joins
    them for a text-only model): chat templates read a string. A part of another type (an image) is refused."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = message["content"]
    other = next((p for p in parts if not (isinstance(p, dict) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str))), None)
    if other is not None:
        kind = other.get("type") if isinstance(other, dict) else type(other).__name__
        raise CallError(f"a message's content part of type {str(kind)[:40]!r}: this model takes text only "
                        '({"type": "text", "text": "..."} parts, or a string).')
    return {**message, "content": "\n".join(p["text"] for p in parts)}


def _token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def usage(prompt_tokens: int, choices: list[Choice]) -> dict[str, Any]:
    """OpenAI's ``usage`` of a request's ``choices``: their tokens together, of which a reasoning model's thinking
    (``reasoning_tokens``), and how many of the prompt's first tokens were found in the cache (``cached_tokens``:
    a conversation's earlier turns, a shared system prompt; their keys and values were not computed again)."""
    tokens = sum(c.reply.tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens,
            "prompt_tokens_details": {"cached_tokens": choices[0].seq.cached},
            "completion_tokens_details": {"reasoning_tokens": sum(c.reasoning_tokens for c in choices)}}


def models(names: list[str]) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "tripy_build"}
                                       for n in names]}
