"""The ASGI application: KServe v2 routes over ``Endpoint``s, bodies read under ``Limits``, every answer JSON.

Routes (``GET`` also answers ``HEAD``; another method on a route is 405 with ``Allow``):

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``: the server;
- ``GET /v2/models/NAME[/versions/V]``, ``.../ready``, ``.../stats``, ``GET /v2/models/stats``: a model;
- ``POST /v2/models/NAME[/versions/V]/infer``: an inference (JSON, or JSON then binary tensor data);
- ``POST /v2/models/NAME/generate`` and ``.../generate_stream`` (an artifact built with ``task=generate``):
  Triton's generate extension with token ids, the second as server-sent events, one per token; requests
  share decode steps (``generation.py``). Such an artifact's entries are not on ``/infer`` (404 naming
  ``/generate``) unless the server exposes them (``expose_entries``);
- ``GET /v1/models``, ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``: OpenAI's API,
  text in and out, over the generate artifacts that store their checkpoint's tokenizer (``openai.py``,
  ``responses.py``); ``/generate`` takes text too (``text_input``, answered with ``text_output``);
- ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: OpenAI's audio API over the speech models
  (Whisper's, ``task=generate``) that store a tokenizer: a WAV file as ``multipart/form-data`` in (the only routes
  that take a form), its text out (``audio.py``); requests that arrive together share decode steps;
- ``GET /metrics``: Prometheus' text format (``metrics.py``).

A request body is read only once its route, its access (``access.py``) and its declared size are
accepted; it is refused (413) as soon as it passes its cap, whether declared or streamed (chunked or
gzip). JSON is strict RFC 8259 (orjson): ``NaN``, ``Infinity`` and numbers beyond a double are refused.
The request is checked on its own (400 naming the input, the dim and the range) before it joins a
batch, and a run's outputs are written by orjson straight from the arrays.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, Awaitable, Callable

import orjson

from ..errors import CallError, TripyBuildError
from ..version import __version__
from .access import Access, Refused
from .endpoint import Endpoint
from .generation import Reply
from .limits import Limits

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_GET = b"GET, HEAD"
# Bodies a web page can send cross-origin without asking first (CORS "simple requests"): never inference.
_FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
_BODY_TYPES = ("application/json", "application/octet-stream")


class App:
    """The server's ASGI application over ``endpoints`` (name -> ``Endpoint``)."""

    def __init__(self, endpoints: dict[str, Endpoint], limits: Limits, access: Access, metrics: Any):
        self.endpoints, self.limits, self.access, self.metrics = endpoints, limits, access, metrics
        self.buffered = 0  # request body bytes held now, over every connection (the event loop's own count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._handle(scope, receive, send)
        except _Gone:
            pass  # no one to answer (the protocol may have: a 408 after the read timeout)
        except Refused as e:
            await self._error(send, scope, e.status, str(e), e.headers)
        except TripyBuildError as e:
            await self._error(send, scope, 400, str(e))
        except Exception as e:  # noqa: BLE001 - the server goes on; the client learns it is the server's fault
            import traceback

            traceback.print_exc()
            await self._error(send, scope, 500, f"internal server error ({type(e).__name__}); the server's log has "
                                                "the details.")

    async def _error(self, send: Send, scope: Scope, status: int, message: str, headers: Any = ()) -> None:
        """A JSON error; the connection is closed after it unless the request's body was read to its end
        (what is left of it would have to be read and thrown away)."""
        if not scope.get("body_read") and any(n in (b"content-length", b"transfer-encoding") for n, _ in scope["headers"]):
            headers = [*headers, (b"connection", b"close")]
        error: Any = message
        if scope["path"].startswith("/v1/"):  # OpenAI's shape, which its clients read the message from
            error = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                     "param": None, "code": None}
        await self._send(send, status, orjson.dumps({"error": error}), headers, scope)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        self.access.check(path, scope["headers"], scope["http_version"])
        parts = [p for p in path.split("/") if p]
        if parts[:3] == ["v2", "models", "stats"] and len(parts) == 3:
            return await self._get(scope, send, lambda: {"model_stats": [e.statistics() for e in self.endpoints.values()]})
        if parts[:2] == ["v2", "models"] and len(parts) >= 3:
            return await self._model(scope, receive, send, parts)
        if parts == ["v2"]:
            return await self._get(scope, send, lambda: {"name": "tripy_build", "version": __version__, "extensions": [
                "binary_tensor_data", "statistics", "generate"]})
        if parts == ["v2", "health", "live"]:
            return await self._get(scope, send, lambda: {"live": True})
        if parts == ["v2", "health", "ready"]:
            return await self._ready(scope, send, {}, all(ep.ready() for ep in self.endpoints.values()))
        if parts[:1] == ["v1"]:
            return await self._openai(scope, receive, send, parts[1:])
        if parts == ["metrics"]:
            self._method(method, _GET)
            text, content_type = self.metrics.exposition()
            return await self._send(send, 200, text, [(b"content-type", content_type.encode())], scope)
        raise Refused(404, f"no such resource: {method} {path[:200]}.")

    async def _model(self, scope: Scope, receive: Receive, send: Send, parts: list[str]) -> None:
        ep = self.endpoints.get(parts[2])
        if ep is None:
            raise Refused(404, f"model {parts[2][:200]!r} is not served here; GET /v2/models/stats lists those that are.")
        rest = parts[3:]
        if rest[:1] == ["versions"]:
            if len(rest) < 2 or rest[1] != ep.version:
                raise Refused(404, f"model {ep.name!r} has version {ep.version!r} only, not "
                                   f"{(rest[1] if len(rest) > 1 else '')[:100]!r}.")
            rest = rest[2:]
        if rest == []:
            return await self._get(scope, send, ep.metadata)
        if rest == ["ready"]:
            return await self._ready(scope, send, {"name": ep.name}, ep.ready())
        if rest == ["stats"]:
            return await self._get(scope, send, lambda: {"model_stats": [ep.statistics()]})
        if rest == ["infer"]:
            self._method(scope["method"], b"POST")
            if not ep.infer_served:
                raise Refused(404, ep.not_served())
            return await self._infer(ep, scope, receive, send)
        if rest in (["generate"], ["generate_stream"]):
            self._method(scope["method"], b"POST")
            if ep.generator is None:
                raise Refused(404, f"model {ep.name!r} does not generate (it was not built with task=generate); "
                                   f"inference is POST /v2/models/{ep.name}/infer.")
            if ep.generator.spec.source_shape:
                raise Refused(404, f"model {ep.name!r}: {_why_not(ep, ep.name, False)}.")
            return await self._generate(ep, scope, receive, send, stream=rest == ["generate_stream"])
        raise Refused(404, f"no such resource: {scope['method']} {scope['path'][:200]}; inference is "
                           f"POST /v2/models/{ep.name}/infer.")

    @staticmethod
    def _method(method: str, allow: bytes) -> None:
        if method.encode() not in allow.split(b", "):
            raise Refused(405, f"{method} is not allowed here; this resource takes {allow.decode()}.", [(b"allow", allow)])

    async def _get(self, scope: Scope, send: Send, body: Callable[[], Any]) -> None:
        self._method(scope["method"], _GET)
        await self._send(send, 200, orjson.dumps(body()), [_JSON], scope)

    async def _ready(self, scope: Scope, send: Send, body: dict[str, Any], ready: bool) -> None:
        """A readiness answer: 200 when ready, 400 while a model's profiles still warm up (the protocol's 4xx
        for false; a Kubernetes readinessProbe routes no traffic until it turns 200)."""
        self._method(scope["method"], _GET)
        await self._send(send, 200 if ready else 400, orjson.dumps({**body, "ready": ready}), [_JSON], scope)

    async def _send(self, send: Send, status: int, body: bytes, headers: Any, scope: Scope) -> None:
        if status >= 400:
            headers = [_JSON, *headers]
        self.metrics.response(status, scope)
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _infer(self, ep: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        binary_head = headers.get(b"inference-header-content-length")
        cap = self.limits.max_body_bytes if binary_head is not None else self.limits.max_json_bytes
        body = await self._body(scope, receive, headers, cap, "binary" if binary_head is not None else "JSON")
        split = len(body)
        if binary_head is not None:
            if not binary_head.isdigit() or not int(binary_head) <= len(body):
                raise CallError(f"Inference-Header-Content-Length {binary_head.decode('latin-1')[:30]!r} must be a "
                                f"length within the body's {len(body)} bytes.")
            split = int(binary_head)
        try:
            request = orjson.loads(memoryview(body)[:split])
        except orjson.JSONDecodeError as e:
            raise CallError(f"the request's JSON is malformed: {e} (JSON as RFC 8259: no NaN or Infinity).") from None
        prepared = ep.prepare(request, memoryview(body)[split:])
        futures = ep.batcher.submit_all(prepared.calls)
        scope["queued"] = True  # counted by the batcher from here on, success or failure
        outs = [await asyncio.wrap_future(f) for f in futures]
        response, blobs = ep.respond(request, prepared, outs)
        head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
        if blobs:
            out_headers = [(b"content-type", b"application/octet-stream"),
                           (b"inference-header-content-length", str(len(head)).encode())]
            return await self._send(send, 200, b"".join([head, *blobs]), out_headers, scope)
        await self._send(send, 200, head, [_JSON], scope)

    async def _json(self, scope: Scope, receive: Receive) -> Any:
        """A JSON request body (under ``max_json_bytes``)."""
        body = await self._body(scope, receive, _headers(scope), self.limits.max_json_bytes, "JSON")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise CallError(f"the request's JSON is malformed: {e} (JSON as RFC 8259: no NaN or Infinity).") from None

    def _start(self, ep: Endpoint, scope: Scope, receive: Receive, ids: Any, options: list[dict[str, Any]]) -> tuple:
        """Generations of ``ids`` joined to ``ep``'s running batch, one per ``options``: their ``Sequence`` objects,
        the queue their tokens arrive on as ``(index, token)`` (then ``(index, StopIteration or the error)``), and
        the task that cancels them when the client goes away."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def put(*item: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, item)
        seqs = [ep.generator.submit(ids, on_token=lambda t, i=i: put(i, t),
                                    on_done=lambda e, i=i: put(i, e or StopIteration()), **o)
                for i, o in enumerate(options)]
        scope["queued"] = True  # its outcome is counted when it ends
        return seqs, events, asyncio.ensure_future(_cancel_on_disconnect(receive, seqs))

    @staticmethod
    async def _constraints(ep: Endpoint, grammar: Any, eos_token_id: Any, n: int = 1) -> list[Any]:
        """``n`` replies' ``runtime.grammar.Constraint`` to ``grammar`` (a JSON schema or a tool-call grammar,
        compiled once), made off the event loop (the first for a tokenizer reads its vocabulary: ~0.3 s for 50k
        tokens)."""
        from ..runtime.grammar import constraints

        spec = ep.generator.spec
        make, stops = constraints(ep.text(), grammar, spec.vocab_size), spec.stops(eos_token_id)
        return await asyncio.to_thread(lambda: [make(stops) for _ in range(n)])

    async def _generate(self, ep: Endpoint, scope: Scope, receive: Receive, send: Send, stream: bool) -> None:
        """Triton's generate extension: token ids (or text, ``text_input``) in, the new ids (and ``text_output``) in
        one answer, or (``stream``) one server-sent event per token as the batch makes it. The request joins the
        running batch at its next step."""
        from .generation import parse_request

        request = await self._json(scope, receive)
        prompt, options = parse_request(request)
        tok = ep.text() if isinstance(prompt, str) else None
        if "json_schema" in options:
            options["constraint"], = await self._constraints(ep, options.pop("json_schema"), options.get("eos_token_id"))
        (seq,), events, watcher = self._start(ep, scope, receive, prompt if tok is None else tok.encode(prompt),
                                              [options])
        head = {"model_name": ep.name, "model_version": ep.version, **({"id": request["id"]} if "id" in request else {})}
        ok = False
        try:
            ok = await self._answer_generate(send, scope, events, head, stream, tok, seq.eos_token_id)
        finally:
            watcher.cancel()
            self.metrics.outcome(ep.name, "success" if ok else "failure")

    async def _answer_generate(self, send: Send, scope: Scope, events: asyncio.Queue, head: dict[str, Any],
                               stream: bool, tok: Any, stops: tuple[int, ...]) -> bool:
        """The answer to a generate request, as its tokens come (with their text where the request sent text); whether
        the generation ended well (an error is raised, or sent as a stream's last event)."""
        from ..runtime.generate import before_stop

        if not stream:
            tokens = await self._tokens(events)
            text = {"text_output": tok.decode(before_stop(tokens, stops))} if tok is not None else {}
            await self._send(send, 200, orjson.dumps({**head, **text, "output_ids": tokens}), [_JSON], scope)
            return True
        await self._start_events(send, scope)
        reply = Reply(tok, stops, []) if tok is not None else None
        index = 0
        while not isinstance(event := (await events.get())[1], BaseException):
            text = {} if reply is None else {"text_output": reply.take(event)}
            await self._event(send, {**head, **text, "output_ids": [event], "index": index})
            index += 1
        if reply is not None and (rest := reply.end()):
            await self._event(send, {**head, "text_output": rest, "output_ids": [], "index": index})
        if not isinstance(event, StopIteration):
            await self._event(send, {"error": str(event)})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return isinstance(event, StopIteration)

    @staticmethod
    async def _tokens(events: asyncio.Queue) -> list[int]:
        """A generation's tokens, once it has made them all (``events``: ``_start``'s queue of one generation); its
        error raised."""
        tokens = []
        while not isinstance(event := (await events.get())[1], BaseException):
            tokens.append(event)
        if not isinstance(event, StopIteration):
            raise event
        return tokens

    async def _start_events(self, send: Send, scope: Scope) -> None:
        self.metrics.response(200, scope)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    @staticmethod
    async def _event(send: Send, data: Any) -> None:
        """One server-sent event (``data: JSON``)."""
        body = data if isinstance(data, bytes) else orjson.dumps(data)
        await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": True})

    async def _openai(self, scope: Scope, receive: Receive, send: Send, rest: list[str]) -> None:
        """OpenAI's ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` (``openai.py``) over the models
        that generate and store a tokenizer, and its other routes over the models they fit."""
        from . import openai

        texts = {n: ep for n, ep in self.endpoints.items() if ep.embeds or ep.chats or ep.reranks}
        if rest == ["models"]:
            return await self._get(scope, send, lambda: openai.models(
                [n for n, ep in self.endpoints.items() if n in texts or ep.transcribes]))
        if rest not in (["chat", "completions"], ["completions"], ["embeddings"], ["responses"], ["rerank"],
                        ["audio", "transcriptions"], ["audio", "translations"]):
            raise Refused(404, f"no such resource: {scope['method']} {scope['path'][:200]}; OpenAI's API here: GET "
                               "/v1/models, POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, "
                               "/v1/audio/transcriptions, /v1/audio/translations; and POST /v1/rerank.")
        self._method(scope["method"], b"POST")
        if rest[0] == "audio":
            return await self._audio(scope, receive, send, rest[1])
        body = await self._json(scope, receive)
        if rest == ["rerank"]:
            return await self._rerank(scope, send, body)
        embed, responding = rest == ["embeddings"], rest == ["responses"]
        if responding:
            from .responses import Answer, chat_body

            chat = chat_body(body)
            req, answer = openai.Request(chat, chat=True), Answer(body, chat)
        else:
            req = openai.Embeddings(body) if embed else openai.Request(body, chat=rest[0] == "chat")
        ep = self.endpoints.get(req.model)
        if ep is None or not (ep.embeds if embed else ep.chats):
            raise Refused(404, f"model {req.model[:200]!r}: {_why_not(ep, req.model, embed)}; GET /v1/models lists the "
                               f"models that take text: {', '.join(texts) or 'none'}.")
        if embed:
            return await self._embed(ep, scope, send, req)
        tok = ep.tokenizer
        plan = openai.Plan(req, tok)
        spec = ep.generator.spec
        plan.stop_at(req, spec.eos_token_id)
        room = spec.room(len(plan.ids))
        options = {**req.generation(spec.sampling), "logprobs": req.logprobs, "logit_bias": req.logit_bias,
                   "max_new_tokens": req.max_tokens if req.max_tokens is not None else max(room, 1)}
        seeds = [None if "seed" not in options else options["seed"] + i for i in range(req.n)]
        helds = ([None] * req.n if plan.grammar is None else
                 await self._constraints(ep, plan.grammar, req.options.get("eos_token_id"), req.n))
        seqs, events, watcher = self._start(ep, scope, receive, plan.ids, [
            {**options, "seed": seed, "constraint": held} for seed, held in zip(seeds, helds)])
        choices = [plan.choice(i, seq, Reply(tok, seq.eos_token_id, req.stop, plan.marks)) for i, seq in enumerate(seqs)]
        ok = False
        try:
            if responding:
                ok = await self._answer_responses(send, scope, req, answer, choices[0], events, len(plan.ids))
            else:
                ok = await self._answer_openai(send, scope, req, choices, events, tok, len(plan.ids))
        finally:
            watcher.cancel()
            self.metrics.outcome(ep.name, "success" if ok else "failure")

    async def _answer_openai(self, send: Send, scope: Scope, req: Any, choices: list[Any], events: asyncio.Queue,
                             tok: Any, prompt_tokens: int) -> bool:
        """A chat or completion answer as its choices' tokens come (``events``: ``(index, token)``, then ``(index,
        StopIteration or the error)``): one JSON answer, or a stream of chunks; whether it ended well (an error is
        raised, or sent as a stream's last event)."""
        if req.stream:
            await self._start_events(send, scope)
            for c in choices:
                await self._event(send, req.chunk(None, first=True, index=c.index))
        live = len(choices)
        while live:
            index, event = await events.get()
            c = choices[index]
            if c.finished:  # a stop string ended it: what its row made after is not sent
                continue
            if isinstance(event, BaseException) and not isinstance(event, StopIteration):
                for other in choices:
                    other.seq.cancelled = True
                if not req.stream:
                    raise event
                await self._event(send, {"error": {"message": str(event), "type": "server_error"}})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return False
            if not isinstance(event, StopIteration):
                (thought, text), calls = c.take(event, req.logprobs is not None), c.new_calls()
                if req.stream and (thought or text or calls):
                    await self._event(send, req.chunk(text or None, logprobs=c.scores(req, tok), index=c.index,
                                                      calls=calls, reasoning=thought))
                if not c.reply.done:
                    continue
                c.seq.cancelled = True  # a stop string: the row is freed at the next step
            live -= 1
            (thought, rest), calls = c.end(), c.new_calls()
            if req.stream:
                if rest or thought or c.scored or calls:
                    await self._event(send, req.chunk(rest or (None if calls or thought else ""), index=c.index,
                                                      logprobs=c.scores(req, tok), calls=calls, reasoning=thought))
                await self._event(send, req.chunk(None, c.reply.finish, index=c.index))
        if not req.stream:
            answer = req.answer(choices, tok, prompt_tokens)
            await self._send(send, 200, orjson.dumps(answer), [_JSON], scope)
            return True
        if req.include_usage:
            await self._event(send, req.usage_chunk(prompt_tokens, choices))
        await self._event(send, b"[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _answer_responses(self, send: Send, scope: Scope, req: Any, answer: Any, choice: Any,
                                events: asyncio.Queue, prompt_tokens: int) -> bool:
        """A Responses API answer (``responses.Answer``) as the reply's tokens come: one JSON response, or (``stream``)
        its events; whether it ended well (an error is raised, or sent as a stream's last event)."""
        from .openai import usage

        if req.stream:
            await self._start_events(send, scope)
            for e in answer.start():
                await self._event(send, e)
        while not isinstance(event := (await events.get())[1], BaseException):
            (thought, text), calls = choice.take(event, False), choice.new_calls()
            made = answer.feed(thought, text, calls)
            for e in made if req.stream else ():
                await self._event(send, e)
        if not isinstance(event, StopIteration):
            if not req.stream:
                raise event
            await self._event(send, answer.event("error", code="server_error", message=str(event), param=None))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return False
        (thought, text), calls = choice.end(), choice.new_calls()
        made = answer.feed(thought, text, calls) + answer.end(choice.reply.finish, usage(prompt_tokens, [choice]))
        if not req.stream:
            await self._send(send, 200, orjson.dumps(made[-1]["response"]), [_JSON], scope)
            return True
        for e in made:
            await self._event(send, e)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _rerank(self, scope: Scope, send: Send, body: Any) -> None:
        """``/v1/rerank`` (``rerank.py``): the query paired with each document, padded into calls of the model's batch
        and run through its batcher (beside ``/infer``'s requests), each pair's score."""
        from ..runtime import classes
        from .rerank import Rerank

        req = Rerank(body)
        ep = self.endpoints.get(req.model)
        if ep is None or not ep.reranks:
            why = "it is not served here" if ep is None else (
                f"it has no tokenizer (token ids only: POST /v2/models/{req.model}/infer)" if ep.tokenizer is None else
                "it is not a cross-encoder (a sequence classifier of one class, as rerankers are)")
            reranks = [n for n, e in self.endpoints.items() if e.reranks]
            raise Refused(404, f"model {req.model[:200]!r}: {why}; the models that rerank here: "
                               f"{', '.join(reranks) or 'none'}.")
        spans = [ep.tokenizer.spans(req.query, d) for d in req.documents]
        calls = ep.text_rows([s.ids for s in spans], [s.type_ids for s in spans], "document {} with the query".format)
        scope["queued"] = True  # counted by the batcher from here on
        outs = [await asyncio.wrap_future(f) for f in ep.batcher.submit_all(calls)]
        logits = [row for o in outs for row in o[ep.output_names.index("logits")]]
        scores = [classes.top(row, ep.labels["logits"], 1, ep.scores_classes)[0]["score"] for row in logits]
        answer = req.answer(scores, sum(len(s.ids) for s in spans))
        await self._send(send, 200, orjson.dumps(answer), [_JSON], scope)

    async def _audio(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        """``/v1/audio/transcriptions`` and ``/v1/audio/translations`` (``audio.py``): the form read, the WAV file made
        into features off the event loop, the reply generated in ``_start``'s running batch and decoded; audio over a
        window, or a format with segments, a window at a time (``audio.Windows``), each window's reply with
        timestamps, in the language the first was detected in."""
        from ..runtime.generate import before_stop
        from ..runtime.longform import Windows, scores
        from .audio import Request, decoded, spoken

        headers = _headers(scope)
        body = await self._body(scope, receive, headers, self.limits.max_body_bytes, "binary", form=True)
        req = Request(route, body, headers.get(b"content-type", b""))
        ep = self.endpoints.get(req.model)
        if ep is None or not ep.transcribes:
            speech = [n for n, e in self.endpoints.items() if e.transcribes]
            raise Refused(404, f"model {req.model[:200]!r}: {_why_not(ep, req.model, False)}; the speech models "
                               f"here: {', '.join(speech) or 'none'}.")
        spec = ep.generator.spec
        features, options = await asyncio.to_thread(req.features, spec, ep.tokenizer)
        ok = False
        try:
            if not req.windowed:
                (seq,), events, watcher = self._start(ep, scope, receive, features, [options])
                try:
                    tokens = await self._tokens(events)
                finally:
                    watcher.cancel()
                answer, content_type = req.answer(ep.tokenizer.decode(before_stop(tokens, seq.eos_token_id)))
            else:
                windows, language = Windows(spec, features), None
                while not windows.done:
                    window = windows.next()
                    (seq,), events, watcher = self._start(ep, scope, receive, window,
                                                          [{**options, "language_token": language, "logprobs": 0}])
                    try:
                        tokens = await self._tokens(events)
                    finally:
                        watcher.cancel()
                    if seq.cancelled:  # the client went away
                        return
                    language = seq.language
                    reply = before_stop(tokens, seq.eos_token_id)
                    windows.take(reply, scores(tokens[:len(reply) + 1], [lp for lp, _ in seq.scored], seq.first,
                                               spec.vocab_size, windows.begin - 2, options.get("temperature") or 0.0))
                text, segments = decoded(windows, ep.tokenizer.decode)
                answer, content_type = req.answer(text, segments, spoken(spec, language))
            await self._send(send, 200, answer, content_type, scope)
            ok = True
        finally:
            if scope.get("queued"):  # else a refusal before the first window joined, counted with its response
                self.metrics.outcome(ep.name, "success" if ok else "failure")

    async def _embed(self, ep: Endpoint, scope: Scope, send: Send, req: Any) -> None:
        """``/v1/embeddings``: the texts tokenized, padded into calls of the model's batch and run through its
        batcher (beside ``/infer``'s requests), each row's embedding (``Endpoint.embeds``)."""
        import numpy as np

        rows = [ep.tokenizer.encode(x) if isinstance(x, str) else x for x in req.input]
        calls = ep.text_rows(rows)
        scope["queued"] = True  # counted by the batcher from here on
        outs = [await asyncio.wrap_future(f) for f in ep.batcher.submit_all(calls)]
        index = ep.output_names.index(ep.embeds)
        answer = req.answer(np.concatenate([o[index] for o in outs]), sum(map(len, rows)))
        await self._send(send, 200, orjson.dumps(answer), [_JSON], scope)

    async def _body(self, scope: Scope, receive: Receive, headers: dict[bytes, bytes], cap: int, kind: str,
                    form: bool = False) -> bytes:
        """The request body, refused (413) once it passes ``cap`` bytes, gzip undone; counted against
        ``max_buffered_bytes`` while it is read. ``form``: a ``multipart/form-data`` body (OpenAI's audio routes,
        which take no other; a web page's request to them is refused as any other by its ``Origin``)."""
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()
        if form and content_type != "multipart/form-data":
            raise Refused(415, f"Content-Type {content_type[:100]!r} is not accepted here; send multipart/form-data "
                               "(a form with the audio file as 'file' and the model's name as 'model'), as OpenAI's "
                               "clients and curl -F do.")
        if not form and content_type and content_type not in _BODY_TYPES and not content_type.endswith("+json"):
            why = " (a web form's type)" if content_type in _FORM_TYPES else ""
            raise Refused(415, f"Content-Type {content_type[:100]!r}{why} is not accepted; send application/json, "
                               "or application/octet-stream with binary tensor data.")
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b"gzip"):
            raise Refused(415, f"Content-Encoding {encoding.decode('latin-1')[:50]!r} is not accepted; send the body "
                               "as it is, or gzip.", [(b"accept-encoding", b"gzip")])
        declared = headers.get(b"content-length")
        too_big = (f"the request's {kind} body is over {cap} bytes, the most this server accepts "
                   f"(--max-{'json' if kind == 'JSON' else 'body'}-bytes)")
        if declared is not None and int(declared) > cap:
            raise Refused(413, f"{too_big}: its Content-Length is {int(declared)}.")
        reserve = int(declared) if declared is not None else cap
        if self.buffered + reserve > self.limits.max_buffered_bytes:
            raise Refused(503, f"the server holds {self.buffered} bytes of request bodies, near its limit of "
                               f"{self.limits.max_buffered_bytes}; try again shortly.", [(b"retry-after", b"1")])
        self.buffered += reserve
        try:
            chunks, size = [], 0
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == b"gzip" else None
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Gone()
                chunk, more = message.get("body", b""), message.get("more_body", False)
                if inflate is not None:
                    try:
                        chunk = inflate.decompress(chunk, cap + 1 - size)
                    except zlib.error as e:
                        raise Refused(400, f"the gzip body is damaged: {e}.") from None
                    if inflate.unconsumed_tail:
                        size = cap + 1
                size += len(chunk)
                if size > cap:
                    raise Refused(413, f"{too_big}{' once gunzipped' if inflate is not None else ''}.")
                chunks.append(chunk)
            scope["body_read"] = True
            if inflate is not None and not inflate.eof:
                raise Refused(400, "the gzip body ends before its stream does.")
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            self.buffered -= reserve


class _Gone(Exception):
    """The client went away (or the protocol answered it) before its body arrived: nothing to answer."""


async def _cancel_on_disconnect(receive: Receive, seqs: list[Any]) -> None:
    """Cancel the generations whose client goes away (their rows are freed at the next step, not at their last
    token)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    for seq in seqs:
        seq.cancelled = True


def _why_not(ep: Endpoint | None, name: str, embed: bool) -> str:
    """Why OpenAI's embeddings (``embed``) or chat and completions routes do not serve the model ``name``."""
    if ep is None:
        return "it is not served here"
    if ep.generator is not None and ep.generator.spec.source_shape:
        return ("it is a speech model: it takes audio, on OpenAI's POST /v1/audio/transcriptions and "
                "/v1/audio/translations (a WAV file as multipart/form-data)" if ep.transcribes else
                "it is a speech model whose artifact stores no tokenizer, so it is not served (rebuild it from a "
                "checkpoint with its tokenizer saved beside it, for POST /v1/audio/transcriptions)")
    if ep.tokenizer is None:
        return f"it has no tokenizer (token ids only: POST /v2/models/{name}/{'infer' if embed else 'generate'})"
    if ep.reranks:
        return "it is a cross-encoder: POST /v1/rerank"
    if embed:
        return ("it does not make sentence embeddings (build it with model.pooling=mean; a CLIP text tower with "
                "model.head=projection)")
    return "it does not generate (an encoder: POST /v1/embeddings)"


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name; one the request repeats with different values is refused."""
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in out and out[name] != value and name in (b"content-type", b"content-encoding",
                                                           b"inference-header-content-length"):
            raise Refused(400, f"the {name.decode()} header is given twice with different values.")
        out[name] = value
    return out
