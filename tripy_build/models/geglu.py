"""GEGLU, NVIDIA Tripy's introductory example: a Linear to twice the width, gated by GELU.

Params: ``{"proj": {"weight": [2 * dim_out, dim_in], "bias": [2 * dim_out]}}``.
``y = x @ weight.T + bias``; ``x, gate = split(y, 2, axis=-1)``; output ``x * gelu(gate)`` with
the exact (erf) GELU, as in Tripy's ``tp.gelu``. Input ``x: [batch, dim_in]``; output
``[batch, dim_out]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, linear, linear_init


@dataclass(frozen=True)
class GEGLU:
    dim_in: int = 512
    dim_out: int = 2048

    name: ClassVar[str] = "geglu"
    padding: ClassVar[dict[str, str]] = {"batch": "rows"}

    def init(self, key: jax.Array) -> Params:
        return {"proj": linear_init(key, self.dim_in, 2 * self.dim_out)}

    def apply(self, params: Params, x: jax.Array) -> jax.Array:
        proj = linear(params["proj"], x)
        x, gate = jnp.split(proj, 2, axis=-1)
        return x * jax.nn.gelu(gate, approximate=False)

    def inputs(self) -> dict[str, list]:
        return {"x": ["batch", self.dim_in]}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}
