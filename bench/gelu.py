"""The exact GELU's two forms in whole BERT encoders, side by side in one process: ``jax.nn.gelu(approximate=False)``
(``erfc``: what the zoo runs, ``_layers.ACTIVATIONS["gelu"]``) against ``x (1 + erf(x / sqrt 2)) / 2`` computed in
float32 (``erf``: PyTorch's form). XLA's CPU code for ``erfc`` is several times dearer per element than for ``erf``,
but the cheaper form changes what XLA fuses: YNNPACK takes ``erf`` into its own fused subgraph with the dots around
it, which is faster at some shapes and slower at others (docs/performance.md, "Where the steady time goes").

Each shape is one jitted encoder (the zoo's ``Bert`` with random weights, the same for both forms), compiled once
per form; the timed calls alternate between the two forms (each goes first every other round), so both see the
same machine. Reported per shape: the
median and p90 ms of each form, the ratio of the medians, and the largest difference between their outputs.

    .venv/bin/python bench/gelu.py                 # BERT-base 1x128 and 8x128, MiniLM-L-6's shape 8x128 and 32x128
    .venv/bin/python bench/gelu.py --rounds 60
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
SHAPES = [("BERT-base", BASE, 1, 128), ("BERT-base", BASE, 8, 128), ("MiniLM-L-6", MINILM, 8, 128),
          ("MiniLM-L-6", MINILM, 32, 128)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed calls per form and shape (default 30)")
    parser.add_argument("--only", choices=sorted({s[0] for s in SHAPES}), help="one model's shapes")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from tripy_build.models import Bert
    from tripy_build.models import _layers

    def erf_form(x):
        x32 = x.astype(jnp.float32)
        return (x32 * (0.5 + 0.5 * jax.lax.erf(x32 * (1 / math.sqrt(2))))).astype(x.dtype)

    _layers.ACTIVATIONS["gelu_erf"] = erf_form
    print(f"jax {jax.__version__}; {len(jax.devices())} device(s); {args.rounds} interleaved calls per form")
    print(f"{'model':11} {'shape':7} {'erf ms':>8} {'p90':>7} {'erfc ms':>8} {'p90':>7} {'erf/erfc':>9} {'max |diff|':>11}")
    rng = np.random.default_rng(0)
    for name, sizes, batch, seq in [s for s in SHAPES if not args.only or s[0] == args.only]:
        forms = {}
        for act in ("gelu_erf", "gelu"):
            model = Bert(hidden_act=act, head="none", **sizes)
            params = model.init(jax.random.PRNGKey(0))
            forms[act] = (jax.jit(model.apply), params)
        ids = rng.integers(0, 30522, (batch, seq)).astype(np.int32)
        mask = np.ones((batch, seq), np.int32)
        types = np.zeros((batch, seq), np.int32)
        outs, times = {}, {act: [] for act in forms}
        for act, (fn, params) in forms.items():
            outs[act] = np.asarray(jax.tree_util.tree_leaves(fn(params, ids, mask, types))[0])
        for r in range(args.rounds):
            for act, (fn, params) in list(forms.items())[::1 if r % 2 else -1]:
                t0 = time.perf_counter()
                jax.block_until_ready(fn(params, ids, mask, types))
                times[act].append(time.perf_counter() - t0)
        med = {a: statistics.median(t) * 1e3 for a, t in times.items()}
        p90 = {a: sorted(t)[int(0.9 * (len(t) - 1))] * 1e3 for a, t in times.items()}
        diff = float(np.abs(outs["gelu_erf"] - outs["gelu"]).max())
        print(f"{name:11} {batch}x{seq:<5} {med['gelu_erf']:8.1f} {p90['gelu_erf']:7.1f} {med['gelu']:8.1f} "
              f"{p90['gelu']:7.1f} {med['gelu_erf'] / med['gelu']:8.2f}x {diff:11.2e}")


if __name__ == "__main__":
    main()
