"""A sweep on Ray: hydra/launcher=ray_local starts a local Ray cluster for the sweep (a fresh worker per
job) and stops it with the driver; the same artifacts as the default launcher. Skipped, saying why,
without the ray extra. (Connecting to a cluster started apart with `ray start --head` needs Ray 2.60's
auth token set up on both sides; not tested here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[ray]'")

SWEEP = ["-m", "model=geglu,mlp", "shapes=static", "model.dim_in=16"]


def _files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".xla") and p.name != "index.json"}


def test_sweep_on_ray_gives_the_default_launchers_artifacts(tmp_path):
    env = {**os.environ, "TRIPY_BUILD_NO_MEMO": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    for launcher in ("basic", "ray_local"):
        extra = ["+hydra.launcher.ray.init.num_cpus=2"] if launcher == "ray_local" else []
        proc = subprocess.run([sys.executable, "-m", "tripy_build", *SWEEP, f"hydra/launcher={launcher}", *extra,
                               f"artifacts_dir={tmp_path / launcher}", f"hydra.sweep.dir={tmp_path / (launcher + '-s')}"],
                              capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "[sweep] 2/2 done, 0 failed" in proc.stdout
    assert len(_files(tmp_path / "basic")) > 4 and _files(tmp_path / "basic") == _files(tmp_path / "ray_local")
    pids = [json.loads(p.read_text())["pid"] for p in (tmp_path / "ray_local-s").glob("*/build_result.json")]
    assert len(pids) == 2 and len(set(pids)) == 2  # each job in a worker of its own (max_calls: 1)
