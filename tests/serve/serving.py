"""Helpers the serve tests share: the ``two_heads`` model, its inputs, threads released together, and
``tripy-build serve`` started as a process."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import jax.numpy as jnp
import numpy as np

W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


def two_heads(x, t, w):
    """x: (batch, seq, 4) float32, t: (batch,) int32 -> (batch, 3) float32 and (batch,) int32."""
    h = jnp.tanh(x @ w).sum(axis=1)
    return h * t[:, None].astype(h.dtype), t * 2


def sample(rng, rows: int, seq: int = 2) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((rows, seq, 4)).astype(np.float32), rng.integers(-5, 5, rows).astype(np.int32)


def concurrently(n: int, fn) -> list:
    """``fn(i)`` on ``n`` threads released together; their results in order."""
    barrier, results = threading.Barrier(n), [None] * n

    def run(i):
        barrier.wait()
        results[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    return results


def start_serve(args: list[str], cwd: Path) -> tuple[subprocess.Popen, list[str]]:
    """``tripy-build serve ARGS`` as a process, and the lines it printed up to ``serving on URL`` (the last)."""
    proc = subprocess.Popen([sys.executable, "-m", "tripy_build", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("serving on "):
            break
    return proc, lines
