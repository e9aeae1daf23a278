"""backend=iree against XLA (backend=cpu), per zoo model, in one run: build, cold start, latency, agreement.

Each zoo model (default sizes) is compiled by both compilers with the same ranges and buckets and
saved. Printed per model, with IREE/XLA ratios:

- build: ``tb.compile`` wall time, and IREE's mode (one dynamic module, or one module per profile and why);
- artifact size;
- cold start: spawn -> first result at opt in a new process, with ``tripy_build.runtime.load`` (no jax;
  IREE's dynamic module needs no jaxlib either) and with ``tripy_build.load`` (medians of ``--cold`` runs);
- steady latency at min, opt and max, interleaved call by call (medians);
- the largest difference between the two compilers' outputs, relative to the output scale.

    .venv/bin/python bench/iree_vs_xla.py              # about 5 minutes on 2 cores
    .venv/bin/python bench/iree_vs_xla.py --models geglu --cold 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tripy_build as tb
from tripy_build.cli.bench import _steady, cold_start
from tripy_build.models import MODELS, input_infos

DIMS = {"batch": (1, 8, 64), "seq": (1, 64, 256), "height": (8, 32, 64), "width": (8, 32, 64)}
# Few buckets, so that IREE's per-profile fallback (about 2 s a module) stays a short build.
BUCKETS = {"batch": [8, 64], "seq": [64, 256], "height": [32, 64], "width": [32, 64]}


def build(name: str, backend: str, params, out: Path):
    model = MODELS[name]()
    dims = {d: r for d, r in DIMS.items() if any(d in s for s in model.inputs().values())}
    masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}
    t0 = time.perf_counter()
    exe = tb.compile(model.apply, args=[params, *input_infos(model, dims).values()],
                     kwargs={"lengths": masks} if masks else None, padding=model.padding,
                     buckets={d: BUCKETS[d] for d in dims}, backend=backend)
    seconds = time.perf_counter() - t0
    exe.save(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return exe, seconds, size, dims


def inputs_at(model, dims, which: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([dims[d][which] if isinstance(d, str) else d for d in shape]).astype(np.float32)
            for shape in model.inputs().values()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="geglu,mlp,transformer,convnet")
    p.add_argument("--cold", type=int, default=5, help="cold-start runs per loader and compiler")
    args = p.parse_args(argv)
    from tripy_build.runtime import iree as iree_backend

    print(f"jax {jax.__version__}, {iree_backend.versions()}, IREE flags {' '.join(iree_backend.FLAGS)}")
    tmp = Path(tempfile.mkdtemp(prefix="iree_vs_xla-"))
    for name in args.models.split(","):
        model = MODELS[name]()
        params = jax.device_get(model.init(jax.random.PRNGKey(0)))
        try:
            built = {b: build(name, b, params, tmp / f"{name}-{b}") for b in ("xla", "iree")}
        except tb.TripyBuildError as e:
            print(f"\n{name}: not compared: {e}")
            continue
        (xla, xla_s, xla_size, dims), (iree, iree_s, iree_size, _) = built["xla"], built["iree"]
        mode = iree.compiler["mode"] + (f" ({iree.compiler['why']})" if iree.compiler.get("why") else "")
        print(f"\n{name}: dims {dims}; IREE mode: {mode}")
        print(f"  {'':24} {'xla':>10} {'iree':>10} {'iree/xla':>9}")
        print(f"  {'build s':24} {xla_s:10.2f} {iree_s:10.2f} {iree_s / xla_s:9.2f}")
        print(f"  {'artifact MB':24} {xla_size / 1e6:10.2f} {iree_size / 1e6:10.2f} {iree_size / xla_size:9.2f}")
        for loader in ("runtime", "tripy_build"):
            c = {b: cold_start(str(tmp / f"{name}-{b}"), args.cold, loader, "none")["seconds"] * 1e3
                 for b in ("xla", "iree")}
            print(f"  {'cold start ms (' + loader + ')':24} {c['xla']:10.0f} {c['iree']:10.0f} {c['iree'] / c['xla']:9.2f}")
        worst = 0.0
        for label, which in (("min", 0), ("opt", 1), ("max", 2)):
            x = inputs_at(model, dims, which)
            want = np.asarray(xla(*x))
            worst = max(worst, float(np.abs(np.asarray(iree(*x)) - want).max() / max(np.abs(want).max(), 1e-30)))
            t = _steady({"xla": xla, "iree": iree}, {"xla": x, "iree": x}, budget_s=1.0)
            m = {b: float(np.median(s)) * 1e3 for b, s in t.items()}
            print(f"  {'latency ms at ' + label:24} {m['xla']:10.3f} {m['iree']:10.3f} {m['iree'] / m['xla']:9.2f}")
        print(f"  max |iree - xla| / output scale: {worst:.2e}")


if __name__ == "__main__":
    main()
