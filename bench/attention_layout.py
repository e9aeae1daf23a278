"""An encoder's self-attention (``models/_layers.attend``: softmax(q k^T) v over a fused ``[b, s, 3 * d]`` projection)
in XLA on the CPU, its products over ``[b, heads, s, hd]`` (``attend``'s now) and over ``[b, s, heads, hd]`` (its
einsums before 2026-12-08), next to PyTorch's matmul and ``scaled_dot_product_attention`` on the same tensors, at
whisper-base's encoder shape (1500 positions, 8 heads of 64), ViT-B/16's (197, 12 of 64) and BERT-base's (128, 12
of 64).

Each library runs in a process of its own (one thread pool at a time), the median of ``--rounds`` calls after one
untimed; the outputs are compared with the first XLA form's.

Run: ``python bench/attention_layout.py`` (~1 min on 2 cores).
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

SHAPES = {"whisper-base": (1500, 8, 64, (1, 4)), "vit-b16": (197, 12, 64, (1, 8)), "bert-base": (128, 12, 64, (1, 8))}


def projection(batch: int, s: int, heads: int, hd: int) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((batch, s, 3 * heads * hd)) * 0.3).astype(np.float32)


def contenders(name: str, heads: int):
    """``{label: f(qkv)}`` of one library, each returning ``[b, s, heads * hd]``, and its array constructor."""
    if name == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)

        def split(x):  # [b, heads, s, hd] each, views
            b, s, _ = x.shape
            return x.reshape(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)

        def matmul(x):
            q, k, v = split(x)
            return (torch.softmax(q @ k.transpose(-1, -2), -1) @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)

        def sdpa(x):
            q, k, v = split(x)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
            return out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return {"torch matmul": matmul, "torch sdpa": sdpa}, torch.from_numpy
    import jax
    import jax.numpy as jnp

    from tripy_build.models._layers import attend

    def before(x):  # attend's einsums before 2026-12-08
        b, s, _ = x.shape
        qkv = x.reshape(b, s, 3, heads, -1)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        p = jax.nn.softmax(jnp.einsum("bqnh,bknh->bnqk", q, k), -1)
        return jnp.einsum("bnqk,bknh->bqnh", p, v).reshape(b, s, -1)
    return {"xla [b, s, heads, hd]": jax.jit(before),
            "xla [b, heads, s, hd]": jax.jit(lambda x: attend(x, heads))}, jnp.asarray


def measure(name: str, shape: str, batch: int, rounds: int) -> dict:
    s, heads, hd, _ = SHAPES[shape]
    x = projection(batch, s, heads, hd)
    fns, put = contenders(name, heads)
    xx = put(x)
    out = {}
    for label, f in fns.items():
        got = np.asarray(f(xx))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            np.asarray(f(xx))
            times.append((time.perf_counter() - t0) * 1e3)
        out[label] = {"ms": statistics.median(times), "out": got.ravel()[:4096].tolist()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--measure", nargs=3, metavar=("LIBRARY", "SHAPE", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1], int(args.measure[2]), args.rounds)))
        return
    print(f"one layer's self-attention; median of {args.rounds}; {os.cpu_count()} cores")
    print(f"{'shape':12} {'batch':>5} {'contender':22} {'ms':>9} {'x torch sdpa':>13} {'max error':>10}")
    for shape in args.shapes.split(","):
        for batch in SHAPES[shape][3]:
            results = {}
            for name in ("jax", "torch"):
                r = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--measure", name, shape,
                                    str(batch)], capture_output=True, text=True)
                if r.returncode:
                    sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
                results.update(json.loads(r.stdout.strip().splitlines()[-1]))
            want = np.asarray(results["xla [b, s, heads, hd]"]["out"])
            base = results["torch sdpa"]["ms"]
            for label, res in results.items():
                error = float(np.abs(np.asarray(res["out"]) - want).max())
                print(f"{shape:12} {batch:>5} {label:22} {res['ms']:>9.2f} {base / res['ms']:>12.2f}x {error:>10.1e}")


if __name__ == "__main__":
    main()
