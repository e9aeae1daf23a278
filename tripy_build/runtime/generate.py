"""Token generation over an artifact's ``prefill`` and ``decode`` entries, shared by both loaders.

The artifact (``task=generate``) holds two entries of one function, ``extend``: it runs ``s`` new
tokens per row against a key/value cache of ``max_length`` positions, writes their keys and values at
``cache_index`` (the cache is donated: updated in place, never copied) and returns the logits of the
last new token. ``prefill`` is compiled for prompt chunks (its ``seq`` buckets), ``decode`` for one token.

Prompts are left-padded: every row's last prompt token sits at the same cache position, so one
``cache_index`` serves the batch and the next token of every row comes from the same logits row. A
prompt is run in chunks whose lengths are prefill buckets (100 tokens: 64 + 32 + 4), so that every
call runs a precompiled profile as it is: no padding beyond the batch's longest prompt, no compile.
A batch is padded with empty rows (all masked) up to a decode batch bucket; a batch larger than the
largest bucket is generated in groups.

This module is numpy only: each loader supplies a ``Steps`` (how to run an entry at a profile on
device, keep the cache there, and read the logits back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from ..errors import CallError

INPUTS = ("input_ids", "position_ids", "attention_mask", "cache", "cache_index")


@dataclass(frozen=True)
class Spec:
    """What the build recorded about generation (``metadata["generate"]``)."""

    prefill: str  # the entry names
    decode: str
    max_length: int  # cache positions: prompt plus new tokens must fit
    cache_shape: tuple[int, ...]  # with -1 for the batch
    cache_dtype: str
    vocab_size: int

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], name: str) -> "Spec":
        g = meta.get("generate")
        if not isinstance(g, dict):
            raise CallError(f"{name}: this artifact was not built for generation; build it with task=generate "
                            "(python -m tripy_build model=gpt2 task=generate).")
        return cls(str(g["prefill"]), str(g["decode"]), int(g["max_length"]), tuple(int(n) for n in g["cache_shape"]),
                   str(g["cache_dtype"]), int(g["vocab_size"]))

    def to_metadata(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode, "max_length": self.max_length,
                "cache_shape": list(self.cache_shape), "cache_dtype": self.cache_dtype, "vocab_size": self.vocab_size}


class Steps(Protocol):
    """What a loader provides: its entries' precompiled profiles, a zeroed cache on the device, and one call."""

    def profiles(self, entry: str) -> list[dict[str, int]]: ...

    def zeros(self, shape: Sequence[int], dtype: str) -> Any: ...

    def run(self, entry: str, profile: dict[str, int], leaves: list[Any]) -> tuple[np.ndarray, Any]:
        """(logits as numpy, the updated cache as a device handle) for ``leaves`` in ``INPUTS`` order."""
        ...


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


class Sampler:
    """Greedy (``temperature`` 0) or sampling from ``softmax(logits / temperature)`` over the ``top_k`` most
    likely tokens, with a seeded generator: the same seed, the same tokens."""

    def __init__(self, temperature: float = 0.0, top_k: int | None = None, seed: int | None = None):
        if not isinstance(temperature, (int, float)) or temperature < 0 or not np.isfinite(temperature):
            raise CallError(f"generate(): temperature={temperature!r}; it is 0 (greedy) or a positive number.")
        if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
            raise CallError(f"generate(): top_k={top_k!r}; it is a positive integer or None (every token).")
        self.temperature, self.top_k = float(temperature), top_k
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.temperature == 0.0:
            return np.argmax(logits, axis=-1).astype(np.int32)
        scaled = logits.astype(np.float64) / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            kth = np.partition(scaled, -self.top_k, axis=-1)[:, -self.top_k][:, None]
            scaled = np.where(scaled < kth, -np.inf, scaled)
        p = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        u = self.rng.random((p.shape[0], 1))
        return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1).astype(np.int32)


def chunks(length: int, sizes: Sequence[int]) -> list[int]:
    """``length`` as a sum of available chunk ``sizes``, largest first (``sizes`` includes 1)."""
    out, left = [], length
    for size in sorted(set(sizes), reverse=True):
        while size <= left:
            out.append(size)
            left -= size
    return out


def generate(steps: Steps, spec: Spec, name: str, input_ids: Any, max_new_tokens: int, attention_mask: Any = None,
             temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
             eos_token_id: int | None = None, pad_token_id: int | None = None) -> np.ndarray:
    """The new tokens, int32 ``[batch, n]``: ``n = max_new_tokens``, or fewer when every row has stopped at
    ``eos_token_id`` (a stopped row is filled with ``pad_token_id``, default ``eos_token_id``)."""
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise CallError(f"generate(): max_new_tokens={max_new_tokens!r}; it is a positive integer.")
    rows = prompts(input_ids, attention_mask)
    for i, r in enumerate(rows):
        bad = r[(r < 0) | (r >= spec.vocab_size)]
        if bad.size:
            raise CallError(f"generate(): input_ids[{i}] holds token id {int(bad[0])}, outside [0, {spec.vocab_size}) "
                            "(this model's vocabulary).")
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > spec.max_length:
        raise CallError(f"generate(): a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} is "
                        f"{longest + max_new_tokens} positions, over this artifact's generate.max_length="
                        f"{spec.max_length}; shorten the prompt, ask for at most {spec.max_length - longest} new "
                        f"tokens, or build with a larger generate.max_length.")
    sampler = Sampler(temperature, top_k, seed)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    batches = sorted({p["batch"] for p in steps.profiles(spec.decode)})
    out = []
    for start in range(0, len(rows), batches[-1]):
        group = rows[start:start + batches[-1]]
        out.append(_group(steps, spec, group, next(b for b in batches if b >= len(group)), max_new_tokens, sampler,
                          eos_token_id, pad))
    n = max(o.shape[1] for o in out)
    return np.concatenate([np.pad(o, ((0, 0), (0, n - o.shape[1])), constant_values=pad if pad is not None else 0)
                           for o in out])


def _group(steps: Steps, spec: Spec, rows: list[np.ndarray], batch: int, max_new_tokens: int, sampler: Sampler,
           eos: int | None, pad: int | None) -> np.ndarray:
    longest = max(len(r) for r in rows)
    ids = np.zeros((batch, longest), np.int32)
    mask = np.zeros((batch, spec.max_length), np.int32)
    for i, r in enumerate(rows):
        ids[i, longest - len(r):] = r
        mask[i, longest - len(r):longest] = 1
    positions = np.maximum(np.cumsum(mask[:, :longest], axis=1) - 1, 0).astype(np.int32)
    cache = steps.zeros([batch if n == -1 else n for n in spec.cache_shape], spec.cache_dtype)
    sizes = [p["seq"] for p in steps.profiles(spec.prefill) if p["batch"] == batch]
    at = 0
    logits = None
    for size in chunks(longest, sizes):
        logits, cache = steps.run(spec.prefill, {"batch": batch, "seq": size},
                                  [ids[:, at:at + size], positions[:, at:at + size], mask, cache, np.int32(at)])
        at += size
    tokens = np.zeros((batch, max_new_tokens), np.int32)
    done = np.zeros(batch, bool)
    done[len(rows):] = True
    position = positions[:, -1]
    for step in range(max_new_tokens):
        token = sampler(logits[:, :spec.vocab_size])
        if pad is not None:
            token = np.where(done, pad, token)
        tokens[:, step] = token
        if eos is not None:
            done |= token == eos
            if done.all():
                return tokens[:len(rows), :step + 1]
        if step + 1 == max_new_tokens:
            break
        mask[:, at] = 1
        position = position + 1
        logits, cache = steps.run(spec.decode, {"batch": batch},
                                  [token[:, None], position[:, None].astype(np.int32), mask, cache, np.int32(at)])
        at += 1
    return tokens[:len(rows)]
