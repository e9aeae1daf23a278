"""Iteration-level batching for ``/generate`` and ``/generate_stream``: one running batch, many clients; and a
reply's text as its tokens come (``Reply``: what ``/generate_stream`` and OpenAI's routes send).

A thread owns a ``runtime.generate.Session`` (the cache of a batch of rows on the device) and loops:
requests waiting join at the next step (each takes a free row and has its prompt prefilled into it),
then one decode step runs for every busy row, each row's token is sampled with its own request's
sampler (its seed), handed to its client, and a row whose request is done is freed at once. N clients
thus share each decode step: a step at batch 8 costs little more than one at batch 1 (a decode step
reads every weight once whatever the batch), so the tokens per second add up.

The batch starts at the smallest decode bucket that holds the requests waiting and grows to the next
bucket when a request finds no free row (the cache is copied into the larger one: once per growth,
never per step); when every row is free the session is dropped and the next request starts small.

Requests that reach an idle server together are prefilled as one batch (``Session.admit_all``): the
thread waits until no request has arrived for ``JOIN_WINDOW_S`` (at most ``4 * JOIN_WINDOW_S``). Without
the wait, of 8 clients sending at once the first was prefilled alone and the other 7 row by row into the
running batch (1.5 s of stalled steps; 8 clients got 2.9x one client's tokens/s, with the wait 3.3x,
bench/generate.py); a lone request pays at most the window, against a prompt's prefill of 25-170 ms for
GPT-2 small here.

An encoder-decoder's batch (``runtime/seq2seq.Session``) is encoded together and decoded in step: requests
that arrive while it runs wait for it to finish, then start the next batch together. Beam searches
(``runtime/beams.py``: a request's ``num_beams``, or the artifact's) run the same way, an encoder-decoder's or a
decoder's, on an idle server: those alike (beams, ends, length) together, each request's beams rows of one batch;
a reply is handed out whole at the search's end.

A speech model's request may ask for ``timestamps`` (``serve/audio.py``'s long audio and segmented formats, a window
at a time): its reply opens without ``<|notimestamps|>`` and its logits are held to ``runtime/timestamps.Stamps``
after the checkpoint's processors, as ``runtime/longform.py`` generates each window. Its language, where detected, is
``Sequence.language`` once it joined; a later window of the same audio passes it back (``language_token``) to be
decoded in it rather than detected again. Only requests that open alike (the same opening, timestamps or none) share
a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import CallError
from ..runtime import seq2seq
from ..runtime.beams import Beams, chosen, search
from ..runtime.generate import Held, Session, Spec, check_prompt
from ..runtime.sampling import NAMES, Sampler
from ..runtime.timestamps import Stamps
from ..runtime.transcription import DETECT, Opening, check_features

log = logging.getLogger(__name__)
JOIN_WINDOW_S = 0.003


@dataclass
class Sequence:
    """One request: its prompt, how to pick its tokens, and where they go."""

    prompt: np.ndarray
    max_new_tokens: int
    sampler: Sampler
    eos_token_id: tuple[int, ...]  # stop at any of these
    on_token: Callable[[int], None]  # called on the batch thread with each new token
    on_done: Callable[[BaseException | None], None]  # called once, at the end (an error, or None)
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False
    logprobs: int | None = None  # score each token (``scored``), with this many most likely alternatives
    ended: bool = False  # its grammar (runtime/grammar.Constraint) took its last token: the reply is whole
    cached: int = 0  # its prompt's first tokens found in the cache (not computed again): set when it joins
    scored: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)  # per token, before on_token
    beams: Beams | None = None  # its beam search (runtime/beams.py): its tokens come at its end
    opening: tuple[int, ...] = ()  # a speech model's: what its reply opens with (runtime/transcription.py)
    stamps: Stamps | None = None  # a speech model's reply with timestamps: their rule
    language: int | None = None  # a speech model's language token: given, or detected when it joined
    first: np.ndarray | None = None  # a speech model's logits after its start token (its no-speech probability's)
    before: tuple[int, ...] = ()  # a speech model's prompt_ids: read before its start token

    @property
    def alike(self) -> tuple[Any, ...]:
        """What the sequences of one batch share: their prompt, their opening, and timestamps or none."""
        return self.before, self.opening, self.stamps

    def next(self, logits: np.ndarray) -> bool:
        """Pick the next token from its logits ``[vocab]`` (scored, where asked), hand it out; whether done (its
        grammar, if it has one, ``ended`` too)."""
        token = int(self.sampler(logits[None])[0])
        if self.logprobs is not None:
            self.scored.append(scored(logits, token, self.logprobs))
        self.ended = bool(np.any(self.sampler.ended()))
        return self.take(token) or self.ended

    def take(self, token: int) -> bool:
        """Record and hand out a token; whether the sequence is done."""
        self.tokens.append(token)
        self.on_token(token)
        return (len(self.tokens) >= self.max_new_tokens or token in self.eos_token_id) or self.cancelled


def scored(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """``token``'s log probability under the model (``log_softmax`` of its logits, before any sampling option, as
    vLLM reports them) and the ``n`` most likely tokens' ``(id, log probability)``, most likely first."""
    x = logits.astype(np.float64)
    top = x.max()
    logp = x - (top + np.log(np.exp(x - top).sum()))
    best = np.argpartition(-logp, n)[:n] if n < logp.size else np.arange(logp.size)
    best = best[np.argsort(-logp[best], kind="stable")]
    return float(logp[token]), [(int(t), float(logp[t])) for t in best]


class Generator:
    """The running batch of one served artifact built with ``task=generate``."""

    def __init__(self, steps: Any, spec: Spec, name: str):
        self.steps, self.spec, self.name = steps, spec, name
        self.buckets = sorted({p["batch"] for p in steps.profiles(spec.decode)})
        # an encoder-decoder's batch is encoded together and decoded in step: requests join only an idle server
        self.seq2seq = spec.kind == "seq2seq"
        # an encoder-decoder's longest source (a decoder's prompt is bounded by its cache: Spec.max_length; a speech
        # model's sources are features of one shape)
        self.longest = max(p["seq"] for p in steps.profiles(spec.prefill)) if self.seq2seq and not spec.source_shape \
            else None
        self.waiting: deque[Sequence] = deque()
        self.rows: dict[int, Sequence] = {}
        self.session: Session | None = None
        self.cv = threading.Condition()
        self.closed = False
        self.steps_run = 0  # decode steps, and the rows they carried (statistics)
        self.rows_run = 0
        self.cancelled = 0  # requests whose client went away before their last token
        self.prompt_tokens = 0  # the prompts' tokens admitted, and those of them found in the cache (not run again)
        self.cached_tokens = 0
        self.thread = threading.Thread(target=self._loop, name=f"tripy_build-generate-{name}", daemon=True)
        self.thread.start()

    def submit(self, prompt: Any, max_new_tokens: int, on_token: Callable[[int], None],
               on_done: Callable[[BaseException | None], None], seed: int | None = None, eos_token_id: Any = None,
               logprobs: int | None = None, constraint: Any = None, logit_bias: dict[int, float] | None = None,
               num_beams: int | None = None, length_penalty: float | None = None,
               early_stopping: bool | str | None = None, language: str | None = None, task: str | None = None,
               timestamps: bool = False, language_token: int | None = None, prompt_ids: Any = None,
               **sampling: Any) -> Sequence:
        """Queue a request (checked here: a bad one raises ``CallError`` at once); it joins at the next step. Its
        tokens are picked by the ``sampling`` options given (``runtime.sampling.Options``) over the artifact's
        defaults, ``logit_bias`` added to their logits, among those its ``constraint``
        (``runtime.grammar.Constraint``) allows; or by beam search (``runtime/beams.chosen``: ``num_beams`` given, or
        the artifact's for a request that picks by score), all at its end. A speech model's ``prompt`` is one source's
        features (``runtime/transcription.check_features``), its reply opening with ``language`` and ``task``, with
        ``timestamps`` where asked, after ``prompt_ids`` (``<|startofprev|>`` and a text, before the start token);
        ``language_token``: the language a source's earlier window was detected in, which
        this one is decoded in rather than detected again."""
        spoken = Opening.of(self.spec.opening)
        opening = spoken.tokens(language, task, timestamps)
        stamps = language_of = None
        if self.spec.source_shape:
            if timestamps:
                eos = self.spec.stops(eos_token_id)
                if not eos:
                    raise CallError("eos_token_id=[]: a reply with timestamps ends at the end of its window's "
                                    "speech, at the model's end id; leave eos_token_id out.")
                stamps = Stamps.of(self.spec, eos)
            known = set((spoken.languages or {}).values())
            language_of = next((t for t in opening[:1] if t in known), None)
            if language_token is not None:
                if language_token not in known or (DETECT not in opening and language_token != language_of):
                    raise CallError(f"language_token={language_token}: the language of an earlier window of the "
                                    "same audio is one of this model's language tokens "
                                    f"({', '.join(map(str, sorted(known))) or 'none'}), and only where the language "
                                    "is detected; leave it out, or give the language.")
                language_of = language_token
            sources = check_features(self.spec, prompt)
            if len(sources) != 1:
                raise CallError(f"a request transcribes one source; it gave {len(sources)}: send one request each.")
            ids = sources[0]
            before = seq2seq.prompt_of(self.spec, "this model", prompt_ids)
            seq2seq.check_room(self.spec, max_new_tokens, [*before, *opening])
        elif language is not None or task is not None or timestamps or language_token is not None or prompt_ids:
            raise CallError("language, task, timestamps, language_token and prompt_ids are a speech model's (Whisper's) "
                            "options; this model takes none.")
        else:
            ids = np.asarray(prompt)
            if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
                raise CallError(f'"input_ids" must be a non-empty list of token ids, got {str(prompt)[:80]}.')
            if self.seq2seq:
                seq2seq.check_source(self.spec, ids, max_new_tokens, self.longest, "input_ids")
            else:
                check_prompt(self.spec, ids, max_new_tokens, "input_ids")
            ids = ids.astype(np.int32)
        outside = [t for t in logit_bias or () if not 0 <= t < self.spec.vocab_size]
        if outside:
            raise CallError(f"logit_bias: token id {outside[0]} is outside [0, {self.spec.vocab_size}) (this model's "
                            "vocabulary).")
        history = [np.array([self.spec.decoder_start_token_id], np.int32)] if self.seq2seq else [ids]  # penalized
        options = self.spec.options(**sampling)
        plain = logprobs is None and not logit_bias  # what a beam search's reply has no place for
        if not plain and (num_beams or 1) > 1:
            raise CallError(f"num_beams={num_beams}: a beam search's reply is scored as a whole; it reports no "
                            "logprobs and takes no logit_bias: pass num_beams=1 for those.")
        beams = chosen(self.spec, self.buckets, options, constraint, num_beams, length_penalty,
                       early_stopping) if plain else None
        sampler = Sampler(options, seed, history, None if constraint is None else [constraint], logit_bias)
        seq = Sequence(ids, int(max_new_tokens), sampler, self.spec.stops(eos_token_id), on_token, on_done,
                       logprobs=logprobs, beams=beams, opening=tuple(opening), stamps=stamps, language=language_of,
                       before=tuple(before) if self.spec.source_shape else ())
        with self.cv:
            if self.closed:
                raise CallError(f"{self.name}: the server is shutting down.")
            self.waiting.append(seq)
            self.cv.notify()
        return seq

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join(timeout=30)

    # --- the batch thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not self.waiting and not self.rows:
                    self.cv.wait()
                if self.session is None:
                    self._gather()
                if self.closed:
                    for seq in [*self.waiting, *self.rows.values()]:
                        seq.on_done(CallError(f"{self.name}: the server shut down before the request finished."))
                    return
                searching = self._searching() if self.session is None else []
                joining = []
                while not searching and self.waiting and self._room(len(joining)) and self.waiting[0].beams is None \
                        and (not joining or self.waiting[0].alike == joining[0].alike):
                    seq = self.waiting.popleft()
                    if seq.cancelled:  # its client left before it joined
                        self.cancelled += 1
                        seq.on_done(None)
                    else:
                        joining.append(seq)
            try:
                self._search(searching)
                self._join(joining)
                if self.rows:
                    self._step()
            except Exception as e:  # every request in the batch learns of it; the loop goes on
                log.exception("%s: generation failed", self.name)
                for seq in {id(s): s for s in [*searching, *joining, *self.rows.values()]}.values():
                    seq.on_done(e)
                self.rows.clear()
                self.session = None

    def _searching(self) -> list[Sequence]:
        """The requests at the queue's head that search alike (the same beams, ends and length), as many as the
        largest batch holds the beams of (``cv`` held; an idle server)."""
        group: list[Sequence] = []
        while self.waiting and self.waiting[0].beams is not None:
            seq = self.waiting[0]
            alike = (seq.beams, seq.eos_token_id, seq.max_new_tokens, seq.alike)
            if group and (alike != (group[0].beams, group[0].eos_token_id, group[0].max_new_tokens, group[0].alike)
                          or (len(group) + 1) * seq.beams.num_beams > self.buckets[-1]):
                break
            self.waiting.popleft()
            if seq.cancelled:
                self.cancelled += 1
                seq.on_done(None)
            else:
                group.append(seq)
        return group

    def _search(self, group: list[Sequence]) -> None:
        """Beam search for ``group`` in a session of its own; each reply's tokens handed out at its end."""
        if not group:
            return
        beams = group[0].beams
        session = self._session([seq.prompt for seq in group for _ in range(beams.num_beams)], group)
        process = seq2seq.forced if self.seq2seq else None
        if group[0].stamps is not None:
            def process(spec: Spec, logits: np.ndarray, step: int, n: int, replies: Any, eos: Any,
                        stamps: Stamps = group[0].stamps) -> np.ndarray:
                return stamps(seq2seq.forced(spec, logits, step, n, replies, eos), replies)
        try:
            answers = search(session, [seq.prompt for seq in group], group[0].max_new_tokens, beams,
                             group[0].eos_token_id, process)
        finally:
            session.close()
        _heard(session, group)
        for seq, answer in zip(group, answers):
            self.prompt_tokens += _tokens(seq)
            for token in answer.tolist():
                seq.take(token)
            self.cancelled += seq.cancelled
            seq.on_done(None)

    def _gather(self) -> None:
        """Let requests that arrive together with the first reach the queue (``cv`` held; each submit notifies)."""
        deadline = time.monotonic() + 4 * JOIN_WINDOW_S
        while not self.closed and len(self.waiting) < self.buckets[-1]:
            left = min(JOIN_WINDOW_S, deadline - time.monotonic())
            if left <= 0 or not self.cv.wait(left):
                return

    def _room(self, joining: int) -> bool:
        if self.seq2seq and self.session is not None:
            return False
        return len(self.rows) + joining < self.buckets[-1]

    def _next(self, seq: Sequence, logits: np.ndarray) -> bool:
        """``seq.next`` of its logits, an encoder-decoder's first and last tokens forced where its checkpoint forces
        them."""
        if self.seq2seq:
            logits = seq2seq.forced(self.spec, logits, len(seq.tokens), seq.max_new_tokens, [seq.tokens],
                                    seq.eos_token_id)
            if seq.stamps is not None:
                logits = seq.stamps(logits, [seq.tokens])
        return seq.next(logits)

    def _join(self, joining: list[Sequence]) -> None:
        if self.session is None and joining:  # an idle server: the requests that arrived together prefill as a batch
            self.session = self._session([seq.prompt for seq in joining], joining)
            rows, logits = self.session.admit_all([seq.prompt for seq in joining])
            _heard(self.session, joining)
            self.rows.update(zip(rows, joining))
            for row, seq, out in zip(rows, joining, logits):
                self._admitted(seq, row)
                if self._next(seq, out):
                    self._finish(row)
            return
        for seq in joining:
            row = self.session.row_for(seq.prompt)
            if row is None:
                self.session = self._grown(self.session)
                row = self.session.row_for(seq.prompt)
            logits = self.session.admit(row, seq.prompt)
            self._admitted(seq, row)
            self.rows[row] = seq
            if self._next(seq, logits):
                self._finish(row)

    def _session(self, rows: list[np.ndarray], seqs: list[Sequence]) -> Any:
        """A session for ``rows`` at the smallest batch that holds them (an encoder-decoder's replies opening as
        ``seqs``' do, alike; their languages already known not detected again)."""
        if self.seq2seq:
            unknown = [seq for seq in seqs if seq.before and DETECT in seq.opening and seq.language is None]
            for seq, token in zip(unknown, seq2seq.Sessions.detect(self.steps, self.spec, [s.prompt for s in unknown])
                                  if unknown else ()):
                seq.language = token  # detected without the prompt, as transformers detects it
            known = {id(seq.prompt): seq.language for seq in seqs if seq.language is not None}
            return seq2seq.Session(self.steps, self.spec, seq2seq.Session.batch_for(self.steps, self.spec, rows),
                                   seqs[0].opening, known, {} if seqs[0].stamps is not None else None,
                                   seqs[0].before)
        return Session(self.steps, self.spec, Session.batch_for(self.steps, self.spec, rows))

    def _admitted(self, seq: Sequence, row: int) -> None:
        seq.cached = int(self.session.reused[row])
        self.prompt_tokens += _tokens(seq)
        self.cached_tokens += seq.cached

    def _step(self) -> None:
        session = self.session
        logits = session.step({row: seq.tokens[-1] for row, seq in self.rows.items()})
        self.steps_run += 1
        self.rows_run += len(self.rows)
        for row, seq in list(self.rows.items()):
            if self._next(seq, logits[row]):
                self._finish(row)

    def _finish(self, row: int) -> None:
        seq = self.rows.pop(row)
        self.cancelled += seq.cancelled
        self.session.release(row)
        seq.on_done(None)
        if not self.rows:
            self.session.close()
            self.session = None  # the next request starts at the smallest batch

    def _bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _grown(self, session: Session) -> Session:
        """The session moved into the next batch bucket: the cache copied once, the rows' state with it."""
        more = self._bucket(session.batch + 1) - session.batch
        cache = self.steps.host(session.cache)
        pad = [(0, 0)] * cache.ndim
        pad[list(self.spec.cache_shape).index(-1)] = (0, more)
        held = session.held
        bigger = Session(self.steps, self.spec, session.batch + more, Held(self.steps.put(np.pad(cache, pad)), *(
            np.pad(a, [(0, more)] + [(0, 0)] * (a.ndim - 1)) for a in (held.tokens, held.valid, held.released))))
        for name in ("mask", "index", "token", "busy", "reused"):
            getattr(bigger, name)[:session.batch] = getattr(session, name)
        session.close()
        return bigger


def _heard(session: Any, seqs: list[Sequence]) -> None:
    """Each speech request's language as its session has it once admitted (detected there, where it was left open),
    and, with timestamps, its logits after the start token."""
    languages, firsts = getattr(session, "languages", {}), getattr(session, "firsts", None) or {}
    for seq in seqs:
        seq.language = languages.get(id(seq.prompt), seq.language)
        seq.first = firsts.get(id(seq.prompt), seq.first)


def _tokens(seq: Sequence) -> int:
    """A request's prompt tokens (a speech model's features are none)."""
    return len(seq.prompt) if seq.prompt.ndim == 1 else 0


class Reply:
    """A reply's text as its tokens come: each ``take`` gives the text that may be sent now (none for an end id; a
    character split over tokens held back until whole; text that could begin a stop string held back until it
    cannot), ``done`` once a stop string appeared (the text before it is the reply), ``end`` what is left.
    ``marks``: special tokens that stand in the text all the same (a tool call's ``<tool_call>`` where the
    checkpoint's tokenizer makes it special, so decoding leaves it out), by id."""

    def __init__(self, tokenizer: Any, eos: tuple[int, ...], stops: list[str], marks: dict[int, str] | None = None):
        self.detok, self.eos, self.stops, self.marks = tokenizer.stream(), eos, stops, marks or {}
        self.hold = max(map(len, stops), default=1) - 1
        self.text, self.sent = "", 0
        self.tokens, self.done, self.finish = 0, False, "length"

    def take(self, token: int) -> str:
        self.tokens += 1
        if token in self.eos:
            self.finish = "stop"
            return ""
        if token in self.marks:
            return self._feed(self.detok.flush() + self.marks[token])
        return self._feed(self.detok.add(token))

    def end(self) -> str:
        if self.done:
            return ""
        out = self._feed(self.detok.flush())
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        return out + rest

    def _feed(self, delta: str) -> str:
        self.text += delta
        found = [i for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]  # none can start before sent
        if found:
            self.text, self.done, self.finish = self.text[:min(found)], True, "stop"
        upto = len(self.text) if self.done else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:upto], upto
        return out


# eos_token_id: an id or a list of ids (none given: the artifact's generate.eos_token_id; []: none); the sampling
# options left out take the artifact's defaults (runtime/sampling.py)
# json_schema: the reply held to this JSON schema (runtime/grammar.py; it needs the artifact's tokenizer)
# num_beams, length_penalty, early_stopping: a beam search (runtime/beams.py), where the artifact has its reorder entry
OPTIONS = {"max_new_tokens": int, **{k: int if k == "top_k" else float for k in NAMES}, "seed": int,
           "eos_token_id": list, "json_schema": dict, "num_beams": int, "length_penalty": float, "early_stopping": bool}


def parse_request(request: Any) -> tuple[list[int] | str, dict[str, Any]]:
    """A generate request: its prompt (``input_ids``, or ``text_input``: text for the artifact's tokenizer, as
    Triton's TensorRT-LLM models take it) and options (top-level keys, or in ``parameters`` as Triton's generate
    extension sends them), each checked; an unknown key is refused by name."""
    if not isinstance(request, dict):
        raise CallError('a generate request is a JSON object: {"input_ids": [464, 2068], "max_new_tokens": 20} or '
                        '{"text_input": "Hello", "max_new_tokens": 20}.')
    params = request.get("parameters", {})
    if not isinstance(params, dict):
        raise CallError(f'"parameters" must be an object, got {str(params)[:80]}.')
    unknown = [k for k in [*request, *params] if k not in (*OPTIONS, "input_ids", "text_input", "parameters", "id")]
    if unknown:
        raise CallError(f"{unknown[0]!r} is not a generate option; the request takes input_ids or text_input, and "
                        f"{', '.join(OPTIONS)} (top level or in parameters), and id.")
    options = parse_options(request, params, {"max_new_tokens": 16})
    if "id" in request and not isinstance(request["id"], str):
        raise CallError(f'"id" must be a string, got {str(request["id"])[:40]}.')
    if ("input_ids" in request) == ("text_input" in request):
        raise CallError('a generate request has either "input_ids" (token ids) or "text_input" (text), not '
                        f"{'both' if 'input_ids' in request else 'neither'}.")
    if "text_input" in request:
        text = request["text_input"]
        if not isinstance(text, str) or not text:
            raise CallError(f'"text_input" must be a non-empty string, got {str(text)[:80]}.')
        return text, options
    ids = request.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise CallError(f'"input_ids" must be a non-empty list of integer token ids, got {str(ids)[:80]}.')
    return ids, options


def parse_options(request: dict[str, Any], params: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` updated with the ``OPTIONS`` a request sets (top level, else in ``params``), each checked."""
    for key, kind in OPTIONS.items():
        value = request.get(key, params.get(key))
        if value is None:
            continue
        if kind is list:  # its ids are checked where they are read (``Spec.stops``, in ``Generator.submit``)
            options[key] = value if isinstance(value, list) else [value]
            continue
        if kind is bool:  # true, false or "never": checked where it is read (``beams.Beams``)
            options[key] = value
            continue
        if kind is dict:  # a schema: checked where it is compiled (``grammar.Constraint``)
            if not isinstance(value, dict):
                raise CallError(f"{key!r} must be a JSON schema (an object), got {str(value)[:40]}.")
            options[key] = value
            continue
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
        if not ok or isinstance(value, bool):
            raise CallError(f"{key!r} must be {'a number' if kind is float else 'an integer'}, got {str(value)[:40]}.")
        options[key] = kind(value)
    return options
