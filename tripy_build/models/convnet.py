"""A small NHWC ConvNet classifier.

For each width ``c`` in ``channels``: a 3x3 convolution, stride 2, SAME padding, then ReLU (each
stage halves H and W, rounding up, so any H, W >= 1 works). Then a global average over H and W and
a Linear to ``classes`` logits.

Params: ``{"convs": [{"kernel": [3, 3, c_in, c_out] (HWIO), "bias": [c_out]}, ...],
"head": {"weight": [classes, channels[-1]], "bias": [classes]}}``.
Input ``x: [batch, height, width, channels_in]``; output ``[batch, classes]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, conv_init, linear, linear_init

KERNEL = 3
STRIDE = 2


@dataclass(frozen=True)
class ConvNet:
    channels_in: int = 3
    channels: tuple[int, ...] = (16, 32)
    classes: int = 10

    name: ClassVar[str] = "convnet"

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))  # lists from configs -> hashable
        if not self.channels:
            raise ValueError("ConvNet needs at least one conv stage (channels is empty).")

    def init(self, key: jax.Array) -> Params:
        keys = jax.random.split(key, len(self.channels) + 1)
        widths = (self.channels_in,) + self.channels
        convs = [conv_init(k, KERNEL, a, b) for k, a, b in zip(keys[:-1], widths[:-1], widths[1:])]
        return {"convs": convs, "head": linear_init(keys[-1], self.channels[-1], self.classes)}

    def apply(self, params: Params, x: jax.Array) -> jax.Array:
        for conv in params["convs"]:
            x = jax.lax.conv_general_dilated(
                x, conv["kernel"], window_strides=(STRIDE, STRIDE), padding="SAME",
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
            x = jax.nn.relu(x + conv["bias"])
        return linear(params["head"], jnp.mean(x, axis=(1, 2)))

    def inputs(self) -> dict[str, list]:
        return {"x": ["batch", "height", "width", self.channels_in]}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}
