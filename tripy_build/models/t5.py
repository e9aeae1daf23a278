"""T5 (Hugging Face's ``T5EncoderModel`` and ``T5ForConditionalGeneration``), in plain JAX: the encoder is the text
encoder of Stable Diffusion 3's and FLUX's pipelines (google/t5-v1_1-xxl) and of sentence-T5 embedding models; with
``head=conditional_generation`` the decoder and its LM head too (t5-small to -11b, FLAN-T5, mT5's and UMT5's
fine-tunes: translation, summarization, instruction following), which ``task=generate`` builds as ``encode`` and
``step`` (``models/_seq2seq.py``).

Fields are ``T5Config``'s keys, defaults its own (t5-small's sizes), so a checkpoint's ``config.json`` maps onto the
dataclass by key (see ``tripy_build.models.hf``). Input ``input_ids``, ``attention_mask: int32 [batch, seq]``; output
``last_hidden_state [batch, seq, d_model]`` (and ``sentence_embedding`` with ``pooling=mean``, as sentence-transformers
pools it)::

    h = Embed(input_ids)                                   # the shared table; no positions, no scaling
    B = relative_attention_bias[bucket(key - query)]       # [heads, s, s], layer 0's table, used by every layer
    per layer: h = h + O(softmax(Q K^T + B + mask) V)(RMSNorm(h))    # no 1/sqrt(d) scaling: T5's
               h = h + Wo(act(Wi(RMSNorm(h))))             # gated (feed_forward_proj gated-gelu: T5 v1.1, FLAN-T5):
                                                           # Wo(act(Wi_0(x)) * Wi_1(x))
    last_hidden_state = RMSNorm(h)

The buckets are T5's bidirectional ones (``relative_attention_num_buckets``, logarithmic up to
``relative_attention_max_distance``; ``mpnet.relative_position_bucket``). The attention's width is ``num_heads * d_kv``,
which need not be ``d_model``. Padding: masked keys (``attention_mask``), so a padded row's real positions are its own.

``head=conditional_generation`` outputs ``logits [batch, seq, vocab_size]`` (float32): the decoder over ``input_ids``
shifted one to the right (``decoder_start_token_id`` first), as ``T5ForConditionalGeneration`` gives them with
``labels=input_ids`` (teacher forcing); ``step`` runs the same decoder a token at a time against a cache::

    d = Embed(decoder ids)                                 # the shared table
    C = relative_attention_bias[causal_bucket(query - key)] + causal mask   # the decoder's own table
    per decoder layer (num_decoder_layers): d = d + O(softmax(Q K^T + C) V)(RMSNorm(d))
               d = d + O'(softmax(Q' K'^T + mask) V')(RMSNorm(d), last_hidden_state)    # cross-attention, no bias
               d = d + FF(RMSNorm(d))                      # the encoder's feed-forward
    logits = LMHead(RMSNorm(d) * d_model**-0.5 if scaled)

The decoder's buckets are T5's unidirectional ones (``bidirectional=False``: all of them for keys before the query).
The LM head is the shared table where the output is scaled (t5-small's: ``tie_word_embeddings``, which transformers 5
saves as ``scale_decoder_outputs``; an ``lm_head.weight`` saved beside it is read as the table's copy, as transformers
4 ties it), an ``lm_head`` of its own elsewhere (T5 v1.1's, FLAN-T5's, mT5's, UMT5's).
Padding stays exact: the decoder is causal and its cross-attention masks the padded source.

``MT5Encoder`` (``model=mt5``: its output never scaled, as transformers 5 has it) and ``UMT5Encoder`` (``model=umt5``:
a table of relative-position biases in every layer of the encoder and of the decoder, not layer 0's for all) are the
same model under their own model types and defaults.

Params (Hugging Face's layouts: Linear weights ``[out, in]``, no biases anywhere)::

    {"embed": [vocab_size, d_model], "relative_attention_bias": [num_buckets, num_heads],
     "layers": [{"attn_norm": [d_model], "q" | "k" | "v": [heads * d_kv, d_model], "o": [d_model, heads * d_kv],
                 "ff_norm": [d_model], "wi": [d_ff, d_model] (gated: "wi_0", "wi_1"), "wo": [d_model, d_ff]}, ...],
     "final_norm": [d_model],
     # head=conditional_generation:
     "decoder": {"relative_attention_bias", "layers": [{... as the encoder's, and "cross_norm",
                                                         "cross_q" | "cross_k" | "cross_v" | "cross_o"}, ...],
                 "final_norm"},
     "lm_head": [vocab_size, d_model] (an LM head of its own)}

(UMT5: each layer's ``relative_attention_bias`` in place of the shared one, in the encoder and in the decoder.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ._layers import Params, activation, embed, head_embed, head_logits, mask_bias, matmul, normal_init, softmax
from ._seq2seq import Seq2Seq, attend_step, layer_of, step_bias, write_step
from ._tokens import TokenInputs
from .heads import sentence_embedding
from .llama import rms_norm
from .mpnet import position_bias

POOLINGS = ("none", "mean")
HEADS = ("auto", "none", "conditional_generation")


def feed_forward(proj: str) -> tuple[str, bool]:
    """``feed_forward_proj`` as ``T5Config`` reads it: the activation (``gated-gelu``: the tanh GELU) and whether the
    feed-forward is gated; ``ValueError`` for another form."""
    parts = proj.split("-") if isinstance(proj, str) else []
    if len(parts) not in (1, 2) or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"feed_forward_proj={proj!r}: give an activation (relu), or gated-ACTIVATION (gated-gelu), as "
                         "T5Config reads it.")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    activation(act, "feed_forward_proj")
    return act, len(parts) == 2


def causal_bucket(distance: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's decoder bucket of each query-minus-key distance, as transformers' ``T5Attention`` computes it with
    ``bidirectional=False`` (in float32): a key after its query as the query itself (masked anyway), distances below
    half the buckets exact, then logarithmic, ``max_distance`` and beyond in the last."""
    n = np.maximum(np.asarray(distance, np.int64), 0)
    exact = num_buckets // 2
    ratio = np.log(np.maximum(n, 1).astype(np.float32) / exact) / np.float32(math.log(max_distance / exact))
    large = np.minimum(exact + (ratio * np.float32(num_buckets - exact)).astype(np.int64), num_buckets - 1)
    return np.where(n < exact, n, large)


@functools.lru_cache(maxsize=None)
def _causal_buckets(num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of every distance 0..max_distance (farther ones clip to the last: the same bucket)."""
    return causal_bucket(np.arange(max_distance + 1), num_buckets, max_distance).astype(np.int32)


def causal_position_bias(table: jax.Array, queries: jax.Array, keys: Any, num_buckets: int, max_distance: int
                         ) -> jax.Array:
    """``[*queries.shape, keys, heads]``: the decoder's bias from ``table`` (``[buckets, heads]``) for each query
    position in ``queries`` and each key position ``0..keys-1``."""
    distance = queries[..., None] - jnp.arange(keys)
    return embed(table, jnp.take(jnp.asarray(_causal_buckets(num_buckets, max_distance)),
                                 jnp.clip(distance, 0, max_distance)))


@dataclass(frozen=True)
class T5Encoder(Seq2Seq, TokenInputs):
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"  # relu (T5) | gated-gelu (T5 v1.1, FLAN-T5, mT5): Wo(act(Wi_0 x) * Wi_1 x)
    # none (T5EncoderModel) | conditional_generation (T5ForConditionalGeneration: logits; task=generate); auto: the
    # checkpoint's, none without one
    head: str = "auto"
    pooling: str = "none"  # none | mean: a sentence_embedding output, the mean over the real tokens (sentence-T5's)
    normalize: bool = False  # the sentence_embedding scaled to unit length
    num_decoder_layers: int | None = None  # the decoder's layers (head=conditional_generation); null: num_layers
    decoder_start_token_id: int = 0  # the decoder's first input (T5's pad id)
    tie_word_embeddings: bool = True  # false: an LM head of its own (transformers 4's configs of T5 v1.1, FLAN-T5, mT5)
    # the decoder's output scaled by d_model**-0.5 before the LM head, which is then the shared table (transformers 5
    # saves it; its tie_word_embeddings is always true); null: tie_word_embeddings (mT5: false)
    scale_decoder_outputs: bool | None = None

    name: ClassVar[str] = "t5"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}
    per_layer_bias: ClassVar[bool] = False  # a relative-position table in every layer (UMT5), or layer 0's for all
    tied_scaled: ClassVar[bool] = True  # a tied LM head scales the output where config.json does not say (mT5's never)

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head={self.head!r} is not a head of {type(self).__name__}; one of auto, none "
                             "(the *EncoderModel), conditional_generation (the *ForConditionalGeneration).")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is not a pooling of T5Encoder; one of {', '.join(POOLINGS)}.")
        if self.pooling != "none" and self.task != "none":
            raise ValueError(f"pooling={self.pooling} makes a sentence embedding of the encoder's states, and head="
                             f"{self.task} outputs the decoder's logits: pool with head=none.")
        if self.normalize and self.pooling == "none":
            raise ValueError("normalize=true scales the sentence embedding, which pooling=none does not make: set "
                             "pooling=mean.")
        if self.num_decoder_layers is not None and self.num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers}: give a positive count, or null for "
                             f"num_layers ({self.num_layers}).")
        feed_forward(self.feed_forward_proj)

    @property
    def task(self) -> str:
        return "conditional_generation" if self.head == "conditional_generation" else "none"

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def scaled(self) -> bool:
        """Whether the decoder's output is scaled by ``d_model**-0.5`` before the LM head."""
        if self.scale_decoder_outputs is not None:
            return bool(self.scale_decoder_outputs)
        return self.tie_word_embeddings and self.tied_scaled

    @property
    def own_lm_head(self) -> bool:
        """An LM head of its own (``lm_head``), not the shared table: wherever the output is not scaled (every
        checkpoint trained so) or ``tie_word_embeddings`` is false."""
        return not (self.tie_word_embeddings and self.scaled)

    @property
    def bias_shape(self) -> tuple[int, int]:
        return self.relative_attention_num_buckets, self.num_heads

    def _layers(self, keys: Any, cross: bool) -> list[Params]:
        """A layer per key; ``cross``: the decoder's, with a cross-attention."""
        d, inner, ff = self.d_model, self.num_heads * self.d_kv, self.d_ff
        _, gated = feed_forward(self.feed_forward_proj)
        layers = []
        for k in keys:
            kq, kk, kv, ko, ki, kj, kw = jax.random.split(k, 7)
            layer = {"attn_norm": jnp.ones((d,), jnp.float32), "q": normal_init(kq, (inner, d)),
                     "k": normal_init(kk, (inner, d)), "v": normal_init(kv, (inner, d)), "o": normal_init(ko, (d, inner)),
                     "ff_norm": jnp.ones((d,), jnp.float32), "wo": normal_init(kw, (d, ff))}
            layer.update({"wi_0": normal_init(ki, (ff, d)), "wi_1": normal_init(kj, (ff, d))} if gated else
                         {"wi": normal_init(ki, (ff, d))})
            if self.per_layer_bias:
                layer["relative_attention_bias"] = normal_init(jax.random.fold_in(k, 1), self.bias_shape)
            if cross:
                cq, ck, cv, co = jax.random.split(jax.random.fold_in(k, 2), 4)
                layer.update(cross_norm=jnp.ones((d,), jnp.float32), cross_q=normal_init(cq, (inner, d)),
                             cross_k=normal_init(ck, (inner, d)), cross_v=normal_init(cv, (inner, d)),
                             cross_o=normal_init(co, (d, inner)))
            layers.append(layer)
        return layers

    def init(self, key: jax.Array) -> Params:
        d = self.d_model
        k_embed, k_bias, *k_layers = jax.random.split(key, 2 + self.num_layers)
        shared = {} if self.per_layer_bias else {"relative_attention_bias": normal_init(k_bias, self.bias_shape)}
        params = {"embed": normal_init(k_embed, (self.vocab_size, d)), **shared,
                  "layers": self._layers(k_layers, False), "final_norm": jnp.ones((d,), jnp.float32)}
        if self.task == "conditional_generation":
            k_dec, k_dbias, k_head = jax.random.split(jax.random.fold_in(key, 2), 3)
            own = {} if self.per_layer_bias else {"relative_attention_bias": normal_init(k_dbias, self.bias_shape)}
            params["decoder"] = {**own, "layers": self._layers(jax.random.split(k_dec, self.decoder_layers), True),
                                 "final_norm": jnp.ones((d,), jnp.float32)}
            if self.own_lm_head:
                params["lm_head"] = normal_init(k_head, (self.vocab_size, d))
        return params

    # --- the layers' math, shared by the encoder, the decoder over a sequence and its step -----------------
    def _embedded(self, params: Params, ids: jax.Array) -> jax.Array:
        """The shared table's rows, read from the copy the LM head computes with where it is the head."""
        tied = self.task == "conditional_generation" and not self.own_lm_head
        return head_embed(params["embed"], ids) if tied else embed(params["embed"], ids)

    def _split(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """``x @ w.T`` in heads: ``[..., d_model] -> [..., num_heads, d_kv]``."""
        return matmul(x, w.T).reshape(*x.shape[:-1], self.num_heads, self.d_kv)

    def _attention(self, p: Params, prefix: str, x: jax.Array, source: jax.Array, bias: jax.Array) -> jax.Array:
        """Attention of ``x`` (``[b, s, d]``) over ``source`` (``[b, t, d]``) through ``p``'s ``{prefix}q``, ``k``,
        ``v`` and ``o``, ``bias`` added to the (unscaled) scores."""
        q = self._split(x, p[prefix + "q"])
        k, v = self._split(source, p[prefix + "k"]), self._split(source, p[prefix + "v"])
        scores = jnp.einsum("bqnh,bknh->bnqk", q, k)
        ctx = jnp.einsum("bnqk,bknh->bqnh", softmax(scores, bias, v.dtype), v)
        return matmul(ctx.reshape(*x.shape[:-1], self.num_heads * self.d_kv), p[prefix + "o"].T)

    def _ff(self, p: Params, h: jax.Array) -> jax.Array:
        act, gated = feed_forward(self.feed_forward_proj)
        act = activation(act, "feed_forward_proj")
        x = rms_norm(p["ff_norm"], h, self.layer_norm_epsilon)
        up = act(matmul(x, p["wi_0"].T)) * matmul(x, p["wi_1"].T) if gated else act(matmul(x, p["wi"].T))
        return h + matmul(up, p["wo"].T)

    def _logits(self, params: Params, h: jax.Array) -> jax.Array:
        """The LM head over the decoder's last states (final-normed), float32."""
        h = h * self.d_model ** -0.5 if self.scaled else h
        return head_logits(h, params["lm_head"] if self.own_lm_head else params["embed"]).astype(jnp.float32)

    def _encoded(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The encoder's ``last_hidden_state``."""
        s = input_ids.shape[1]
        h = self._embedded(params, input_ids)
        mask = mask_bias(attention_mask != 0)[:, None, None, :]

        def biased(table: jax.Array) -> jax.Array:
            return position_bias(table, s, self.relative_attention_num_buckets, self.relative_attention_max_distance
                                 ).astype(jnp.float32) + mask
        bias = None if self.per_layer_bias else biased(params["relative_attention_bias"])
        for p in params["layers"]:
            bias = biased(p["relative_attention_bias"]) if self.per_layer_bias else bias
            x = rms_norm(p["attn_norm"], h, self.layer_norm_epsilon)
            h = self._ff(p, h + self._attention(p, "", x, x, bias))
        return rms_norm(params["final_norm"], h, self.layer_norm_epsilon)

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        h = self._encoded(params, input_ids, attention_mask)
        if self.task == "conditional_generation":
            start = jnp.full((input_ids.shape[0], 1), self.decoder_start_token_id, input_ids.dtype)
            return {"logits": self._decoded(params, jnp.concatenate([start, input_ids[:, :-1]], axis=1), h,
                                            attention_mask)}
        out = {"last_hidden_state": h}
        if self.pooling != "none":
            out["sentence_embedding"] = sentence_embedding(h, attention_mask, self.pooling, self.normalize)
        return out

    def _decoded(self, params: Params, ids: jax.Array, encoded: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The decoder's logits over the whole of ``ids`` (``[b, t]``, teacher-forced), attending ``encoded``."""
        dec, eps = params["decoder"], self.layer_norm_epsilon
        t = ids.shape[1]
        positions = jnp.arange(t)
        causal = mask_bias(positions[None, :] <= positions[:, None])[None, None]
        source = mask_bias(attention_mask != 0)[:, None, None, :]

        def biased(table: jax.Array) -> jax.Array:
            by_key = causal_position_bias(table, positions, t, self.relative_attention_num_buckets,
                                          self.relative_attention_max_distance)  # [t, t, heads]
            return jnp.transpose(by_key, (2, 0, 1))[None].astype(jnp.float32) + causal
        bias = None if self.per_layer_bias else biased(dec["relative_attention_bias"])
        h = self._embedded(params, ids)
        for p in dec["layers"]:
            bias = biased(p["relative_attention_bias"]) if self.per_layer_bias else bias
            x = rms_norm(p["attn_norm"], h, eps)
            h = h + self._attention(p, "", x, x, bias)
            h = h + self._attention(p, "cross_", rms_norm(p["cross_norm"], h, eps), encoded, source)
            h = self._ff(p, h)
        return self._logits(params, rms_norm(dec["final_norm"], h, eps))

    # --- generation (head=conditional_generation): models/_seq2seq.py -------------------------------------
    def cross_shape(self, batch: Any, seq: Any) -> tuple[Any, ...]:
        return (batch, self.num_heads, seq, self.d_kv)

    def cache_shape(self, batch: Any, max_length: int) -> tuple[Any, ...]:
        return self.cross_shape(batch, max_length)

    def encode(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        """The encoder over the source, and each decoder layer's cross-attention keys and values of its output."""
        encoded = self._encoded(params, input_ids, attention_mask)
        return {"cross": [self._split(encoded, p[f"cross_{n}"]).swapaxes(1, 2).astype(params["embed"].dtype)
                          for p in params["decoder"]["layers"] for n in "kv"]}

    def step(self, params: Params, input_ids: jax.Array, cache_index: jax.Array, encoder_mask: jax.Array,
             cross: list[jax.Array], cache: list[jax.Array]) -> dict[str, Any]:
        """One decoder token per row at its position ``cache_index`` (``models/_seq2seq.py``)."""
        dec, eps = params["decoder"], self.layer_norm_epsilon
        cache = list(cache)
        n = cache[0].shape[2]
        seen = step_bias(cache_index, n)
        source = mask_bias(encoder_mask != 0)[:, None, None, :]

        def biased(table: jax.Array) -> jax.Array:
            by_key = causal_position_bias(table, cache_index, n, self.relative_attention_num_buckets,
                                          self.relative_attention_max_distance)  # [b, n, heads]
            return jnp.transpose(by_key, (0, 2, 1))[:, :, None, :].astype(jnp.float32) + seen
        bias = None if self.per_layer_bias else biased(dec["relative_attention_bias"])
        h = self._embedded(params, input_ids[:, 0])
        for i, p in enumerate(dec["layers"]):
            bias = biased(p["relative_attention_bias"]) if self.per_layer_bias else bias
            x = rms_norm(p["attn_norm"], h, eps)
            q, k, v = (self._split(x, p[w]) for w in "qkv")
            h = h + matmul(attend_step(q, *write_step(cache, i, k, v, cache_index), bias), p["o"].T)
            q = self._split(rms_norm(p["cross_norm"], h, eps), p["cross_q"])
            h = h + matmul(attend_step(q, *layer_of(cross, i), source), p["cross_o"].T)
            h = self._ff(p, h)
        return {"logits": self._logits(params, rms_norm(dec["final_norm"], h, eps)), "cache": cache}


@dataclass(frozen=True)
class MT5Encoder(T5Encoder):
    """mT5 (``MT5EncoderModel``, ``MT5ForConditionalGeneration``): T5 v1.1's layers over a multilingual vocabulary;
    defaults ``MT5Config``'s (mt5-small's sizes)."""

    vocab_size: int = 250112
    d_ff: int = 1024
    num_layers: int = 8
    num_heads: int = 6
    feed_forward_proj: str = "gated-gelu"

    name: ClassVar[str] = "mt5"
    tied_scaled: ClassVar[bool] = False


@dataclass(frozen=True)
class UMT5Encoder(MT5Encoder):
    """UMT5 (``UMT5EncoderModel``: google/umt5-xxl, the text encoder of the Wan video models;
    ``UMT5ForConditionalGeneration``): mT5's, with a relative-position table in every layer; defaults
    ``UMT5Config``'s."""

    name: ClassVar[str] = "umt5"
    per_layer_bias: ClassVar[bool] = True
    tied_scaled: ClassVar[bool] = True
