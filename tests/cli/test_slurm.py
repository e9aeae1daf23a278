"""A sweep through a real Slurm cluster: one node on localhost (scripts/local-slurm.sh), hydra/launcher=slurm_cpu.

Skipped, with the reason, where Slurm is not installed (``scripts/local-slurm.sh install`` needs root and
apt; .ci/run does it) or cannot start.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tripy_build.cli.verify import verify

from conftest import default_sweep_dir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-slurm.sh"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if not all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "sinfo")):
        pytest.skip("Slurm is not installed here (scripts/local-slurm.sh install: apt-get, as root)")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[submitit]'")
    state = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"a local Slurm cluster did not start: {proc.stderr.strip()[-300:]}")
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    yield {"SLURM_CONF": conf}
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], capture_output=True, timeout=60)


def test_sweep_on_slurm_builds_every_artifact(slurm, tmp_path):
    env = {**os.environ, **slurm, "TRIPY_BUILD_NO_MEMO": "1"}
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "-m", "model=geglu,mlp", "shapes=static,dynamic",
                           "model.dim_in=16", "shapes.dims.batch=[1,2,4]", "hydra/launcher=slurm_cpu",
                           "hydra.launcher.cpus_per_task=1", f"artifacts_dir={tmp_path / 'arts'}"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)  # Hydra's default sweep dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = default_sweep_dir(tmp_path)
    assert "[sweep] 4/4 done, 0 failed" in proc.stdout
    rows = json.loads((sweep / "summary.json").read_text())
    assert len(rows) == 4 and all(r["status"] == "built" for r in rows)
    for r in rows:
        assert verify(Path(r["path"]), out=io.StringIO()), r["path"]
    # the jobs ran as Slurm jobs (submitit's logs name them), not in the driver
    logs = list(sweep.rglob("*_log.out"))
    assert logs and all(json.loads(p.read_text())["pid"] != os.getpid() for p in sweep.glob("*/build_result.json"))
