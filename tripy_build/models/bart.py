"""BART (Hugging Face ``BartModel``, ``BartForSequenceClassification``, ``BartForQuestionAnswering``,
``BartForConditionalGeneration``) and Marian (``MarianModel``, ``MarianMTModel``: the Helsinki-NLP/opus-mt-*
translators), in plain JAX.

Fields are ``BartConfig``'s keys, defaults bart-large's (facebook/bart-large-mnli's sizes: the zero-shot
pipeline's default model), so a checkpoint's ``config.json`` maps onto the dataclass by key (``models/hf.py``).

Inputs (int32 ``[batch, seq]``): ``input_ids``, ``attention_mask``. BART is an encoder and a decoder; the heads
here read the decoder's states for the text itself, as Hugging Face's do when no ``decoder_input_ids`` are given:
the decoder's input is ``input_ids`` shifted one to the right, ``decoder_start_token_id`` first.

    enc = LN(shared[ids] * scale + enc_pos[2 + 0..s-1])
    per encoder layer (post-LN): a = LN(h + SelfAttention(h, padding masked)); h = LN(a + fc2(act(fc1(a))))
    dec = LN(shared[shift(ids)] * scale + dec_pos[2 + 0..s-1])
    per decoder layer: a = LN(h + CausalSelfAttention(h)); c = LN(a + CrossAttention(a, enc, padding masked));
                       h = LN(c + fc2(act(fc1(c))))

(``scale``: sqrt(d_model) with ``scale_embedding``, else 1; the position tables hold two rows before the first
position, as BART's learned positions do.) Outputs: ``none`` ``{"last_hidden_state": the decoder's,
"encoder_last_hidden_state"}``; ``sequence_classification`` ``{"logits": [batch, num_labels]}``: each row's last
``eos_token_id`` among its real tokens (``attention_mask`` 1) through dense, tanh and ``out_proj`` (Hugging Face's
``BartClassificationHead``; it refuses a batch whose rows lack the token, and so does a call here: ``input_ids``
declares that every row holds it, ``InputInfo.holds``); ``question_answering`` ``{"start_logits", "end_logits"}``;
``conditional_generation`` ``{"logits": [batch, seq, vocab]}``: the decoder's states through the shared table (the
LM head is tied to it) plus ``final_logits_bias``. With that head ``task=generate`` builds ``encode`` and ``step``
(``models/_seq2seq.py``): the summarizers (bart-large-cnn, distilbart) and BART's other fine-tunes generate.

Padding at the end is exact: the encoder and the cross-attention mask the padded keys, the decoder is causal, and
the classifier reads a real position. Hence ``padding = {"batch": "rows", "seq": {"mask_input":
"attention_mask"}}``.

Params (Hugging Face's layouts, Linear weights ``[out, in]``)::

    {"shared": [vocab_size, d],
     "encoder": {"position": [max_position_embeddings + 2, d], "ln": LN,
                 "layers": [{"q" | "k" | "v" | "out" | "fc1" | "fc2": Linear, "attn_ln" | "final_ln": LN}, ...]},
     "decoder": {... as the encoder's, each layer also "cross_q" | "cross_k" | "cross_v" | "cross_out": Linear,
                 "cross_ln": LN},
     "head": {"dense": Linear, "out": Linear} (sequence classification) | {"out": Linear [2, d]} (QA)
             | {"final_logits_bias": [1, vocab_size]} (conditional generation)}

Marian (``Marian``, ``MarianConfig``'s keys, defaults opus-mt-en-de's) is BART's layers with two differences: its
positions are fixed sinusoids (``MarianSinusoidalPositionalEmbedding``: ``pos / 10000 ** (2 * (j // 2) / d)``, the
sines of the even features in the first half, the cosines of the odd ones in the second, from position 0: no
offset), a constant rather than a parameter; and no LayerNorm follows the embeddings::

    enc = shared[ids] * scale + sinusoids[0..s-1]        dec = shared[shift(ids)] * scale + sinusoids[0..s-1]

Its params have neither ``"position"`` nor ``"ln"`` (``{"encoder": {"layers": [...]}, ...}``), and its heads are
``none`` and ``conditional_generation`` (the decoder's start token is the pad's: 58100 in opus-mt-en-de).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ._layers import (
    Params, activation, attend, embed, fused_qkv, grouped_attention, head_embed, head_logits, layer_norm, linear,
    mask_bias, matmul, normal_init, positions,
)
from ._seq2seq import DecoderSized, attend_step, layer_of, step_bias, write_step
from ._tokens import TokenInputs
from .bert import _linear, _ln
from .heads import Headed, last_real

OFFSET = 2  # the rows BART's learned position tables hold before position 0


@lru_cache(maxsize=8)
def sinusoids(rows: int, d: int) -> np.ndarray:
    """Marian's fixed position table ``[rows, d]`` (``MarianSinusoidalPositionalEmbedding.create_weight``): position
    ``p`` over ``10000 ** (2 * (j // 2) / d)`` for feature ``j``, the even features' sines in the first half, the odd
    ones' cosines in the second; computed in float64, returned in float32 (read-only: cached)."""
    angles = np.arange(rows, dtype=np.float64)[:, None] / np.power(10000, 2 * (np.arange(d) // 2) / d)[None, :]
    table = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1).astype(np.float32)
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class Bart(Headed, TokenInputs, DecoderSized):
    vocab_size: int = 50265
    d_model: int = 1024
    encoder_layers: int = 12
    decoder_layers: int = 12
    encoder_attention_heads: int = 16
    decoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    decoder_ffn_dim: int = 4096
    activation_function: str = "gelu"
    max_position_embeddings: int = 1024
    scale_embedding: bool = False
    decoder_start_token_id: int = 2
    eos_token_id: int | None = 2  # the token the sequence classifier reads (null under the other heads: unread)
    # none | sequence_classification | question_answering | conditional_generation (task=generate); auto: the
    # checkpoint's, none without
    head: str = "auto"
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function; null: by num_labels

    name: ClassVar[str] = "bart"
    HEADS: ClassVar[tuple[str, ...]] = ("none", "sequence_classification", "question_answering", "conditional_generation")
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}
    LEARNED_POSITIONS: ClassVar[bool] = True  # each side's position table a parameter ("position"); else sinusoids
    EMBEDDING_LN: ClassVar[bool] = True  # a LayerNorm ("ln") over each side's embeddings

    def __post_init__(self) -> None:
        self.check_sizes()
        activation(self.activation_function, "activation_function")
        if self.task == "sequence_classification" and self.eos_token_id is None:
            raise ValueError("eos_token_id=null: BART's sequence classifier reads each row at its last "
                             "end-of-sequence token; give its id (config.json's eos_token_id).")
        self.check_head()
        if self.task != "sequence_classification":
            object.__setattr__(self, "eos_token_id", None)

    def input_holds(self) -> dict[str, int]:
        """The sequence classifier reads each row at its last ``eos_token_id``: every row must hold one."""
        return {"input_ids": self.eos_token_id} if self.task == "sequence_classification" else {}

    def max_positions(self) -> int:
        """The longest sequence the position tables hold: a build's ``seq`` beyond it is refused."""
        return self.max_position_embeddings

    def init(self, key: jax.Array) -> Params:
        d = self.d_model
        k_shared, k_enc, k_dec, k_epos, k_dpos, k_dense, k_out = jax.random.split(key, 7)
        rows = self.max_position_embeddings + OFFSET

        def embedding(k_pos: jax.Array) -> Params:
            return {**({"position": normal_init(k_pos, (rows, d))} if self.LEARNED_POSITIONS else {}),
                    **({"ln": _ln(d)} if self.EMBEDDING_LN else {})}
        params = {"shared": normal_init(k_shared, (self.vocab_size, d)),
                  "encoder": {**embedding(k_epos),
                              "layers": self.layer_stack(k_enc, self.encoder_layers, self.encoder_ffn_dim, False)},
                  "decoder": {**embedding(k_dpos),
                              "layers": self.layer_stack(k_dec, self.decoder_layers, self.decoder_ffn_dim, True)}}
        if self.task == "sequence_classification":
            params["head"] = {"dense": _linear(k_dense, d, d), "out": _linear(k_out, d, self.num_labels)}
        elif self.task == "question_answering":
            params["head"] = {"out": _linear(k_out, d, 2)}
        elif self.task == "conditional_generation":
            params["head"] = {"final_logits_bias": jnp.zeros((1, self.vocab_size), jnp.float32)}
        return params

    def _positions(self, side: Params, dtype: Any) -> jax.Array:
        """``side``'s (the encoder's or the decoder's) position table from position 0: its learned one, or the
        sinusoids (a constant, in the weights' dtype)."""
        if self.LEARNED_POSITIONS:
            return side["position"][OFFSET:]
        return jnp.asarray(sinusoids(self.max_position_embeddings, self.d_model), dtype)

    def _normed(self, side: Params, h: jax.Array) -> jax.Array:
        """The embeddings through ``side``'s LayerNorm, where it has one."""
        return layer_norm(side["ln"], h) if self.EMBEDDING_LN else h

    def _embedded(self, params: Params, side: Params, ids: jax.Array) -> jax.Array:
        scale = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        h = embed(params["shared"], ids) * scale
        return self._normed(side, h + positions(self._positions(side, params["shared"].dtype), ids.shape[1]))

    def _ffn(self, p: Params, h: jax.Array) -> jax.Array:
        act = activation(self.activation_function, "activation_function")
        return layer_norm(p["final_ln"], h + linear(p["fc2"], act(linear(p["fc1"], h))))

    def _encoded(self, params: Params, input_ids: jax.Array, keys: jax.Array) -> jax.Array:
        """The encoder's last hidden state; ``keys``: the padded source positions' additive mask."""
        enc = params["encoder"]
        heads = self.encoder_attention_heads
        h = self._embedded(params, enc, input_ids)
        for p in enc["layers"]:
            w_qkv, b_qkv = fused_qkv(p["q"], p["k"], p["v"], 1.0 / math.sqrt(self.d_model // heads))
            h = self._ffn(p, layer_norm(p["attn_ln"], h + linear(p["out"], attend(matmul(h, w_qkv) + b_qkv, heads, keys))))
        return h

    def _logits(self, params: Params, h: jax.Array) -> jax.Array:
        """The LM head: the shared table (tied) and ``final_logits_bias``."""
        return head_logits(h, params["shared"]) + params["head"]["final_logits_bias"][0]

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        dec = params["decoder"]
        keys = mask_bias(attention_mask != 0, jnp.float32)[:, None, None, :]  # padded keys never attended
        encoded = self._encoded(params, input_ids, keys)

        start = jnp.full((input_ids.shape[0], 1), self.decoder_start_token_id, input_ids.dtype)
        shifted = jnp.concatenate([start, input_ids[:, :-1]], axis=1)
        s = input_ids.shape[1]
        causal = mask_bias(jnp.arange(s)[None, :] <= jnp.arange(s)[:, None], jnp.float32)[None, None]
        heads = self.decoder_attention_heads
        scale = 1.0 / math.sqrt(self.d_model // heads)
        h = self._embedded(params, dec, shifted)
        for p in dec["layers"]:
            w_qkv, b_qkv = fused_qkv(p["q"], p["k"], p["v"], scale)
            h = layer_norm(p["attn_ln"], h + linear(p["out"], attend(matmul(h, w_qkv) + b_qkv, heads, causal)))
            q = (linear(p["cross_q"], h) * scale).reshape(*h.shape[:2], heads, -1)
            k, v = (linear(p[f"cross_{n}"], encoded).reshape(*h.shape[:2], heads, -1).swapaxes(1, 2) for n in "kv")
            ctx = grouped_attention(q, k, v, keys).reshape(h.shape)
            h = self._ffn(p, layer_norm(p["cross_ln"], h + linear(p["cross_out"], ctx)))

        if self.task == "none":
            return {"last_hidden_state": h, "encoder_last_hidden_state": encoded}
        if self.task == "conditional_generation":
            return {"logits": self._logits(params, h)}
        if self.task == "question_answering":
            both = linear(params["head"]["out"], h)
            return {"start_logits": both[..., 0], "end_logits": both[..., 1]}
        at = last_real((input_ids == self.eos_token_id) & (attention_mask != 0))
        at_eos = jnp.take_along_axis(h, at[:, None, None], axis=1)[:, 0]
        return {"logits": linear(params["head"]["out"], jnp.tanh(linear(params["head"]["dense"], at_eos)))}

    # --- generation (head=conditional_generation): models/_seq2seq.py -------------------------------
    def encode(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        """The encoder over the source, and each decoder layer's cross-attention keys and values of its output."""
        encoded = self._encoded(params, input_ids, mask_bias(attention_mask != 0, jnp.float32)[:, None, None, :])
        heads, _ = self._heads()
        b, s = input_ids.shape
        return {"cross": [linear(p[f"cross_{n}"], encoded).reshape(b, s, heads, -1).swapaxes(1, 2)
                          for p in params["decoder"]["layers"] for n in "kv"]}

    def step(self, params: Params, input_ids: jax.Array, cache_index: jax.Array, encoder_mask: jax.Array,
             cross: list[jax.Array], cache: list[jax.Array]) -> dict[str, Any]:
        """One decoder token per row at its position ``cache_index`` (``models/_seq2seq.py``)."""
        dec = params["decoder"]
        heads, hd = self._heads()
        b = input_ids.shape[0]
        scale = 1.0 / math.sqrt(hd)
        grow = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        h = head_embed(params["shared"], input_ids[:, 0]) * grow
        h = self._normed(dec, h + embed(self._positions(dec, params["shared"].dtype), cache_index))
        cache = list(cache)
        seen = step_bias(cache_index, cache[0].shape[2])
        source = mask_bias(encoder_mask != 0, jnp.float32)[:, None, None, :]
        for i, p in enumerate(dec["layers"]):
            q, k, v = (linear(p[n], h).reshape(b, heads, hd) for n in "qkv")
            keys, values = write_step(cache, i, k, v, cache_index)
            h = layer_norm(p["attn_ln"], h + linear(p["out"], attend_step(q * scale, keys, values, seen)))
            q = linear(p["cross_q"], h).reshape(b, heads, hd) * scale
            h = layer_norm(p["cross_ln"], h + linear(p["cross_out"], attend_step(q, *layer_of(cross, i), source)))
            h = self._ffn(p, h)
        return {"logits": self._logits(params, h), "cache": cache}


@dataclass(frozen=True)
class Marian(Bart):
    """Marian (``MarianModel``, ``MarianMTModel``: the Helsinki-NLP/opus-mt-* translators): BART's layers, with fixed
    sinusoidal positions and no LayerNorm over the embeddings. Defaults opus-mt-en-de's."""

    vocab_size: int = 58101
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "swish"
    max_position_embeddings: int = 512
    scale_embedding: bool = True
    decoder_start_token_id: int = 58100  # the pad token
    eos_token_id: int | None = 0  # unread (Marian has no sequence classifier)
    decoder_vocab_size: int | None = None  # config.json's: the shared table's, vocab_size (null: the same)

    name: ClassVar[str] = "marian"
    HEADS: ClassVar[tuple[str, ...]] = ("none", "conditional_generation")
    LEARNED_POSITIONS: ClassVar[bool] = False
    EMBEDDING_LN: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.decoder_vocab_size not in (None, self.vocab_size):
            raise ValueError(f"decoder_vocab_size={self.decoder_vocab_size} with vocab_size={self.vocab_size}: Marian "
                             "reads one table, shared by the encoder, the decoder and the LM head "
                             "(share_encoder_decoder_embeddings=true), so the two must be equal.")
        super().__post_init__()
