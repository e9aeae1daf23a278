"""ResNet (Hugging Face ``ResNetModel`` in eval mode), in plain JAX.

Fields are ``ResNetConfig``'s keys, defaults ResNet-50 (``ResNetConfig()`` = ``microsoft/resnet-50``),
so a checkpoint's ``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``),
plus ``image_size`` (not a ``ResNetConfig`` key: ResNet takes any size; it fixes the input shape
the zoo model declares, 224 like ``microsoft/resnet-50``'s preprocessing).

Input ``pixel_values: float32 [batch, num_channels, image_size, image_size]`` (NCHW, as Hugging
Face). Output ``{"last_hidden_state": [batch, hidden_sizes[-1], h, w], "pooler_output": [batch,
hidden_sizes[-1], 1, 1]}`` (NCHW; ``h = w = 7`` at 224).

    stem: Conv7x7/2 -> BN -> hidden_act -> MaxPool3x3/2 (pad 1)
    stage s (stride 2, except stage 0 unless downsample_in_first_stage), depths[s] layers:
      bottleneck: Conv1x1 -> BN -> relu -> Conv3x3 -> BN -> relu -> Conv1x1 -> BN  (+ shortcut) -> hidden_act
                  (the stride sits on the 3x3, or on the first 1x1 with downsample_in_bottleneck;
                   the inner width is out // 4)
      basic:      Conv3x3 -> BN -> relu -> Conv3x3 -> BN  (+ shortcut) -> hidden_act
      shortcut: Conv1x1/stride -> BN where the width or the stride changes, else the identity
    pooler_output = mean over (h, w)

Convolutions have no bias and PyTorch's padding ``kernel // 2``; the inner activations are ReLU
whatever ``hidden_act`` says, as in Hugging Face. BatchNorm is inference BatchNorm from the running
statistics (eps 1e-5, ``nn.BatchNorm2d``'s default): ``apply`` folds each one into its convolution
(kernel * weight / sqrt(var + eps), then + bias - mean * weight / sqrt(var + eps)), weight-only work
that tripy_build does once at load. The params keep the four BatchNorm tensors as the checkpoint
has them. Every batch row is independent: ``padding = {"batch": "rows"}``.

Params (the checkpoint's layouts: conv kernels OIHW)::

    conv = {"kernel": [out, in, k, k], "scale": [out], "bias": [out], "mean": [out], "var": [out]}
    {"embedder": conv,                                   # 7x7, num_channels -> embedding_size
     "stages": [[{"convs": [conv, conv, conv],           # bottleneck (basic: two 3x3 convs)
                  "shortcut": conv},                     # 1x1, only where HF has one
                 ...],                                   # depths[s] layers
                ...]}                                    # one list per stage

Internally the activations are NHWC (the input is transposed once, the outputs back to NCHW).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from .heads import Headed, IMAGE_HEADS
from ._layers import Params, activation, linear

BN_EPS = 1e-5
LAYER_TYPES = ("basic", "bottleneck")
REDUCTION = 4  # the bottleneck's inner width is out // 4


def _conv_init(key: jax.Array, c_in: int, c_out: int, k: int) -> Params:
    std = math.sqrt(2.0 / (c_out * k * k))  # kaiming normal, fan_out, as Hugging Face initialises
    ones, zeros = jnp.ones((c_out,), jnp.float32), jnp.zeros((c_out,), jnp.float32)
    return {"kernel": std * jax.random.normal(key, (c_out, c_in, k, k), jnp.float32),
            "scale": ones, "bias": zeros, "mean": zeros, "var": ones}


def _conv_bn(p: Params, x: jax.Array, stride: int) -> jax.Array:
    """Conv (no bias, padding k // 2) then inference BatchNorm, folded into one conv + shift; NHWC."""
    factor = p["scale"] * jax.lax.rsqrt(p["var"] + BN_EPS)
    kernel = jnp.transpose(p["kernel"] * factor[:, None, None, None], (2, 3, 1, 0))  # OIHW -> HWIO
    shift = p["bias"] - p["mean"] * factor
    pad = kernel.shape[0] // 2
    y = jax.lax.conv_general_dilated(
        x, kernel, window_strides=(stride, stride), padding=((pad, pad), (pad, pad)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return y + shift


def _max_pool(x: jax.Array) -> jax.Array:
    """``nn.MaxPool2d(kernel_size=3, stride=2, padding=1)`` on NHWC (padding never wins the max)."""
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
    )


@dataclass(frozen=True)
class ResNet(Headed):
    num_channels: int = 3
    embedding_size: int = 64
    hidden_sizes: tuple[int, ...] = (256, 512, 1024, 2048)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    layer_type: str = "bottleneck"
    hidden_act: str = "relu"
    downsample_in_first_stage: bool = False
    downsample_in_bottleneck: bool = False
    image_size: int = 224
    head: str = "auto"  # none | image_classification (ResNetForImageClassification); auto: the checkpoint's
    num_labels: int = 2  # the classes of image_classification (config.json: id2label's size)
    labels: tuple = ()  # their names, in id order (config.json's id2label)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels

    HEADS: ClassVar[tuple[str, ...]] = IMAGE_HEADS
    name: ClassVar[str] = "resnet50"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))  # lists from configs -> hashable
        object.__setattr__(self, "depths", tuple(self.depths))
        if not self.hidden_sizes or len(self.hidden_sizes) != len(self.depths):
            raise ValueError(
                f"hidden_sizes {self.hidden_sizes} and depths {self.depths} must be non-empty and of one length."
            )
        if self.layer_type not in LAYER_TYPES:
            raise ValueError(f"layer_type={self.layer_type!r} is not supported; supported: {', '.join(LAYER_TYPES)}.")
        activation(self.hidden_act, "hidden_act")
        self.check_head()

    def blocks(self) -> list[list[tuple[int, int, int]]]:
        """``(in, out, stride)`` of every layer, per stage, as ``ResNetEncoder`` builds them."""
        stages, c_in = [], self.embedding_size
        for s, (c_out, depth) in enumerate(zip(self.hidden_sizes, self.depths)):
            stride = 2 if (s > 0 or self.downsample_in_first_stage) else 1
            stages.append([(c_in, c_out, stride)] + [(c_out, c_out, 1)] * (depth - 1))
            c_in = c_out
        return stages

    def _layer_convs(self, c_in: int, c_out: int, stride: int) -> list[tuple[int, int, int, int]]:
        """``(in, out, kernel, stride)`` of a layer's main-path convs."""
        if self.layer_type == "basic":
            return [(c_in, c_out, 3, stride), (c_out, c_out, 3, 1)]
        mid = c_out // REDUCTION
        first, second = (stride, 1) if self.downsample_in_bottleneck else (1, stride)
        return [(c_in, mid, 1, first), (mid, mid, 3, second), (mid, c_out, 1, 1)]

    def init(self, key: jax.Array) -> Params:
        k_stem, key = jax.random.split(key)
        stages = []
        for stage in self.blocks():
            layers = []
            for c_in, c_out, stride in stage:
                key, *ks = jax.random.split(key, 5)
                layer = {"convs": [_conv_init(k, i, o, kk) for k, (i, o, kk, _) in
                                   zip(ks, self._layer_convs(c_in, c_out, stride))]}
                if c_in != c_out or stride != 1:
                    layer["shortcut"] = _conv_init(ks[3], c_in, c_out, 1)
                layers.append(layer)
            stages.append(layers)
        params = {"embedder": _conv_init(k_stem, self.num_channels, self.embedding_size, 7), "stages": stages}
        if self.task == "image_classification":
            d = self.hidden_sizes[-1]
            params["head"] = {"out": {"weight": jnp.zeros((self.num_labels, d), jnp.float32),
                                      "bias": jnp.zeros((self.num_labels,), jnp.float32)}}
        return params

    def apply(self, params: Params, pixel_values: jax.Array) -> dict[str, jax.Array]:
        act = activation(self.hidden_act, "hidden_act")
        x = jnp.transpose(pixel_values, (0, 2, 3, 1))  # NCHW -> NHWC
        x = _max_pool(act(_conv_bn(params["embedder"], x, 2)))
        for stage, stage_params in zip(self.blocks(), params["stages"]):
            for (c_in, c_out, stride), p in zip(stage, stage_params):
                shortcut = _conv_bn(p["shortcut"], x, stride) if "shortcut" in p else x
                specs = self._layer_convs(c_in, c_out, stride)
                h = x
                for j, ((_, _, _, s), conv) in enumerate(zip(specs, p["convs"])):
                    h = _conv_bn(conv, h, s)
                    if j < len(specs) - 1:
                        h = jax.nn.relu(h)
                x = act(h + shortcut)
        pooled = jnp.mean(x, axis=(1, 2))
        if self.task == "image_classification":
            return {"logits": linear(params["head"]["out"], pooled)}
        return {"last_hidden_state": jnp.transpose(x, (0, 3, 1, 2)), "pooler_output": pooled[:, :, None, None]}

    def inputs(self) -> dict[str, list]:
        return {"pixel_values": ["batch", self.num_channels, self.image_size, self.image_size]}

    def input_dtypes(self) -> dict[str, str]:
        return {"pixel_values": "float32"}
