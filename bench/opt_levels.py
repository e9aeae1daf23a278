"""Compile time and steady latency at each ``optimization_level`` (0..5), per zoo model, as ratios to level 3.

Each model (the zoo's default sizes) is compiled with ``tb.compile`` at its opt shape only
(``buckets="none"``) at every level, several times; compile time is the median of the executable's
own compile times (``Precompiled.seconds``). Steady latency interleaves the levels round by round on
the same input (medians of per-round medians). The options each level resolves to are printed:
``tripy_build/compiler/optimization.py`` documents the mapping and why levels 3..5 coincide on the CPU.

    .venv/bin/python bench/opt_levels.py            # about 3 minutes on 2 cores
    .venv/bin/python bench/opt_levels.py --quick --models geglu
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tripy_build as tb
from tripy_build.models import MODELS, input_infos
from tripy_build.compiler.optimization import LEVELS, compiler_options

DIMS = {"batch": (1, 8, 64), "seq": (1, 64, 256), "height": (8, 32, 64), "width": (8, 32, 64)}


def build(name: str, level: int, params):
    model = MODELS[name]()
    infos = input_infos(model, {d: r for d, r in DIMS.items() if any(d in s for s in model.inputs().values())})
    masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}
    exe = tb.compile(model.apply, level, args=[params, *infos.values()], kwargs={"lengths": masks} if masks else None,
                     buckets="none")
    (pre,) = exe.compiled.profiles
    x = [np.random.default_rng(0).standard_normal(info.shape_bounds.opt).astype(np.float32) for info in infos.values()]
    return exe, pre.seconds, x


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="geglu,mlp,transformer,convnet")
    p.add_argument("--quick", action="store_true", help="fewer compiles and rounds")
    args = p.parse_args(argv)
    compiles, rounds, calls = (2, 10, 5) if args.quick else (3, 40, 10)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}; {compiles} compiles per level, "
          f"{rounds} interleaved rounds x {calls} calls")
    for level in LEVELS:
        print(f"  level {level}: {compiler_options(level, jax.default_backend()) or 'XLA defaults'}")
    for name in args.models.split(","):
        params = jax.device_get(jax.jit(MODELS[name]().init)(jax.random.PRNGKey(0)))
        build(name, 3, params)  # the first compile in a process pays for setup: not counted
        exes, ctimes = {}, {}
        for level in LEVELS:
            times = []
            for _ in range(compiles):
                exe, seconds, x = build(name, level, params)
                times.append(seconds)
            exes[level], ctimes[level] = (exe, x), float(np.median(times))
        per_round = {level: [] for level in LEVELS}
        for r in range(rounds):
            for level in [*LEVELS[r % 6:], *LEVELS[:r % 6]]:
                exe, x = exes[level]
                jax.block_until_ready(exe(*x))
                ts = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    jax.block_until_ready(exe(*x))
                    ts.append(time.perf_counter() - t0)
                per_round[level].append(np.median(ts))
        ref = np.asarray(exes[3][0](*exes[3][1]))
        run = {level: float(np.median(v)) for level, v in per_round.items()}
        print(f"\n{name} at its opt shape {[a.shape for a in exes[3][1]]}")
        print(f"  {'level':>5} {'compile ms':>11} {'/ level 3':>10} {'run ms':>9} {'/ level 3':>10} {'max |diff|':>11}")
        for level in LEVELS:
            diff = float(np.abs(np.asarray(exes[level][0](*exes[level][1])) - ref).max())
            print(f"  {level:>5} {ctimes[level] * 1e3:>11.0f} {ctimes[level] / ctimes[3]:>10.2f} "
                  f"{run[level] * 1e3:>9.3f} {run[level] / run[3]:>10.2f} {diff:>11.1e}")


if __name__ == "__main__":
    main()
