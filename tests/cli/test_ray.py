"""Sweeps on Ray (hydra/launcher=ray_local, a fresh worker process per job), with the same artifacts as
the default launcher: on a cluster started apart with `ray start --head` on this host, reached through loopback
with token authentication (Ray 2.59+ turns it on for local clusters; here the token is set on both sides, as on a
real cluster). The launcher's other way, a local cluster it starts for the sweep itself, differs from this one only
in `ray.init`'s arguments (Ray's code, not ours) and cost a second Ray startup (~30 s); it is not run here. Skipped,
saying why, without the ray extra."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_sweep_dir, reproducible_files

pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[ray]'")

SWEEP = ["-m", "model=geglu,mlp", "shapes=static", "model.dim_in=16"]
RAY = str(Path(sys.executable).with_name("ray"))


def _sweep(tmp_path: Path, name: str, *overrides: str, env: dict[str, str] | None = None,
           default_dir: bool = False) -> Path:
    """Run the sweep (in Hydra's default sweep dir under ``tmp_path`` with ``default_dir``); its artifacts dir.
    Asserts that every job was built."""
    env = {**os.environ, "TRIPY_BUILD_NO_MEMO": "1", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    sweep_dir = [] if default_dir else [f"hydra.sweep.dir={tmp_path / (name + '-s')}"]
    proc = subprocess.run([sys.executable, "-m", "tripy_build", *SWEEP, *overrides, f"artifacts_dir={tmp_path / name}",
                           *sweep_dir], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] 2/2 done, 0 failed" in proc.stdout
    swept = default_sweep_dir(tmp_path) if default_dir else tmp_path / (name + "-s")
    pids = [json.loads(p.read_text())["pid"] for p in swept.glob("*/build_result.json")]
    assert len(pids) == 2 and (name == "basic" or len(set(pids)) == 2)  # on Ray: a worker per job (max_calls: 1)
    return tmp_path / name


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray-basic")
    files = reproducible_files(_sweep(tmp, "basic", "hydra/launcher=basic"))
    assert len(files) > 4
    return files


@pytest.fixture
def cluster(tmp_path):
    """A Ray head on this host, started apart from the sweep; (address, the environment that reaches it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                           "--include-dashboard=false", "--disable-usage-stats"],
                          capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        yield f"127.0.0.1:{port}", {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_sweep_on_a_ray_cluster_started_apart(basic, cluster, tmp_path):
    address, env = cluster
    # a driver without the cluster's token is refused: the cluster is not open to anyone on the network. Ray
    # retries for ~20 s before it gives up, mostly asleep, so it runs beside the sweep.
    refused = subprocess.Popen([sys.executable, "-m", "tripy_build", *SWEEP, "hydra/launcher=ray_local",
                                f"hydra.launcher.ray.init.address={address}", f"artifacts_dir={tmp_path / 'refused'}",
                                f"hydra.sweep.dir={tmp_path / 'refused-s'}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                               env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64,
                                    "RAY_USAGE_STATS_ENABLED": "0", "TRIPY_BUILD_NO_MEMO": "1"})
    try:
        arts = _sweep(tmp_path, "ray_cluster", "hydra/launcher=ray_local", f"hydra.launcher.ray.init.address={address}",
                      env=env, default_dir=True)
        assert reproducible_files(arts) == basic
        out, _ = refused.communicate(timeout=300)
    finally:
        refused.kill()
    assert refused.returncode != 0 and not (tmp_path / "refused").exists()
    assert "InvalidAuthToken" in out, out[-3000:]  # refused for its token, not for anything else
