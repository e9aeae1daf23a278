"""Small shared building blocks for the model zoo (plain JAX, no framework).

Linear layers store ``weight`` as ``[out, in]`` (PyTorch/Tripy layout) and compute
``x @ weight.T + bias``. Initialisation follows PyTorch's default for ``nn.Linear`` / ``nn.Conv2d``:
uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` for weights and biases. Every parameter is float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def linear_init(key: jax.Array, dim_in: int, dim_out: int) -> Params:
    kw, kb = jax.random.split(key)
    return {"weight": _uniform(kw, (dim_out, dim_in), dim_in), "bias": _uniform(kb, (dim_out,), dim_in)}


def linear(params: Params, x: jax.Array) -> jax.Array:
    """``x @ weight.T + bias`` over the last axis of ``x`` (any leading dims, static or symbolic)."""
    return jnp.matmul(x, params["weight"].T) + params["bias"]


def layer_norm_init(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


def layer_norm(params: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * params["scale"] + params["bias"]


def conv_init(key: jax.Array, kernel: int, c_in: int, c_out: int) -> Params:
    """A ``kernel x kernel`` convolution with an HWIO kernel ``[k, k, c_in, c_out]`` and a bias."""
    kw, kb = jax.random.split(key)
    fan_in = kernel * kernel * c_in
    return {"kernel": _uniform(kw, (kernel, kernel, c_in, c_out), fan_in), "bias": _uniform(kb, (c_out,), fan_in)}
