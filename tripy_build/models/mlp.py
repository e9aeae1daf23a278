"""MLP: ``layers`` Linear layers with ReLU between them (none after the last).

Widths: ``dim_in -> hidden -> ... -> hidden -> dim_out`` (``layers == 1`` is one
``dim_in -> dim_out`` Linear). Params: ``{"layers": [{"weight": [out, in], "bias": [out]}, ...]}``,
a list of ``layers`` dicts in order. Input ``x: [batch, dim_in]``; output ``[batch, dim_out]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax

from ._layers import Params, linear, linear_init


@dataclass(frozen=True)
class MLP:
    dim_in: int = 512
    hidden: int = 1024
    dim_out: int = 512
    layers: int = 4

    name: ClassVar[str] = "mlp"
    padding: ClassVar[dict[str, str]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"MLP needs at least one layer, got layers={self.layers}.")

    def widths(self) -> list[int]:
        return [self.dim_in] + [self.hidden] * (self.layers - 1) + [self.dim_out]

    def init(self, key: jax.Array) -> Params:
        widths = self.widths()
        keys = jax.random.split(key, self.layers)
        return {"layers": [linear_init(k, a, b) for k, a, b in zip(keys, widths[:-1], widths[1:])]}

    def apply(self, params: Params, x: jax.Array) -> jax.Array:
        last = len(params["layers"]) - 1
        for i, layer in enumerate(params["layers"]):
            x = linear(layer, x)
            if i < last:
                x = jax.nn.relu(x)
        return x

    def inputs(self) -> dict[str, list]:
        return {"x": ["batch", self.dim_in]}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}
