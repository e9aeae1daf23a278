"""ViT (Hugging Face ``ViTModel`` with its pooler), in plain JAX.

Fields are ``ViTConfig``'s keys, defaults ViT-B/16 at 224 (``google/vit-base-patch16-224``'s sizes),
so a checkpoint's ``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``).

Input ``pixel_values: float32 [batch, num_channels, height, width]`` (NCHW, as Hugging Face; the
image size is fixed by ``image_size``). Output ``{"last_hidden_state": [batch, 1 + patches, d],
"pooler_output": [batch, pooler_output_size]}``, ``patches = (height // p) * (width // p)``
(197 tokens for the defaults).

    h = [cls | Patches(pixel_values)] + position          # Patches: a p x p, stride p convolution
    per layer: h = h + Out(Attention(LN_before(h)));  h = h + Down(act(Up(LN_after(h))))   # pre-LN
    last_hidden_state = LN(h);  pooler_output = pooler_act(Pooler(last_hidden_state[:, 0]))

No masking; every batch row is independent: ``padding = {"batch": "rows"}``.

Params (Hugging Face's layouts: Linear weights ``[out, in]``, the patch kernel OIHW)::

    {"embeddings": {"cls_token": [1, 1, d], "position": [1, 1 + patches, d],
                    "patch": {"weight": [d, num_channels, p, p], "bias": [d]}},
     "layers": [{"query" | "key" | "value": {"weight": [d, d], "bias": [d]},   # no bias if not qkv_bias
                 "attn_out": {"weight": [d, d], "bias": [d]},
                 "ln_before" | "ln_after": {"scale": [d], "bias": [d]},
                 "intermediate": {"weight": [intermediate_size, d], "bias": [intermediate_size]},
                 "output": {"weight": [d, intermediate_size], "bias": [d]}}, ...],
     "ln": {"scale": [d], "bias": [d]},
     "pooler": {"weight": [pooler_output_size, d], "bias": [pooler_output_size]}}

``apply`` computes the patch embedding as one matmul over ``(channel, row, column)`` of each patch
and fuses query/key/value into one matmul (scale folded into the query): weight-only work that
tripy_build does once at load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from .heads import Headed, IMAGE_HEADS
from ._layers import Params, activation, attend, fused_qkv, layer_norm, linear, matmul, normal_init


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair of ints, got {v!r}.")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _linear(key: jax.Array, dim_in: int, dim_out: int, bias: bool = True) -> Params:
    p = {"weight": normal_init(key, (dim_out, dim_in))}
    if bias:
        p["bias"] = jnp.zeros((dim_out,), jnp.float32)
    return p


def _ln(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


def init_layers(keys: list[jax.Array], d: int, ff: int, qkv_bias: bool = True) -> list[Params]:
    """The params of pre-LayerNorm encoder layers (``encode``), one per key."""
    layers = []
    for k in keys:
        kq, kk, kv, ko, ki, kd = jax.random.split(k, 6)
        layers.append({
            "query": _linear(kq, d, d, qkv_bias), "key": _linear(kk, d, d, qkv_bias),
            "value": _linear(kv, d, d, qkv_bias), "attn_out": _linear(ko, d, d),
            "ln_before": _ln(d), "intermediate": _linear(ki, d, ff), "output": _linear(kd, ff, d),
            "ln_after": _ln(d),
        })
    return layers


def patches(pixel_values: jax.Array, kernel: jax.Array) -> jax.Array:
    """The patch embedding, a convolution of kernel ``p x p`` and stride ``p`` (``kernel``: OIHW ``[d, c, p, p]``, no
    bias), as one matmul over each patch's (channel, row, column): ``[b, patches, d]``, row by row (rows and columns
    past the last whole patch are dropped, as the convolution drops them)."""
    b, c, height, width = pixel_values.shape
    d, _, ph, pw = kernel.shape
    gh, gw = height // ph, width // pw
    x = pixel_values[:, :, : gh * ph, : gw * pw].reshape(b, c, gh, ph, gw, pw)
    return jnp.einsum("bcyixj,dcij->byxd", x, kernel).reshape(b, gh * gw, d)


def encode(layers: list[Params], h: jax.Array, heads: int, eps: float, act: Any,
           bias: jax.Array | None = None) -> jax.Array:
    """Pre-LayerNorm encoder layers over ``h: [b, s, d]`` (ViT's and CLIP's): ``h + Out(Attention(LN(h)))``, then
    ``h + Down(act(Up(LN(h))))``; ``bias`` (broadcastable to ``[b, heads, s, s]``) masks the attention."""
    scale = 1.0 / math.sqrt(h.shape[-1] // heads)
    for p in layers:
        w_qkv, b_qkv = fused_qkv(p["query"], p["key"], p["value"], scale)
        qkv = matmul(layer_norm(p["ln_before"], h, eps), w_qkv)
        if b_qkv is not None:
            qkv = qkv + b_qkv
        h = h + linear(p["attn_out"], attend(qkv, heads, bias))
        h = h + linear(p["output"], act(linear(p["intermediate"], layer_norm(p["ln_after"], h, eps))))
    return h


@dataclass(frozen=True)
class ViT(Headed):
    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    qkv_bias: bool = True
    pooler_output_size: int | None = None
    pooler_act: str = "tanh"
    head: str = "auto"  # none | image_classification (ViTForImageClassification); auto: the checkpoint's
    num_labels: int = 2  # the classes of image_classification (config.json: id2label's size)
    labels: tuple = ()  # their names, in id order (config.json's id2label)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels

    HEADS: ClassVar[tuple[str, ...]] = IMAGE_HEADS
    name: ClassVar[str] = "vit"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        for f in ("image_size", "patch_size"):  # lists from configs -> hashable
            v = getattr(self, f)
            if isinstance(v, list):
                object.__setattr__(self, f, tuple(v))
            _pair(getattr(self, f))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})."
            )
        (h, w), (ph, pw) = _pair(self.image_size), _pair(self.patch_size)
        if h < ph or w < pw:
            raise ValueError(f"image_size {self.image_size} is smaller than patch_size {self.patch_size}.")
        activation(self.hidden_act, "hidden_act")
        activation(self.pooler_act, "pooler_act")
        self.check_head()

    @property
    def grid(self) -> tuple[int, int]:
        (h, w), (ph, pw) = _pair(self.image_size), _pair(self.patch_size)
        return h // ph, w // pw

    @property
    def pooler_size(self) -> int:
        return self.pooler_output_size if self.pooler_output_size is not None else self.hidden_size

    def init(self, key: jax.Array) -> Params:
        d, ff = self.hidden_size, self.intermediate_size
        gh, gw = self.grid
        ph, pw = _pair(self.patch_size)
        k_cls, k_pos, k_patch, k_pool, *k_layers = jax.random.split(key, 4 + self.num_hidden_layers)
        layers = init_layers(k_layers, d, ff, self.qkv_bias)
        return {
            "embeddings": {
                "cls_token": normal_init(k_cls, (1, 1, d)),
                "position": normal_init(k_pos, (1, 1 + gh * gw, d)),
                "patch": {"weight": normal_init(k_patch, (d, self.num_channels, ph, pw)),
                          "bias": jnp.zeros((d,), jnp.float32)},
            },
            "layers": layers,
            "ln": _ln(d),
            # ViTForImageClassification builds its ViTModel without a pooler: the classifier reads h[:, 0]
            **({"head": {"out": _linear(k_pool, d, self.num_labels)}} if self.task == "image_classification"
               else {"pooler": _linear(k_pool, d, self.pooler_size)}),
        }

    def apply(self, params: Params, pixel_values: jax.Array) -> dict[str, jax.Array]:
        act = activation(self.hidden_act, "hidden_act")
        pool_act = activation(self.pooler_act, "pooler_act")
        eps, d, heads = self.layer_norm_eps, self.hidden_size, self.num_attention_heads
        emb = params["embeddings"]
        b = pixel_values.shape[0]
        x = patches(pixel_values, emb["patch"]["weight"]) + emb["patch"]["bias"]
        cls = jnp.broadcast_to(emb["cls_token"], (b, 1, d))
        h = jnp.concatenate([cls, x], axis=1) + emb["position"]
        h = layer_norm(params["ln"], encode(params["layers"], h, heads, eps, act), eps)
        if self.task == "image_classification":
            return {"logits": linear(params["head"]["out"], h[:, 0])}
        return {"last_hidden_state": h, "pooler_output": pool_act(linear(params["pooler"], h[:, 0]))}

    def inputs(self) -> dict[str, list]:
        h, w = _pair(self.image_size)
        return {"pixel_values": ["batch", self.num_channels, h, w]}

    def input_dtypes(self) -> dict[str, str]:
        return {"pixel_values": "float32"}
