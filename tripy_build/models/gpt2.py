"""GPT-2 (Hugging Face ``GPT2LMHeadModel``, logits through the tied ``lm_head = wte``, and its other heads), in
plain JAX.

Fields are ``GPT2Config``'s keys, defaults GPT-2 small (``gpt2``'s sizes), so a checkpoint's
``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``).

Inputs (int32 ``[batch, seq]``, Hugging Face's names): ``input_ids``, ``attention_mask`` (1 = real
token, 0 = padding). Outputs by ``head`` (``heads.DECODER_HEADS``, as the Llama family's): ``causal_lm``
(``GPT2LMHeadModel``) ``{"logits": [batch, seq, vocab_size]}``; ``none`` (``GPT2Model``) ``{"last_hidden_state"}``
after ``ln_f`` (with ``pooling``, a ``sentence_embedding``); ``sequence_classification``
(``GPT2ForSequenceClassification``: DialogRPT, reward models) the ``score`` Linear (no bias) of each row's last real
token; ``token_classification`` (``GPT2ForTokenClassification``) its ``classifier`` Linear (read as ``score``) on
every token; ``question_answering`` (``GPT2ForQuestionAnswering``) its ``qa_outputs`` Linear (read as ``score``) on
every token, ``{"start_logits", "end_logits": [batch, seq]}``. Positions are ``0..seq-1`` (as ``GPT2LMHeadModel``
without ``position_ids``), so padding goes on the right.

    h = wte[ids] + wpe[0..s-1]
    per layer: h = h + Proj(CausalAttention(LN1(h)));  h = h + MlpProj(act(FC(LN2(h))))   # pre-LN
    logits = LN_f(h) @ wte.T

In float32 ``wte.T`` is weight-only work, done once at load: the model holds the table as ``[d, vocab]`` only, the
layout XLA's CPU dot runs fastest at a few rows (GPT-2 small's logits at 8 rows: 3.4 ms against 5.2 over ``wte``'s
own last axis; alike at one row and at 1,024), and reads the inputs' embeddings as its columns; in bfloat16 the
other way round (``_layers.head_logits``).

Masking: query ``i`` sees key ``j`` when ``j <= i`` and ``attention_mask[j] != 0``; other keys get
the additive bias ``finfo(float32).min`` (Hugging Face's value: a fully masked row stays finite).
With right padding the real positions see only real keys, and every other step acts on each
position and each batch row alone: padded and unpadded inputs agree at the real positions. Hence
``padding = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}``. Ids out of range are
clamped; positions past ``n_positions`` reuse the last row (Hugging Face raises): keep ``seq`` within.

Params (Hugging Face's layouts: GPT-2's ``Conv1D`` weights are ``[in, out]``; a rename to load)::

    {"wte": [vocab_size, d], "wpe": [n_positions, d],
     "h": [{"ln_1": {"scale", "bias"},
            "c_attn": {"weight": [d, 3d], "bias": [3d]},        # fused [q | k | v]
            "c_proj": {"weight": [d, d], "bias": [d]},
            "ln_2": {"scale", "bias"},
            "c_fc": {"weight": [d, inner], "bias": [inner]},
            "mlp_proj": {"weight": [inner, d], "bias": [d]}}, ...],   # n_layer of them
     "ln_f": {"scale", "bias"}, ("score": {"weight": [num_labels, d], ("bias")})}

``inner`` is ``n_inner`` or ``4 * n_embd`` when it is None. The attention scale (``scale_attn_weights``,
``scale_attn_by_inverse_layer_idx``) is folded into the query columns of ``c_attn``: weight-only work.
``reorder_and_upcast_attn`` only changes float16 numerics, so it is not a field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ..core.spec import InputInfo
from ._tokens import TokenInputs
from .heads import DecoderHeaded
from ._layers import (
    Params, activation, attend, attend_cache, cache_step, embed, extend_inputs, head_embed, head_logits, layer_norm,
    mask_bias, matmul, normal_init, positions, scaled,
)


def _conv1d(key: jax.Array, dim_in: int, dim_out: int, std: float = 0.02) -> Params:
    return {"weight": normal_init(key, (dim_in, dim_out), std), "bias": jnp.zeros((dim_out,), jnp.float32)}


def _ln(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


@dataclass(frozen=True)
class GPT2(DecoderHeaded, TokenInputs):
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    head: str = "auto"  # DECODER_HEADS; auto: the checkpoint's (config.json's architectures), causal_lm without one
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label; default LABEL_0, LABEL_1, ...)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels
    pad_token_id: int | None = None  # sequence_classification: a token with this id is never the one classified
    pooling: str = "none"  # none | last | mean: a sentence_embedding output (head none), as sentence-transformers
    normalize: bool = False  # the sentence_embedding scaled to unit length (cosine similarity as a dot product)

    name: ClassVar[str] = "gpt2"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}).")
        activation(self.activation_function, "activation_function")
        self.check_heads()

    @property
    def inner(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    def init(self, key: jax.Array) -> Params:
        d, inner = self.n_embd, self.inner
        k_wte, k_wpe, *k_layers = jax.random.split(key, 2 + self.n_layer)
        proj_std = 0.02 / math.sqrt(2 * self.n_layer)  # GPT-2's scaled init of the residual projections
        layers = []
        for k in k_layers:
            ka, kp, kf, km = jax.random.split(k, 4)
            layers.append({
                "ln_1": _ln(d), "c_attn": _conv1d(ka, d, 3 * d), "c_proj": _conv1d(kp, d, d, proj_std),
                "ln_2": _ln(d), "c_fc": _conv1d(kf, d, inner), "mlp_proj": _conv1d(km, inner, d, proj_std),
            })
        params = {
            "wte": normal_init(k_wte, (self.vocab_size, d)),
            "wpe": normal_init(k_wpe, (self.n_positions, d), 0.01),
            "h": layers,
            "ln_f": _ln(d),
        }
        score = self.score_init(jax.random.fold_in(k_wpe, 1), d)
        return params if score is None else {**params, "score": score}

    def _scale(self, layer: int) -> float:
        scale = 1.0 / math.sqrt(self.n_embd // self.n_head) if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def _qkv(self, p: Params, layer: int) -> tuple[jax.Array, jax.Array]:
        """The fused [q | k | v] weight and bias with the attention scale folded into the query columns."""
        d = self.n_embd
        col_scale = jnp.concatenate([jnp.full((d,), self._scale(layer), jnp.float32), jnp.ones((2 * d,), jnp.float32)])
        return scaled(p["c_attn"]["weight"], col_scale), scaled(p["c_attn"]["bias"], col_scale)

    def _mlp(self, p: Params, h: jax.Array) -> jax.Array:
        act = activation(self.activation_function, "activation_function")
        x = layer_norm(p["ln_2"], h, self.layer_norm_epsilon)
        x = act(matmul(x, p["c_fc"]["weight"]) + p["c_fc"]["bias"])
        return h + matmul(x, p["mlp_proj"]["weight"]) + p["mlp_proj"]["bias"]

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        eps = self.layer_norm_epsilon
        seq = input_ids.shape[1]
        words = head_embed(params["wte"], input_ids) if self.task == "causal_lm" else embed(params["wte"], input_ids)
        h = words + positions(params["wpe"], seq)
        causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]               # [q, k]
        keep = causal[None, None, :, :] & (attention_mask != 0)[:, None, None, :]    # [b, 1, q, k]
        bias = mask_bias(keep, h.dtype)
        for i, p in enumerate(params["h"]):
            w_qkv, b_qkv = self._qkv(p, i)
            x = layer_norm(p["ln_1"], h, eps)
            ctx = attend(matmul(x, w_qkv) + b_qkv, self.n_head, bias)
            h = self._mlp(p, h + matmul(ctx, p["c_proj"]["weight"]) + p["c_proj"]["bias"])
        h = layer_norm(params["ln_f"], h, eps)
        if self.task != "causal_lm":
            return self.head_outputs(params.get("score"), h, input_ids, attention_mask)
        return {"logits": head_logits(h, params["wte"])}

    def max_positions(self) -> int:
        """The longest sequence (prompt and new tokens) the position table holds."""
        return self.n_positions

    # --- generation: a key/value cache extended in place -------------------------------------------
    def cache_shape(self, batch: Any, max_length: int) -> tuple[Any, ...]:
        """``[n_layer, 2 (keys, values), batch, n_head, max_length, head_dim]``."""
        return (self.n_layer, 2, batch, self.n_head, max_length, self.n_embd // self.n_head)

    def extend_inputs(self, batch: Any, seq: Any, max_length: int, one_row: bool,
                      cache_dtype: str = "float32") -> dict[str, InputInfo]:
        """``extend``'s inputs: a cache of ``batch`` rows (of ``cache_dtype``, the build's precision), and ``seq`` new
        tokens for every row, or (``one_row``) for the one row ``row`` names; with the values each may hold."""
        return extend_inputs(self.vocab_size, self.n_positions, self.cache_shape, batch, seq, max_length, one_row,
                             cache_dtype)

    def extend(self, params: Params, input_ids: jax.Array, position_ids: jax.Array, attention_mask: jax.Array,
               cache: jax.Array, cache_index: jax.Array, row: jax.Array | None = None) -> dict[str, jax.Array]:
        """Run ``s`` new tokens per row against the cache, write their keys and values into it at each row's
        ``cache_index .. cache_index + s - 1``, and return the logits of each row's last new token.

        A decode step is this with ``s = 1`` for every row of the cache; a prefill is this over one row's
        prompt (``row``), in bucket-sized chunks, into the cache of a running batch. Each row has its own
        positions, so a request joins a batch at any step. The same function for both: the two entries do
        the same weight-only work and share it.

        Args:
            input_ids, position_ids: ``[n, s]`` int32 (``n``: the cache's rows, or 1 with ``row``); positions
                as Hugging Face counts them: the real tokens before this one in its sequence.
            attention_mask: ``[b, max_length]`` int32, 1 at every cache position holding a real token,
                the new ones included; 0 elsewhere.
            cache: ``cache_shape(b, max_length)``, in the build's precision; its buffer is reused for the result.
            cache_index: ``[n]`` int32, where each row's new tokens go; ``cache_index + s <= max_length``.
            row: ``[1]`` int32: the cache row the new tokens belong to (``n`` is then 1); None: every row.

        Returns:
            ``{"logits": [n, vocab_size], "cache": the cache with the new tokens' keys and values}``.
        """
        eps, heads = self.layer_norm_epsilon, self.n_head
        n, s = input_ids.shape
        hd = self.n_embd // heads
        h = head_embed(params["wte"], input_ids) + embed(params["wpe"], position_ids)  # [n, s, d]
        # decode's chunks (prompts that start together: every generate() call's prompts) read only the cache
        # window they see; prefill, one row's prompt into a running batch, reads it all: it compiles every seq
        # bucket at every batch bucket (GPT-2 small's build: 28 chunk profiles against decode's 8), and each
        # window adds compile time to every chunk profile
        rows, query_at, keep, windows = cache_step(attention_mask, cache_index, n, s, row)
        bias = mask_bias(keep, h.dtype)
        for i, p in enumerate(params["h"]):
            w_qkv, b_qkv = self._qkv(p, i)
            x = layer_norm(p["ln_1"], h, eps)
            qkv = (matmul(x, w_qkv) + b_qkv).reshape(n, s, 3, heads, hd)
            q = qkv[:, :, 0]                                                              # [n, s, heads, hd]
            for kind in (0, 1):  # keys, values: written in place (a scatter into the donated cache)
                cache = cache.at[i, kind, rows[:, None], :, query_at, :].set(qkv[:, :, 1 + kind].astype(cache.dtype))

            def read(kind: int, size: int, cache=cache, i=i) -> jax.Array:  # [n, heads, size, hd]
                part = cache[i, kind, :, :, :size]
                return part if row is None else jax.lax.dynamic_slice_in_dim(part, row[0], 1, axis=0)
            ctx = attend_cache(q, read, bias, query_at, windows).reshape(n, s, self.n_embd)
            h = self._mlp(p, h + matmul(ctx, p["c_proj"]["weight"]) + p["c_proj"]["bias"])
        last = layer_norm(params["ln_f"], h[:, -1], eps)
        return {"logits": head_logits(last, params["wte"]), "cache": cache}

