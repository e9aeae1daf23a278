"""Per-call latency of a loaded tripy_build artifact vs its raw executable, ``jax.jit`` and eager, for GEGLU(512, 2048).

Contenders, each called as ``jax.block_until_ready(f(x))`` on a jax array ``x`` already on the device:

- ``artifact``         ``tb.compile`` with batch NamedDimension("batch", 1, 8, 256) and rows padding, saved,
                       ``tb.load``-ed: batch 8 and 256 are both precompiled profiles (pow2 buckets).
- ``raw executable``   the very executable the artifact dispatches to, called directly with the prepared
                       weights (``Compiled``'s own C++ dispatch): the wrapper's cost is the difference.
- ``runtime``          the same artifact loaded by ``tripy_build.runtime`` (jaxlib's PJRT client, numpy out).
- ``jax.jit``          ``jax.jit(partial(model.apply, params))`` (params closed over as constants).
- ``eager``            ``model.apply(params, x)``, op by op.

Contenders are interleaved in many short rounds (per round and batch, each contender in turn runs
a few untimed calls, then a short block of timed ones; the order rotates each round), and every
call is timed on its own. The table shows the median over all calls and the 10th/90th percentiles.
Because a shared machine's speed drifts, the ratios
are *paired*: per round, a contender's median divided by jax.jit's median from the same round, then
the median (and interquartile range) of those per-round ratios. The 5% target (the artifact's
per-call overhead against the raw executable at batch 8) is judged on that.
By default the process is pinned to one CPU and XLA's Eigen thread pool is off (both set before jax
is imported), which makes timings more stable; ``--no-pin`` turns that off.

    .venv/bin/python bench/call_overhead.py            # full run (about 1.5 minutes)
    .venv/bin/python bench/call_overhead.py --quick    # about ten seconds
    .venv/bin/python bench/call_overhead.py --dim-in 16 --dim-out 32 --calls-small 100 --calls-large 20
        # a tiny GEGLU: compute is negligible, so this isolates the per-call dispatch overhead

At GEGLU(512, 2048) a batch-8 call is bound by streaming the 8 MB weight, and jax.jit and the
artifact run the same optimized HLO, so their difference is the wrapper's dispatch (about 2 us)
plus machine noise; on a shared machine expect a few percent either way between runs.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short run: fewer rounds and calls")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 200, quick 20)")
    p.add_argument("--calls-small", type=int, default=25, help="timed calls per contender per round at batch 8 (default 25)")
    p.add_argument("--calls-large", type=int, default=2, help="timed calls per contender per round at batch 256 (default 2)")
    p.add_argument("--dim-in", type=int, default=512, help="GEGLU dim_in (default 512)")
    p.add_argument("--dim-out", type=int, default=2048, help="GEGLU dim_out (default 2048)")
    p.add_argument("--no-pin", action="store_true", help="do not pin to one CPU / one XLA thread")
    p.add_argument("--cpu", type=int, default=None, help="the CPU to pin to (default: the last allowed one)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (20 if args.quick else 200)
    return args


ARGS = parse_args() if __name__ == "__main__" else None

# Pinning must happen before jax is imported: XLA sizes its CPU thread pools at client creation.
PINNED = None
if ARGS is not None and not ARGS.no_pin:
    allowed = sorted(os.sched_getaffinity(0))
    PINNED = ARGS.cpu if ARGS.cpu is not None else allowed[-1]
    os.sched_setaffinity(0, {PINNED})
    # Only --xla_cpu_multi_thread_eigen is a real XLA flag; "intra_op_parallelism_threads=1" (the
    # often-quoted companion) is a TensorFlow option that XLA silently ignores, so it is left out.
    flag = "--xla_cpu_multi_thread_eigen=false"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()

import tempfile  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tripy_build as tb  # noqa: E402
from tripy_build.models import GEGLU  # noqa: E402

BATCHES = (8, 256)


def build_artifact(model: GEGLU, params, root: str):
    info = tb.InputInfo([tb.NamedDimension("batch", 1, 8, 256), model.dim_in], "float32")
    exe = tb.compile(model.apply, args=[params, info], padding=model.padding)
    path = exe.save(os.path.join(root, "geglu"))
    loaded = tb.load(path, warmup="now")
    assert all(((b, model.dim_in),) in loaded.precompiled_shapes for b in BATCHES), loaded.precompiled_shapes
    return path, loaded


def raw_executable(loaded, b: int):
    """The profile's executable with the artifact's prepared weights, through Compiled's C++ dispatch."""
    compiled = next(p for p in loaded.compiled.profiles if p.target == (b,)).ready()
    lead = tuple(loaded.compiled.leading)
    compiled(*lead, np.zeros((b, loaded.flat_inputs[0][1].shape_bounds.opt[1]), np.float32))  # makes _call
    call = compiled._call
    return lambda x: call(*lead, x)


def time_calls(fn, x, n: int, out: list[float]) -> None:
    clock = time.perf_counter_ns
    block = jax.block_until_ready
    for _ in range(n):
        t0 = clock()
        block(fn(x))
        out.append(clock() - t0)


def main(args: argparse.Namespace) -> None:
    model = GEGLU(args.dim_in, args.dim_out)
    params = model.init(jax.random.PRNGKey(0))
    jax.block_until_ready(params)

    from tripy_build import runtime

    root = tempfile.TemporaryDirectory()
    t0 = time.perf_counter()
    path, art = build_artifact(model, params, root.name)
    build_s = time.perf_counter() - t0
    raw = {b: raw_executable(art, b) for b in BATCHES}
    rt = runtime.load(path, warmup="now")
    contenders = {
        "artifact": art,
        "raw executable": lambda x: raw[x.shape[0]](x),
        "runtime": lambda x: rt(np.asarray(x)),  # numpy in, as it is used without jax
        "jax.jit": jax.jit(partial(model.apply, params)),
        "eager": partial(model.apply, params),
    }

    rng = np.random.default_rng(0)
    xs = {b: jax.device_put(rng.standard_normal((b, model.dim_in)).astype(np.float32)) for b in BATCHES}
    ref = {b: np.asarray(contenders["jax.jit"](xs[b])) for b in BATCHES}
    for fn in contenders.values():  # warm up (compiles whatever is compiled lazily) and check
        for b in BATCHES:
            for _ in range(3):
                y = jax.block_until_ready(fn(xs[b]))
            np.testing.assert_allclose(np.asarray(y), ref[b], rtol=1e-4, atol=1e-4)

    calls = {8: args.calls_small, 256: args.calls_large}
    warm = {8: 5, 256: 1}  # untimed calls before each block: re-warm caches after a switch
    samples = {(n, b): [] for n in contenders for b in BATCHES}
    round_medians = {(n, b): [] for n in contenders for b in BATCHES}
    names = list(contenders)
    t0 = time.perf_counter()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for b in BATCHES:
            for name in order:
                fn, x = contenders[name], xs[b]
                time_calls(fn, x, warm[b], [])
                this: list[float] = []
                time_calls(fn, x, calls[b], this)
                samples[(name, b)].extend(this)
                round_medians[(name, b)].append(float(np.median(this)))
    bench_s = time.perf_counter() - t0

    print(f"GEGLU(dim_in={model.dim_in}, dim_out={model.dim_out}) float32, per-call latency "
          f"(f(x).block_until_ready()), jax {jax.__version__}, backend {jax.default_backend()}")
    pin = f"pinned to CPU {PINNED}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}" if PINNED is not None else "not pinned"
    print(f"{args.rounds} interleaved rounds x {calls[8]} calls (batch 8) / {calls[256]} calls (batch 256) "
          f"per contender; {pin}")
    print(f"artifact built+saved+loaded in {build_s:.1f}s; timed section {bench_s:.1f}s\n")
    root.cleanup()

    def path(name: str, b: int) -> str:
        return {"artifact": "tb.load: checks, dispatch, the profile's executable",
                "raw executable": "the same executable, called directly",
                "runtime": "tripy_build.runtime: checks, PJRT execute, numpy out",
                "jax.jit": "jit, weights folded in"}.get(name, "op by op")

    def paired(name: str, b: int, base: str = "jax.jit") -> np.ndarray:
        """Per-round ratios of ``name``'s median to ``base``'s median in the same round."""
        return np.asarray(round_medians[(name, b)]) / np.asarray(round_medians[(base, b)])

    header = (f"{'batch':>5}  {'contender':<17} {'median us':>10} {'p10 us':>9} {'p90 us':>9} "
              f"{'/ jit (paired, IQR)':>22}  path")
    print(header)
    print("-" * (len(header) + 34))
    med = {}
    for b in BATCHES:
        for name in names:
            s = np.asarray(samples[(name, b)]) / 1e3
            med[(name, b)] = float(np.median(s))
            r = paired(name, b)
            q1, q2, q3 = np.percentile(r, [25, 50, 75])
            print(f"{b:>5}  {name:<17} {med[(name, b)]:>10.1f} {np.percentile(s, 10):>9.1f} "
                  f"{np.percentile(s, 90):>9.1f} {f'{q2:.3f} ({q1:.3f}-{q3:.3f})':>22}  {path(name, b)}")
        print()

    print("ratios at the same batch: paired (median of per-round ratios) [ratio of overall medians]")
    for b in BATCHES:
        parts = [f"{n} / {base} = {np.median(paired(n, b, base)):.3f} [{med[(n, b)] / med[(base, b)]:.3f}]"
                 for n, base in (("artifact", "raw executable"), ("runtime", "raw executable"),
                                 ("artifact", "jax.jit"), ("eager", "jax.jit"))]
        print(f"  batch {b:>3}: " + "   ".join(parts))
    r8 = float(np.median(paired("artifact", 8, "raw executable")))
    verdict = "MET" if r8 <= 1.05 else "NOT MET"
    print(f"\ntarget (the artifact's per-call overhead within 5% of its raw executable at batch 8): {verdict} "
          f"(paired {(r8 - 1) * 100:+.1f}%; overall medians "
          f"{med[('artifact', 8)] - med[('raw executable', 8)]:+.1f} us)")

if __name__ == "__main__":
    main(ARGS)
