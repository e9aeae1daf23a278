"""GPT-2 (Hugging Face ``GPT2LMHeadModel``, logits through the tied ``lm_head = wte``), in plain JAX.

Fields are ``GPT2Config``'s keys, defaults GPT-2 small (``gpt2``'s sizes), so a checkpoint's
``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``).

Inputs (int32 ``[batch, seq]``, Hugging Face's names): ``input_ids``, ``attention_mask`` (1 = real
token, 0 = padding). Output: ``{"logits": [batch, seq, vocab_size]}``. Positions are ``0..seq-1``
(as ``GPT2LMHeadModel`` without ``position_ids``), so padding goes on the right.

    h = wte[ids] + wpe[0..s-1]
    per layer: h = h + Proj(CausalAttention(LN1(h)));  h = h + MlpProj(act(FC(LN2(h))))   # pre-LN
    logits = LN_f(h) @ wte.T

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
     "ln_f": {"scale", "bias"}}

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

from ._layers import Params, activation, attend, embed, layer_norm, mask_bias, normal_init, positions


def _conv1d(key: jax.Array, dim_in: int, dim_out: int, std: float = 0.02) -> Params:
    return {"weight": normal_init(key, (dim_in, dim_out), std), "bias": jnp.zeros((dim_out,), jnp.float32)}


def _ln(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


@dataclass(frozen=True)
class GPT2:
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

    name: ClassVar[str] = "gpt2"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}).")
        activation(self.activation_function, "activation_function")

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
        return {
            "wte": normal_init(k_wte, (self.vocab_size, d)),
            "wpe": normal_init(k_wpe, (self.n_positions, d), 0.01),
            "h": layers,
            "ln_f": _ln(d),
        }

    def _scale(self, layer: int) -> float:
        scale = 1.0 / math.sqrt(self.n_embd // self.n_head) if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        act = activation(self.activation_function, "activation_function")
        eps, d = self.layer_norm_epsilon, self.n_embd
        seq = input_ids.shape[1]
        h = embed(params["wte"], input_ids) + positions(params["wpe"], seq)
        causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]               # [q, k]
        keep = causal[None, None, :, :] & (attention_mask != 0)[:, None, None, :]    # [b, 1, q, k]
        bias = mask_bias(keep, h.dtype)
        for i, p in enumerate(params["h"]):
            # Fold the attention scale into the query columns of the fused [q | k | v] projection.
            col_scale = jnp.concatenate([jnp.full((d,), self._scale(i), jnp.float32), jnp.ones((2 * d,), jnp.float32)])
            w_qkv, b_qkv = p["c_attn"]["weight"] * col_scale, p["c_attn"]["bias"] * col_scale
            x = layer_norm(p["ln_1"], h, eps)
            ctx = attend(jnp.matmul(x, w_qkv) + b_qkv, self.n_head, bias)
            h = h + jnp.matmul(ctx, p["c_proj"]["weight"]) + p["c_proj"]["bias"]
            x = layer_norm(p["ln_2"], h, eps)
            x = act(jnp.matmul(x, p["c_fc"]["weight"]) + p["c_fc"]["bias"])
            h = h + jnp.matmul(x, p["mlp_proj"]["weight"]) + p["mlp_proj"]["bias"]
        h = layer_norm(params["ln_f"], h, eps)
        return {"logits": jnp.matmul(h, params["wte"].T)}

    def inputs(self) -> dict[str, list]:
        return {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}

    def input_values(self) -> dict[str, tuple[int, int]]:
        """The values each integer input may hold, ``[lo, hi)``: a call outside is refused."""
        return {"input_ids": (0, self.vocab_size), "attention_mask": (0, 2)}

    def input_dtypes(self) -> dict[str, str]:
        return {"input_ids": "int32", "attention_mask": "int32"}
