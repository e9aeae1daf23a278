"""A 16-job sweep with each launcher, side by side: wall time, speed-up over the default, and where a
job's time goes (process start and imports vs building).

    python bench/sweep_launchers.py [--launchers basic,tripy_local,submitit_local]

The sweep: model=geglu,mlp shapes=static,dynamic optimization_level=0,3 precision=float32,bfloat16.
Every run starts from an empty artifacts folder (no cache hits) and the memo off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["model=geglu,mlp", "shapes=static,dynamic", "optimization_level=0,3", "precision=float32,bfloat16"]


def run(launcher: str, tmp: Path) -> tuple[float, list[dict]]:
    arts, sweep = tmp / f"{launcher}-arts", tmp / f"{launcher}-sweep"
    shutil.rmtree(arts, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "-m", *SWEEP, f"artifacts_dir={arts}",
                           f"hydra.sweep.dir={sweep}", f"hydra/launcher={launcher}"],
                          capture_output=True, text=True, env={**os.environ, "TRIPY_BUILD_NO_MEMO": "1"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{launcher} failed:\n{proc.stderr[-2000:]}")
    return wall, json.loads((sweep / "summary.json").read_text())


def import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tripy_build.cli, jax; jax.devices()"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launchers", default="basic,tripy_local,submitit_local")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sweep-launchers-"))
    print(f"{os.cpu_count()} cores; a fresh process's start and imports (tripy_build.cli, jax, its CPU "
          f"backend): {import_seconds():.2f} s")
    base = None
    for launcher in args.launchers.split(","):
        wall, rows = run(launcher, tmp)
        build = sum(r["build_seconds"] for r in rows if isinstance(r["build_seconds"], (int, float)))
        base = base or wall
        print(f"{launcher:16} {wall:7.1f} s wall  x{base / wall:4.2f} vs {args.launchers.split(',')[0]}   "
              f"sum of the jobs' build time {build:6.1f} s ({len(rows)} jobs)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
