"""A user's own model in bfloat16: ``tb.compile(..., precision="bfloat16")`` against the same function jitted by
jax with its bfloat16 weights passed as arguments (the program the build compiled before
``compiler/reduced_dots.py``: a build's weights are its program's arguments, never folded constants), and against
the float32 build.

The model is four SwiGLU MLP blocks of Qwen2.5-0.5B's width (896 -> 4864 -> 896), written as users write them:
an RMS norm whose scale is a float32 numpy constant, so every product after it takes a float32 operand and a
bfloat16 weight. Batch 1 (a decode step's shape) and 8.

    python bench/reduced_precision.py [--rounds 200] [--layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import tripy_build as tb

D, HIDDEN = 896, 4864


def make(layers: int):
    rng = np.random.default_rng(0)
    norm = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)  # a float32 constant the model closes over

    def model(x, params):
        for p in params:
            h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * norm
            x = x + (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]
        return x

    params = [{"gate": (rng.standard_normal((D, HIDDEN)) / 30).astype(np.float32),
               "up": (rng.standard_normal((D, HIDDEN)) / 30).astype(np.float32),
               "down": (rng.standard_normal((HIDDEN, D)) / 70).astype(np.float32)} for _ in range(layers)]
    return model, params


def timed(call, x, rounds: int) -> float:
    jax.block_until_ready(call(x))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(call(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    model, params = make(args.layers)
    spec = [tb.InputInfo(((1, 1, 8), D), "float32"), params]
    builds = {"float32": tb.compile(model, args=spec), "bfloat16": tb.compile(model, args=spec, precision="bfloat16")}
    half = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.bfloat16), params)
    jitted = jax.jit(lambda x, p: model(x.astype(jnp.bfloat16), p).astype(jnp.float32))
    plain = lambda x: jitted(x, half)  # noqa: E731
    print(f"jax {jax.__version__}, {args.layers} MLP blocks {D} -> {HIDDEN} -> {D}; median of {args.rounds} calls, ms")
    print(f"bfloat16 build rewrote: {builds['bfloat16'].metadata['precision']['rewritten']}, error against float32 "
          f"{builds['bfloat16'].metadata['precision']['max_rel_error']:.2%} of the output scale")
    print(f"{'batch':>5} {'tb float32':>11} {'tb bfloat16':>12} {'jax.jit bf16':>13} {'jit / tb bf16':>14} "
          f"{'f32 / tb bf16':>14}")
    for batch in (1, 8):
        x = np.random.default_rng(batch).standard_normal((batch, D)).astype(np.float32)
        f32 = timed(builds["float32"], x, args.rounds)
        bf16 = timed(builds["bfloat16"], x, args.rounds)
        jit = timed(plain, jnp.asarray(x), args.rounds)
        print(f"{batch:>5} {f32:>11.2f} {bf16:>12.2f} {jit:>13.2f} {jit / bf16:>13.2f}x {f32 / bf16:>13.2f}x")


if __name__ == "__main__":
    main()
