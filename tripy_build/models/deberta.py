"""DeBERTa-v2 and DeBERTa-v3 (Hugging Face ``DebertaV2Model`` and its heads), and DeBERTa (``DebertaModel``: v1,
``Deberta`` below), in plain JAX.

Fields are ``DebertaV2Config``'s keys (those its modules read with ``getattr`` included: ``position_buckets``,
``norm_rel_ebd``, ``share_att_key``, ``embedding_size``, ``conv_*``), defaults deberta-v3-base's: 12 layers of 768,
relative attention over 256 log buckets, ``c2p|p2c``, shared keys, no absolute positions. A ``config.json`` that
leaves a key out means Hugging Face's default, which ``models/hf.py`` fills (``Architecture.defaults``).

Inputs (int32 ``[batch, seq]``): ``input_ids``, ``attention_mask``, and ``token_type_ids`` where
``type_vocab_size > 0`` (DeBERTa-v3 has none). Output ``last_hidden_state`` (no pooler), or the head's.

    e = LN(proj(word[ids] + position[0..s-1] + token_type[types])) * mask   # position: position_biased_input;
                                                                            # proj: embedding_size != hidden_size
    per layer: a = LN(h + Out(DisentangledAttention(h)));  h = LN(a + Down(act(Up(a))))
    after the first layer (conv_kernel_size > 0): h = LN(h + conv_act(Conv1d(e) * mask)) * mask

Disentangled attention, per head, with ``r = rel(i, j)`` the relative position ``i - j`` (in log buckets with
``position_buckets``), ``R`` the relative embeddings (``LN``'d with ``norm_rel_ebd=layer_norm``), ``span`` the
buckets (or ``max_relative_positions``) and ``n = 1 + [c2p] + [p2c]``::

    score(i, j) = (q_i . k_j  +  q_i . K_R[clip(r(i, j) + span)]  +  k_j . Q_R[clip(-r(j, i) + span)]) / sqrt(hd n)

``K_R``, ``Q_R``: ``R`` through the key and query projections (``share_att_key``) or their own (``pos_key_proj``,
``pos_query_proj``). Keys and queries where ``attention_mask == 0`` are filled with ``finfo(float32).min``, as
Hugging Face fills them. Relative positions depend on ``i - j`` alone, the padding's embeddings are zeroed before
any layer reads them and every batch row is computed alone: a sequence padded at the end with ``attention_mask =
0`` (any valid ids there) gives, at its real positions, the unpadded result. Hence ``padding = {"batch": "rows",
"seq": {"mask_input": "attention_mask"}}``. Without absolute positions any ``seq`` runs (as in Hugging Face).

Params (Hugging Face's layouts: Linear ``[out, in]``, Conv1d ``[out, in / groups, kernel]``)::

    {"embeddings": {"word": [vocab_size, e], "position": [max_position_embeddings, e], "token_type": [types, e],
                    "proj": {"weight": [d, e]}, "ln": {"scale": [d], "bias": [d]}},   # as the settings need them
     "rel_embeddings": [2 span, d], "rel_ln": {"scale", "bias"},
     "layers": [{"query" | "key" | "value" | "attn_out" | "pos_key" | "pos_query": {"weight": [d, d], "bias": [d]},
                 "attn_ln", "intermediate", "output", "output_ln"}, ...],
     "conv": {"weight": [d, d / conv_groups, conv_kernel_size], "bias": [d]}, "conv_ln": {"scale", "bias"},
     "head": ...}                                                                       # models/heads.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .bert import Bert, _linear, _ln, encoder_outputs
from .heads import STYLES, Style, init as init_head
from ._layers import Params, activation, embed, fused_qkv, layer_norm, linear, matmul, normal_init, positions

POS_ATT_TYPES = ("c2p", "p2c")
NORM_REL_EBD = ("none", "layer_norm")


def _names(value: Any) -> tuple[str, ...]:
    """``"p2c|c2p"``, a list, or None (Hugging Face's forms of ``pos_att_type`` and ``norm_rel_ebd``) -> a tuple."""
    if value is None:
        return ()
    items = value.split("|") if isinstance(value, str) else list(value)
    return tuple(str(x).strip().lower() for x in items)


def log_buckets(bucket_size: int, max_position: int, span: int) -> np.ndarray:
    """Hugging Face's ``make_log_bucket_position`` of the distances ``0..A``: ``table[a]`` is the bucket of a relative
    position ``a`` (of ``-a``: ``-table[a]``). Distances up to ``bucket_size // 2`` are their own bucket, farther ones
    share log-spaced buckets. Computed here in float32 in Hugging Face's order of operations, so each bucket is
    the one PyTorch gives; ``A`` is the first distance whose bucket reaches ``span``, from where on every gather
    index is clipped alike (the buckets only grow), so a longer distance reads ``table[A]``."""
    mid = bucket_size // 2
    table = list(range(mid + 1))
    den = np.log(np.float32((max_position - 1) / mid))
    a = mid
    while table[-1] < span:
        a += 1
        num = np.log(np.float32(a) / np.float32(mid))
        table.append(int(np.ceil(num / den * np.float32(mid - 1))) + mid)
    return np.asarray(table, np.int32)


@dataclass(frozen=True)
class DebertaV2(Bert):
    vocab_size: int = 128100
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = True
    max_relative_positions: int = -1  # < 1: max_position_embeddings
    position_buckets: int = 256  # <= 0: no buckets, relative positions clipped at +-max_relative_positions
    position_biased_input: bool = False  # absolute position embeddings added to the input (DeBERTa-v2's)
    pos_att_type: tuple = ("p2c", "c2p")  # the disentangled terms: content-to-position, position-to-content
    share_att_key: bool = True  # the relative embeddings through the content's key and query projections
    norm_rel_ebd: str = "layer_norm"  # none | layer_norm: a LayerNorm on the relative embeddings
    embedding_size: int | None = None  # the embeddings' width, projected to hidden_size; None: hidden_size
    attention_head_size: int | None = None  # None: hidden_size / num_attention_heads (the only one that runs)
    conv_kernel_size: int = 0  # > 0: a Conv1d over the embeddings added after the first layer (DeBERTa-v2 xlarge)
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_hidden_act: str = "gelu"  # the sequence classifier's ContextPooler: act(dense(h[:, 0]))
    pooler_hidden_size: int | None = None  # None: hidden_size (the only one that runs)
    legacy: bool = True  # the masked-LM head's names: cls.predictions (legacy) or lm_predictions (the same math)

    name: ClassVar[str] = "deberta-v2"
    style: ClassVar[Style] = STYLES["deberta-v2"]

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "pos_att_type", _names(self.pos_att_type))
        object.__setattr__(self, "norm_rel_ebd", "|".join(_names(self.norm_rel_ebd)) or "none")
        heads, d = self.num_attention_heads, self.hidden_size
        unknown = [t for t in self.pos_att_type if t not in POS_ATT_TYPES]
        if unknown:
            raise ValueError(f"pos_att_type={'|'.join(self.pos_att_type)}: {unknown[0]!r} is not a disentangled "
                             f"term; implemented: {', '.join(POS_ATT_TYPES)} (joined by |, or a list).")
        if any(n not in NORM_REL_EBD for n in _names(self.norm_rel_ebd)):
            raise ValueError(f"norm_rel_ebd={self.norm_rel_ebd!r} is not implemented; one of {', '.join(NORM_REL_EBD)}.")
        for key, value, only in (("attention_head_size", self.attention_head_size, d // heads),
                                 ("pooler_hidden_size", self.pooler_hidden_size, d)):
            if value is not None and value != only:
                raise ValueError(f"{key}={value}: only {key}={only} runs (hidden_size={d}, num_attention_heads="
                                 f"{heads}), where DebertaV2's output layers are hidden_size wide.")
        activation(self.pooler_hidden_act, "pooler_hidden_act")
        if self.conv_kernel_size:
            activation(self.conv_act, "conv_act")
            if self.conv_kernel_size % 2 == 0 or d % self.conv_groups:
                raise ValueError(f"conv_kernel_size={self.conv_kernel_size}, conv_groups={self.conv_groups}: the "
                                 f"convolution keeps the length only with an odd kernel, over groups that divide "
                                 f"hidden_size={d}.")
        if self.relative_attention and self.position_buckets > 0:
            mid = self.position_buckets // 2
            if mid < 2 or self._max_relative() - 1 <= mid:
                raise ValueError(f"position_buckets={self.position_buckets} with max_relative_positions="
                                 f"{self._max_relative()}: log buckets need position_buckets >= 4 and "
                                 "max_relative_positions - 1 > position_buckets // 2.")
        if self.task == "masked_lm" and not self.legacy and self._emb() != d:
            raise ValueError(f"legacy=false with embedding_size={self._emb()}: the masked-LM head lm_predictions "
                             f"multiplies hidden_size={d} wide states by the embeddings, which runs only with "
                             "embedding_size = hidden_size (legacy=true transforms to embedding_size).")

    @property
    def checkpoint_head(self) -> str:
        """The head's names in ``models/hf.py``'s table: ``DebertaV2ForMaskedLM`` with ``legacy=false`` saves its
        masked-LM head (dense, activation, LayerNorm, the word embeddings and a bias, as the legacy one) as
        ``lm_predictions.lm_head``."""
        return "masked_lm:lm_predictions" if self.task == "masked_lm" and not self.legacy else self.task

    def _max_relative(self) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    def span(self) -> int:
        """How many relative positions each side the relative embeddings hold (``att_span``)."""
        return self.position_buckets if self.position_buckets > 0 else self._max_relative()

    def _emb(self) -> int:
        return self.embedding_size or self.hidden_size

    def init(self, key: jax.Array) -> Params:
        d, ff, e = self.hidden_size, self.intermediate_size, self._emb()
        k_word, k_pos, k_type, k_proj, k_rel, k_conv, *k_layers = jax.random.split(key, 6 + self.num_hidden_layers)
        embeddings: Params = {"word": normal_init(k_word, (self.vocab_size, e))}
        if self.position_biased_input:
            embeddings["position"] = normal_init(k_pos, (self.max_position_embeddings, e))
        if self.type_vocab_size:
            embeddings["token_type"] = normal_init(k_type, (self.type_vocab_size, e))
        if e != d:
            embeddings["proj"] = {"weight": normal_init(k_proj, (d, e))}
        embeddings["ln"] = _ln(d)
        params: Params = {"embeddings": embeddings}
        if self.relative_attention:
            params["rel_embeddings"] = normal_init(k_rel, (2 * self.span(), d))
        if "layer_norm" in self.norm_rel_ebd.split("|"):
            params["rel_ln"] = _ln(d)
        layers = []
        for k in k_layers:
            kq, kk, kv, ko, ki, kd, kpk, kpq = jax.random.split(k, 8)
            layer = {"query": _linear(kq, d, d), "key": _linear(kk, d, d), "value": _linear(kv, d, d),
                     "attn_out": _linear(ko, d, d), "attn_ln": _ln(d),
                     "intermediate": _linear(ki, d, ff), "output": _linear(kd, ff, d), "output_ln": _ln(d)}
            if self.relative_attention and not self.share_att_key:
                if "c2p" in self.pos_att_type:
                    layer["pos_key"] = _linear(kpk, d, d)
                if "p2c" in self.pos_att_type:
                    layer["pos_query"] = _linear(kpq, d, d)
            layers.append(layer)
        params["layers"] = layers
        if self.conv_kernel_size:
            params["conv"] = {"weight": normal_init(k_conv, (d, d // self.conv_groups, self.conv_kernel_size)),
                              "bias": jnp.zeros((d,), jnp.float32)}
            params["conv_ln"] = _ln(d)
        if self.task != "none":
            params["head"] = init_head(jax.random.fold_in(key, 1), self.task, self.style, d, self.num_labels,
                                        self.vocab_size, _linear, _ln, e)
        return params

    def relative_positions(self, seq: Any) -> jax.Array:
        """``rel[i, j]``, ``[seq, seq]``: ``i - j``, or its log bucket (``build_relative_position``)."""
        ids = jnp.arange(seq, dtype=jnp.int32)
        rel = ids[:, None] - ids[None, :]
        if self.position_buckets <= 0:
            return rel
        table = jnp.asarray(log_buckets(self.position_buckets, self._max_relative(), self.span()))
        return jnp.sign(rel) * jnp.take(table, jnp.minimum(jnp.abs(rel), table.shape[0] - 1), axis=0)

    def _attention(self, p: Params, h: jax.Array, keep: jax.Array, rel_emb: jax.Array | None,
                   rel: jax.Array | None) -> jax.Array:
        b, s, d = h.shape
        n = self.num_attention_heads
        terms = [t for t in POS_ATT_TYPES if t in self.pos_att_type]
        inv = 1.0 / float(np.sqrt(np.float32(d // n) * (1 + len(terms))))  # scaled_size_sqrt, as PyTorch computes it
        w_qkv, b_qkv = fused_qkv(p["query"], p["key"], p["value"], inv)  # q scaled: every term q . x is divided
        qkv = (matmul(h, w_qkv) + b_qkv).reshape(b, s, 3, n, d // n)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqnh,bknh->bnqk", q, k)
        if rel_emb is not None:
            span = self.span()
            heads = (2 * span, n, d // n)
            if "c2p" in terms:
                pos_key = linear(p["key"] if self.share_att_key else p["pos_key"], rel_emb).reshape(heads)
                c2p = jnp.einsum("bqnh,rnh->bnqr", q, pos_key)  # [b, n, s, 2 span]: q_i against every bucket
                at = jnp.clip(rel + span, 0, 2 * span - 1)
                scores = scores + jnp.take_along_axis(c2p, jnp.broadcast_to(at, (b, n, s, s)), axis=-1)
            if "p2c" in terms:
                pos_query = linear(p["query"] if self.share_att_key else p["pos_query"], rel_emb) * inv
                p2c = jnp.einsum("bknh,rnh->bnkr", k, pos_query.reshape(heads))  # k_j against every bucket
                at = jnp.clip(-rel + span, 0, 2 * span - 1)  # [key j, query i]: the bucket of -rel(j, i)
                gathered = jnp.take_along_axis(p2c, jnp.broadcast_to(at, (b, n, s, s)), axis=-1)
                scores = scores + jnp.swapaxes(gathered, -1, -2)
        scores = jnp.where(keep, scores, jnp.finfo(scores.dtype).min)
        ctx = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(scores, axis=-1), v)
        return ctx.reshape(b, s, d)

    def _conv(self, params: Params, e: jax.Array, h: jax.Array, real: jax.Array) -> jax.Array:
        """``ConvLayer``: a length-keeping Conv1d over the embeddings ``e``, zeroed at the padding, added to the
        first layer's output ``h``."""
        pad = (self.conv_kernel_size - 1) // 2
        out = jax.lax.conv_general_dilated(e, params["conv"]["weight"], (1,), [(pad, pad)],
                                           dimension_numbers=("NWC", "OIW", "NWC"),
                                           feature_group_count=self.conv_groups) + params["conv"]["bias"]
        out = activation(self.conv_act, "conv_act")(out * real)
        return layer_norm(params["conv_ln"], h + out, self.layer_norm_eps) * real

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array,
              token_type_ids: jax.Array | None = None) -> dict[str, jax.Array]:
        act = activation(self.hidden_act, "hidden_act")
        eps = self.layer_norm_eps
        emb = params["embeddings"]
        e = embed(emb["word"], input_ids)
        if "position" in emb:
            e = e + positions(emb["position"], input_ids.shape[1])
        if "token_type" in emb:
            e = e + embed(emb["token_type"], token_type_ids)
        if "proj" in emb:
            e = matmul(e, emb["proj"]["weight"].T)
        mask = attention_mask != 0
        real = mask[..., None].astype(e.dtype)
        e = layer_norm(emb["ln"], e, eps) * real
        keep = (mask[:, None, :, None] & mask[:, None, None, :])  # [b, 1, q, k]: both real
        rel_emb = rel = None
        if self.relative_attention:
            rel_emb = params["rel_embeddings"]
            if "rel_ln" in params:
                rel_emb = layer_norm(params["rel_ln"], rel_emb, eps)
            rel = self.relative_positions(input_ids.shape[1])
        h = e
        for i, p in enumerate(params["layers"]):
            a = layer_norm(p["attn_ln"], h + linear(p["attn_out"], self._attention(p, h, keep, rel_emb, rel)), eps)
            h = layer_norm(p["output_ln"], a + linear(p["output"], act(linear(p["intermediate"], a))), eps)
            if i == 0 and "conv" in params:
                h = self._conv(params, e, h, real)
        return encoder_outputs(self, params, h, attention_mask, self.pooler_hidden_act)

    def max_positions(self) -> int | None:
        """The absolute position table's size where the input has one (``position_biased_input``); else None:
        relative positions hold any ``seq``."""
        return self.max_position_embeddings if self.position_biased_input else None


V1_ONLY = (("position_buckets", 0), ("share_att_key", False), ("norm_rel_ebd", "none"), ("conv_kernel_size", 0))


@dataclass(frozen=True)
class Deberta(DebertaV2):
    """DeBERTa (``model_type: deberta``: microsoft/deberta-base and -large, deberta-large-mnli and their fine-tunes):
    DeBERTa-v2's disentangled attention without its additions (no log buckets: relative positions clipped at
    ``max_relative_positions``; the position projections of their own, the key's without a bias; no LayerNorm of the
    relative embeddings; no convolution), and its query, key and value one Linear without a bias (``in_proj``, each
    head's ``q | k | v`` in turn) with a bias for the query and the value (``q_bias``, ``v_bias``). Defaults:
    deberta-base's. Params: as DeBERTa-v2's, each layer's ``query``, ``key`` and ``value`` replaced by ``"in_proj":
    {"weight": [3 d, d]}, "q_bias": [d], "v_bias": [d]``, its ``pos_key`` without ``bias``."""

    vocab_size: int = 50265
    max_relative_positions: int = -1
    position_buckets: int = 0
    pos_att_type: tuple = ("c2p", "p2c")
    share_att_key: bool = False
    norm_rel_ebd: str = "none"

    name: ClassVar[str] = "deberta"
    style: ClassVar[Style] = STYLES["deberta"]

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, only in V1_ONLY:
            if getattr(self, key) != only:
                raise ValueError(f"{key}={getattr(self, key)!r} is a DeBERTa-v2 setting; DeBERTa (v1) runs only "
                                 f"{key}={only!r} (model=deberta-v2 for a v2 or v3 checkpoint).")

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        d = self.hidden_size
        for i, layer in enumerate(params["layers"]):
            k = jax.random.fold_in(key, 100 + i)
            for name in ("query", "key", "value"):
                del layer[name]
            layer.update(in_proj={"weight": normal_init(k, (3 * d, d))}, q_bias=jnp.zeros((d,), jnp.float32),
                         v_bias=jnp.zeros((d,), jnp.float32))
            if "pos_key" in layer:
                del layer["pos_key"]["bias"]
        return params

    def _attention(self, p: Params, h: jax.Array, keep: jax.Array, rel_emb: jax.Array | None,
                   rel: jax.Array | None) -> jax.Array:
        n, d = self.num_attention_heads, self.hidden_size
        w = p["in_proj"]["weight"].reshape(n, 3, d // n, d)  # [head, q | k | v, head_dim, d]: Hugging Face's chunks
        q, k, v = ({"weight": w[:, i].reshape(d, d)} for i in range(3))
        return super()._attention({**p, "query": {**q, "bias": p["q_bias"]}, "key": k,
                                   "value": {**v, "bias": p["v_bias"]}}, h, keep, rel_emb, rel)


__all__ = ["Deberta", "DebertaV2", "log_buckets"]
