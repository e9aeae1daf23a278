"""One decode step's cross-attention of an encoder-decoder (whisper-base's: 6 decoder layers, 8 heads of 64, over the
encoder's 1500 positions), in XLA on the CPU (jax.jit, the formulations ``models/_seq2seq.attend_step`` could use) next
to PyTorch's matmul and ``scaled_dot_product_attention`` on the same tensors: one query per row and head against its
keys, a softmax, the values. The keys and values are one ``[layers, 2, batch, heads, positions, head_dim]`` array,
as the artifacts held them before 2026-12-08, or an array per layer and kind (``xla einsum, per layer``), as
``models/_seq2seq.py`` holds them now: a slice of one array is copied out before XLA's CPU backend runs a product on
it (a PyTorch slice is a view).

Each contender runs in a process of its own (one thread pool at a time), the median of ``--rounds`` calls after one
untimed; the outputs are compared with numpy's. ``XLA_FLAGS`` in the environment reach the XLA process (e.g.
``--xla_cpu_experimental_ynn_fusion_type=dot``).

Run: ``python bench/cross_attention.py`` (~1 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

LAYERS, HEADS, POSITIONS, HEAD_DIM = 6, 8, 1500, 64


def tensors(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((LAYERS, 2, batch, HEADS, POSITIONS, HEAD_DIM)).astype(np.float32),
            rng.standard_normal((batch, HEADS, HEAD_DIM)).astype(np.float32) / 8)


def reference(cross: np.ndarray, q: np.ndarray) -> np.ndarray:
    scores = np.einsum("bnh,lbnkh->lbnk", q, cross[:, 0])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("lbnk,lbnkh->lbnh", p / p.sum(-1, keepdims=True), cross[:, 1])


def contenders(name: str):
    """``{label: f(cross, q)}`` of one library, each returning ``[layers, batch, heads, head_dim]``."""
    if name == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def matmul(c, q):
            return torch.stack([torch.softmax(q[:, :, None] @ c[i, 0].transpose(-1, -2), -1) @ c[i, 1]
                                for i in range(LAYERS)])[:, :, :, 0]
        return {"torch matmul": matmul,
                "torch sdpa": lambda c, q: torch.stack([sdpa(q[:, :, None], c[i, 0], c[i, 1], scale=1.0)
                                                        for i in range(LAYERS)])[:, :, :, 0]}, torch.from_numpy
    import jax
    import jax.numpy as jnp

    def layers(step):
        return jax.jit(lambda c, q: jnp.stack([step(q, c[i, 0], c[i, 1]) for i in range(LAYERS)]))

    def per_layer(step):
        run = jax.jit(lambda parts, q: jnp.stack([step(q, parts[2 * i], parts[2 * i + 1]) for i in range(LAYERS)]))
        held: dict[int, list] = {}

        def f(c, q):  # the arrays split once, outside the timed calls: the runtime holds them apart
            if id(c) not in held:
                held[id(c)] = [jax.block_until_ready(c[i, j]) for i in range(LAYERS) for j in range(2)]
            return run(held[id(c)], q)
        return f

    def einsum(q, k, v):  # models/_seq2seq.attend_step's
        return jnp.einsum("bnk,bnkh->bnh", jax.nn.softmax(jnp.einsum("bnh,bnkh->bnk", q, k), -1), v)

    def matmul(q, k, v):
        return (jax.nn.softmax(q[:, :, None] @ jnp.swapaxes(k, -1, -2), -1) @ v)[:, :, 0]

    def summed(q, k, v):
        p = jax.nn.softmax((k * q[:, :, None]).sum(-1), -1)
        return (p[..., None] * v).sum(-2)
    return {"xla einsum": layers(einsum), "xla matmul": layers(matmul), "xla multiply-sum": layers(summed),
            "xla einsum, per layer": per_layer(einsum)}, jnp.asarray


def measure(name: str, batch: int, rounds: int) -> dict:
    cross, q = tensors(batch)
    want = reference(cross, q)
    fns, put = contenders(name)
    c, qq = put(cross), put(q)
    out = {}
    for label, f in fns.items():
        got = np.asarray(f(c, qq))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            np.asarray(f(c, qq))
            times.append((time.perf_counter() - t0) * 1e3)
        out[label] = {"ms": statistics.median(times), "error": float(np.abs(got - want).max())}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--measure", nargs=2, metavar=("LIBRARY", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]), args.rounds)))
        return
    print(f"{LAYERS} layers x {HEADS} heads x {POSITIONS} positions x {HEAD_DIM}; median of {args.rounds}; "
          f"{os.cpu_count()} cores; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{'batch':>5} {'contender':22} {'ms':>8} {'MB read':>8} {'GB/s':>6} {'x torch matmul':>15} {'max error':>10}")
    for batch in (1, 4):
        results = {}
        for name in ("torch", "jax"):
            r = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--measure", name, str(batch)],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
            results.update(json.loads(r.stdout.strip().splitlines()[-1]))
        mb = LAYERS * 2 * batch * HEADS * POSITIONS * HEAD_DIM * 4 / 1e6
        base = results["torch matmul"]["ms"]
        for label, res in results.items():
            print(f"{batch:>5} {label:22} {res['ms']:>8.2f} {mb:>8.1f} {mb / res['ms']:>6.1f} "
                  f"{base / res['ms']:>14.2f}x {res['error']:>10.1e}")


if __name__ == "__main__":
    main()
