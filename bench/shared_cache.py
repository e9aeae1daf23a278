"""A sweep repeated on a second host through a shared remote cache: every job a hit, and its wall time.

    python bench/shared_cache.py

Host A runs the 16-job sweep with cache.remote=file://<tmp>/remote (it builds and uploads); host B,
simulated by another host name (TRIPY_BUILD_HOSTNAME) and its own artifacts folder, runs the same sweep.
Prints both wall times, B's cache hits and the ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["model=geglu,mlp", "shapes=static,dynamic", "optimization_level=0,3", "precision=float32,bfloat16"]


def sweep(host: str, tmp: Path, remote: str) -> tuple[float, list[dict]]:
    env = {**os.environ, "TRIPY_BUILD_HOSTNAME": host, "TRIPY_BUILD_NO_MEMO": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "-m", *SWEEP, f"artifacts_dir={tmp / host}",
                           f"hydra.sweep.dir={tmp / (host + '-sweep')}", f"cache.remote={remote}"],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return wall, json.loads((tmp / (host + "-sweep") / "summary.json").read_text())


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="shared-cache-"))
    remote = (tmp / "remote").as_uri()
    a, rows_a = sweep("host-a", tmp, remote)
    b, rows_b = sweep("host-b", tmp, remote)
    hits = sum(r["status"] == "cache hit" for r in rows_b)
    size = sum(p.stat().st_size for p in (tmp / "remote").rglob("*.tar"))
    print(f"host A (builds, uploads): {a:6.1f} s, {sum(r['status'] == 'built' for r in rows_a)} built")
    print(f"host B (same sweep):      {b:6.1f} s, {hits}/{len(rows_b)} cache hits ({hits / len(rows_b):.0%}), "
          f"x{a / b:.1f} faster; remote store {size / 1e6:.1f} MB")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
