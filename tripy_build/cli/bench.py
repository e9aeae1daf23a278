"""``python -m tripy_build bench PATH``: how a built artifact performs where it is deployed.

Run in a fresh process, it measures, side by side in one run:

- cold start: spawn a new process -> first result (a child process, timed from here), and in this
  process: ``import tripy_build``, ``load``, the first call (at opt);
- each profile's first call right after a fresh load (its exact shape, cheapest first, calls back to
  back), against its latency on the next calls: within ``2 x steady + 1 ms`` or not;
- a seeded stream of random in-range shapes, each call timed once, as a server would see them; a call
  *stalls* when it takes more than twice the steady latency at its shape plus 10 ms (a compile costs
  50-1400 ms here, running a precompiled bucket for the first time a few ms);
- steady latency (median, p90, p99), once both loaders' background warm-up is done, at min, opt, max
  and at shapes sampled from the stream, with the route each takes (an exact profile, padded to a
  bucket, split into bucket-sized calls, or compiled on first use; the runtime's where it differs) and the
  padding overhead: the ratio to the same program compiled by ``jax.jit`` for exactly that shape, timed
  interleaved with it. ``bench/split_vs_pad.py`` times a rows dim's every size padded and split.

All of it for both loaders (``tripy_build.load`` and the jax-free ``tripy_build.runtime.load``), except
the ratio to ``jax.jit`` (``tb.load``'s). ``--threads 1,2`` runs the whole bench once per count, each in a
process pinned to that many cores (XLA sizes its thread pool to the cores a process may use).

``--json FILE`` writes every number for machines (``-`` for stdout); ``--plot FILE.png`` draws steady
latency against each dynamic dim with the buckets marked (needs matplotlib: ``pip install
'tripy_build[plot]'``). Timings on a shared machine are noisy: medians, interleaved, and the
repetitions adapt to each shape's latency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Sequence

from ..runtime.warmup import FIRST_CALL_FACTOR, FIRST_CALL_MARGIN_S

STALL_FACTOR = 2.0
STALL_MARGIN_S = 0.010


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(samples) * 1e3
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "n": int(a.size)}


def _inputs(exe: Any, sizes: Sequence[int], seed: int) -> list[Any]:
    from ..compiler.selftest import sample

    shapes = exe.dispatcher.leaf_shapes(sizes)
    return [sample(info, s, (seed, li)) for li, ((_, info), s) in enumerate(zip(exe.flat_inputs, shapes))]


def _timed(fn: Any, args: Sequence[Any]) -> float:
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def _steady(fns: dict[str, Any], args: dict[str, Sequence[Any]], budget_s: float, max_reps: int = 400) -> dict[str, list[float]]:
    """Interleaved repeated calls of each function (after one warm-up call each)."""
    for name, fn in fns.items():
        _timed(fn, args[name])
    one = max(sum(_timed(fn, args[name]) for name, fn in fns.items()), 1e-6)
    reps = int(min(max_reps, max(7, budget_s / one)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(_timed(fn, args[name]))
    return samples


def _route_label(exe: Any, shapes: Sequence[Sequence[int]]) -> str:
    """The route a loader (``tb.load``'s ``Executable`` or the runtime's ``Runtime``) takes at ``shapes``, split
    plans included (its warm-up's latencies, ``warmup.calibrate``)."""
    route = exe.route(shapes)
    if route.split is not None:
        return "split " + "+".join(",".join(map(str, sub.target)) for _, _, sub in route.split[1])
    target = ",".join(map(str, route.target))
    if route.target in exe.dispatcher.profiles:
        return f"padded->{target}" if route.padded else "exact"
    return f"compiled {target}" + (" (padded)" if route.padded else "")


def _exact_jit(exe: Any, sizes: Sequence[int]) -> Any:
    """The artifact's own program, compiled by jax.jit for exactly these shapes (no padding)."""
    import jax
    import numpy as np

    route = exe.dispatcher.route(exe.dispatcher.leaf_shapes(sizes))
    compiled = jax.jit(exe.compiled.program.main.call)
    lead, dim_sizes = tuple(exe.compiled.leading), [np.int32(n) for n in route.sizes]
    return lambda *leaves: compiled(*lead, *leaves, *dim_sizes)


COLD_START_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
if sys.argv[2] == "runtime":
    from tripy_build import runtime as loader
else:
    import tripy_build as loader
t1 = time.perf_counter()
exe = loader.load(sys.argv[1], warmup=sys.argv[3])
t2 = time.perf_counter()
rng = np.random.default_rng(0)
x = [rng.standard_normal(info.shape_bounds.opt).astype(info.dtype) for _, info in exe.flat_inputs]
y = exe(*x)
y = np.asarray(y if not isinstance(y, (list, tuple, dict)) else sorted(y.values())[0] if isinstance(y, dict) else y[0])
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first_call": t3 - t2, "jax_imported": "jax" in sys.modules,
                  "checksum": float(y.ravel()[0])}), flush=True)
"""


def cold_start(path: str, rounds: int, loader: str = "tripy_build", warmup: str = "background") -> dict[str, Any]:
    """Spawn -> first result (at opt) in a new process, timed from here, loading with ``tripy_build.load``
    (``loader="tripy_build"``) or ``tripy_build.runtime.load`` (``"runtime"``, no jax).

    The child reports its own split: the import (for ``tripy_build.load`` mostly ``import jax``),
    ``load`` and the first call; the rest is the interpreter starting. The clock stops when the
    result reaches this process, not when the child exits.
    """
    runs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", COLD_START_CHILD, path, loader, warmup],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        wall = time.perf_counter() - t0
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0 or not line.strip():
            raise RuntimeError(f"cold-start child failed:\n{err[-2000:]}")
        runs.append(dict(json.loads(line), seconds=wall))
    median = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**median, "all": [r["seconds"] for r in runs]}


def first_calls(path: str, loader: str, warmup: str, shaper: Any) -> dict[str, Any]:
    """Each precompiled profile's first call right after a fresh load with ``loader`` (``"tripy_build"`` or
    ``"runtime"``), at its exact shape, cheapest first and back to back; its steady latency: the faster
    of the next two calls. A first call is *within* when it takes at most ``2 x steady + 1 ms``.
    ``shaper``: the same artifact already loaded by ``tb.load``, which gives each profile's input shapes."""
    import math

    from .. import runtime
    from ..runtime.loader import load

    exe = (load if loader == "tripy_build" else runtime.load)(path, warmup=warmup)
    points = []
    for target in sorted((tuple(p.values()) for p in shaper.profiles), key=math.prod):
        x = _inputs(shaper, target, 5)
        first = _timed(exe, x)
        steady = min(_timed(exe, x) for _ in range(2))
        points.append({"sizes": list(target), "first_ms": first * 1e3, "steady_ms": steady * 1e3,
                       "within": first <= FIRST_CALL_FACTOR * steady + FIRST_CALL_MARGIN_S})
    worst = max(points, key=lambda p: p["first_ms"] / p["steady_ms"], default=None)
    return {"profiles": len(points), "within": sum(p["within"] for p in points),
            "rule": f"<= {FIRST_CALL_FACTOR:g} x steady + {FIRST_CALL_MARGIN_S * 1e3:g} ms", "worst": worst,
            "points": points}


def _stream(sizes: Sequence[Sequence[int]], times: Sequence[float], steady: dict[tuple[int, ...], float],
            seed: int) -> dict[str, Any]:
    """A stream's calls against the steady latency at each one's shape: percentiles and stalls."""
    import numpy as np

    stalls = [i for i, (s, t) in enumerate(zip(sizes, times)) if t > STALL_FACTOR * steady[tuple(s)] + STALL_MARGIN_S]
    ratios = [t / steady[tuple(s)] for s, t in zip(sizes, times)]
    return {
        "calls": len(sizes), "seed": seed, **_percentiles(times),
        "stalls": len(stalls), "stall_rule": f"> {STALL_FACTOR:g} x steady at the shape + {STALL_MARGIN_S * 1e3:g} ms",
        "worst_ratio_to_steady": float(max(ratios, default=0.0)),
        "p99_ratio_to_steady": float(np.percentile(ratios, 99)) if ratios else 0.0,
        "stalled": [{"call": i, "sizes": sizes[i], "ms": times[i] * 1e3, "steady_ms": steady[tuple(sizes[i])] * 1e3}
                    for i in stalls],
        "points": [{"sizes": s, "ms": t * 1e3, "steady_ms": steady[tuple(s)] * 1e3} for s, t in zip(sizes, times)],
    }


def run(path: str, stream: int = 200, seed: int = 0, sample_shapes: int = 8, budget_s: float = 0.3,
        cold_rounds: int = 3, warmup: str = "background") -> dict[str, Any]:
    """Every measurement, as a JSON-able dict (see the module docstring)."""
    import numpy as np

    from .. import runtime
    from ..runtime.loader import load

    cold = None
    if cold_rounds:
        cold = {"tripy_build.load": cold_start(path, cold_rounds, "tripy_build", warmup),
                "tripy_build.runtime.load": cold_start(path, cold_rounds, "runtime", warmup)}
    t0 = time.perf_counter()
    exe = load(path, warmup=warmup)
    load_s = time.perf_counter() - t0
    dims = exe.dims
    opt = [d.bounds[1] for d in dims]
    x_opt = _inputs(exe, opt, 0)
    first_call_s = _timed(exe, x_opt)

    rng = np.random.default_rng(seed)
    stream_sizes = [[int(rng.integers(d.bounds[0], d.bounds[2] + 1)) for d in dims] for _ in range(stream)]
    stream_inputs = [_inputs(exe, s, 1000 + i) for i, s in enumerate(stream_sizes)]
    stream_times = [_timed(exe, x) for x in stream_inputs]
    rt = runtime.load(path, warmup=warmup)
    rt_stream_times = [_timed(rt, x) for x in stream_inputs]
    firsts = {"tripy_build.load": first_calls(path, "tripy_build", warmup, exe),
              "tripy_build.runtime.load": first_calls(path, "runtime", warmup, exe)}

    exe.wait_warmed()  # steady latency is timed once the background warm-up no longer shares the cores
    rt.wait_warmed()
    named = {"min": [d.bounds[0] for d in dims], "opt": opt, "max": [d.bounds[2] for d in dims]}
    distinct = list(dict.fromkeys(tuple(s) for s in stream_sizes))
    picks = rng.choice(len(distinct), size=min(sample_shapes, len(distinct)), replace=False) if distinct else []
    for i in sorted(picks):
        named.setdefault(f"stream{i}", list(distinct[i]))
    shapes = []
    for label, sizes in named.items():
        x = _inputs(exe, sizes, 7)
        jit = _exact_jit(exe, sizes)
        samples = _steady({"tripy_build": exe, "runtime": rt, "jax.jit": jit},
                          {"tripy_build": x, "runtime": x, "jax.jit": x}, budget_s)
        ours, theirs = _percentiles(samples["tripy_build"]), _percentiles(samples["jax.jit"])
        shapes.append({
            "label": label, "sizes": {d.name or d.symbol: n for d, n in zip(dims, sizes)},
            "route": _route_label(exe, [a.shape for a in x]),
            "runtime_route": _route_label(rt, [a.shape for a in x]), **ours,
            "runtime_median_ms": _percentiles(samples["runtime"])["median_ms"],
            "jit_median_ms": theirs["median_ms"], "overhead": ours["median_ms"] / theirs["median_ms"],
        })

    steady_by_shape, rt_steady_by_shape = {}, {}
    for sizes in distinct:
        x = _inputs(exe, sizes, 11)
        steady_by_shape[sizes] = float(np.median([_timed(exe, x) for _ in range(5)]))
        rt_steady_by_shape[sizes] = float(np.median([_timed(rt, x) for _ in range(5)]))
    return {
        "artifact": os.path.abspath(path), "function": exe.__name__,
        "dims": [{"name": d.name or d.symbol, "min": d.bounds[0], "opt": d.bounds[1], "max": d.bounds[2],
                  "buckets": list(d.buckets), "padding": d.padding, "strategy": d.strategy} for d in dims],
        "profiles": len(exe.profiles), "warmup": warmup, "cores": len(_cores()),
        "cold_start": cold, "load_seconds": load_s, "first_call_seconds": first_call_s,
        "first_calls": firsts,
        "shapes": shapes,
        "padding_overhead_median": float(np.median([s["overhead"] for s in shapes])),
        "stream": _stream(stream_sizes, stream_times, steady_by_shape, seed),
        "runtime_stream": _stream(stream_sizes, rt_stream_times, rt_steady_by_shape, seed),
    }


def _cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def report(result: dict[str, Any]) -> str:
    lines = [f"artifact: {result['artifact']} ({result['function']}, {result['profiles']} profiles; "
             f"{result['cores']} core{'s' if result['cores'] > 1 else ''})"]
    for d in result["dims"]:
        lines.append(f"  dim {d['name']} [{d['min']}..{d['max']}] opt {d['opt']}: {d['strategy']}"
                     + (f", buckets {' '.join(map(str, d['buckets']))}" if d["buckets"] else ""))
    for loader, cold in (result["cold_start"] or {}).items():
        lines.append(f"  cold start, {loader + ':':<26} {cold['seconds'] * 1e3:4.0f} ms spawn -> first result = import "
                     f"{cold['import'] * 1e3:.0f} ms + load {cold['load'] * 1e3:.0f} ms + first call "
                     f"{cold['first_call'] * 1e3:.1f} ms + interpreter start"
                     + ("" if cold["jax_imported"] else " (jax never imported)"))
    lines.append(f"  this process (warmup={result['warmup']}): load {result['load_seconds'] * 1e3:.0f} ms, "
                 f"first call {result['first_call_seconds'] * 1e3:.1f} ms")
    for loader, f in result["first_calls"].items():
        worst = f["worst"]
        lines.append(f"  first calls, {loader + ':':<25} {f['within']} of {f['profiles']} profiles {f['rule']}"
                     + (f"; worst at {','.join(map(str, worst['sizes']))}: {worst['first_ms']:.1f} ms against "
                        f"{worst['steady_ms']:.1f} ms" if worst else ""))
    for loader, key in (("tripy_build.load", "stream"), ("tripy_build.runtime.load", "runtime_stream")):
        s = result[key]
        lines.append(f"  stream, {loader + ':':<30} {s['calls']} random in-range shapes (seed {s['seed']}): median "
                     f"{s['median_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms; stalls {s['stalls']} ({s['stall_rule']}); "
                     f"p99 / steady {s['p99_ratio_to_steady']:.2f}x, worst {s['worst_ratio_to_steady']:.2f}x")
    header = (f"  {'shape':<10} {'sizes':<26} {'route':<22} {'median':>9} {'p90':>9} {'p99':>9} {'runtime':>9} "
              f"{'jax.jit':>9} {'ratio':>6}")
    lines += ["", header, "  " + "-" * (len(header) - 2)]
    for r in result["shapes"]:
        sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
        theirs = r.get("runtime_route", r["route"])
        lines.append(f"  {r['label']:<10} {sizes:<26} {r['route']:<22} {r['median_ms']:>7.3f}ms {r['p90_ms']:>7.3f}ms "
                     f"{r['p99_ms']:>7.3f}ms {r['runtime_median_ms']:>7.3f}ms {r['jit_median_ms']:>7.3f}ms "
                     f"{r['overhead']:>5.2f}x" + ("" if theirs == r["route"] else f"  (runtime: {theirs})"))
    lines.append(f"  padding overhead (median over shapes of tripy_build / exact-shape jax.jit): "
                 f"{result['padding_overhead_median']:.2f}x")
    return "\n".join(lines)


def plot(result: dict[str, Any], out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import TripyBuildError

        raise TripyBuildError("--plot needs matplotlib: pip install 'tripy_build[plot]'.") from None
    dims = result["dims"]
    if len(dims) == 2:
        _heatmap(result, out, plt)
        return
    fig, axes = plt.subplots(1, max(1, len(dims)), figsize=(5.5 * max(1, len(dims)), 4), squeeze=False)
    points = result["stream"]["points"]
    for ax, (i, d) in zip(axes[0], enumerate(dims)):
        ax.scatter([p["sizes"][i] for p in points], [p["steady_ms"] for p in points], s=10, label="steady (tripy_build)")
        ax.scatter([p["sizes"][i] for p in points], [p["ms"] for p in points], s=6, marker="x", alpha=0.5,
                   label="first call in the stream")
        xs = [r["sizes"][d["name"]] for r in result["shapes"]]
        ax.scatter(xs, [r["jit_median_ms"] for r in result["shapes"]], s=25, marker="^", label="jax.jit, exact shape")
        for b in d["buckets"]:
            ax.axvline(b, color="gray", linestyle=":", linewidth=0.8)
        ax.set_xlabel(f"{d['name']} ({d['strategy']}; dotted: buckets)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['function']}: latency against shape")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def cells(result: dict[str, Any]) -> tuple[list[float], list[float], list[list[float | None]]]:
    """The stream's steady latencies of a two-dim artifact on a grid whose cells are the sizes that run
    the same profile: along a padded dim a cell is one bucket (the sizes it covers), along another each
    size the stream met is its own. Returns the cell edges along each dim and the median latency (ms)
    per cell, ``grid[j][i]`` for cell i of the first dim and j of the second (None where the stream had
    no call)."""
    import numpy as np

    points = result["stream"]["points"]
    edges = []
    for i, d in enumerate(result["dims"]):
        if d["strategy"] == "padded":
            tops = [b for b in d["buckets"]] + ([d["max"]] if d["buckets"][-1] < d["max"] else [])
        else:
            tops = sorted({p["sizes"][i] for p in points})
        edges.append([d["min"] - 0.5] + [t + 0.5 for t in tops])
    grid: list[list[list[float]]] = [[[] for _ in edges[0][1:]] for _ in edges[1][1:]]
    for p in points:
        i, j = (int(np.searchsorted(e, size) - 1) for e, size in zip(edges, p["sizes"]))
        grid[j][i].append(p["steady_ms"])
    return edges[0], edges[1], [[float(np.median(c)) if c else None for c in row] for row in grid]


def _heatmap(result: dict[str, Any], out: str, plt: Any) -> None:
    """Two dims: steady latency as a heatmap over both (a cell per profile a call runs), the stream's calls
    as dots, and the calls that stalled ringed."""
    import numpy as np
    from matplotlib.colors import LogNorm

    (a, b), points = result["dims"], result["stream"]["points"]
    xs, ys, grid = cells(result)
    values = np.array([[np.nan if v is None else v for v in row] for row in grid])
    fig, ax = plt.subplots(figsize=(7, 5))
    finite = values[np.isfinite(values)]
    mesh = ax.pcolormesh(xs, ys, np.ma.masked_invalid(values), cmap="viridis", shading="flat",
                         norm=LogNorm(vmin=finite.min(), vmax=finite.max()) if finite.size else None)
    fig.colorbar(mesh, ax=ax, label="steady latency (ms), median per cell")
    ax.scatter([p["sizes"][0] for p in points], [p["sizes"][1] for p in points], s=6, color="white", alpha=0.7,
               label="calls in the stream")
    stalled = result["stream"]["stalled"]
    if stalled:
        ax.scatter([p["sizes"][0] for p in stalled], [p["sizes"][1] for p in stalled], s=40, facecolors="none",
                   edgecolors="red", label="stalled (first call)")
    ax.set_xlabel(f"{a['name']} ({a['strategy']})")
    ax.set_ylabel(f"{b['name']} ({b['strategy']})")
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{result['function']}: latency over {a['name']} x {b['name']} (cells: the profile a call runs)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build bench", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact directory")
    parser.add_argument("--stream", type=int, default=200, help="calls in the random in-range stream (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stream's shapes (default 0)")
    parser.add_argument("--shapes", type=int, default=8, help="stream shapes also timed steadily against jax.jit")
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of repeated calls per shape (default 0.3)")
    parser.add_argument("--cold-rounds", type=int, default=3, help="spawned cold starts, median reported (0: skip)")
    parser.add_argument("--warmup", choices=("background", "now", "none"), default="background",
                        help="how the artifact is loaded (tripy_build.load's warmup; default background)")
    parser.add_argument("--threads", metavar="N[,N...]",
                        help="run the whole bench once per count, each in a process pinned to that many cores")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw latency against shape (needs matplotlib)")
    args = parser.parse_args(argv)
    from ..errors import TripyBuildError

    if args.threads:
        try:
            return _per_thread_count(args, list(argv if argv is not None else sys.argv[1:]))
        except TripyBuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    try:
        result = run(args.path, args.stream, args.seed, args.shapes, args.budget, args.cold_rounds, args.warmup)
        if args.plot:
            plot(result, args.plot)
    except TripyBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(result, indent=1))
    else:
        print(report(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


def _thread_counts(spec: str) -> list[int]:
    from ..errors import SpecError

    cores = _cores()
    try:
        counts = [int(x) for x in spec.split(",")]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= n <= len(cores) for n in counts):
        raise SpecError(f"--threads {spec}: expected core counts between 1 and {len(cores)} (the cores this process "
                        f"may use), separated by commas, e.g. --threads 1,{len(cores)}.")
    return counts


def _per_thread_count(args: argparse.Namespace, argv: list[str]) -> int:
    """``--threads``: the bench again in a child process per count, pinned to the first that many cores of
    this one's; their reports printed in turn, their results gathered (``--json``: ``{"threads": {n: ...}}``)."""
    import tempfile

    from ..errors import TripyBuildError

    counts, cores = _thread_counts(args.threads), _cores()
    rest, skip = [], False
    for a in argv:  # the child's arguments: these less --threads, --json and --plot (the parent writes them)
        if skip:
            skip = False
        elif a in ("--threads", "--json", "--plot"):
            skip = True
        elif not a.startswith(("--threads=", "--json=", "--plot=")):
            rest.append(a)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            out = os.path.join(tmp, f"{n}.json")
            pinned = cores[:n]
            proc = subprocess.run([sys.executable, "-m", "tripy_build.cli.bench", *rest, "--json", out],
                                  preexec_fn=lambda pinned=pinned: os.sched_setaffinity(0, pinned),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise TripyBuildError(f"the bench on {n} core(s) failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            with open(out) as f:
                results[str(n)] = json.load(f)
            if args.json != "-":
                print(f"== {n} thread{'s' if n > 1 else ''} (cores {','.join(map(str, pinned))}) ==")
                print(proc.stdout.rstrip())
    if args.json:
        text = json.dumps({"threads": results}, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    if args.plot:
        plot(results[str(counts[-1])], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
