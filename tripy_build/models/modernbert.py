"""ModernBERT (Hugging Face ``ModernBertModel`` and its heads), in plain JAX.

Fields are ``ModernBertConfig``'s keys, defaults ModernBERT-base's (``answerdotai/ModernBERT-base``'s
``config.json``: 22 layers of 768, a GLU MLP of 1152, a global layer every third, a 128-token window in the others,
rotary bases 160000 and 10000, no biases, and ``classifier_pooling: mean``, where ``ModernBertConfig`` says
``cls``: a ``config.json`` that leaves it out means ``cls``, which ``models/hf.py`` fills, ``Architecture.defaults``).
Older checkpoints' ``global_attn_every_n_layers``, ``global_rope_theta`` and ``local_rope_theta`` are read as
transformers 5 reads them into ``layer_types`` and ``rope_parameters`` (which win where both are given).

Inputs (int32 ``[batch, seq]``): ``input_ids``, ``attention_mask`` (optional: ones); no token types. Output
``last_hidden_state`` (no pooler), or the head's (``models/heads.py``'s ``transform`` style: every head reads its
input through ``ModernBertPredictionHead``, dense (``classifier_bias``), ``classifier_activation``, LayerNorm; the
sequence classifier's input is ``classifier_pooling`` of the states, the first token's or the mean over the real
ones; the masked LM's decoder is the word embeddings, tied, with a bias where ``decoder_bias``).

    h = LN(word[ids])                                                       # no positions added: rotary
    per layer l: h = h + Wo(Attention_l(RoPE_l(Wqkv(LN_attn(h)))))           # LN_attn: none in layer 0
                 h = h + Wo_mlp(act(x) * g),  [x | g] = Wi(LN_mlp(h))        # GLU: hidden_activation on the first half
    last_hidden_state = LN_final(h)

Each layer is ``full_attention`` (global: every key) or ``sliding_attention`` (local: the keys within
``local_attention // 2`` positions either side of the query, its own included, as Hugging Face's
``sliding_window_bidirectional_overlay`` counts them: ``|i - j| <= local_attention // 2``), as ``layer_types`` says,
or without it every ``global_attn_every_n_layers``-th layer from layer 0 global. Each kind rotates its queries and
keys by its own base (``rope_parameters[kind].rope_theta``: ``global_rope_theta`` and ``local_rope_theta``), at
positions ``0..seq-1``. LayerNorms have a bias only where ``norm_bias``, the attention's Linears where
``attention_bias``, the MLP's where ``mlp_bias``.

Masking: keys where ``attention_mask == 0`` get the additive bias ``finfo(float32).min``, as Hugging Face's eager
attention gives them. Positions count from 0 whatever the mask says, the window depends on ``i - j`` alone, and
every other step acts on each position alone: a sequence padded at the end with ``attention_mask = 0`` (any valid
ids there) gives, at its real positions, in the first token's pooling and in the mean over the real ones, the
unpadded result. Hence ``padding = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}``. Rotary positions
have no table; a build's ``seq`` is bounded by ``max_position_embeddings`` (the length trained, 8192), as the Llama
family's.

Params (Hugging Face's layouts: Linear weights ``[out, in]``; a bias only where the setting has one)::

    {"embeddings": {"word": [vocab_size, d], "ln": {"scale": [d], ("bias")}},
     "layers": [{"attn_norm": {...} (not in layer 0), "qkv": {"weight": [3d, d], ("bias")},
                 "attn_out": {"weight": [d, d], ("bias")}, "mlp_norm": {...},
                 "wi": {"weight": [2 intermediate_size, d], ("bias")}, "wo": {"weight": [d, intermediate_size]}}, ...],
     "final_norm": {"scale": [d], ("bias")},
     "head": {"dense": {"weight": [d, d], ("bias")}, "ln": {...}, "out": Linear | "bias": [vocab]}}   # models/heads.py

``apply`` folds the attention's ``1 / sqrt(head_dim)`` into the query rows of ``Wqkv`` (the rotation is linear, so
scaling before it is scaling after it): weight-only work, done once at load by tripy_build.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .bert import _linear, _ln, check_encoder, encoder_outputs
from ._tokens import TokenInputs
from .heads import Headed, STYLES, Style, init as init_head, sentence_embedding
from ._layers import (ATTENTION_TYPES, Params, activation, embed, layer_norm, layer_types, linear, mask_bias,
                      normal_init, rotate_half, scaled, softmax)

LAYER_TYPES = ATTENTION_TYPES  # Hugging Face's layer_types: global (every key) and local (a window) layers
THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
CLASSIFIER_POOLINGS = ("cls", "mean")


def _optional(tree: Params, keep: bool) -> Params:
    """``tree`` (a Linear or LayerNorm) without its ``bias`` unless ``keep``."""
    return tree if keep else {k: v for k, v in tree.items() if k != "bias"}


@dataclass(frozen=True)
class ModernBert(Headed, TokenInputs):
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()  # per layer, full_attention or sliding_attention (): global_attn_every_n_layers'
    global_attn_every_n_layers: int = 3  # without layer_types: layers 0, n, 2n, ... global, the others local
    rope_parameters: Any = None  # {full_attention: {rope_type: default, rope_theta}, sliding_attention: {...}}
    global_rope_theta: float = 160000.0  # older configs' keys; rope_parameters' rope_theta where it has one
    local_rope_theta: float = 10000.0
    rope_scaling: Any = None  # older configs': merged into both kinds' rope_parameters (only rope_type default runs)
    local_attention: int = 128  # a local layer's window: local_attention // 2 keys each side of the query
    mlp_bias: bool = False
    decoder_bias: bool = True  # the masked LM's decoder bias
    classifier_pooling: str = "mean"  # the sequence classifier's input: cls (the first token) or mean (real tokens)
    classifier_bias: bool = False  # the heads' dense layer's bias
    classifier_activation: str = "gelu"  # the heads' activation (ModernBertPredictionHead)
    head: str = "auto"  # models/heads.HEADS; auto: the checkpoint's (config.json's architectures), none without one
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label; default LABEL_0, LABEL_1, ...)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels
    pooling: str = "none"  # none | mean | cls: a sentence_embedding output (the encoder alone), as sentence-transformers
    normalize: bool = False  # the sentence_embedding scaled to unit length (cosine similarity as a dot product)

    name: ClassVar[str] = "modernbert"
    style: ClassVar[Style] = STYLES["modernbert"]
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        activation(self.hidden_activation, "hidden_activation")
        activation(self.classifier_activation, "classifier_activation")
        check_encoder(self)
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            raise ValueError(f"classifier_pooling={self.classifier_pooling!r} is not implemented; one of "
                             f"{', '.join(CLASSIFIER_POOLINGS)} (ModernBertForSequenceClassification's).")
        object.__setattr__(self, "layer_types", layer_types(self.layer_types, self.num_hidden_layers, "ModernBERT"))
        self._read_rope()

    def _read_rope(self) -> None:
        """``rope_parameters`` (and older configs' ``rope_scaling``) into the two bases, as ``ModernBertConfig``
        reads them: a kind's ``rope_theta`` where it has one, else ``global_rope_theta`` / ``local_rope_theta``;
        ``rope_scaling`` merged into both kinds. Only ``rope_type: default`` is implemented: another is refused."""
        given = self.rope_parameters or {}
        if not isinstance(given, Mapping) or set(given) - set(LAYER_TYPES):
            raise ValueError(f"rope_parameters={given!r}: ModernBERT's are per layer type ({', '.join(LAYER_TYPES)}), "
                             "each a mapping with rope_type and rope_theta.")
        scaling = self.rope_scaling or {}
        for kind, key in THETA_KEYS.items():
            rope = {**dict(given.get(kind) or {}), **dict(scaling)}
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                where = "rope_scaling" if scaling else f"rope_parameters.{kind}"
                raise ValueError(f"{where}: rope_type={rope_type!r} is not implemented; ModernBERT's rotary "
                                 "positions run with rope_type default only.")
            if "rope_theta" in rope:
                object.__setattr__(self, key, float(rope["rope_theta"]))
        object.__setattr__(self, "rope_parameters", None)  # read into the bases: hashable, as every zoo model
        object.__setattr__(self, "rope_scaling", None)

    # The names bert.check_encoder and bert.encoder_outputs read.
    @property
    def hidden_act(self) -> str:
        return self.hidden_activation

    @property
    def layer_norm_eps(self) -> float:
        return self.norm_eps

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def kinds(self) -> tuple[str, ...]:
        """Each layer's type: ``layer_types``, or every ``global_attn_every_n_layers``-th global from layer 0."""
        n = self.global_attn_every_n_layers
        return self.layer_types or tuple(LAYER_TYPES[bool(i % n)] for i in range(self.num_hidden_layers))

    def theta(self, kind: str) -> float:
        return self.global_rope_theta if kind == "full_attention" else self.local_rope_theta

    def inv_freq(self, kind: str) -> np.ndarray:
        """The rotary frequencies of a layer type, ``[head_dim / 2]``: ``1 / theta^(2i / head_dim)``."""
        hd = self.head_dim
        return (1.0 / (self.theta(kind) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))).astype(np.float32)

    def init(self, key: jax.Array) -> Params:
        d, ff = self.hidden_size, self.intermediate_size

        def lin(k: jax.Array, din: int, dout: int, bias: bool) -> Params:
            return _optional(_linear(k, din, dout), bias)

        def ln() -> Params:
            return _optional(_ln(d), self.norm_bias)
        k_word, *k_layers = jax.random.split(key, 1 + self.num_hidden_layers)
        layers = []
        for i, k in enumerate(k_layers):
            kq, ko, ki, kd = jax.random.split(k, 4)
            layer = {"attn_norm": ln(), "qkv": lin(kq, d, 3 * d, self.attention_bias),
                     "attn_out": lin(ko, d, d, self.attention_bias), "mlp_norm": ln(),
                     "wi": lin(ki, d, 2 * ff, self.mlp_bias), "wo": lin(kd, ff, d, self.mlp_bias)}
            if i == 0:
                del layer["attn_norm"]  # Hugging Face's first layer: nn.Identity
            layers.append(layer)
        params: Params = {"embeddings": {"word": normal_init(k_word, (self.vocab_size, d)), "ln": ln()},
                          "layers": layers, "final_norm": ln()}
        if self.task != "none":
            head = init_head(jax.random.fold_in(key, 1), self.task, self.style, d, self.num_labels, self.vocab_size,
                             _linear, _ln)
            head["dense"] = _optional(head["dense"], self.classifier_bias)
            head["ln"] = _optional(head["ln"], self.norm_bias)
            params["head"] = _optional(head, self.decoder_bias or self.task != "masked_lm")
        return params

    def _rotation(self, kind: str, seq: Any) -> tuple[jax.Array, jax.Array]:
        """``cos`` and ``sin`` ``[seq, head_dim]`` of a layer type's rotation at positions ``0..seq-1``."""
        freqs = jnp.arange(seq, dtype=jnp.float32)[:, None] * jnp.asarray(self.inv_freq(kind))
        angles = jnp.concatenate([freqs, freqs], axis=-1)
        return jnp.cos(angles), jnp.sin(angles)

    def _attention(self, p: Params, x: jax.Array, bias: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        b, s, d = x.shape
        n, hd = self.num_attention_heads, self.head_dim
        scale = jnp.concatenate([jnp.full((d,), 1.0 / math.sqrt(hd), jnp.float32), jnp.ones((2 * d,), jnp.float32)])
        qkv = linear({k: scaled(v, scale[:, None] if k == "weight" else scale) for k, v in p["qkv"].items()}, x)
        qkv = jnp.transpose(qkv.reshape(b, s, 3, n, hd), (2, 0, 3, 1, 4))  # [3, b, heads, s, hd]
        q, k, v = qkv[0], qkv[1], qkv[2]
        cos, sin = cos.astype(q.dtype), sin.astype(q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin  # cos, sin [s, hd]: every head's
        # batched matmuls over [b, heads]: XLA's CPU code runs them a third faster than the einsums over [b, s, heads]
        # (12 heads of 64 at 1x512: 2.5 ms a layer against 3.8)
        scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2))
        ctx = jnp.matmul(softmax(scores, bias, v.dtype), v)
        return linear(p["attn_out"], jnp.transpose(ctx, (0, 2, 1, 3)).reshape(b, s, d))

    def _mlp(self, p: Params, x: jax.Array) -> jax.Array:
        """The GLU: ``Wo(act(x) * gate)`` of ``[x | gate] = Wi(x)``."""
        up = linear(p["wi"], x)
        ff = self.intermediate_size
        return linear(p["wo"], activation(self.hidden_activation, "hidden_activation")(up[..., :ff]) * up[..., ff:])

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        eps = self.norm_eps
        emb = params["embeddings"]
        h = layer_norm(emb["ln"], embed(emb["word"], input_ids), eps)
        seq = input_ids.shape[1]
        keys = (attention_mask != 0)[:, None, None, :]  # [b, 1, 1, k]
        pos = jnp.arange(seq)
        near = jnp.abs(pos[:, None] - pos[None, :]) <= self.local_attention // 2  # [q, k]: within the window
        kinds = self.kinds()
        bias = {kind: mask_bias(keys if kind == "full_attention" else keys & near, h.dtype) for kind in set(kinds)}
        rotation = {kind: self._rotation(kind, seq) for kind in set(kinds)}
        for p, kind in zip(params["layers"], kinds):
            x = layer_norm(p["attn_norm"], h, eps) if "attn_norm" in p else h
            h = h + self._attention(p, x, bias[kind], *rotation[kind])
            h = h + self._mlp(p, layer_norm(p["mlp_norm"], h, eps))
        h = layer_norm(params["final_norm"], h, eps)
        pooled = (sentence_embedding(h, attention_mask, self.classifier_pooling, False)
                  if self.task == "sequence_classification" else None)
        return encoder_outputs(self, params, h, attention_mask, self.classifier_activation, pooled)

    def max_positions(self) -> int:
        """The longest sequence served: the length trained (``max_position_embeddings``; rotary positions have no
        table, and Hugging Face runs longer ones)."""
        return self.max_position_embeddings

    def positions_limit(self) -> str:
        return (f"ModernBert's rotary positions were trained up to max_position_embeddings={self.max_position_embeddings} "
                "(no table: Hugging Face runs longer sequences, this zoo does not)")


__all__ = ["ModernBert"]
