"""Generation with an encoder-decoder (``task=generate`` of a ``*ForConditionalGeneration``: BART, T5), numpy only.

The artifact holds two entries over one set of weights (``models/_seq2seq.py``): ``encode`` runs the encoder
over a batch of sources and returns every decoder layer's cross-attention keys and values; ``decode`` runs
one decoder token per row against them and the decoder's own cache (donated: written in place). A batch of
sources is padded to an ``encode`` profile (the smallest batch and ``seq`` buckets that hold it, the padding
masked), encoded once, and decoded a token a step at that same profile until every row stopped or
``max_new_tokens`` were made. Each token is picked by ``sampling.Sampler`` as for a decoder alone; the first
and the last are forced where the checkpoint forces them (``forced_bos_token_id``, ``forced_eos_token_id``),
and the tokens it never generates masked (one-token ``bad_words_ids``, ``suppress_tokens``), as transformers'
logits processors do.

Rows do not join a running batch here (a reply's cross-attention is over its own source, encoded with the
batch): ``generate`` runs each batch of sources from start to end, and so does the server (``Session``, which
``serve/generation.py`` drives as it drives a decoder's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..errors import CallError
from .beams import Beams, searched
from .generate import Spec, Steps, check_ids, in_groups, prompts
from .transcription import DETECT, Opening, check_features


def check_source(spec: Spec, source: np.ndarray, max_new_tokens: int, longest: int, where: str) -> None:
    """A source's ids within the vocabulary and its length within the encoder's ``longest``; ``max_new_tokens``
    within the decoder's positions."""
    check_ids(spec, source, max_new_tokens, where)
    if max_new_tokens > spec.max_length:
        raise CallError(f"generate(): max_new_tokens={max_new_tokens} is over this artifact's generate.max_length="
                        f"{spec.max_length} (the decoder's positions); ask for at most {spec.max_length}, or build "
                        "with a larger generate.max_length.")
    if len(source) > longest:
        raise CallError(f"generate(): {where} is a source of {len(source)} tokens, over the {longest} this artifact's "
                        "encoder was built for (shapes.dims.seq); shorten it, or build with a larger seq.")


def forced(spec: Spec, logits: np.ndarray, step: int, max_new_tokens: int,
           replies: Sequence[Sequence[int]] = (), eos: Sequence[int] = ()) -> np.ndarray:
    """``logits`` (``[vocab]``, or ``[rows, vocab]`` with a reply per row in ``replies``: the tokens it has so far) of
    each reply's token ``step`` (0: its first) as transformers' logits processors leave them: the ``suppressed``
    tokens masked; the ``eos`` ids while the decoder holds fewer than ``min_length`` tokens (its start among them);
    each token that would repeat an n-gram of ``no_repeat_ngram_size`` in its reply (its start among it); and every
    token but the forced one where the checkpoint forces it: ``forced_eos_token_id`` at the last of
    ``max_new_tokens`` (applied after the first's, so one new token is the forced end), else ``forced_bos_token_id``
    first."""
    last = step == max_new_tokens - 1 and spec.forced_eos_token_id is not None
    token = spec.forced_eos_token_id if last else spec.forced_bos_token_id if step == 0 else None
    if token is not None:
        out = np.full_like(logits, -np.inf)
        out[..., token] = 0.0
        return out
    masked = [*spec.suppressed, *(spec.begin_suppressed if step == 0 else ()), *(eos if 1 + step < spec.min_length else ())]
    n = spec.no_repeat_ngram_size
    if not masked and not (n and replies):
        return logits
    out = logits.copy()
    out[..., masked] = -np.inf
    rows = out.reshape(-1, out.shape[-1])
    for row, reply in zip(rows, replies if n else ()):
        row[repeats([spec.decoder_start_token_id, *reply], n)] = -np.inf
    return out


def repeats(tokens: Sequence[int], n: int) -> list[int]:
    """The tokens that would end an n-gram ``tokens`` already holds (transformers' ``NoRepeatNGramLogitsProcessor``)."""
    if len(tokens) + 1 < n:
        return []
    tail = tuple(tokens[len(tokens) - n + 1:])
    return [int(tokens[i + n - 1]) for i in range(len(tokens) - n + 1) if tuple(tokens[i:i + n - 1]) == tail]


class Session:
    """A batch of sources encoded together and their replies decoded in step, a token per row per step; the
    interface of ``runtime.generate.Session`` that ``serve/generation.py`` drives, with rows that join only
    together (``joins`` False: a request waits for the running batch to finish)."""

    joins = False

    def __init__(self, steps: Steps, spec: Spec, batch: int, opening: Sequence[int] | None = None,
                 languages: dict[int, int] | None = None, firsts: dict[int, np.ndarray] | None = None,
                 prompt: Sequence[int] = ()):
        """``opening``: the tokens after the start token before the reply (``transcription.Opening.tokens``, with
        ``DETECT`` where each row's language is detected); None: the artifact's, as a call that gives no language
        and task has it. ``languages``: the language tokens of sources (by ``id``) already detected, which are not
        detected again; each source detected here is added (a long audio's windows are in its first one's
        language, as transformers detects it once). ``firsts``: where given, each source's logits after the start
        token are put in it by ``id`` (what Whisper's no-speech probability is read from). ``prompt``: tokens the
        decoder reads before its start token (Whisper's ``<|startofprev|>`` and a previous text: ``prompt_ids``);
        with one, a language to detect must be in ``languages`` already (``detect``: it is detected without the
        prompt, as transformers detects it)."""
        self.steps, self.spec, self.batch = steps, spec, batch
        self.caches = steps.names(spec.decode, "cache")  # the decoder's cache arrays, by name (an array per layer and kind)
        self.opening = Opening.of(spec.opening).tokens() if opening is None else list(opening)
        self.languages = {} if languages is None else languages
        self.firsts = firsts
        self.prompt = [int(t) for t in prompt]
        self.profiles = [p for p in steps.profiles(spec.prefill) if p["batch"] == batch]
        self.busy = np.zeros(batch, bool)
        self.reused = np.zeros(batch, np.int32)  # no prefix is taken from a cache here
        self.token = np.full(batch, self.prompt[0] if self.prompt else spec.decoder_start_token_id, np.int32)
        self.at = 0  # the decoder position of every row's next token
        self.profile = self.state = None

    @staticmethod
    def batch_for(steps: Steps, spec: Spec, sources: Sequence[np.ndarray]) -> int:
        """The batch a session for ``sources`` runs at: that of the smallest profile holding as many rows and the
        longest source (a build's profiles need not pair every batch with every length: a lone long source may
        take a batch of 4)."""
        longest = 0 if spec.source_shape else max(map(len, sources))
        fits = [p for p in steps.profiles(spec.prefill) if p["batch"] >= len(sources) and p.get("seq", 0) >= longest]
        if not fits:
            raise CallError(f"generate(): no profile of this artifact holds {len(sources)} sources of up to {longest} "
                            "tokens together; send fewer at a time, or build with larger shapes.dims.batch and seq.")
        return min(fits, key=lambda p: (p["batch"] * p.get("seq", 1), p["batch"]))["batch"]

    def admit_all(self, sources: Sequence[np.ndarray]) -> tuple[list[int], np.ndarray]:
        """Encode ``sources`` (token ids padded to the smallest ``seq`` bucket that holds the longest; or features,
        ``Spec.source_shape``) and run the decoder's start token and the opening after it; (their rows, the logits of
        their first reply token ``[n, vocab]``)."""
        if self.busy.any():
            raise CallError("generate(): admit_all() needs an empty session.")
        if self.spec.source_shape:
            self.profile = self.profiles[0]
            mask = np.ones((self.batch, self.spec.encoded_length), np.int32)
            cross = self._features(sources)
        else:
            longest = max(len(s) for s in sources)
            self.profile = min((p for p in self.profiles if p["seq"] >= longest), key=lambda p: p["seq"])
            ids, mask = (np.zeros((self.batch, self.profile["seq"]), np.int32) for _ in range(2))
            for row, source in enumerate(sources):
                ids[row, :len(source)], mask[row, :len(source)] = source, 1
            cross = self.steps.outputs(self.spec.prefill, self.profile, [ids, mask],
                                       self.steps.names(self.spec.prefill, "cross"))
        shape = [self.batch if n == -1 else n for n in self.spec.cache_shape]
        cache = [self.steps.zeros(shape, self.spec.cache_dtype) for _ in self.caches]
        self.state = [self.steps.put(mask), list(cross), cache]
        self.busy[:len(sources)] = True
        rows = list(range(len(sources)))
        logits = self._run()
        for token in [*self.prompt[1:], self.spec.decoder_start_token_id] if self.prompt else ():
            logits = self.step({row: token for row in rows})
        if self.firsts is not None:
            self.firsts.update((id(source), logits[row].copy()) for row, source in enumerate(sources))
        languages = None
        if DETECT in self.opening:
            if self.prompt and any(id(source) not in self.languages for source in sources):
                raise CallError("generate(): a language to detect after a prompt: detect it first (seq2seq.detect).")
            found = Opening.of(self.spec.opening).detected(logits)
            languages = [self.languages.setdefault(id(source), int(found[row])) for row, source in enumerate(sources)]
        for token in self.opening:
            logits = self.step({row: int(languages[row]) if token == DETECT else token for row in rows})
        return rows, logits[:len(sources)]

    def _features(self, sources: Sequence[np.ndarray]) -> tuple[Any, ...]:
        """The cross-attention keys and values of a speech model's ``sources`` at this session's batch: each distinct
        source (a source's beams are one array) encoded once, at the smallest batch that holds them, and its rows
        gathered into the batch's on the device (``Spec.expand``; an artifact without it encodes every row)."""
        distinct: list[np.ndarray] = []
        index = np.zeros(self.batch, np.int32)
        for row, source in enumerate(sources):
            at = next((i for i, d in enumerate(distinct) if d is source), len(distinct))
            if at == len(distinct):
                distinct.append(source)
            index[row] = at
        n = len(distinct) if self.spec.expand and len(distinct) < len(sources) else self.batch
        n = min(p["batch"] for p in self.steps.profiles(self.spec.prefill) if p["batch"] >= n)
        encoded = sources if n == self.batch else distinct
        x = np.zeros((n, *self.spec.source_shape), np.float32)
        x[:len(encoded)] = encoded
        cross = self.steps.outputs(self.spec.prefill, {"batch": n}, [x], self.steps.names(self.spec.prefill, "cross"))
        if n == self.batch:
            return cross
        return self.steps.outputs(self.spec.expand, {"sources": n, "batch": self.batch}, [*cross, index],
                                  self.steps.names(self.spec.expand, "cross"))

    def step(self, tokens: dict[int, int]) -> np.ndarray:
        """One decoder step: each busy row's last token ``tokens[row]`` in; the next logits of every row."""
        for row, token in tokens.items():
            self.token[row] = token
        return self._run()

    def _run(self) -> np.ndarray:
        if self.at >= self.spec.max_length:
            raise CallError(f"generate(): a reply past generate.max_length={self.spec.max_length} decoder positions.")
        mask, cross, cache = self.state
        logits, *cache = self.steps.outputs(self.spec.decode, self.profile, [
            self.token[:, None], np.full(self.batch, self.at, np.int32), mask, *cross, *cache],
            ("logits", *self.caches))
        self.state[2] = cache
        self.at += 1
        return self.steps.host(logits)[:, :self.spec.vocab_size]

    def reorder(self, rows: dict[int, int]) -> None:
        """The decoder's cache row ``i`` replaced by row ``rows[i]`` (the rows not named keep theirs), on the device:
        beam search's continuations (``Steps.reorder``). Their cross-attention and masks need no reordering: a
        source's beams are rows of one source."""
        self.state[2], _ = self.steps.reorder(self.spec.reorder, self.batch, self.state[2], rows)

    def release(self, row: int) -> None:
        self.busy[row] = False

    def close(self) -> None:
        self.state = None


def check_room(spec: Spec, max_new_tokens: int, opening: Sequence[int]) -> None:
    """``max_new_tokens`` a positive integer within the decoder positions left after the start token and ``opening``."""
    check_ids(spec, np.zeros(0, np.int32), max_new_tokens, "")
    room = spec.room(0, len(opening))
    if max_new_tokens > room:
        raise CallError(f"generate(): max_new_tokens={max_new_tokens} is over the {room} decoder positions this "
                        f"artifact's generate.max_length={spec.max_length} leaves after the start token and its "
                        f"{len(opening)} opening tokens; ask for at most {room}, or build with a larger generate.max_length.")


class Sessions:
    """``Session``s whose replies start with one ``opening`` (a call's language and task): what ``in_groups`` and
    ``beams.searched`` make a session of each batch with."""

    batch_for = staticmethod(Session.batch_for)

    def __init__(self, opening: Sequence[int], languages: dict[int, int] | None = None,
                 firsts: dict[int, np.ndarray] | None = None, prompt: Sequence[int] = ()):
        self.opening, self.languages, self.firsts = opening, {} if languages is None else languages, firsts
        self.prompt = prompt

    def __call__(self, steps: Steps, spec: Spec, batch: int) -> Session:
        return Session(steps, spec, batch, self.opening, self.languages, self.firsts, self.prompt)

    @staticmethod
    def detect(steps: Steps, spec: Spec, sources: Sequence[np.ndarray]) -> list[int]:
        """Each source's language token, from the logits after the start token alone (transformers'
        ``detect_language``): an encoder run and a decoder step per batch of them."""
        found: list[int] = []
        most = max(p["batch"] for p in steps.profiles(spec.prefill))
        for at in range(0, len(sources), most):
            group = list(sources[at:at + most])
            session = Session(steps, spec, Session.batch_for(steps, spec, group), ())
            _, logits = session.admit_all(group)
            session.close()
            found += [int(t) for t in Opening.of(spec.opening).detected(logits)]
        return found


def generate(steps: Steps, spec: Spec, name: str, input_ids: Any, max_new_tokens: int, attention_mask: Any = None,
             seed: int | None = None, eos_token_id: Any = None, pad_token_id: int | None = None,
             constraints: Any = None, beams: Beams | None = None, input_features: Any = None,
             language: str | None = None, task: str | None = None, return_timestamps: bool | None = None,
             return_segments: bool = False, fallback: Any = None, prompt_ids: Any = None, **sampling: Any) -> Any:
    """The new tokens of each source, int32 ``[batch, n]`` (the decoder's start token and opening left out): as
    ``runtime/generate.generate`` says, with ``input_ids`` the sources the replies are to (a speech model's:
    ``input_features``, each reply opening with ``language`` and ``task``, ``runtime/transcription.py``); each the
    best of a beam search where ``beams`` are given (``runtime/beams.chosen``).

    A speech model's replies with ``return_timestamps`` (None: where the features are longer than one window), and
    features of any length, are transcribed window by window (``runtime/longform.py``): the tokens are each source's
    segments', timestamps among them; with ``return_segments``, ``{"sequences": tokens, "segments": [[{"start",
    "end", "tokens", ...}, ...], ...]}``, each segment's times in seconds. ``fallback``: when a window's reply is
    generated again hotter, or the window skipped (``longform.Fallback``; None: never). ``prompt_ids``: what a
    speech model's decoder reads before its start token (``<|startofprev|>`` and a text's tokens: transformers'
    ``prompt_ids``), each window's."""
    prompt = prompt_of(spec, name, prompt_ids)
    if spec.source_shape and (input_ids is not None or input_features is None):
        raise CallError(f"generate(): {name} is a speech model: give input_features [batch, {spec.source_shape[0]}, "
                        f"{spec.source_shape[-1]}] (or frames of any length; or call transcribe(audio)), not input_ids.")
    if spec.source_shape and (return_timestamps or return_segments or _longer(spec, input_features)):
        if return_timestamps is False:
            raise CallError(f"generate(): return_timestamps=False with features over one window of "
                            f"{spec.source_shape[-1]} frames (30 s) or with return_segments: audio longer than that "
                            "is transcribed window by window, where the timestamps say where each window ends; "
                            "leave return_timestamps out.")
        return _timestamped(steps, spec, max_new_tokens, attention_mask, seed, eos_token_id,
                            pad_token_id, constraints, beams, input_features, language, task, return_segments,
                            sampling, fallback, prompt)
    if return_timestamps or return_segments:
        raise CallError(f"generate(): return_timestamps and return_segments are a speech model's (Whisper's); {name} "
                        "has no timestamps.")
    if fallback is not None and fallback.checks:
        raise CallError("generate(): a temperature fallback (temperature=(t0, t1, ...)) and the compression, "
                        "log-probability and no-speech thresholds act window by window, on replies with timestamps: "
                        + ("give return_timestamps=True (or audio over 30 s)." if spec.source_shape else
                           f"they are a speech model's (Whisper's); {name} takes one temperature."))
    opening = Opening.of(spec.opening).tokens(language, task)
    if spec.source_shape:
        sources = check_features(spec, input_features)
    else:
        if input_features is not None or language is not None or task is not None:
            raise CallError(f"generate(): input_features, language and task are a speech model's (Whisper's); {name} "
                            "takes its sources as input_ids.")
        sources = prompts(input_ids, attention_mask)
        longest = max(p["seq"] for p in steps.profiles(spec.prefill))
        for i, source in enumerate(sources):
            check_source(spec, source, max_new_tokens, longest, f"input_ids[{i}]")
    check_room(spec, max_new_tokens, [*prompt, *opening])
    session = Sessions(opening, _languages(steps, spec, sources, opening, prompt), None, prompt)
    if beams is not None:
        return searched(steps, spec, session, sources, max_new_tokens, beams, eos_token_id, pad_token_id, forced)
    start = [np.array([spec.decoder_start_token_id], np.int32)] * len(sources)  # what the penalties count
    return in_groups(steps, spec, session, sources, start, max_new_tokens, seed, eos_token_id, pad_token_id,
                     constraints, sampling, forced)


def _longer(spec: Spec, features: Any) -> bool:
    """Whether a call's ``input_features`` (as ``longform.sources`` takes them) run past one window."""
    if features is None:
        return False
    if isinstance(features, (list, tuple)) and features and all(np.ndim(f) == 2 for f in features):
        return max(np.shape(f)[-1] for f in features) > spec.source_shape[-1]
    return np.ndim(features) >= 2 and np.shape(features)[-1] > spec.source_shape[-1]


def _timestamped(steps: Steps, spec: Spec, max_new_tokens: int, attention_mask: Any,
                 seed: int | None, eos_token_id: Any, pad_token_id: int | None, constraints: Any, beams: Beams | None,
                 input_features: Any, language: str | None, task: str | None, return_segments: bool,
                 sampling: dict[str, Any], fallback: Any, prompt: list[int]) -> Any:
    """``generate``'s replies with timestamps (``runtime/longform.py``)."""
    from .longform import Fallback, sequences, sources, transcribed

    opening = Opening.of(spec.opening).tokens(language, task, timestamps=True)
    features, frames = sources(spec, input_features, attention_mask)
    check_room(spec, max_new_tokens, [*prompt, *opening])
    segments = transcribed(steps, spec, features, frames, opening, max_new_tokens, seed, eos_token_id, pad_token_id,
                           constraints, beams, sampling, forced, Sessions, fallback or Fallback(), prompt)
    ids = sequences(segments, spec.fill(pad_token_id, spec.stops(eos_token_id)))
    if not return_segments:
        return ids
    return {"sequences": ids, "segments": [[{**dataclasses.asdict(s), "tokens": np.array(s.tokens, np.int32)}
                                            for s in source] for source in segments]}


def prompt_of(spec: Spec, name: str, prompt_ids: Any) -> list[int]:
    """A call's ``prompt_ids`` as token ids ([]: none); a ``CallError`` where they are not a speech model's ids."""
    if prompt_ids is None:
        return []
    ids = np.asarray(prompt_ids)
    if not spec.source_shape:
        raise CallError(f"generate(): prompt_ids are a speech model's (Whisper's previous text); {name} takes none.")
    if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 \
            or ids.max() >= spec.vocab_size:
        raise CallError(f"generate(): prompt_ids={str(prompt_ids)[:60]}: a list of token ids in [0, {spec.vocab_size}), "
                        "<|startofprev|> first (transformers' processor.get_prompt_ids(text) makes them; transcribe("
                        "prompt=text) takes the text).")
    return [int(t) for t in ids]


def _languages(steps: Steps, spec: Spec, sources: Sequence[np.ndarray], opening: Sequence[int],
               prompt: Sequence[int]) -> dict[int, int]:
    """The sources' languages detected before a ``prompt`` is read (by ``id``: ``Session``'s ``languages``), where the
    opening detects them; {} without a prompt, where the start token's run detects them."""
    if not prompt or DETECT not in opening:
        return {}
    distinct = list({id(s): s for s in sources}.values())
    return dict(zip(map(id, distinct), Sessions.detect(steps, spec, distinct)))
