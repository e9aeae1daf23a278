"""A pre-LayerNorm Transformer encoder block (no dropout), with optional key-padding masking.

    h = x + Attention(LN1(x))
    y = h + Down(gelu(Up(LN2(h))))        # exact (erf) GELU

``apply(params, x, lengths={"seq": n})`` attends only to the first ``n`` positions of each sequence
(later keys get zero attention weight), so a sequence padded at the end gives, in its first ``n``
rows, exactly the result of the unpadded one. Every other step acts on each position alone, and
every batch row alone: hence ``padding = {"batch": "rows", "seq": "mask"}``.

Params (Linear weights are ``[out, in]``)::

    {"ln1": {"scale": [d], "bias": [d]},
     "attn": {"q"|"k"|"v"|"out": {"weight": [d, d], "bias": [d]}},
     "ln2": {"scale": [d], "bias": [d]},
     "ffn": {"up": {"weight": [d_ff, d], "bias": [d_ff]}, "down": {"weight": [d, d_ff], "bias": [d]}}}

Input ``x: [batch, seq, d_model]``; output the same shape. Heads are split by reshaping the
*weights* (static shapes) and contracting with einsum, so activations are never reshaped and batch
and seq can be symbolic under ``jax.export``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, layer_norm, layer_norm_init, linear, linear_init


@dataclass(frozen=True)
class TransformerBlock:
    d_model: int = 256
    heads: int = 4
    d_ff: int = 1024

    name: ClassVar[str] = "transformer"
    padding: ClassVar[dict[str, str]] = {"batch": "rows", "seq": "mask"}

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads}).")

    def init(self, key: jax.Array) -> Params:
        d = self.d_model
        kq, kk, kv, ko, ku, kd = jax.random.split(key, 6)
        return {
            "ln1": layer_norm_init(d),
            "attn": {"q": linear_init(kq, d, d), "k": linear_init(kk, d, d),
                     "v": linear_init(kv, d, d), "out": linear_init(ko, d, d)},
            "ln2": layer_norm_init(d),
            "ffn": {"up": linear_init(ku, d, self.d_ff), "down": linear_init(kd, self.d_ff, d)},
        }

    def _heads(self, p: Params, x: jax.Array) -> jax.Array:
        """``[b, s, d] -> [b, s, heads, d_head]`` through a Linear whose weight is split per head."""
        dh = self.d_model // self.heads
        w = p["weight"].reshape(self.heads, dh, self.d_model)
        return jnp.einsum("bsd,hkd->bshk", x, w) + p["bias"].reshape(self.heads, dh)

    def attention(self, p: Params, x: jax.Array, length: jax.Array | None = None) -> jax.Array:
        """Multi-head self-attention; with ``length``, keys at positions ``>= length`` are masked out."""
        dh = self.d_model // self.heads
        q, k, v = (self._heads(p[n], x) for n in ("q", "k", "v"))
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(dh)
        if length is not None:
            keep = jnp.arange(scores.shape[-1]) < length
            scores = jnp.where(keep, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqs,bshk->bqhk", probs, v)
        w_out = p["out"]["weight"].reshape(self.d_model, self.heads, dh)
        return jnp.einsum("bqhk,dhk->bqd", ctx, w_out) + p["out"]["bias"]

    def apply(self, params: Params, x: jax.Array, lengths: dict[str, jax.Array] | None = None) -> jax.Array:
        h = x + self.attention(params["attn"], layer_norm(params["ln1"], x), (lengths or {}).get("seq"))
        ff = linear(params["ffn"]["up"], layer_norm(params["ln2"], h))
        ff = linear(params["ffn"]["down"], jax.nn.gelu(ff, approximate=False))
        return h + ff

    def inputs(self) -> dict[str, list]:
        return {"x": ["batch", "seq", self.d_model]}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}
