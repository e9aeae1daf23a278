"""A small NHWC ConvNet classifier.

For each width ``c`` in ``channels``: a 3x3 convolution, stride 2, one pixel of zero padding on each
side (PyTorch's ``Conv2d(kernel_size=3, stride=2, padding=1)``), then ReLU; each stage halves H and
W, rounding up, so any H, W >= 1 works. Then a global average over H and W and a Linear to
``classes`` logits.

``apply(params, x, lengths={"height": h, "width": w})`` treats only the top-left ``h x w`` pixels as
the image: the input and every stage's output are zeroed outside the valid region (which is then
exactly the zero padding the unpadded image would see) and the average divides by the valid count.
An image padded at the bottom and right therefore gives exactly the unpadded result. (With XLA's
``SAME`` padding that is impossible: how many zeros go on the top and left depends on whether the
size is even.) Hence ``padding = {"batch": "rows", "height": "mask", "width": "mask"}``.

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
PAD = 1


def _valid_only(x: jax.Array, h: jax.Array, w: jax.Array) -> jax.Array:
    """``x`` (NHWC) with every pixel at row ``>= h`` or column ``>= w`` set to zero."""
    rows = jnp.arange(x.shape[1]) < h
    cols = jnp.arange(x.shape[2]) < w
    return jnp.where(rows[:, None, None] & cols[None, :, None], x, 0)


@dataclass(frozen=True)
class ConvNet:
    channels_in: int = 3
    channels: tuple[int, ...] = (16, 32)
    classes: int = 10

    name: ClassVar[str] = "convnet"
    padding: ClassVar[dict[str, str]] = {"batch": "rows", "height": "mask", "width": "mask"}

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))  # lists from configs -> hashable
        if not self.channels:
            raise ValueError("ConvNet needs at least one conv stage (channels is empty).")

    def init(self, key: jax.Array) -> Params:
        keys = jax.random.split(key, len(self.channels) + 1)
        widths = (self.channels_in,) + self.channels
        convs = [conv_init(k, KERNEL, a, b) for k, a, b in zip(keys[:-1], widths[:-1], widths[1:])]
        return {"convs": convs, "head": linear_init(keys[-1], self.channels[-1], self.classes)}

    def apply(self, params: Params, x: jax.Array, lengths: dict[str, jax.Array] | None = None) -> jax.Array:
        lengths = lengths or {}
        h = jnp.asarray(lengths.get("height", x.shape[1]), jnp.int32)
        w = jnp.asarray(lengths.get("width", x.shape[2]), jnp.int32)
        x = _valid_only(x, h, w)
        for conv in params["convs"]:
            x = jax.lax.conv_general_dilated(
                x, conv["kernel"], window_strides=(STRIDE, STRIDE), padding=((PAD, PAD), (PAD, PAD)),
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
            h, w = (h + 1) // STRIDE, (w + 1) // STRIDE
            x = _valid_only(jax.nn.relu(x + conv["bias"]), h, w)
        pooled = jnp.sum(x, axis=(1, 2)) / (h * w).astype(x.dtype)
        return linear(params["head"], pooled)

    def inputs(self) -> dict[str, list]:
        return {"x": ["batch", "height", "width", self.channels_in]}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}
