"""T5's encoder (Hugging Face's ``T5EncoderModel``), in plain JAX: the text encoder of Stable Diffusion 3's and FLUX's
pipelines (google/t5-v1_1-xxl) and of sentence-T5 embedding models.

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

``MT5Encoder`` (``model=mt5``) and ``UMT5Encoder`` (``model=umt5``: a table of relative-position biases in every layer,
not layer 0's for all) are the same encoder under their own model types and defaults.

Params (Hugging Face's layouts: Linear weights ``[out, in]``, no biases anywhere)::

    {"embed": [vocab_size, d_model], "relative_attention_bias": [num_buckets, num_heads],
     "layers": [{"attn_norm": [d_model], "q" | "k" | "v": [heads * d_kv, d_model], "o": [d_model, heads * d_kv],
                 "ff_norm": [d_model], "wi": [d_ff, d_model] (gated: "wi_0", "wi_1"), "wo": [d_model, d_ff]}, ...],
     "final_norm": [d_model]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, activation, embed, mask_bias, matmul, normal_init, softmax
from ._tokens import TokenInputs
from .heads import sentence_embedding
from .llama import rms_norm
from .mpnet import position_bias

POOLINGS = ("none", "mean")


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


@dataclass(frozen=True)
class T5Encoder(TokenInputs):
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
    head: str = "auto"  # none (T5EncoderModel); auto: the checkpoint's
    pooling: str = "none"  # none | mean: a sentence_embedding output, the mean over the real tokens (sentence-T5's)
    normalize: bool = False  # the sentence_embedding scaled to unit length

    name: ClassVar[str] = "t5"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}
    per_layer_bias: ClassVar[bool] = False  # a relative-position table in every layer (UMT5), or layer 0's for all

    def __post_init__(self) -> None:
        if self.head == "conditional_generation":
            raise ValueError("head=conditional_generation: a *ForConditionalGeneration checkpoint generates through an "
                             "encoder and a decoder, which is not built; model.head=none builds its encoder alone (the "
                             "*EncoderModel's outputs, the decoder's tensors skipped and said).")
        if self.head not in ("auto", "none"):
            raise ValueError(f"head={self.head!r} is not a head of T5Encoder; one of auto, none (T5EncoderModel).")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is not a pooling of T5Encoder; one of {', '.join(POOLINGS)}.")
        if self.normalize and self.pooling == "none":
            raise ValueError("normalize=true scales the sentence embedding, which pooling=none does not make: set "
                             "pooling=mean.")
        feed_forward(self.feed_forward_proj)

    @property
    def task(self) -> str:
        return "none"

    def init(self, key: jax.Array) -> Params:
        d, inner, ff = self.d_model, self.num_heads * self.d_kv, self.d_ff
        _, gated = feed_forward(self.feed_forward_proj)
        k_embed, k_bias, *k_layers = jax.random.split(key, 2 + self.num_layers)
        layers = []
        for k in k_layers:
            kq, kk, kv, ko, ki, kj, kw = jax.random.split(k, 7)
            layer = {"attn_norm": jnp.ones((d,), jnp.float32), "q": normal_init(kq, (inner, d)),
                     "k": normal_init(kk, (inner, d)), "v": normal_init(kv, (inner, d)), "o": normal_init(ko, (d, inner)),
                     "ff_norm": jnp.ones((d,), jnp.float32), "wo": normal_init(kw, (d, ff))}
            layer.update({"wi_0": normal_init(ki, (ff, d)), "wi_1": normal_init(kj, (ff, d))} if gated else
                         {"wi": normal_init(ki, (ff, d))})
            if self.per_layer_bias:
                layer["relative_attention_bias"] = normal_init(jax.random.fold_in(k, 1), self.bias_shape)
            layers.append(layer)
        shared = {} if self.per_layer_bias else {"relative_attention_bias": normal_init(k_bias, self.bias_shape)}
        return {"embed": normal_init(k_embed, (self.vocab_size, d)), **shared, "layers": layers,
                "final_norm": jnp.ones((d,), jnp.float32)}

    @property
    def bias_shape(self) -> tuple[int, int]:
        return self.relative_attention_num_buckets, self.num_heads

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        b, s = input_ids.shape
        heads, eps = self.num_heads, self.layer_norm_epsilon
        act, gated = feed_forward(self.feed_forward_proj)
        act = activation(act, "feed_forward_proj")
        h = embed(params["embed"], input_ids)
        mask = mask_bias(attention_mask != 0)[:, None, None, :]

        def biased(table: jax.Array) -> jax.Array:
            return position_bias(table, s, self.relative_attention_num_buckets, self.relative_attention_max_distance
                                 ).astype(jnp.float32) + mask
        bias = None if self.per_layer_bias else biased(params["relative_attention_bias"])
        for p in params["layers"]:
            bias = biased(p["relative_attention_bias"]) if self.per_layer_bias else bias
            x = rms_norm(p["attn_norm"], h, eps)
            q, k, v = (matmul(x, p[n].T).reshape(b, s, heads, self.d_kv) for n in ("q", "k", "v"))
            scores = jnp.einsum("bqnh,bknh->bnqk", q, k)
            ctx = jnp.einsum("bnqk,bknh->bqnh", softmax(scores, bias, v.dtype), v).reshape(b, s, heads * self.d_kv)
            h = h + matmul(ctx, p["o"].T)
            x = rms_norm(p["ff_norm"], h, eps)
            up = act(matmul(x, p["wi_0"].T)) * matmul(x, p["wi_1"].T) if gated else act(matmul(x, p["wi"].T))
            h = h + matmul(up, p["wo"].T)
        h = rms_norm(params["final_norm"], h, eps)
        out = {"last_hidden_state": h}
        if self.pooling != "none":
            out["sentence_embedding"] = sentence_embedding(h, attention_mask, self.pooling, self.normalize)
        return out


@dataclass(frozen=True)
class MT5Encoder(T5Encoder):
    """mT5's encoder (``MT5EncoderModel``): T5 v1.1's layers over a multilingual vocabulary; defaults ``MT5Config``'s
    (mt5-small's sizes)."""

    vocab_size: int = 250112
    d_ff: int = 1024
    num_layers: int = 8
    num_heads: int = 6
    feed_forward_proj: str = "gated-gelu"

    name: ClassVar[str] = "mt5"


@dataclass(frozen=True)
class UMT5Encoder(MT5Encoder):
    """UMT5's encoder (``UMT5EncoderModel``: google/umt5-xxl, the text encoder of the Wan video models): mT5's, with a
    relative-position table in every layer; defaults ``UMT5Config``'s."""

    name: ClassVar[str] = "umt5"
    per_layer_bias: ClassVar[bool] = True
