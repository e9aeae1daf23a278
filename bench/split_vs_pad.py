"""A rows dim's sizes between buckets: one padded call against the split into bucket-sized calls, both loaders.

For each size ``n`` of a ``rows`` dim (every size from its min to its max, the other dims held at
``--at``), it times, through each loader's own call path (``tripy_build.load``'s and the jax-free
``tripy_build.runtime.load``'s), the padded call (``n`` rows padded up to the smallest covering bucket)
and a split: the plan ``core.dispatch.split_plan`` makes of the profiles' latencies as this bench measures
them, with no threshold (the cheapest split it can estimate, whether or not the loader would take it).
Every variant of one size is timed interleaved, ``--rounds`` times, and the median kept: the machine is
shared and its noise reaches every variant alike. It also reports what each loader decides at that size
(``pad`` or the split it takes) from the latencies its own warm-up measured, and whether that decision
was the faster one (``ok``; closer than ``--margin``, default 10%, is a tie), a split taken that was
``SLOWER`` than padding (what must not happen), or a faster split ``missed`` (a cost, not an error: the
loaders split only where their estimate says at least 30% faster, ``core.dispatch.SPLIT_MIN_GAIN``).

    .venv/bin/python bench/split_vs_pad.py                          # the zoo's GEGLU (shapes=dynamic): batch 1..64
    .venv/bin/python bench/split_vs_pad.py --model transformer --at seq=64 --sizes 1-64:3
    .venv/bin/python bench/split_vs_pad.py --artifact PATH --rounds 40

The loaders are loaded with their default warm-up and, as ``tripy-build bench`` does, called at once with
``--stream`` random in-range calls (beside the warm-up), then waited for (``wait_warmed``) before any timing.

Measured on the 2-core VM (shared with other work, so a bucket's latency moves ~1.8x as XLA's second
thread is free or not: GEGLU's 64 at 0.77 or 1.45 ms), GEGLU (``model=geglu shapes=dynamic``), all sizes
1..64, 15 rounds. Before the loaders timed their split latencies at quiet moments (``warmup.calibrate``),
tb.load's were taken beside the stream (bucket 1 at 5.5 ms, 2 at 232 ms, 16 at 2.2 ms) and the runtime
planned no splits; after, with ``SPLIT_MIN_GAIN`` 0.7:

    run            splits taken measured slower than padding     faster splits missed (tb.load + runtime)
    before, 1      1 (tb.load: 14 as 8+6, 0.66 against 0.59 ms)   31
    before, 2      0                                              40
    after, 1       0                                              23
    after, 2       0                                              32

With ``--plan 39=16+16+8 --plan 63=16+16+16+16`` (the plans issue 12 met), tb.load: 1.17 and 1.50 ms against
0.92 padded while both cores were free, 1.40 and 1.98 against 1.65 with one busy: 63 as 16x4 is the slower
either way, 39 as 16+16+8 only with the cores free. The transformer block at seq 64 (``--at seq=64
--sizes 1-64:3 --rounds 9``, one artifact, the runs back to back): its warm-up times no profile past 20 ms,
so the 32 and 64 buckets went untimed and the large gains were missed (no split taken, 29 faster ones
missed: 34 rows padded to 64 at 27.1 ms against 13.4 as 32+2). With the untimed profiles estimated from
their flops (``warmup.extrapolate``): 14 splits taken by tb.load and 13 by the runtime, 0 slower than
padding, 15 missed (34 rows as 32+2: 13.1 ms against 26.5 padded; 40 as 32+8: 14.9 against 26.8). GEGLU
(all its profiles timed) is unchanged: 0 taken, 0 slower, 9 missed (``--sizes 1-64:2 --rounds 9``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BUILD = {"geglu": ["model=geglu", "shapes=dynamic"], "transformer": ["model=transformer"]}


def build(model: str, root: Path) -> str:
    out = root / "artifacts"
    subprocess.run([sys.executable, "-m", "tripy_build", *BUILD[model], f"artifacts_dir={out}"], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "TRIPY_BUILD_NO_MEMO": "1"})
    return str(max((out / model).iterdir(), key=lambda p: p.stat().st_mtime))


def sizes_arg(text: str, lo: int, hi: int) -> list[int]:
    """``1-64``, ``1-64:3`` (every third), or ``3,39,63``; all of lo..hi by default."""
    if not text:
        return list(range(lo, hi + 1))
    if "-" in text:
        span, _, step = text.partition(":")
        a, b = (int(x) for x in span.split("-"))
        return list(range(max(a, lo), min(b, hi) + 1, int(step or 1)))
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="geglu", choices=sorted(BUILD))
    p.add_argument("--artifact", help="a built artifact (else --model is built in a temporary directory)")
    p.add_argument("--at", action="append", default=[], metavar="DIM=N",
                   help="the size of another dim (default: its opt)")
    p.add_argument("--sizes", default="", help="sizes of the rows dim: 1-64, 1-64:3 or 3,39,63 (default: all)")
    p.add_argument("--rounds", type=int, default=25, help="interleaved rounds per size (median kept; default 25)")
    p.add_argument("--margin", type=float, default=0.10, help="a decision is wrong only past this (default 0.10)")
    p.add_argument("--plan", action="append", default=[], metavar="N=A+B+...",
                   help="also time this split of N rows (e.g. 39=16+16+8), both loaders, against padding")
    p.add_argument("--stream", type=int, default=200,
                   help="random in-range calls right after load, before the warm-up is waited for (default 200)")
    args = p.parse_args(argv)

    import jax

    import tripy_build as tb
    from tripy_build import runtime
    from tripy_build.core.dispatch import split_plan
    from tripy_build.runtime.warmup import fastest_run

    with tempfile.TemporaryDirectory() as tmp:
        path = args.artifact or build(args.model, Path(tmp))
        exe, rt = tb.load(path), runtime.load(path)
        dims = exe.dims
        di = next(i for i, d in enumerate(dims) if d.padding == "rows")
        row = dims[di]
        fixed = dict(a.split("=", 1) for a in args.at)
        base = [int(fixed.get(d.name, d.bounds[1])) for d in dims]
        rng = np.random.default_rng(0)

        def inputs(n: int) -> list[np.ndarray]:
            sizes = [*base[:di], n, *base[di + 1:]]
            out = []
            for (_, info), shape in zip(exe.flat_inputs, exe.dispatcher.leaf_shapes(sizes)):
                if np.issubdtype(info.dtype, np.integer):
                    lo, hi = info.values or (0, 2)
                    out.append(rng.integers(lo, hi, shape).astype(info.dtype))
                else:
                    out.append(rng.standard_normal(shape).astype(info.dtype))
            return out

        r = np.random.default_rng(1)  # the calls tripy-build bench makes right after load, beside the warm-up
        for _ in range(args.stream):
            x = inputs(int(r.integers(row.bounds[0], row.bounds[2] + 1)))
            jax.block_until_ready(exe(*x))
            rt(*x)
        exe.wait_warmed()
        rt.wait_warmed()

        def runner(loader: object, route: object):
            if loader is exe:
                run = exe._route_runner(route)
                return lambda xs: jax.block_until_ready(run(list(xs)))
            run = rt._route_runner(route)
            return lambda xs: run(list(xs))

        def medians(variants: dict, xs: dict) -> dict:
            """Each variant's median time, timed interleaved: every round runs each once."""
            samples: dict = {k: [] for k in variants}
            for _ in range(args.rounds):
                for k, run in variants.items():
                    samples[k].append(fastest_run(functools.partial(run, xs[k]), budget_s=0, most=1))
            return {k: statistics.median(v) for k, v in samples.items()}

        loaders = {"tb.load": exe, "runtime": rt}
        # the buckets' latencies as this bench measures them, through each loader's own call path
        lat: dict[str, dict[int, float]] = {name: {} for name in loaders}
        xs = {(name, b): inputs(b) for name in loaders for b in row.buckets}
        variants = {(name, b): runner(loader, loader.dispatcher.route([x.shape for x in xs[(name, b)]]))
                    for name, loader in loaders.items() for b in row.buckets}
        for (name, b), t in medians(variants, xs).items():
            lat[name][b] = t

        def target(b: int) -> tuple[int, ...]:
            return (*base[:di], b, *base[di + 1:])

        others = {d.name: n for d, n in zip(dims, base) if d is not row}
        print(f"{exe.__name__}: {row.name} {row.bounds[0]}..{row.bounds[2]} (rows), buckets "
              f"{' '.join(map(str, row.buckets))}; other dims {others}; {len(os.sched_getaffinity(0))} cores; "
              f"medians of {args.rounds} interleaved rounds")
        for name in loaders:
            print(f"  {name:8} bucket latency (ms), measured here:  "
                  + "  ".join(f"{b}: {v * 1e3:.3f}" for b, v in lat[name].items()))
        # each loader's own latencies, which its split plans use (none: a runtime from before it planned splits)
        own_latency = {name: getattr(loader, "_latency", {}) for name, loader in loaders.items()}
        for name, own in own_latency.items():
            print(f"  {name:8} bucket latency (ms), its warm-up's:  " + "  ".join(
                f"{b}: {own[target(b)] * 1e3:.3f}" if target(b) in own else f"{b}: -" for b in row.buckets))
        print()
        head = (f"{'n':>3}  {'split timed':<12} | {'tb.load pad':>11} {'split':>7}  {'decides':<12} | "
                f"{'runtime pad':>11} {'split':>7}  {'decides':<12}")
        print(head + "\n" + "-" * len(head))
        slower = missed = 0
        for n in sizes_arg(args.sizes, row.bounds[0], row.bounds[2]):
            x = inputs(n)
            shapes = [a.shape for a in x]
            decided = {name: loader.dispatcher.route(shapes, own_latency[name] or None) for name, loader in loaders.items()}
            # the split timed: the one the loader takes, else the cheapest the bench's latencies can make
            plans = {name: [stop_ - start for start, stop_, _ in decided[name].split[1]] if decided[name].split else
                     split_plan(n, row.buckets, lat[name].get, min_gain=float("inf")) for name in loaders}
            variants = {}
            for name, loader in loaders.items():
                variants[(name, "pad")] = runner(loader, loader.dispatcher.route(shapes))
                if plans[name]:
                    variants[(name, "split")] = runner(loader, loader.dispatcher.split_route(shapes, di, plans[name]))
            med = medians(variants, dict.fromkeys(variants, x))
            plan = plans["tb.load"] or plans["runtime"]
            line = f"{n:>3}  {'+'.join(map(str, plan or [])) or '-':<12} |"
            for name in loaders:
                pad, split = med[(name, "pad")], med.get((name, "split"))
                took = "split" if decided[name].split is not None else "pad"
                mine, other = (pad, split) if took == "pad" else (split, pad)
                verdict = "ok" if other is None or mine <= other * (1 + args.margin) else \
                    "SLOWER" if took == "split" else "missed"
                slower += verdict == "SLOWER"
                missed += verdict == "missed"
                line += f" {pad * 1e3:>9.3f}ms {'-' if split is None else f'{split * 1e3:.3f}':>7}  {took + ' ' + verdict:<12} |"
            print(line.rstrip(" |"), flush=True)
        for text in args.plan:  # splits given on the command line, against padding
            n, _, chunks = text.partition("=")
            plan, x = [int(c) for c in chunks.split("+")], inputs(int(n))
            shapes = [a.shape for a in x]
            variants = {(name, kind): runner(loader, loader.dispatcher.split_route(shapes, di, plan) if kind == "split"
                                             else loader.dispatcher.route(shapes))
                        for name, loader in loaders.items() for kind in ("pad", "split")}
            med = medians(variants, dict.fromkeys(variants, x))
            print(f"{int(n):>3}  {chunks:<12} |" + " |".join(
                f" {med[(name, 'pad')] * 1e3:>9.3f}ms {med[(name, 'split')] * 1e3:>7.3f}  {'(given)':<12}"
                for name in loaders), flush=True)
        print(f"\nsplits taken and measured slower than padding (by more than {args.margin:.0%}): {slower}; "
              f"splits measured faster that were not taken: {missed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
