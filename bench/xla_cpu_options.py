"""XLA's CPU library options on BERT-base: which ops go to YNNPACK, oneDNN or XNNPACK, against what the project sets.

BERT-base (the zoo's ``Bert``, random weights) is compiled through ``tb.compile`` (the weights prepared, as an
artifact runs them) once per option set at (batch, seq) = (1, 128) and (8, 128), static; each executable is timed
interleaved with the others, rounds of ``--calls`` calls, and the medians reported with their ratio to the
project's current CPU options (``compiler/optimization.py``). An option set XLA refuses is reported with its error.

    python bench/xla_cpu_options.py [--rounds 5] [--calls 20] [--layers 12]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import numpy as np

import tripy_build as tb
from tripy_build.compiler.optimization import compiler_options
from tripy_build.models.bert import Bert
from tripy_build.runtime.executable import Executable

CURRENT = compiler_options(3, "cpu")
YNN = "xla_cpu_experimental_ynn_fusion_type"
NO_YNN = {YNN: "LIBRARY_FUSION_TYPE_INVALID"}  # a repeated enum: INVALID leaves YNNPACK nothing
OPTIONS = {
    "project (YNNPACK: dots only)": CURRENT,
    "XLA default (YNNPACK's own list)": {},
    "YNNPACK: dot fusions": {YNN: "LIBRARY_FUSION_TYPE_DOT"},
    "YNNPACK: dots + elementwise": {YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_ELTWISE"},
    "oneDNN dots, no YNNPACK": {**NO_YNN, "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "XNNPACK dots, no YNNPACK": {**NO_YNN, "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "no libraries (XLA's own dots)": NO_YNN,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--layers", type=int, default=12)
    args = p.parse_args()
    model = Bert(num_hidden_layers=args.layers)
    params = jax.tree_util.tree_map(np.asarray, model.init(jax.random.key(0)))
    rng = np.random.default_rng(0)
    results: dict[tuple[str, str], list[float]] = {}
    runs = {}
    for batch, seq in ((1, 128), (8, 128)):
        ids = rng.integers(0, model.vocab_size, (batch, seq), dtype=np.int32)
        mask, types = np.ones_like(ids), np.zeros_like(ids)
        specs = [tb.InputInfo((batch, seq), "int32")] * 3
        compiled = tb.compile(lambda p, a, b, c: model.apply(p, a, b, c), args=[params, *specs])
        want = None
        for name, options in OPTIONS.items():
            try:
                exe = _with_options(compiled, options)
                out = np.asarray(exe(ids, mask, types)["last_hidden_state"])
            except Exception as e:  # noqa: BLE001 - a set XLA refuses is reported, the others go on
                print(f"{batch}x{seq} {name}: refused ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
                continue
            want = out if want is None else want
            err = float(np.abs(out - want).max() / np.abs(want).max())
            runs[(f"{batch}x{seq}", name)] = (exe, (ids, mask, types), err)
    for _ in range(args.rounds):
        for key, (exe, xs, _) in runs.items():
            exe(*xs)["last_hidden_state"].block_until_ready()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                out = exe(*xs)
            out["last_hidden_state"].block_until_ready()
            results.setdefault(key, []).append((time.perf_counter() - t0) / args.calls * 1e3)
    print(f"\njax {jax.__version__}, BERT-base ({args.layers} layers), medians of {args.rounds} rounds of {args.calls} calls")
    print(f"{'shape':8} {'options':36} {'ms':>8} {'x project':>10} {'error':>9}")
    for shape in ("1x128", "8x128"):
        base = statistics.median(results[(shape, next(iter(OPTIONS)))])
        for (s, name), times in results.items():
            if s == shape:
                ms = statistics.median(times)
                print(f"{shape:8} {name:36} {ms:8.2f} {base / ms:9.2f}x {runs[(s, name)][2]:9.1e}")


def _with_options(compiled, options):
    """The executable's model with its profiles compiled again with ``options`` (the same exported program and
    prepared weights): what an artifact built with those options would run. Its profile compiles on its first call
    (``runtime/compile_here.py``), which the timing rounds' warm-up call makes."""
    model = dataclasses.replace(compiled.compiled, compiler_options={"cpu": dict(options)}, profiles=())
    return Executable(model)
