"""Build targets: several XLA platforms in one artifact, a platform missing at load, portable CPU builds.

No GPU is needed: a multi-platform program is exported for cpu and cuda on a CPU-only host (its cuda executables
compiled for a named GPU without it) and runs on the CPU; a cuda-only artifact is refused where there is no GPU;
a portable build is compiled for an instruction-set ceiling (``--xla_cpu_max_isa``) and judged by the features
its code was built for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from tripy_build.cli import config
from tripy_build.build.pipeline import build

from conftest import SMALL, compose_cfg, eager_reference, run_cli

GEGLU = ["model=geglu", *SMALL["geglu"], "shapes=dynamic", "shapes.dims.batch=[1,2,4]"]


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    request = config.validate(compose_cfg([*GEGLU, "backend=[cpu,cuda]", "target.gpu=h100",
                                           f"artifacts_dir={tmp_path_factory.mktemp('arts')}"]))
    return request, build(request).path


def test_multi_platform_artifact_exports_for_both_and_runs_here(multi):
    request, path = multi
    m = _manifest(path)
    assert request.platforms == ["cpu", "cuda"] and m["platforms"] == ["cpu", "cuda"]
    assert set(m["compiler_options"]) == {"cpu", "cuda"}
    assert sorted(e["platform"] for e in m["executables"]) == ["cpu"] * 3 + ["cuda"] * 3  # every profile for each
    exported = jax.export.deserialize(bytearray((path / "program.jaxexport").read_bytes()))
    assert tuple(exported.platforms) == ("cpu", "cuda")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(tb.load(path)(x)), eager_reference(request, {"x": x}), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runtime.load(path)(x), eager_reference(request, {"x": x}), rtol=1e-5, atol=1e-5)


def test_an_artifact_without_this_hosts_platform_is_refused_at_load(multi, tmp_path):
    _, path = multi
    copy = tmp_path / "cuda-only"
    shutil.copytree(path, copy)
    m = _manifest(copy)
    m["platforms"] = ["cuda"]
    (copy / "manifest.json").write_text(json.dumps(m))  # the manifest is not in its own file table
    for loader in (tb.load, runtime.load):
        with pytest.raises(tb.TripyBuildError) as e:
            loader(copy)
        assert "built for cuda only (NVIDIA H100 80GB HBM3), and this host runs cpu" in str(e.value)
        assert "backend=[cuda,cpu]" in str(e.value)


def test_a_cuda_build_on_a_cpu_host_without_a_named_gpu_is_refused_and_writes_nothing(tmp_path):
    proc = run_cli(*GEGLU, "backend=cuda", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "backend includes cuda, and this machine has no NVIDIA GPU that jax can use" in proc.stderr
    assert "target.gpu=h100" in proc.stderr and not (tmp_path / "arts").exists()


@pytest.mark.skipif(jax.devices()[0].platform != "cpu" or __import__("platform").machine().lower() not in ("x86_64", "amd64"),
                    reason="the portable ceiling tested here is x86-64's AVX2")
def test_portable_cpu_build_targets_avx2_and_loads_here(tmp_path):
    host = run_cli(*GEGLU, f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path).stdout
    proc = run_cli(*GEGLU, "target.cpu=portable", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = sorted(tmp_path.glob("arts/geglu/*"))
    assert len(paths) == 2, "the portable build has a build key of its own"
    portable = next(p for p in paths if "--xla_cpu_max_isa=AVX2" in _manifest(p)["toolchain"]["xla_flags"])
    m = _manifest(portable)
    assert m["metadata"]["build_key_parts"]["target"]["cpu"] == "portable"
    deps = m["executables"][0]["depends_on"]
    assert "avx2" in deps["isa"] and not any(f.startswith("avx512") for f in deps["isa"])
    assert deps["target_cpu"] == "haswell"
    assert str(portable) in proc.stdout and all(str(p) in host + proc.stdout for p in paths)
    code = ("import warnings, numpy as np, tripy_build as tb\n"
            "warnings.simplefilter('error')\n"
            f"exe = tb.load({str(portable)!r}, warmup='none')\n"
            "assert len(exe.profiles) == 3\n"
            "print(exe(np.ones((3, 16), np.float32)).shape)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "(3, 8)" in run.stdout, run.stderr[-2000:]


def test_a_cpu_target_cannot_change_once_jax_has_started_in_the_process(tmp_path):
    sweep = run_cli("-m", *GEGLU, "target.cpu=host,portable", f"artifacts_dir={tmp_path / 'arts'}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=600)
    rows = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert [r["status"] for r in rows] == ["built", "failed"]
    assert "XLA reads once, when its CPU backend starts" in rows[1]["error"]
    assert "hydra/launcher=submitit_local" in rows[1]["error"] and "failed" in sweep.stdout
