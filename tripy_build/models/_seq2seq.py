"""What an encoder-decoder model that generates (a ``*ForConditionalGeneration``: BART, T5) has for ``task=generate``.

Two functions over one set of weights, compiled as two entries (``builder/generate.py``) and driven by
``runtime/seq2seq.py``:

- ``encode(params, input_ids [b, s], attention_mask [b, s]) -> {"cross": [cross_shape(b, s), ...]}``: the encoder
  over the source, and from its output every decoder layer's cross-attention keys and values (computed once per source,
  not once per generated token, as transformers' ``EncoderDecoderCache`` keeps them).
- ``step(params, input_ids [b, 1], cache_index [b], encoder_mask [b, s], cross, cache) -> {"logits": [b, vocab],
  "cache"}``: one decoder token per row at its position ``cache_index`` (the decoder start token at 0), its
  self-attention keys and values written into ``cache`` (arrays of ``cache_shape(b, max_length)``, donated) and attended with
  every position before it; the cross-attention over ``cross``, the padded source positions (``encoder_mask`` 0)
  masked.

Both caches are lists of ``2 x layers`` arrays ``[batch, heads, positions, head_dim]`` (layer ``i``'s keys at ``2i``,
its values at ``2i + 1``), in the build's precision: each array is an input of its own, so that a step's products
read it where it lies. Held as one ``[layers, 2, ...]`` array, each layer's keys and values were copied out of it
before every product (XLA's CPU backend gives a dot operand a buffer of its own): at whisper-base's shape, 37 MB a
row a step (``bench/cross_attention.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..core.spec import InputInfo
from ._layers import mask_bias, softmax
from .bert import _linear, _ln

METHODS = ("encode", "encode_inputs", "step", "step_inputs", "cache_shape", "cross_shape")


class Seq2Seq:
    """``encode_inputs`` and ``step_inputs`` from the model's ``cross_shape`` and ``cache_shape``; the model sets
    ``vocab_size`` and ``decoder_start_token_id`` and defines ``encode``, ``step`` and the two shapes."""

    vocab_size: int
    decoder_start_token_id: int

    decoder_layers: int

    def cross_shape(self, batch: Any, seq: Any) -> tuple[Any, ...]:
        """One array of the cross-attention's keys or values: ``[batch, heads, seq, head_dim]``."""
        raise NotImplementedError

    def cache_shape(self, batch: Any, max_length: int) -> tuple[Any, ...]:
        """One array of the decoder's cache: ``[batch, heads, max_length, head_dim]``."""
        raise NotImplementedError

    def cross_inputs(self, batch: Any, seq: Any, dtype: str) -> list[InputInfo]:
        """The cross-attention's keys and values, an array per decoder layer and kind (``step``'s ``cross``)."""
        return [InputInfo(self.cross_shape(batch, seq), dtype) for _ in range(2 * self.decoder_layers)]

    def cache_inputs(self, batch: Any, max_length: int, dtype: str) -> list[InputInfo]:
        """The decoder's cache, an array per layer and kind (``step``'s ``cache``)."""
        return [InputInfo(self.cache_shape(batch, max_length), dtype) for _ in range(2 * self.decoder_layers)]

    def encode_inputs(self, batch: Any, seq: Any) -> dict[str, InputInfo]:
        """``encode``'s inputs: the source's ids and its mask (1: a token, 0: padding)."""
        return {"input_ids": InputInfo((batch, seq), "int32", (0, self.vocab_size)),
                "attention_mask": InputInfo((batch, seq), "int32", (0, 2))}

    def step_inputs(self, batch: Any, seq: Any, max_length: int, cache_dtype: str = "float32") -> dict[str, InputInfo]:
        """``step``'s inputs: a token per row, its position, the source's mask, the cross-attention's keys and values
        (``encode``'s ``cross``) and the decoder's cache, both in ``cache_dtype`` (the build's precision)."""
        return {"input_ids": InputInfo((batch, 1), "int32", (0, self.vocab_size)),
                "cache_index": InputInfo((batch,), "int32", (0, max_length)),
                "encoder_mask": InputInfo((batch, seq), "int32", (0, 2)),
                "cross": self.cross_inputs(batch, seq, cache_dtype),
                "cache": self.cache_inputs(batch, max_length, cache_dtype)}


class DecoderSized(Seq2Seq):
    """The caches' shapes of a decoder sized by ``decoder_layers``, ``decoder_attention_heads`` and ``d_model``, and the
    check of those sizes (BART's, Marian's, Whisper's)."""

    decoder_layers: int
    decoder_attention_heads: int
    encoder_attention_heads: int
    d_model: int

    def check_sizes(self) -> None:
        """Each side's heads divide ``d_model``; a ``ValueError`` naming the side's setting."""
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by {side}_attention_heads ({heads}).")

    def layer_stack(self, key: jax.Array, layers: int, ffn: int, cross: bool, key_bias: bool = True) -> list[Any]:
        """``layers`` random layers (BART's layout: ``q``, ``k``, ``v``, ``out``, ``attn_ln``, ``fc1``, ``fc2``,
        ``final_ln``; ``cross``: a decoder's, with ``cross_*``); without ``key_bias`` the key projections have no
        bias (Whisper's)."""
        def key_linear(k: jax.Array) -> dict[str, Any]:
            made = _linear(k, d, d)
            return made if key_bias else {"weight": made["weight"]}
        d = self.d_model
        out = []
        for k in jax.random.split(key, layers):
            ks = jax.random.split(k, 10)
            layer = {"q": _linear(ks[0], d, d), "k": key_linear(ks[1]), "v": _linear(ks[2], d, d),
                     "out": _linear(ks[3], d, d), "attn_ln": _ln(d), "fc1": _linear(ks[4], d, ffn),
                     "fc2": _linear(ks[5], ffn, d), "final_ln": _ln(d)}
            if cross:
                layer.update(cross_q=_linear(ks[6], d, d), cross_k=key_linear(ks[7]), cross_v=_linear(ks[8], d, d),
                             cross_out=_linear(ks[9], d, d), cross_ln=_ln(d))
            out.append(layer)
        return out

    def _heads(self) -> tuple[int, int]:
        return self.decoder_attention_heads, self.d_model // self.decoder_attention_heads

    def cross_shape(self, batch: Any, seq: Any) -> tuple[Any, ...]:
        heads, hd = self._heads()
        return (batch, heads, seq, hd)

    def cache_shape(self, batch: Any, max_length: int) -> tuple[Any, ...]:
        return self.cross_shape(batch, max_length)


def write_step(cache: list[jax.Array], layer: int, k: jax.Array, v: jax.Array,
               cache_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One new token's keys and values ``k, v: [b, heads, hd]`` written at each row's ``cache_index`` into layer
    ``layer``'s arrays of ``cache`` (the list, replaced in it); (its keys, its values)."""
    rows = jnp.arange(k.shape[0])
    for kind, x in ((0, k), (1, v)):
        at = 2 * layer + kind
        cache[at] = cache[at].at[rows, :, cache_index, :].set(x.astype(cache[at].dtype))
    return cache[2 * layer], cache[2 * layer + 1]


def layer_of(cross: list[jax.Array], layer: int) -> tuple[jax.Array, jax.Array]:
    """Layer ``layer``'s (keys, values) in a list of the caches' arrays."""
    return cross[2 * layer], cross[2 * layer + 1]


def step_bias(cache_index: jax.Array, max_length: int, dtype: Any = jnp.float32) -> jax.Array:
    """``[b, 1, 1, max_length]``: 0 at the positions a row's new token sees (its own and every one before), the
    dtype's most negative value after it."""
    return mask_bias(jnp.arange(max_length)[None, :] <= cache_index[:, None], dtype)[:, None, None, :]


def attend_step(q: jax.Array, keys: jax.Array, values: jax.Array, bias: jax.Array) -> jax.Array:
    """One query per row ``q: [b, heads, hd]`` (already scaled) over ``keys, values: [b, heads, n, hd]``, ``bias``
    broadcasting to ``[b, heads, 1, n]`` -> ``[b, heads * hd]``; the scores in float32."""
    scores = jnp.einsum("bnh,bnkh->bnk", q, keys)[:, :, None, :]
    probs = softmax(scores, bias, values.dtype)[:, :, 0, :]
    return jnp.einsum("bnk,bnkh->bnh", probs, values).reshape(q.shape[0], -1)
