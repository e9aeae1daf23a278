"""Builds for NVIDIA GPUs on a machine without one (``target.gpu``, compiler/gpu.py), with jax's CUDA 13 plugin
alone (the ``cuda-deviceless`` extra): the executables, what the manifest records of them, and their refusal on
a machine that cannot run them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import tripy_build as tb
from conftest import SMALL, run_cli
from tripy_build import jaxlib_api, runtime
from tripy_build.compiler import gpu
from tripy_build.host import version

GEGLU = ["model=geglu", *SMALL["geglu"], "shapes.dims.batch=[1,2,4]"]


def build(tmp_path: Path, *overrides: str) -> Path:
    r = run_cli(*GEGLU, *overrides, f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (artifact,) = (tmp_path / "arts" / "geglu").iterdir()
    return artifact


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("h100")
    r = run_cli(*GEGLU, "backend=cuda", "target.gpu=h100", f"artifacts_dir={root / 'arts'}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (artifact,) = (root / "arts" / "geglu").iterdir()
    return artifact, r.stdout + r.stderr


def test_a_gpu_build_without_the_gpu_compiles_every_profile_for_it(h100):
    artifact, output = h100
    m = json.loads((artifact / "manifest.json").read_text())
    assert m["platforms"] == ["cuda"]
    assert sorted(e["profile"]["batch"] for e in m["executables"]) == [1, 2, 4]
    for e in m["executables"]:
        deps = e["depends_on"]
        assert e["platform"] == "cuda" and deps["gpu"] == "NVIDIA H100 80GB HBM3"
        assert deps["compute_capability"] == "9.0" and deps["code"] == "sm_90a" and deps["gpu_target"] == "h100"
        assert deps["jaxlib"] == version("jaxlib") and deps["cuda_plugin"] == f"jax-cuda13-plugin {version('jaxlib')}"
        assert deps["deviceless"] is True and any("autotuning" in line for line in deps["not_done"])
        assert b"sm_90a" in (artifact / e["file"]).read_bytes()  # native code for Hopper, not the CPU
    assert m["prep"]["chunks"][0]["executable"]["platform"] == "cuda"  # not the CPU twin's
    # the build says what it could not do without the GPU
    assert "compiled for the NVIDIA H100 80GB HBM3 without it" in output and "autotuning" in output
    assert "self-test on the GPU" in output


def test_a_gpu_artifact_is_refused_on_this_cpu_machine_in_one_line(h100):
    artifact, _ = h100
    for load in (tb.load, runtime.load):
        with pytest.raises(tb.TripyBuildError) as e:
            load(artifact)
        message = str(e.value)
        assert "\n" not in message and "built for cuda only (NVIDIA H100 80GB HBM3)" in message
        assert "this host runs cpu" in message and "backend=[cuda,cpu]" in message


def test_both_platforms_on_a_cpu_machine(tmp_path, rng):
    artifact = build(tmp_path, "backend=[cpu,cuda]", "target.gpu=a100")
    m = json.loads((artifact / "manifest.json").read_text())
    platforms = sorted((e["platform"], e["profile"]["batch"]) for e in m["executables"])
    assert platforms == [("cpu", 1), ("cpu", 2), ("cpu", 4), ("cuda", 1), ("cuda", 2), ("cuda", 4)]
    assert {e["depends_on"].get("gpu") for e in m["executables"] if e["platform"] == "cuda"} == {"NVIDIA A100-SXM4-80GB"}
    exe = tb.load(artifact, warmup="none")
    assert len(exe.precompiled_shapes) == 3  # the CPU's profiles run here; the GPU's are only carried
    x = rng.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_array_equal(runtime.load(artifact, warmup="none")(x), np.asarray(exe(x)))
    r = run_cli("verify", str(artifact), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("VERIFIED"), r.stdout[-2000:]
    listed = run_cli("list", str(tmp_path / "arts"), cwd=tmp_path)
    assert "cpu+cuda" in listed.stdout and "gpu=a100" in listed.stdout


@pytest.mark.parametrize("name", list(gpu.GPUS))
def test_every_described_gpu_compiles_a_function(name):
    spec = gpu.GPUS[name]
    device = gpu.compile_device(spec)
    assert device.device_kind == spec.name and str(device.compute_capability) == spec.capability
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct((8, 64), np.float32, sharding=sharding)] * 2
    compiled = jax.jit(lambda a, b: jax.nn.gelu(a @ b.T)).lower(*args).compile()
    assert spec.sm.encode() in jaxlib_api.serialize(jaxlib_api.compiled_parts(compiled)[0])


@pytest.mark.parametrize("overrides, message", [
    (["backend=cuda", "target.gpu=h10"], r"target.gpu: 'h10' is not a GPU .*h100, h100_pcie.* Did you mean 'h100'"),
    (["target.gpu=h100"], r"target.gpu=h100: names the GPU that cuda executables are for, and backend=cpu builds none"),
])
def test_gpu_config_errors(tmp_path, overrides, message):
    r = run_cli(*GEGLU, *overrides, f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert r.returncode != 0
    assert re.search(message, r.stderr), r.stderr[-2000:]
    assert not (tmp_path / "arts").exists() or not any((tmp_path / "arts").rglob("manifest.json"))


def test_a_cuda_plugin_of_another_version_is_refused_naming_the_one_to_install(monkeypatch):
    monkeypatch.setattr(gpu, "plugin_version", lambda: "jax-cuda13-plugin 0.11.1")
    with pytest.raises(tb.TripyBuildError) as e:
        gpu.compile_device(gpu.GPUS["h100"])
    assert f"jax-cuda13-plugin 0.11.1 does not match jaxlib {version('jaxlib')}" in str(e.value)
    assert f"pip install 'jax-cuda13-plugin=={version('jaxlib')}'" in str(e.value)


GPU_HOST_WITHOUT_A_GPU = r"""
import sys
from tripy_build import host, runtime
host.gpu_present = lambda: True  # the device nodes of a GPU machine, whose GPU CUDA cannot see
try:
    runtime.load(sys.argv[1])
except Exception as e:
    print("REFUSED", type(e).__name__, str(e))
print("JAX IMPORTED", "jax" in sys.modules)
import jax
from tripy_build.compiler import gpu
device = gpu.compile_device(gpu.GPUS["h100"])  # jax's own "cuda" plugin, registered after the runtime's
sharding = jax.sharding.SingleDeviceSharding(device)
compiled = jax.jit(lambda a: a * 2).lower(jax.ShapeDtypeStruct((8,), "float32", sharding=sharding)).compile()
print("COMPILED FOR", device.device_kind)
"""


def test_the_jax_free_runtime_takes_a_gpu_machines_cuda_executables_through_jaxs_plugin(h100, tmp_path):
    """On a machine with NVIDIA device nodes the runtime picks the artifact's CUDA executables and starts jax's CUDA
    plugin itself, without importing jax; here CUDA sees no GPU, which it says in one line. The plugin is loaded
    under its own name, so jax, started after it in the same process, still has its CUDA plugin (it compiles for
    an H100 here): loaded as "cuda", jax's own registration would fail and leave it on the CPU."""
    artifact, _ = h100
    r = subprocess.run([sys.executable, "-c", GPU_HOST_WITHOUT_A_GPU, str(artifact)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    refused = next(line for line in r.stdout.splitlines() if line.startswith("REFUSED"))
    assert refused.startswith("REFUSED ArtifactError tripy_build.runtime cannot start jax's CUDA plugin (")
    assert "xla_cuda_plugin.so" in refused and "No visible GPU devices" in refused and "tripy_build.load" in refused
    assert "JAX IMPORTED False" in r.stdout
    assert "COMPILED FOR NVIDIA H100 80GB HBM3" in r.stdout


def test_the_runtime_names_the_cuda_plugin_to_install(h100, monkeypatch):
    artifact, _ = h100
    monkeypatch.setattr(tb.host, "gpu_present", lambda: True)
    monkeypatch.setattr(tb.host, "plugin_version", lambda: "jax-cuda13-plugin 0.11.1")
    with pytest.raises(tb.TripyBuildError) as e:
        runtime.load(artifact)
    message = str(e.value)
    assert f"jax-cuda13-plugin 0.11.1 does not match jaxlib {version('jaxlib')}" in message and "\n" not in message
    assert f"pip install -e '.[cuda13]' (jax[cuda13]=={version('jax')})" in message
    assert jaxlib_api.cuda_plugin_library().endswith("jax_plugins/xla_cuda13/xla_cuda_plugin.so")
