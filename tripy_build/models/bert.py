"""BERT (Hugging Face ``BertModel``, with its pooler), in plain JAX.

Fields are ``BertConfig``'s keys, defaults BERT-base (``bert-base-uncased``'s sizes), so a
checkpoint's ``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``).

Inputs (int32 ``[batch, seq]``, Hugging Face's names): ``input_ids``, ``attention_mask`` (1 = real
token, 0 = padding), ``token_type_ids``. Output: ``{"last_hidden_state": [batch, seq, hidden_size],
"pooler_output": [batch, hidden_size]}``. Positions are ``0..seq-1`` (``BertModel`` without
``position_ids``).

    h = LN(word[ids] + token_type[types] + position[0..s-1])
    per layer: a = LN(h + Out(Attention(h)));  h = LN(a + Down(act(Up(a))))     # post-LN
    pooler_output = tanh(Pooler(h[:, 0]))

Masking: keys where ``attention_mask == 0`` get the additive bias ``finfo(float32).min`` (as
Hugging Face does), so they get zero attention weight and a fully masked row stays finite. Every
other step acts on each position alone and every batch row alone: a sequence padded at the end with
``attention_mask = 0`` (any valid ids there) gives, at its real positions and in ``pooler_output``
(position 0), the unpadded result. Hence ``padding = {"batch": "rows", "seq": {"mask_input":
"attention_mask"}}``. Token ids and token types out of range are clamped (never NaN); positions past
``max_position_embeddings`` reuse the last row, where Hugging Face raises: keep ``seq`` within it.

Params (Hugging Face's layouts: Linear weights ``[out, in]``; loading a checkpoint is a rename)::

    {"embeddings": {"word": [vocab_size, d], "position": [max_position_embeddings, d],
                    "token_type": [type_vocab_size, d], "ln": {"scale": [d], "bias": [d]}},
                    # ELECTRA's: these [.., embedding_size] wide, and "proj": {"weight": [d, embedding_size], "bias"}
     "layers": [{"query" | "key" | "value" | "attn_out": {"weight": [d, d], "bias": [d]},
                 "attn_ln": {"scale", "bias"},
                 "intermediate": {"weight": [intermediate_size, d], "bias": [intermediate_size]},
                 "output": {"weight": [d, intermediate_size], "bias": [d]},
                 "output_ln": {"scale", "bias"}}, ...],          # num_hidden_layers of them
     "pooler": {"weight": [d, d], "bias": [d]}}

``apply`` concatenates query/key/value into one ``[d, 3d]`` matmul (with the 1/sqrt(head_dim) scale
folded into the query part): weight-only work, done once at load by tripy_build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._tokens import TokenInputs
from .heads import Headed, STYLES, Style, apply as apply_head, has_pooler, init as init_head, sentence_embedding
from ._layers import (
    Params, activation, attend, embed, fused_qkv, layer_norm, linear, mask_bias, matmul, normal_init, positions,
)


def _linear(key: jax.Array, dim_in: int, dim_out: int) -> Params:
    return {"weight": normal_init(key, (dim_out, dim_in)), "bias": jnp.zeros((dim_out,), jnp.float32)}


def _ln(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


@dataclass(frozen=True)
class Bert(Headed, TokenInputs):
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    head: str = "auto"  # models/heads.HEADS; auto: the checkpoint's (config.json's architectures), none without one
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label; default LABEL_0, LABEL_1, ...)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels
    pooling: str = "none"  # none | mean | cls: a sentence_embedding output (the encoder alone), as sentence-transformers
    normalize: bool = False  # the sentence_embedding scaled to unit length (cosine similarity as a dot product)

    name: ClassVar[str] = "bert"
    style: ClassVar[Style] = STYLES["bert"]
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        check_encoder(self)

    def position_ids(self, input_ids: jax.Array, table: jax.Array) -> jax.Array:
        """The position rows, ``[seq, d]`` (or ``[b, seq, d]``): ``0..seq-1`` (RoBERTa counts from its pad id)."""
        return positions(table, input_ids.shape[1])

    def embedding_width(self) -> int:
        """The embeddings' width: the layers' (ELECTRA's and ALBERT's may be narrower, projected to
        ``hidden_size``)."""
        return self.hidden_size

    def projects(self) -> bool:
        """Whether the embeddings go through a Linear to the layers' width (``embeddings.proj``): where the widths
        differ (ALBERT's always)."""
        return self.embedding_width() != self.hidden_size

    def init_stack(self, keys: list[jax.Array], d: int, ff: int) -> Params:
        """The layers' params: ``{"layers": [...]}``, one per key (ALBERT's: its shared groups)."""
        return {"layers": init_layers(keys, d, ff)}

    def stack(self, params: Params) -> list[Params]:
        """The params of each layer the states go through, in order (ALBERT's: its groups' layers, repeated)."""
        return params["layers"]

    def init(self, key: jax.Array) -> Params:
        d, e, ff = self.hidden_size, self.embedding_width(), self.intermediate_size
        k_word, k_pos, k_type, k_pool, *k_layers = jax.random.split(key, 4 + self.num_hidden_layers)
        embeddings = {"word": normal_init(k_word, (self.vocab_size, e)),
                      "position": normal_init(k_pos, (self.max_position_embeddings, e)), "ln": _ln(e)}
        if self.type_vocab_size:
            embeddings["token_type"] = normal_init(k_type, (self.type_vocab_size, e))
        if self.projects():
            embeddings["proj"] = _linear(jax.random.fold_in(key, 2), e, d)
        params = {"embeddings": embeddings, **self.init_stack(k_layers, d, ff)}
        if has_pooler(self.task, self.style):
            params["pooler"] = _linear(k_pool, d, d)
        if self.task != "none":
            params["head"] = init_head(jax.random.fold_in(key, 1), self.task, self.style, d, self.num_labels,
                                        self.vocab_size, _linear, _ln, embedding_size=e)
        return params

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array,
              token_type_ids: jax.Array | None = None) -> dict[str, jax.Array]:
        emb = params["embeddings"]
        h = embed(emb["word"], input_ids) + self.position_ids(input_ids, emb["position"])
        if "token_type" in emb:
            h = h + embed(emb["token_type"], token_type_ids)
        h = layer_norm(emb["ln"], h, self.layer_norm_eps)
        if "proj" in emb:  # ELECTRA's embeddings_project, ALBERT's embedding_hidden_mapping_in
            h = linear(emb["proj"], h)
        h = encode(self, self.stack(params), h, mask_bias(attention_mask != 0, h.dtype)[:, None, None, :])
        return encoder_outputs(self, params, h, attention_mask)

    def _names(self) -> tuple[str, ...]:
        return ("input_ids", "attention_mask", "token_type_ids")[:3 if self.type_vocab_size else 2]

    def max_positions(self) -> int:
        """The longest sequence the position table holds: a build's ``seq`` beyond it is refused."""
        return self.max_position_embeddings


POOLINGS = ("none", "mean", "cls")


def check_encoder(model: Any) -> None:
    """The settings of a BERT-like encoder (``Bert``, ``models/mpnet.MPNet``, ``models/modernbert.ModernBert``): its
    sizes, activation, head and sentence embedding; ``ValueError`` naming the setting."""
    if model.hidden_size % model.num_attention_heads:
        raise ValueError(
            f"hidden_size ({model.hidden_size}) must be divisible by "
            f"num_attention_heads ({model.num_attention_heads})."
        )
    activation(model.hidden_act, "hidden_act")
    model.check_head()
    model.check_pooling(POOLINGS)


def init_layers(keys: list[jax.Array], d: int, ff: int) -> list[Params]:
    """BERT's post-LN layers (``layers`` of the tree above), one per key."""
    layers = []
    for k in keys:
        kq, kk, kv, ko, ki, kd = jax.random.split(k, 6)
        layers.append({
            "query": _linear(kq, d, d), "key": _linear(kk, d, d), "value": _linear(kv, d, d),
            "attn_out": _linear(ko, d, d), "attn_ln": _ln(d),
            "intermediate": _linear(ki, d, ff), "output": _linear(kd, ff, d), "output_ln": _ln(d),
        })
    return layers


def encode(model: Any, layers: list[Params], h: jax.Array, bias: jax.Array) -> jax.Array:
    """``h`` through BERT's post-LN layers, each attention's scores plus ``bias`` (broadcast to ``[b, heads, s,
    s]``: the padding mask over the keys, and MPNet's relative position bias)."""
    act = activation(model.hidden_act, "hidden_act")
    eps = model.layer_norm_eps
    n_heads = model.num_attention_heads
    scale = 1.0 / math.sqrt(model.hidden_size // n_heads)
    for p in layers:
        w_qkv, b_qkv = fused_qkv(p["query"], p["key"], p["value"], scale)
        ctx = attend(matmul(h, w_qkv) + b_qkv, n_heads, bias)
        a = layer_norm(p["attn_ln"], h + linear(p["attn_out"], ctx), eps)
        ff = linear(p["output"], act(linear(p["intermediate"], a)))
        h = layer_norm(p["output_ln"], a + ff, eps)
    return h


def encoder_outputs(model: Any, params: Params, h: jax.Array, attention_mask: jax.Array,
                    pooler_act: str = "tanh", pooled: jax.Array | None = None) -> dict[str, jax.Array]:
    """The outputs from the last layer's states ``h``: the pooler's (where the tree has one), the head's (``pooler_act``:
    a ``dense_act`` or ``transform`` head's activation; ``pooled``: what a ``transform`` sequence classifier reads,
    ModernBERT's pooling of ``h``), and the sentence embedding (``pooling``)."""
    if "pooler" in params:
        pooled = jnp.tanh(linear(params["pooler"], h[:, 0]))
    out = apply_head(params.get("head", {}), model.task, model.style, h, pooled, params["embeddings"]["word"],
                     model.hidden_act, model.layer_norm_eps, pooler_act)
    if model.pooling != "none":
        out["sentence_embedding"] = sentence_embedding(h, attention_mask, model.pooling, model.normalize)
    return out


def counted_positions(table: jax.Array, input_ids: jax.Array, pad_id: int) -> jax.Array:
    """The position rows ``[b, seq, d]`` counted from ``pad_id`` as fairseq counts them (Hugging Face's
    ``create_position_ids_from_input_ids``): the first token that is not ``pad_id`` at ``pad_id + 1``, a pad token
    at the pad row. Each position counts only the tokens before it: padding at the end moves no real one."""
    real = (input_ids != pad_id).astype(jnp.int32)
    return embed(table, jnp.cumsum(real, axis=1) * real + pad_id)


@dataclass(frozen=True)
class Roberta(Bert):
    """RoBERTa (``RobertaModel`` and its heads): BERT's encoder with positions counted from the pad id
    (``pad_token_id + 1`` for the first token: Hugging Face's ``create_position_ids_from_input_ids``), one token
    type, and its own heads (``STYLES``). ``max_position_embeddings`` holds ``pad_token_id + 1`` rows
    before the first position: roberta-base's 514 serve 512 tokens."""

    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1

    name: ClassVar[str] = "roberta"
    style: ClassVar[Style] = STYLES["roberta"]

    def position_ids(self, input_ids: jax.Array, table: jax.Array) -> jax.Array:
        return counted_positions(table, input_ids, self.pad_token_id)

    def max_positions(self) -> int:
        return self.max_position_embeddings - self.pad_token_id - 1


@dataclass(frozen=True)
class XLMRoberta(Roberta):
    """XLM-RoBERTa: RoBERTa's architecture (``model_type`` ``xlm-roberta``), a 250k vocabulary."""

    vocab_size: int = 250002
    name: ClassVar[str] = "xlm-roberta"


@dataclass(frozen=True)
class DistilBert(Bert):
    """DistilBERT (``DistilBertModel`` and its heads): BERT's post-LN encoder without token types or pooler,
    6 layers. Its ``config.json`` names (``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``, ``activation``) are
    read as BERT's (``models/hf.py``)."""

    num_hidden_layers: int = 6
    type_vocab_size: int = 0

    name: ClassVar[str] = "distilbert"
    style: ClassVar[Style] = STYLES["distilbert"]


@dataclass(frozen=True)
class Camembert(Roberta):
    """CamemBERT (``CamembertModel`` and its heads: camembert-base and the French fine-tunes): RoBERTa's
    architecture under its own ``model_type``, a 32k sentencepiece vocabulary."""

    vocab_size: int = 32005
    name: ClassVar[str] = "camembert"


@dataclass(frozen=True)
class Electra(Bert):
    """ELECTRA (``ElectraModel`` and its heads: google/electra-*-discriminator and -generator and their fine-tunes):
    BERT's encoder under embeddings ``embedding_size`` wide, projected to ``hidden_size`` where the two differ
    (``embeddings.proj``: Hugging Face's ``embeddings_project``), no pooler, and its own heads (``STYLES``: the
    sequence classifier reads the first token through a dense layer and GELU; the masked LM, the generator's, through
    a dense layer to ``embedding_size``, GELU and a LayerNorm). Defaults: electra-base-discriminator's sizes."""

    embedding_size: int = 768

    name: ClassVar[str] = "electra"
    style: ClassVar[Style] = STYLES["electra"]

    def embedding_width(self) -> int:
        return self.embedding_size


@dataclass(frozen=True)
class Albert(Bert):
    """ALBERT (``AlbertModel`` and its heads: albert-base-v2 and its fine-tunes): BERT's layers shared across the
    depth: ``num_hidden_groups`` groups of ``inner_group_num`` layers each, layer ``i`` of ``num_hidden_layers`` running
    group ``int(i / (num_hidden_layers / num_hidden_groups))``'s layers in turn (``params["groups"]``, in place of
    ``layers``); the embeddings ``embedding_size`` wide, always through a Linear to ``hidden_size``
    (``embedding_hidden_mapping_in``); BERT's pooler and heads, the masked LM's transform to ``embedding_size``.
    Defaults: albert-base-v2's sizes."""

    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_act: str = "gelu_new"
    num_hidden_groups: int = 1
    inner_group_num: int = 1

    name: ClassVar[str] = "albert"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.num_hidden_groups <= self.num_hidden_layers or self.inner_group_num < 1:
            raise ValueError(f"num_hidden_groups={self.num_hidden_groups}, inner_group_num={self.inner_group_num}: "
                             f"ALBERT shares 1 to num_hidden_layers ({self.num_hidden_layers}) groups of one layer or "
                             "more.")

    def embedding_width(self) -> int:
        return self.embedding_size

    def projects(self) -> bool:
        return True

    def init_stack(self, keys: list[jax.Array], d: int, ff: int) -> Params:
        groups = jax.random.split(keys[0], self.num_hidden_groups)
        return {"groups": [init_layers(list(jax.random.split(g, self.inner_group_num)), d, ff) for g in groups]}

    def stack(self, params: Params) -> list[Params]:
        per = self.num_hidden_layers / self.num_hidden_groups
        return [layer for i in range(self.num_hidden_layers) for layer in params["groups"][int(i / per)]]
