"""Build targets: several XLA platforms in one artifact, a platform missing at load, portable CPU builds.

No GPU is needed: a multi-platform program is exported for cpu and cuda on a CPU-only host (its cuda executables
compiled for a named GPU without it) and runs on the CPU; a cuda-only artifact is refused where there is no GPU;
a portable build is compiled for a named baseline (x86-64-v3), never for the building CPU's features, and judged
by the features its code was built for.
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
from tripy_build.builder.pipeline import build

from conftest import SMALL, compose_cfg, model_reference, run_cli

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
    np.testing.assert_allclose(np.asarray(tb.load(path)(x)), model_reference(request, {"x": x}), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runtime.load(path)(x), model_reference(request, {"x": x}), rtol=1e-5, atol=1e-5)


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


# LLVM's features of an Intel Haswell (Xeon E5 v3) and an AMD Zen 2 (EPYC Rome): two AVX2 servers a portable
# artifact must run on.
HASWELL = set("64bit aes avx avx2 bmi bmi2 cmov crc32 cx16 cx8 f16c fma fsgsbase fxsr invpcid lzcnt mmx movbe pclmul "
              "popcnt rdrnd sahf sse sse2 sse3 sse4.1 sse4.2 ssse3 xsave xsaveopt".split())
ZNVER2 = set("64bit adx aes avx avx2 bmi bmi2 clflushopt clwb clzero cmov crc32 cx16 cx8 f16c fma fsgsbase fxsr lzcnt "
             "mmx movbe mwaitx pclmul popcnt prfchw rdpid rdrnd rdseed sahf sha sse sse2 sse3 sse4.1 sse4.2 sse4a ssse3 "
             "wbnoinvd xsave xsavec xsaveopt xsaves".split())


@pytest.mark.skipif(jax.devices()[0].platform != "cpu" or __import__("platform").machine().lower() not in ("x86_64", "amd64"),
                    reason="the portable baseline tested here is x86-64's")
def test_portable_cpu_build_is_x86_64_v3_whatever_the_build_host_and_loads_here(tmp_path):
    """target.cpu=portable compiles for x86-64-v3 on a compile-only CPU device: the recorded features are exactly
    the baseline's (no AMD-only sse4a/clzero, no sha/vaes of the build host's generation), within both vendors'
    AVX2 servers'; the build key leaves out the build host's CPU, and the artifact loads and runs here."""
    from tripy_build.artifact.compat import missing_features
    from tripy_build.compiler.target import cpu_baseline

    host = run_cli(*GEGLU, f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path).stdout
    proc = run_cli(*GEGLU, "target.cpu=portable", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = sorted(tmp_path.glob("arts/geglu/*"))
    assert len(paths) == 2, "the portable build has a build key of its own"
    portable = next(p for p in paths if _manifest(p)["metadata"]["build_key_parts"]["target"]["cpu"] == "portable")
    m = _manifest(portable)
    assert "cpu_features" not in m["metadata"]["build_key_parts"]["target"]
    assert "--xla_cpu_max_isa" not in m["toolchain"]["xla_flags"]
    baseline = cpu_baseline("portable")
    assert baseline[0] == "x86-64-v3"
    for e in m["executables"]:
        deps = e["depends_on"]
        assert deps["target_cpu"] == "x86-64-v3" and sorted(deps["isa"]) == baseline[1]
        assert set(deps["isa"]) <= HASWELL & ZNVER2, set(deps["isa"]) - (HASWELL & ZNVER2)
        assert not missing_features(deps["isa"], HASWELL) and not missing_features(deps["isa"], ZNVER2)
        assert not {"sse4a", "clzero", "sha", "vaes", "vpclmulqdq", "wbnoinvd", "shstk"} & set(deps["isa"])
        assert "cpu_features" not in deps and "cpu_model" not in deps  # the build host's, not the code's
    assert str(portable) in proc.stdout and all(str(p) in host + proc.stdout for p in paths)
    code = ("import warnings, numpy as np, tripy_build as tb\n"
            "from tripy_build import runtime\n"
            "warnings.simplefilter('error')\n"
            f"exe = tb.load({str(portable)!r}, warmup='none')\n"
            f"rt = runtime.load({str(portable)!r}, warmup='none')\n"
            "assert len(exe.profiles) == 3\n"
            "x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)\n"
            "np.testing.assert_array_equal(np.asarray(exe(x)), rt(x))\n"
            "print(exe(x).shape)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "(3, 8)" in run.stdout, run.stderr[-2000:]
    verify = run_cli("verify", str(portable), cwd=tmp_path)
    assert verify.returncode == 0 and "VERIFIED" in verify.stdout, verify.stdout[-2000:]


def test_cpu_baselines_build_in_one_process_and_an_unknown_one_is_refused(tmp_path):
    """A baseline is compiled for on a device of its own, not through XLA_FLAGS: host and portable builds sweep in
    one process; a name that is not a baseline of this machine is refused in one line listing them."""
    sweep = run_cli("-m", *GEGLU, "target.cpu=host,portable", f"artifacts_dir={tmp_path / 'arts'}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=600)
    rows = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert [r["status"] for r in rows] == ["built", "built"], sweep.stdout[-2000:]
    bad = run_cli(*GEGLU, "target.cpu=AVX512", f"artifacts_dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and not (tmp_path / "bad").exists()
    assert "target.cpu: 'AVX512' is not a CPU baseline" in bad.stderr and "portable" in bad.stderr
