"""Token generation over an artifact's ``prefill`` and ``decode`` entries, shared by both loaders and the server.

The artifact (``task=generate``) holds two entries of one function, ``extend``: it runs new tokens
against a key/value cache of ``max_length`` positions per row, writes their keys and values at each
row's own position (the cache is donated: updated in place, never copied) and returns the logits of
each row's last new token. ``prefill`` runs one row's prompt chunk (its ``seq`` buckets) into the
cache of a whole batch; ``decode`` one token for every row, or a chunk of every row's prompt.

A ``Session`` is a running batch: a cache of ``batch`` rows (a decode bucket) and, per row, where its
next token goes. A sequence joins at any step by taking a free row: its prompt is prefilled into that
row in chunks whose lengths are prefill buckets (100 tokens: 64 + 32 + 4), so that every call runs a
precompiled profile as it is (no padding, no compile), and it leaves when it is done. Prompts that
start together (a ``generate`` call, or requests that find the server idle) are prefilled as a batch:
their common length through ``decode``'s chunk sizes over every row, the rest row by row. ``generate``
runs one batch of prompts through a session; ``serve/generation.py`` keeps one running for many
clients (iteration-level batching).

This module is numpy only: each loader supplies ``Steps`` (run an entry at a profile, keep the cache on
the device, read the logits back).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.spec import to_dtype
from ..errors import CallError
from .beams import searched
from .sampling import Options, Sampler


SEQ2SEQ_TOKENS = ("decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")
SEQ2SEQ_LIMITS = ("min_length", "no_repeat_ngram_size")  # generation_config.json's, applied to an encoder-decoder's reply


@dataclass(frozen=True)
class Spec:
    """What the build recorded about generation (``metadata["generate"]``)."""

    prefill: str  # the entry names
    decode: str
    max_length: int  # cache positions: prompt plus new tokens must fit
    cache_shape: tuple[int, ...]  # with -1 for the batch
    cache_dtype: str
    vocab_size: int
    eos_token_id: tuple[int, ...] = ()  # where a row stops unless a call says otherwise (generate.eos_token_id)
    pad_token_id: int | None = None  # what a stopped row is filled with (the checkpoint's; else the first eos id)
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)  # the defaults of calls' options (sampling.Options)
    # ``causal``: a decoder's prompt extended (``prefill``, ``decode``); ``seq2seq``: an encoder-decoder's source
    # encoded (``prefill`` names the ``encode`` entry) and its reply decoded a token a step (``runtime/seq2seq.py``)
    kind: str = "causal"
    decoder_start_token_id: int | None = None  # seq2seq: the decoder's first input (config.json's)
    # seq2seq: the token forced first and the token forced last (at max_new_tokens), as transformers forces them
    # (generation_config.json's forced_bos_token_id, forced_eos_token_id: BART's summarizers, Marian's translators)
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    # seq2seq: tokens never generated (generation_config.json's one-token bad_words_ids and suppress_tokens: Marian's
    # pad)
    suppressed: tuple[int, ...] = ()
    # seq2seq: no end before the decoder holds this many tokens (its start among them), and no n-gram of this size
    # twice in a reply, as transformers' min_length and no_repeat_ngram_size (BART's summarizers: 56 and 3)
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    # the entry that reorders the cache's rows (beam search keeps the best continuations: every encoder-decoder's, a
    # decoder's built with generate.beams; None: none, or an artifact built before it), and the beam search calls
    # get by default (generate.beams: the checkpoint's num_beams, length_penalty and early_stopping; runtime/beams.py)
    reorder: str | None = None
    beams: dict[str, Any] = dataclasses.field(default_factory=dict)
    # seq2seq: tokens never generated first (generation_config.json's begin_suppress_tokens: Whisper's blank and end)
    begin_suppressed: tuple[int, ...] = ()
    # seq2seq: what the decoder's start token is followed by before the reply (Whisper's language, task and
    # <|notimestamps|>: runtime/transcription.py's Opening); {}: nothing
    opening: dict[str, Any] = dataclasses.field(default_factory=dict)
    # seq2seq whose sources are not token ids: one source's shape (Whisper's features [num_mel_bins, frames]), the
    # encoder's output positions (what encoder_mask covers), and the audio's features settings (runtime/audio.LogMel)
    source_shape: tuple[int, ...] = ()
    encoded_length: int = 0
    audio: dict[str, Any] = dataclasses.field(default_factory=dict)
    # a speech model's entry that gathers encoded sources' cross-attention rows into a batch's (a source's beams
    # encoded once); None: each row encoded
    expand: str | None = None

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], name: str) -> "Spec":
        g = meta.get("generate")
        if not isinstance(g, dict):
            raise CallError(f"{name}: this artifact was not built for generation; build it with task=generate "
                            "(python -m tripy_build model=gpt2 task=generate).")
        def token(key: str) -> int | None:
            return None if g.get(key) is None else int(g[key])
        return cls(str(g["prefill"]), str(g["decode"]), int(g["max_length"]), tuple(int(n) for n in g["cache_shape"]),
                   str(g["cache_dtype"]), int(g["vocab_size"]), tuple(int(t) for t in g.get("eos_token_id") or ()),
                   token("pad_token_id"), dict(g.get("sampling") or {}), str(g.get("kind", "causal")),
                   *(token(k) for k in SEQ2SEQ_TOKENS), tuple(int(t) for t in g.get("suppressed") or ()),
                   *(int(g.get(k) or 0) for k in SEQ2SEQ_LIMITS), g.get("reorder"), dict(g.get("beams") or {}),
                   begin_suppressed=tuple(int(t) for t in g.get("begin_suppressed") or ()),
                   opening=dict(g.get("opening") or {}), source_shape=tuple(int(n) for n in g.get("source_shape") or ()),
                   encoded_length=int(g.get("encoded_length") or 0), audio=dict(g.get("audio") or {}),
                   expand=g.get("expand"))

    def to_metadata(self) -> dict[str, Any]:
        out = {"prefill": self.prefill, "decode": self.decode, "max_length": self.max_length,
               "cache_shape": list(self.cache_shape), "cache_dtype": self.cache_dtype, "vocab_size": self.vocab_size,
               "eos_token_id": list(self.eos_token_id), "pad_token_id": self.pad_token_id, "sampling": self.sampling}
        if self.kind != "causal":  # an artifact of a decoder alone is recorded as before
            out.update(kind=self.kind, suppressed=list(self.suppressed),
                       **{k: getattr(self, k) for k in (*SEQ2SEQ_TOKENS, *SEQ2SEQ_LIMITS)})
        if self.kind != "causal" or self.reorder is not None:
            out.update(reorder=self.reorder, beams=self.beams)
        out.update({k: v for k, v in (("begin_suppressed", list(self.begin_suppressed)), ("opening", self.opening),
                                      ("source_shape", list(self.source_shape)), ("encoded_length", self.encoded_length),
                                      ("audio", self.audio), ("expand", self.expand)) if v})  # Whisper's
        return out

    def room(self, prompt: int, opening: int = 0) -> int:
        """How many new tokens the cache has room for after a prompt of ``prompt`` tokens (an encoder-decoder's
        decoder: all its positions but the ``opening`` tokens its replies start with, Whisper's language and task; its
        source is the encoder's)."""
        return self.max_length - opening if self.kind == "seq2seq" else self.max_length - prompt

    def options(self, **given: Any) -> Options:
        """A call's sampling options: those it gives (None: not given) over this artifact's defaults."""
        return Options.of(self.sampling, **given)

    def stops(self, eos_token_id: Any) -> tuple[int, ...]:
        """The ids a call's rows stop at: ``eos_token_id`` as given (an id, or ids; () for none), or None: the
        build's (``generate.eos_token_id``)."""
        if eos_token_id is None:
            return self.eos_token_id
        ids = [eos_token_id] if np.ndim(eos_token_id) == 0 else list(np.asarray(eos_token_id).reshape(-1))
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
            raise CallError(f"'eos_token_id' must be a token id or a list of them, got {str(eos_token_id)[:60]}.")
        return tuple(int(t) for t in ids)

    def fill(self, pad_token_id: int | None, eos: tuple[int, ...]) -> int | None:
        """What a stopped row is filled with: ``pad_token_id`` as given, else the build's, else the first stop id."""
        if pad_token_id is not None:
            return int(pad_token_id)
        return self.pad_token_id if self.pad_token_id is not None else (eos[0] if eos else None)


@dataclass
class Held:
    """A cache and what it holds: per row, the tokens whose keys and values sit at its first ``valid`` positions
    (``tokens[row, :valid[row]]``), a prefix that a later prompt starting with the same tokens need not run
    again (``Session.reusable``), and when each row was last let go (``released``: the free row given up first
    is the one let go longest ago)."""

    cache: Any
    tokens: np.ndarray  # int32 [batch, max_length]
    valid: np.ndarray  # int32 [batch]
    released: np.ndarray  # int64 [batch]

    @classmethod
    def empty(cls, cache: Any, batch: int, max_length: int) -> "Held":
        return cls(cache, np.zeros((batch, max_length), np.int32), np.zeros(batch, np.int32), np.zeros(batch, np.int64))


class Spares:
    """The caches of finished sessions, one per shape, for the next session to take instead of placing zeros:
    GPT-2 small's cache at batch 8 is 75 MB, 60-70 ms to place (5% of that batch's time to first token). Each
    keeps what its rows hold (``Held``), so the next session starts from the prompts the last one ran: a
    conversation's next turn, or a request with the same system prompt and tools, prefills only what is new.

    A cache taken back is not cleared, and need not be: a row attends only the positions its mask marks,
    and every call writes its tokens' keys and values before it attends them, so what an earlier session
    left is masked exactly as zeros are. What is kept is at most one cache per batch bucket.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[tuple[Any, ...], Held] = {}

    def take(self, shape: Sequence[int], dtype: str) -> Held | None:
        with self.lock:
            return self.free.pop((tuple(shape), dtype), None)

    def give(self, shape: Sequence[int], dtype: str, held: Held) -> None:
        with self.lock:
            self.free[(tuple(shape), dtype)] = held


class Steps:
    """How generation drives a loaded artifact's prefill and decode entries, with either loader: one per loaded
    artifact (``generation_steps()``), with the ``spares`` its sessions leave.

    Each loader provides ``_place`` (a host array onto its device), ``_fetch`` (a device value back as numpy) and,
    per entry, ``_step(target, leaves, names)``: one profile run as it is, the flat outputs ``names`` (``logits``,
    ``cache``; an encoder-decoder's ``cache[0]``, ``cache[1]``...) left on the device; the cache is passed back to the
    next step (donated: updated in place).
    """

    def __init__(self, loaded: Any):
        self.loaded = loaded
        self.spares = Spares()

    def spec(self) -> Spec:
        return Spec.from_metadata(self.loaded.metadata, self.loaded.__name__)

    def profiles(self, entry: str) -> list[dict[str, int]]:
        return self.loaded.entry(entry).profiles

    def zeros(self, shape: Sequence[int], dtype: str) -> Any:
        return self.put(np.zeros(shape, to_dtype(dtype)))  # bfloat16 and float16 caches too

    def host(self, x: Any) -> np.ndarray:
        return self.loaded._fetch(x)

    def put(self, x: np.ndarray) -> Any:
        return self.loaded._place(x)

    def run(self, entry: str, profile: dict[str, int], leaves: list[Any]) -> tuple[np.ndarray, Any]:
        """(logits as numpy, the updated cache on the device) for ``leaves`` in the entry's input order."""
        logits, cache = self.outputs(entry, profile, leaves, ("logits", "cache"))
        return self.host(logits), cache

    def reorder(self, entry: str, batch: int, cache: Any, rows: dict[int, int]) -> tuple[Any, np.ndarray]:
        """(the cache (an array, or an encoder-decoder's list of them) with row ``i`` replaced by row ``rows[i]``, the
        rows not named keeping theirs, and the index that says so): the artifact's ``reorder`` entry, a gather on the
        device (beam search's continuations, ``runtime/beams.py``)."""
        index = np.arange(batch, dtype=np.int32)
        index[list(rows)] = list(rows.values())
        if isinstance(cache, list):
            return list(self.outputs(entry, {"batch": batch}, [*cache, index], self.names(entry, "cache"))), index
        (cache,) = self.outputs(entry, {"batch": batch}, [cache, index], ("cache",))
        return cache, index

    def names(self, entry: str, output: str) -> tuple[str, ...]:
        """The flat names of the entry's output ``output``: its own (an array), or its arrays' (``cross[0]``,
        ``cross[1]``...: an encoder-decoder's caches, an array per layer and kind)."""
        return tuple(n for n in self.loaded.entry(entry).output_names if n == output or n.startswith(output + "["))

    def outputs(self, entry: str, profile: dict[str, int], leaves: list[Any], names: Sequence[str]) -> tuple[Any, ...]:
        """The entry's outputs ``names``, left on the device, for ``leaves`` in its input order."""
        e = self.loaded.entry(entry)
        return e._step(tuple(profile[d.name] for d in e.dims), leaves, tuple(names))


def prompts(input_ids: Any, attention_mask: Any = None) -> list[np.ndarray]:
    """Each row's prompt tokens: from a list of token lists, or a 2-D array with an optional mask (1 = token,
    0 = padding, on either side)."""
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(r, (list, tuple, np.ndarray))
                                                                  for r in input_ids):
        if attention_mask is None:
            rows = [np.asarray(r) for r in input_ids]
            return [_ids(r, f"input_ids[{i}]") for i, r in enumerate(rows)]
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise CallError(f"generate(): input_ids must be [batch, prompt] token ids (or a list of token lists), got "
                        f"shape {ids.shape}.")
    if attention_mask is None:
        return [_ids(r, f"input_ids[{i}]") for i, r in enumerate(ids)]
    mask = np.asarray(attention_mask)
    if mask.shape != ids.shape:
        raise CallError(f"generate(): attention_mask has shape {mask.shape}, input_ids {ids.shape}; they must match.")
    return [_ids(r[m != 0], f"input_ids[{i}]") for i, (r, m) in enumerate(zip(ids, mask))]


def _ids(row: np.ndarray, where: str) -> np.ndarray:
    if row.ndim != 1 or row.size == 0:
        raise CallError(f"generate(): {where} is empty or not a list of token ids; every prompt needs at least one token.")
    if not np.issubdtype(row.dtype, np.integer):
        raise CallError(f"generate(): {where} has dtype {row.dtype}; token ids are integers.")
    return row.astype(np.int32)


def before_stop(row: Sequence[int], stops: Sequence[int]) -> list[int]:
    """A row's new tokens up to the first stop id it generated (the stop id and the fill after it left out)."""
    row = [int(t) for t in row]
    return row[:next((i for i, t in enumerate(row) if t in stops), len(row))]


def chunks(length: int, sizes: Sequence[int]) -> list[int]:
    """``length`` as a sum of available chunk ``sizes``, largest first: all of it when ``sizes`` includes 1, else
    as much as they cover."""
    out, left = [], length
    for size in sorted(set(sizes), reverse=True):
        while size <= left:
            out.append(size)
            left -= size
    return out


def check_ids(spec: Spec, prompt: np.ndarray, max_new_tokens: int, where: str) -> None:
    """``max_new_tokens`` a positive integer and a prompt's (or source's) ids within the vocabulary."""
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise CallError(f"generate(): max_new_tokens={max_new_tokens!r}; it is a positive integer.")
    bad = prompt[(prompt < 0) | (prompt >= spec.vocab_size)]
    if bad.size:
        raise CallError(f"generate(): {where} holds token id {int(bad[0])}, outside [0, {spec.vocab_size}) "
                        "(this model's vocabulary).")


def check_prompt(spec: Spec, prompt: np.ndarray, max_new_tokens: int, where: str) -> None:
    """A prompt's ids within the vocabulary and its length plus ``max_new_tokens`` within the cache."""
    check_ids(spec, prompt, max_new_tokens, where)
    if len(prompt) + max_new_tokens > spec.max_length:
        raise CallError(f"generate(): {where} is a prompt of {len(prompt)} tokens; plus max_new_tokens={max_new_tokens} is "
                        f"{len(prompt) + max_new_tokens} positions, over this artifact's generate.max_length="
                        f"{spec.max_length}; shorten the prompt, ask for at most {spec.max_length - len(prompt)} new "
                        f"tokens, or build with a larger generate.max_length.")


class Session:
    """A running batch: the cache of ``batch`` rows on the device and, per row, where its next token goes.

    Each row also keeps which tokens its cache positions hold (``Held``), past its release and, through the
    loader's ``Spares``, past the session: a prompt admitted into a row whose held tokens begin as it does
    runs only the rest (``reusable``), and it goes to the free row that holds the most of it (``row_for``).
    The keys and values taken are those the same tokens at the same positions wrote, so the logits are the
    ones a full prefill gives (to float rounding: the chunks differ), as vLLM's prefix caching gives them.
    """

    def __init__(self, steps: Steps, spec: Spec, batch: int, held: Held | None = None):
        """``held``: the cache to start from (a smaller session's, grown); None: the spare of this shape, else zeros."""
        self.steps, self.spec, self.batch = steps, spec, batch
        self.shape = [batch if n == -1 else n for n in spec.cache_shape]
        held = held or steps.spares.take(self.shape, spec.cache_dtype)
        self.held = held or Held.empty(steps.zeros(self.shape, spec.cache_dtype), batch, spec.max_length)
        self.mask = np.zeros((batch, spec.max_length), np.int32)
        self.index = np.zeros(batch, np.int32)  # the cache position of each row's next token
        self.token = np.zeros(batch, np.int32)  # each row's last token: the next decode step's input
        self.busy = np.zeros(batch, bool)
        self.reused = np.zeros(batch, np.int32)  # each row's prompt tokens taken from the cache at its admission
        self.released = int(self.held.released.max())  # releases so far (the order rows were let go in)
        self.sizes = sorted({p["seq"] for p in steps.profiles(spec.prefill) if p["batch"] == batch})
        # decode's chunk sizes over every row (artifacts built before it had them: steps only)
        self.wide = sorted({p.get("seq", 1) for p in steps.profiles(spec.decode) if p["batch"] == batch} - {1})

    @staticmethod
    def batch_for(steps: Steps, spec: Spec, rows: Sequence[np.ndarray]) -> int:
        """The batch a session for ``rows`` starts at: the smallest decode bucket that holds them."""
        return min(p["batch"] for p in steps.profiles(spec.decode) if p["batch"] >= len(rows))

    @property
    def cache(self) -> Any:
        return self.held.cache

    @cache.setter
    def cache(self, cache: Any) -> None:
        self.held.cache = cache

    def reusable(self, row: int, prompt: np.ndarray) -> int:
        """How many of ``prompt``'s first tokens ``row`` holds already: their keys and values need not be computed
        again. At most all but the last token, whose logits the admission returns."""
        n = min(int(self.held.valid[row]), len(prompt) - 1)
        differ = np.flatnonzero(self.held.tokens[row, :n] != prompt[:n]) if n > 0 else ()
        return int(differ[0]) if len(differ) else max(n, 0)

    def row_for(self, prompt: np.ndarray, taken: Sequence[int] = ()) -> int | None:
        """The free row (not in ``taken``) to admit ``prompt`` into: the one holding most of its first tokens; where
        none holds any, the one let go longest ago (its tokens the least likely to come back). None: no free row."""
        free = [r for r in np.flatnonzero(~self.busy) if r not in taken]
        if not free:
            return None
        return int(max(free, key=lambda r: (self.reusable(r, prompt), -self.held.released[r])))

    def admit(self, row: int, prompt: np.ndarray) -> np.ndarray:
        """Prefill ``prompt`` into ``row`` (chunk by chunk, from the first token it does not hold); the logits of its
        last token, ``[vocab]``."""
        self.mask[row] = 0
        self.mask[row, :len(prompt)] = 1
        self.reused[row] = self.reusable(row, prompt)
        return self._prefill(row, prompt, int(self.reused[row]), None)

    def admit_all(self, prompts: Sequence[np.ndarray]) -> tuple[list[int], np.ndarray]:
        """Prefill ``prompts`` into free rows of an empty session, each into the row that holds most of it
        (``row_for``); (their rows, their last logits ``[n, vocab]``).

        The prompts' common length (past what every one of them finds held) is run over every row at once, in
        ``decode``'s chunk sizes (one call of ``[batch, 128]`` instead of ``batch`` calls of ``[1, 128]``); what
        is left of each prompt goes through ``prefill`` row by row. The other rows compute on masked zeros and
        stay free (what they held from there on is lost).
        """
        if self.busy.any():
            raise CallError("generate(): admit_all() needs an empty session; admit() a row into a running one.")
        rows: list[int] = []
        for prompt in prompts:
            rows.append(self.row_for(prompt, rows))
        reused = [self.reusable(row, prompt) for row, prompt in zip(rows, prompts)]
        self.mask[:] = 0
        for row, prompt in zip(rows, prompts):
            self.mask[row, :len(prompt)] = 1
        at = start = min(reused)
        wide = chunks(min(len(p) for p in prompts) - start, self.wide)
        if wide:
            np.minimum(self.held.valid, start, out=self.held.valid)
        logits = None
        for size in wide:
            ids = np.zeros((self.batch, size), np.int32)
            for row, prompt in zip(rows, prompts):
                ids[row] = prompt[at:at + size]
            positions = np.broadcast_to(np.arange(at, at + size, dtype=np.int32), (self.batch, size))
            logits, self.cache = self.steps.run(self.spec.decode, {"batch": self.batch, "seq": size}, [
                ids, np.ascontiguousarray(positions), self.mask, self.cache, np.full(self.batch, at, np.int32)])
            at += size
        self.reused[rows] = reused
        return rows, np.stack([self._prefill(row, prompt, max(at, r), logits[row] if at > r else None)
                               for row, prompt, r in zip(rows, prompts, reused)])

    def _prefill(self, row: int, prompt: np.ndarray, at: int, logits: np.ndarray | None) -> np.ndarray:
        """The rest of ``prompt`` from ``at`` into ``row`` (``logits``: those of token ``at - 1``, if run)."""
        self.held.valid[row] = min(self.held.valid[row], at)
        for size in chunks(len(prompt) - at, self.sizes):
            out, self.cache = self.steps.run(self.spec.prefill, {"batch": self.batch, "seq": size}, [
                prompt[None, at:at + size].astype(np.int32), np.arange(at, at + size, dtype=np.int32)[None],
                self.mask, self.cache, np.array([at], np.int32), np.array([row], np.int32)])
            logits = out[0]
            at += size
        self.held.tokens[row, :len(prompt)] = prompt
        self.held.valid[row] = self.index[row] = len(prompt)
        self.busy[row] = True
        return logits[:self.spec.vocab_size]

    def step(self, tokens: dict[int, int]) -> np.ndarray:
        """One decode step: each busy row's next ``tokens[row]`` in; the next logits of every row, ``[batch, vocab]``.

        A free row computes too (on a mask of zeros); it writes at its first position past what it holds, so its
        tokens stay for a later prompt (the last position given up where it holds all of them)."""
        for row, token in tokens.items():
            self.token[row] = token
            self.mask[row, self.index[row]] = 1
        valid = self.held.valid
        np.minimum(valid, self.spec.max_length - 1, out=valid, where=~self.busy)
        index = np.where(self.busy, self.index, valid).astype(np.int32)
        logits, self.cache = self.steps.run(self.spec.decode, {"batch": self.batch, "seq": 1}, [
            self.token[:, None], index[:, None], self.mask, self.cache, index])
        busy = np.flatnonzero(self.busy)
        self.held.tokens[busy, self.index[busy]] = self.token[busy]
        self.index[busy] += 1
        valid[busy] = self.index[busy]
        return logits[:, :self.spec.vocab_size]

    def reorder(self, rows: dict[int, int]) -> None:
        """Row ``i`` replaced by row ``rows[i]`` (the rows not named keep theirs): the cache's rows (``Steps.reorder``),
        and what each row holds with them: beam search's continuations (``runtime/beams.py``)."""
        self.cache, index = self.steps.reorder(self.spec.reorder, self.batch, self.cache, rows)
        for a in (self.mask, self.index, self.token, self.busy, self.reused, self.held.tokens, self.held.valid):
            a[:] = a[index]

    def release(self, row: int) -> None:
        self.busy[row] = False
        self.mask[row] = 0
        self.index[row] = 0
        self.released += 1
        self.held.released[row] = self.released

    def close(self) -> None:
        """Done: the cache and what it holds go to the loader's spares for the next session of this batch."""
        if self.held is not None:
            self.steps.spares.give(self.shape, self.spec.cache_dtype, self.held)
            self.held = None


def generate(steps: Steps, spec: Spec, name: str, input_ids: Any, max_new_tokens: int, attention_mask: Any = None,
             seed: int | None = None, eos_token_id: Any = None, pad_token_id: int | None = None,
             constraints: Any = None, beams: Any = None, **sampling: Any) -> np.ndarray:
    """The new tokens, int32 ``[batch, n]``: ``n = max_new_tokens``, or fewer when every row has stopped at one of
    the ``eos_token_id`` ids (``Spec.stops``; a stopped row is filled as ``Spec.fill`` says) or its grammar ended;
    each token picked by the ``sampling`` options given (``sampling.Options``; those left out or None: the
    artifact's defaults), among those ``constraints(eos)`` (a function giving a ``grammar.Constraint`` per call,
    None: any token) allows; or each reply the best of a beam search where ``beams`` are given
    (``runtime/beams.chosen``)."""
    rows = prompts(input_ids, attention_mask)
    for i, r in enumerate(rows):
        check_prompt(spec, r, max_new_tokens, f"input_ids[{i}]")
    if beams is not None:
        return searched(steps, spec, Session, rows, max_new_tokens, beams, eos_token_id, pad_token_id)
    return in_groups(steps, spec, Session, rows, rows, max_new_tokens, seed, eos_token_id, pad_token_id, constraints,
                     sampling)


def in_groups(steps: Steps, spec: Spec, session: Any, rows: list[np.ndarray], histories: Sequence[np.ndarray],
              max_new_tokens: int, seed: int | None, eos_token_id: Any, pad_token_id: int | None, constraints: Any,
              sampling: dict[str, Any], process: Any = None, observe: Any = None) -> np.ndarray:
    """``generate``'s tokens for ``rows``, in groups of the largest batch bucket, each a ``session`` (the class: a
    decoder's ``Session``, an encoder-decoder's ``seq2seq.Session``); ``histories``: what each row's penalties count
    (a decoder's prompt; an encoder-decoder's start token); ``process(spec, logits, step, max_new_tokens, replies,
    eos)``: the logits as the checkpoint's processors leave them (``seq2seq.forced``), None: as they are;
    ``observe(rows, logits, tokens)``: told each step's processed logits and the tokens picked from them, ``rows``
    the indices of their rows in ``rows`` (Whisper's long-form scores its replies by them)."""
    options = spec.options(**sampling)
    eos = spec.stops(eos_token_id)
    pad = spec.fill(pad_token_id, eos)
    batches = sorted({p["batch"] for p in steps.profiles(spec.decode)})
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, len(rows), batches[-1]):
        group = rows[start:start + batches[-1]]
        running = session(steps, spec, session.batch_for(steps, spec, group))
        sampler = Sampler(options, rng, histories[start:start + batches[-1]],
                          None if constraints is None else [constraints(eos) for _ in group])
        seen = None if observe is None else functools.partial(observe, range(start, start + len(group)))
        out.append(_group(running, group, max_new_tokens, sampler, eos, pad, process, seen))
        running.close()
    n = max(o.shape[1] for o in out)
    return np.concatenate([np.pad(o, ((0, 0), (0, n - o.shape[1])), constant_values=pad if pad is not None else 0)
                           for o in out])


def _group(session: Any, rows: list[np.ndarray], max_new_tokens: int, sampler: Sampler, eos: tuple[int, ...],
           pad: int | None, process: Any, observe: Any = None) -> np.ndarray:
    at, logits = session.admit_all(rows)
    tokens = np.zeros((len(rows), max_new_tokens), np.int32)
    done = np.zeros(len(rows), bool)
    for step in range(max_new_tokens):
        if process is not None:
            logits = process(session.spec, logits, step, max_new_tokens, tokens[:, :step].tolist(), eos)
        token = sampler(logits)
        if observe is not None:
            observe(logits, token)
        if pad is not None:
            token = np.where(done, pad, token)
        tokens[:, step] = token
        done |= np.isin(token, eos) | sampler.ended()  # an end id, or a reply its grammar holds whole
        if done.all():
            return tokens[:, :step + 1]
        if step + 1 == max_new_tokens:
            break
        logits = session.step({row: int(t) for row, t in zip(at, token)})[at]
    return tokens
