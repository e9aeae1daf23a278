"""The Hydra build command: composed configs, the README command, sweeps, params, bad configs."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.cli import sweep
from tripy_build.cli import config
from tripy_build.builder.pipeline import build
from tripy_build.builder.model import input_infos, instantiate as instantiate_model, padding as model_padding
from tripy_build.errors import ConfigError

from conftest import SMALL, SMALL_SHAPES, compose_cfg, default_sweep_dir, model_reference, reproducible_files, run_cli

REPO = Path(__file__).resolve().parents[2]
def run_sweep(tmp_path: Path, *overrides: str, name: str | None = "sweep") -> tuple[subprocess.CompletedProcess, list | None]:
    """A ``-m`` sweep with its sweep dir at ``tmp_path/name``, or Hydra's default one (``multirun/<date>/<time>``
    under ``tmp_path``, as users run it) when ``name`` is None (artifacts in ``tmp_path/arts`` unless an override
    says where); the process and the summary rows it wrote (None if it wrote none)."""
    arts = [] if any(o.startswith("artifacts_dir=") for o in overrides) else [f"artifacts_dir={tmp_path / 'arts'}"]
    sweep_dir = [] if name is None else [f"hydra.sweep.dir={tmp_path / name}"]
    proc = run_cli("-m", *overrides, *arts, *sweep_dir, cwd=tmp_path, timeout=600)
    summary = (default_sweep_dir(tmp_path) if name is None else tmp_path / name) / "summary.json"
    return proc, json.loads(summary.read_text()) if summary.is_file() else None


def sample_inputs(exe, which: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, info in exe.input_infos.items():
        shape = getattr(info.shape_bounds, which)
        out[name] = rng.standard_normal(shape).astype(info.dtype)
    return out


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
@pytest.mark.parametrize("model", ["geglu", "mlp", "transformer", "convnet"])
def test_every_config_option_composes_builds_and_matches_the_model(model, shapes, tmp_path):
    cfg = compose_cfg([f"model={model}", f"shapes={shapes}", f"artifacts_dir={tmp_path}",
                       "optimization_level=0", *SMALL[model], *SMALL_SHAPES[shapes]])
    request = config.validate(cfg)
    result = build(request)
    assert not result.cache_hit and (result.path / "manifest.json").is_file()
    assert result.path.parent == tmp_path / model
    exe = tb.load(result.path)
    for which in ("min", "max"):
        xs = sample_inputs(exe, which)
        np.testing.assert_allclose(np.asarray(exe(*xs.values())), model_reference(request, xs), rtol=2e-5, atol=2e-5)
    infos = exe.input_infos
    dims = [d for info in infos.values() for d in range(info.rank)]
    if shapes == "static":
        assert all(info.shape_bounds.min == info.shape_bounds.max for info in infos.values())
    else:
        assert any(info.dimension_names for info in infos.values()) and dims


def test_readme_command_builds_default_artifact_and_it_loads_in_fresh_process(tmp_path):
    proc = run_cli("model=geglu", "shapes=dynamic", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(next(line.split(":", 1)[1].strip().split()[0] for line in proc.stdout.splitlines()
                     if line.startswith("artifact:")))
    assert path.is_dir() and path.parent == tmp_path / "arts" / "geglu"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arts"]  # nothing else: no Hydra outputs/<date>/<time>/
    assert "input x: float32[batch=[1..64, opt 8], 512]" in proc.stdout
    assert "trace+export" in proc.stdout and "program.jaxexport" in proc.stdout
    assert "dim batch [1..64]: padded (rows), buckets 1 2 4 8 16 32 64" in proc.stdout
    assert "profiles: 7 precompiled" in proc.stdout
    # The build log names its stages with timings as it goes, one line per profile.
    log = proc.stderr + proc.stdout
    assert all(re.search(rf"profile [1-7]/7 batch={b} \(", log) for b in (1, 2, 4, 8, 16, 32, 64)) and "prove padding" in log
    check = textwrap.dedent(f"""
        import jax, numpy as np, tripy_build as tb
        from tripy_build.models.geglu import GEGLU
        exe = tb.load({str(path)!r})
        m = GEGLU(512, 2048); p = m.init(jax.random.PRNGKey(0))
        for b in (1, 8, 33):
            x = np.random.default_rng(b).standard_normal((b, 512)).astype(np.float32)
            np.testing.assert_allclose(np.asarray(exe(x)), np.asarray(m.apply(p, x)), rtol=2e-5, atol=2e-5)
        print("OK", list(exe.input_infos))
    """)
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and "OK ['x']" in out.stdout, out.stderr[-3000:]
    again = run_cli("model=geglu", "shapes=dynamic", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert again.returncode == 0 and "cache hit" in again.stdout


def test_multirun_sweep_writes_summary_and_reports_failed_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc, rows = run_sweep(tmp_path, "model=geglu,mlp", "shapes=static,dynamic", "optimization_level=0,9",
                           "model.dim_in=16", *SMALL_SHAPES["dynamic"][:1])
    assert proc.returncode == 1, proc.stderr[-3000:]  # a failed job fails the sweep, after its summary
    assert "[sweep] 8/8 done, 4 failed" in proc.stdout and "[sweep] 1/8 done" in proc.stdout
    assert len(rows) == 8
    failed = [r for r in rows if r["status"] == "failed"]
    built = [r for r in rows if r["status"] == "built"]
    assert len(failed) == 4 and all("optimization_level=9" in r["overrides"] for r in failed)
    assert all("optimization_level" in r["error"] and "0..5" in r["error"] for r in failed)
    assert len(built) == 4 and all(Path(r["path"]).is_dir() and r["size_bytes"] > 0 for r in built)
    csv_text = (sweep_dir / "summary.csv").read_text()
    assert csv_text.splitlines()[0].startswith("job,overrides,status") and len(csv_text.splitlines()) == 9
    assert "8 builds, 4 failed" in proc.stdout
    # each job keeps Hydra's config and its log beside its result (a single build writes neither)
    assert all((sweep_dir / str(r["job"]) / ".hydra" / "config.yaml").is_file() for r in rows)
    assert "profile" in (sweep_dir / str(built[0]["job"]) / "build.log").read_text()
    for r in built:
        assert_matches_the_model(Path(r["path"]))


def test_sweep_finds_results_in_nested_job_dirs_and_fails_when_a_job_wrote_none(tmp_path):
    """``hydra.sweep.subdir`` may nest (an override with a path in ``override_dirname``); a job whose result
    is not in the sweep directory (killed first, or its output sent elsewhere) fails the sweep, named."""
    common = ["model=geglu", "model.dim_in=16", "shapes=static", "optimization_level=0,3"]
    proc, rows = run_sweep(tmp_path, *common, "hydra.sweep.subdir=${hydra.job.override_dirname}", name="nested")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] 2/2 done, 0 failed" in proc.stdout and [r["status"] for r in rows] == ["built", "built"]
    proc, rows = run_sweep(tmp_path, *common, f"hydra.sweep.subdir={tmp_path / 'elsewhere'}/${{hydra.job.num}}",
                           name="nested")  # run again in the same directory: the first run's results are not this one's
    assert proc.returncode == 1 and rows == []
    assert "0 builds, 0 failed, 2 of the 2 jobs wrote no result" in proc.stdout, proc.stdout[-2000:]


def assert_matches_the_model(path: Path) -> None:
    """Load an artifact and compare it with the model's own apply (traced at each shape: unpadded, no lengths) on the
    params its manifest says it was built with."""
    manifest = json.loads((path / "manifest.json").read_text())
    parts = manifest["metadata"]["build_key_parts"]
    model = instantiate_model(parts["config"]["model"])
    params = model.init(jax.random.PRNGKey(parts["params"]["seed"]))
    exe = tb.load(path)
    assert list(exe.input_infos) == list(model.inputs())
    apply = jax.jit(model.apply)
    for which in ("min", "opt", "max"):
        xs = sample_inputs(exe, which)
        np.testing.assert_allclose(np.asarray(exe(*xs.values())), np.asarray(apply(params, *xs.values())),
                                   rtol=2e-5, atol=2e-5)


def test_parallel_sweep_with_submitit_local_runs_each_job_in_a_fresh_process(tmp_path):
    proc, rows = run_sweep(tmp_path, "hydra/launcher=submitit_local", "model=geglu", "model.dim_in=16",
                           "model.dim_out=8", "shapes=static,dynamic", name=None)  # Hydra's default sweep dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = default_sweep_dir(tmp_path)
    assert "[sweep] 2/2 done, 0 failed" in proc.stdout
    assert [r["status"] for r in rows] == ["built", "built"], rows
    pids = {json.loads(p.read_text())["pid"] for p in sweep_dir.glob("*/build_result.json")}
    assert len(pids) == 2 and os.getpid() not in pids
    for r in rows:
        assert_matches_the_model(Path(r["path"]))


def _geglu_known_params():
    return {"proj": {"weight": np.array([[1.0, 2.0], [0.5, -1.0]], np.float32),
                     "bias": np.array([0.25, -0.5], np.float32)}}


def _geglu_by_hand(params, x):
    from math import erf

    y = x @ params["proj"]["weight"].T + params["proj"]["bias"]
    a, gate = y[:, :1], y[:, 1:]
    gelu = gate * 0.5 * (1.0 + np.vectorize(erf)(gate / np.sqrt(2.0)))
    return a * gelu


def test_params_checkpoint_restores_known_weights(tmp_path):
    import orbax.checkpoint as ocp

    params = _geglu_known_params()
    ckpt = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as c:
        c.save(ckpt, params)
        c.wait_until_finished()
    cfg = compose_cfg(["model=geglu", "model.dim_in=2", "model.dim_out=1", "shapes=dynamic",
                       f"params.checkpoint={ckpt}", f"artifacts_dir={tmp_path / 'arts'}"])
    result = build(config.validate(cfg))
    exe = tb.load(result.path)
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [3.0, -2.0]], np.float32)
    np.testing.assert_allclose(np.asarray(exe(x)), _geglu_by_hand(params, x), rtol=1e-6, atol=1e-6)
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["metadata"]["params"]["init"] == "checkpoint"


def test_params_checkpoint_reads_only_the_models_leaves(tmp_path, monkeypatch):
    """Optimizer state saved alongside the params (a list too) is neither read nor needed."""
    import orbax.checkpoint as ocp

    params = _geglu_known_params()
    ckpt = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as c:
        c.save(ckpt, {**params, "opt_state": {"mu": np.ones((512, 512), np.float32), "count": np.int32(7)},
                      "history": [np.ones(3, np.float32)]})
        c.wait_until_finished()
    read = []
    restore = ocp.PyTreeCheckpointer.restore
    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", lambda self, *a, **k: read.append(restore(self, *a, **k)) or read[-1])
    cfg = compose_cfg(["model=geglu", "model.dim_in=2", "model.dim_out=1", "shapes=static", "shapes.dims.batch=3",
                       f"params.checkpoint={ckpt}", f"artifacts_dir={tmp_path / 'arts'}"])
    exe = tb.load(build(config.validate(cfg)).path)
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [3.0, -2.0]], np.float32)
    np.testing.assert_allclose(np.asarray(exe(x)), _geglu_by_hand(params, x), rtol=1e-6, atol=1e-6)
    assert [sorted(r) for r in read] == [["proj"]]  # one read, of the model's leaves only


def test_params_checkpoint_with_wrong_tree_is_a_config_error(tmp_path):
    import orbax.checkpoint as ocp

    ckpt = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as c:
        c.save(ckpt, {"proj": {"weight": np.ones((3, 3), np.float32)}})
        c.wait_until_finished()
    cfg = compose_cfg(["model=geglu", "model.dim_in=2", "model.dim_out=1", f"params.checkpoint={ckpt}",
                       f"artifacts_dir={tmp_path / 'arts'}"])
    with pytest.raises(ConfigError, match="params.checkpoint"):
        build(config.validate(cfg))
    assert not (tmp_path / "arts").exists()


def test_weights_are_stored_once_and_swappable_after_load(tmp_path):
    cfg = compose_cfg(["model=geglu", "model.dim_in=2", "model.dim_out=1", "shapes=dynamic",
                       "shapes.dims.batch=[1,2,8]", f"artifacts_dir={tmp_path / 'arts'}"])
    request = config.validate(cfg)
    result = build(request)
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert sorted(w["path"] for w in manifest["weights"]) == ["params['proj']['bias']", "params['proj']['weight']"]
    assert {w["argument"] for w in manifest["weights"]} == {"params"}
    exe = tb.load(result.path)
    import inspect

    assert list(inspect.signature(exe).parameters) == ["x"]
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [3.0, 0.0]], np.float32)  # batch 3 runs the padded batch-4 profile
    np.testing.assert_allclose(np.asarray(exe(x)), model_reference(request, {"x": x}), rtol=1e-6, atol=1e-6)
    swapped = exe.bind(params=_geglu_known_params())
    np.testing.assert_allclose(np.asarray(swapped(x)), _geglu_by_hand(_geglu_known_params(), x), rtol=1e-6, atol=1e-6)
    assert swapped.precompiled_shapes == exe.precompiled_shapes
    # the weights are not folded into the program or the executables: their bytes appear once
    big = build(config.validate(compose_cfg(["model=geglu", "model.dim_in=256", "model.dim_out=256",
                                             "shapes.dims.batch=[1,2,8]", f"artifacts_dir={tmp_path / 'big'}"])))
    weight_bytes = 256 * 512 * 4
    assert (big.path / "program.jaxexport").stat().st_size < weight_bytes / 4
    assert all(p.stat().st_size < weight_bytes / 2 for p in (big.path / "executables").iterdir())
    assert sum(p.stat().st_size for p in (big.path / "weights").iterdir()) < weight_bytes * 1.1


def test_reduced_precision_build_stores_weights_at_that_precision_and_records_its_error(tmp_path):
    cfg = compose_cfg(["model=mlp", *SMALL["mlp"], "shapes=dynamic", "shapes.dims.batch=[1,2,4]",
                       "precision=bfloat16", f"artifacts_dir={tmp_path / 'arts'}"])
    request = config.validate(cfg)
    assert (request.precision, request.max_error) == ("bfloat16", None)  # the budget: the compiler's default, 0.08
    result = build(request)
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert {w["dtype"] for w in manifest["weights"]} == {"bfloat16"}
    assert [s["dtype"] for s in manifest["input_specs"]] == ["float32"] and manifest["outputs"][0]["dtype"] == "float32"
    p = manifest["metadata"]["precision"]
    assert p["dtype"] == "bfloat16" and 0 < p["max_rel_error"] <= 0.02 and p["max_error"] == 0.08
    assert "precision: bfloat16, error against float32" in result.summary()
    over = run_cli("model=mlp", *SMALL["mlp"], "shapes.dims.batch=[1,2,4]", "precision=bfloat16",
                   "precision.max_error=1e-9", f"artifacts_dir={tmp_path / 'over'}", cwd=tmp_path)
    assert over.returncode != 0 and "Traceback" not in over.stderr
    assert "precision bfloat16: the outputs differ from float32 by up to" in over.stderr
    assert "over the budget max_error=1e-09" in over.stderr and not (tmp_path / "over").exists()
    exe = tb.load(result.path)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    y = exe(x)
    want = model_reference(request, {"x": x})
    assert y.dtype == np.float32 and 0 < np.abs(np.asarray(y) - want).max() <= 0.02 * np.abs(want).max()
    full = build(config.validate(compose_cfg(["model=mlp", *SMALL["mlp"], "shapes=dynamic", "shapes.dims.batch=[1,2,4]",
                                              f"artifacts_dir={tmp_path / 'arts'}"])))
    def weight_bytes(path):
        entries = json.loads((path / "manifest.json").read_text())["weights"]
        return sum(int(np.prod(w["shape"])) * np.dtype(tb.InputInfo((1,), w["dtype"]).dtype).itemsize for w in entries)

    assert weight_bytes(full.path) == 2 * weight_bytes(result.path) and full.key != result.key


def test_config_validation_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"shapes\.dims\.batch.*min <= opt <= max"):
        config.validate(compose_cfg(["shapes.dims.batch=[8,4,2]"]))
    with pytest.raises(ConfigError, match=r"model\.dim_out.*at least 1"):
        config.validate(compose_cfg(["model.dim_out=0"]))


def test_user_model_from_own_config_dir_without_touching_the_package(tmp_path):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        import jax, jax.numpy as jnp

        @dataclass(frozen=True)
        class Scale:
            width: int = 4
            name = "scale"
            def init(self, key):
                return {"w": jax.random.normal(key, (self.width,))}
            def apply(self, params, x):
                return x * params["w"]
            def inputs(self):
                return {"x": ["batch", self.width]}
    """))
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "scale.yaml").write_text("_target_: my_models.Scale\nname: scale\nwidth: 3\n")
    # models are imported from the working directory, by `python -m tripy_build` and the `tripy-build` script alike
    proc = run_cli("--config-dir", str(tmp_path / "my_conf"), "model=scale", f"artifacts_dir={tmp_path / 'arts'}",
                   cwd=tmp_path, env={"PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = subprocess.run([str(Path(sys.executable).with_name("tripy-build")), "--config-dir", "my_conf", "model=scale",
                             "artifacts_dir=script-arts"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": "", "TRIPY_BUILD_NO_MEMO": "1"})
    assert script.returncode == 0, script.stderr[-2000:]
    (path,) = (tmp_path / "arts" / "scale").iterdir()
    assert [p.name for p in (tmp_path / "script-arts" / "scale").iterdir()] == [path.name]
    exe = tb.load(path)
    assert exe.input_infos["x"].shape_bounds.max == (64, 3)
    x = np.ones((5, 3), np.float32)
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (3,)))
    np.testing.assert_allclose(np.asarray(exe(x)), x * w, rtol=1e-6)


def test_installed_wheel_finds_its_packaged_configs(tmp_path):
    """The configs ship inside the package: an installed wheel builds from any directory."""
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import zipfile

    (wheel,) = wheel_dir.glob("*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import tripy_build; print(tripy_build.__file__)"], cwd=workdir,
                           capture_output=True, text=True, env={**os.environ, **env})
    assert where.stdout.strip().startswith(str(site)), where
    proc = run_cli("model=geglu", "model.dim_in=16", "model.dim_out=8", "shapes=static", "artifacts_dir=arts",
                   cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "artifact:" in proc.stdout and len(list((workdir / "arts" / "geglu").iterdir())) == 1


# --- measuring what was built ---------------------------------------------------------------------

def test_bench_json_reports_cold_start_stream_and_padding_overhead(tmp_path):
    cfg = compose_cfg(["model=geglu", "model.dim_in=16", "model.dim_out=8", "shapes=dynamic",
                       "shapes.dims.batch=[1,2,8]", f"artifacts_dir={tmp_path / 'arts'}"])
    path = build(config.validate(cfg)).path
    proc = run_cli("bench", str(path), "--json", "-", "--stream", "30", "--shapes", "2", "--cold-rounds", "1",
                   "--budget", "0.02", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["function"] == "geglu" and r["profiles"] == 4 and r["warmup"] == "background"
    assert r["dims"] == [{"name": "batch", "min": 1, "opt": 2, "max": 8, "buckets": [1, 2, 4, 8],
                          "padding": "rows", "strategy": "padded"}]
    for loader in ("tripy_build.load", "tripy_build.runtime.load"):
        cold = r["cold_start"][loader]
        assert cold["seconds"] > cold["import"] + cold["load"] + cold["first_call"] > 0
    assert r["cold_start"]["tripy_build.runtime.load"]["jax_imported"] is False
    assert r["cold_start"]["tripy_build.load"]["jax_imported"] is True
    s = r["stream"]
    assert s["calls"] == 30 and len(s["points"]) == 30 and s["stalls"] == len(s["stalled"])
    assert all(1 <= p["sizes"][0] <= 8 and p["ms"] > 0 and p["steady_ms"] > 0 for p in s["points"])
    labels = [x["label"] for x in r["shapes"]]
    assert labels[:3] == ["min", "opt", "max"] and len(labels) == 5
    for x in r["shapes"]:
        assert x["route"] in ("exact", "padded->4", "padded->8") or x["route"].startswith("split ")
        assert x["median_ms"] <= x["p90_ms"] <= x["p99_ms"]
        assert x["overhead"] == pytest.approx(x["median_ms"] / x["jit_median_ms"])
    assert r["padding_overhead_median"] > 0
    assert r["cores"] == len(os.sched_getaffinity(0))
    rs = r["runtime_stream"]  # the same stream through tripy_build.runtime
    assert rs["calls"] == 30 and [p["sizes"] for p in rs["points"]] == [p["sizes"] for p in s["points"]]
    assert all(x["runtime_median_ms"] > 0 for x in r["shapes"])
    for loader in ("tripy_build.load", "tripy_build.runtime.load"):
        f = r["first_calls"][loader]
        assert f["profiles"] == 4 and [p["sizes"] for p in f["points"]] == [[1], [2], [4], [8]]
        assert f["within"] == sum(p["within"] for p in f["points"])
        assert all(p["within"] == (p["first_ms"] <= 2 * p["steady_ms"] + 1) for p in f["points"])


def test_bench_threads_runs_the_bench_pinned_to_each_core_count(tmp_path):
    cfg = compose_cfg(["model=geglu", "model.dim_in=16", "model.dim_out=8", "shapes=static",
                       f"artifacts_dir={tmp_path / 'arts'}"])
    path = build(config.validate(cfg)).path
    args = [sys.executable, "-m", "tripy_build", "bench", str(path), "--stream", "5", "--shapes", "1",
            "--cold-rounds", "1", "--budget", "0.02"]
    proc = subprocess.run([*args, "--threads", "1", "--json", "-"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)["threads"]
    assert list(r) == ["1"] and r["1"]["cores"] == 1 and r["1"]["function"] == "geglu"
    assert r["1"]["cold_start"]["tripy_build.runtime.load"]["seconds"] > 0
    text = subprocess.run([*args, "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert text.returncode == 0 and "== 1 thread (cores " in text.stdout and "1 core)" in text.stdout
    too_many = len(os.sched_getaffinity(0)) + 1
    bad = subprocess.run([*args, "--threads", f"1,{too_many}"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and f"--threads 1,{too_many}: expected core counts between 1 and" in bad.stderr


def test_sweep_with_bench_adds_latency_and_marks_the_pareto_front(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc, rows = run_sweep(tmp_path, "model=geglu", "model.dim_in=16", "model.dim_out=8,32", "shapes.dims.batch=[1,2,4]",
                           "bench=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(rows) == 2 and all(r["status"] == "built" for r in rows)
    for r in rows:
        assert r["latency_ms"] > 0 and r["p99_ms"] >= r["latency_ms"] and r["stalls"] >= 0 and r["cold_start_ms"] > 0
    assert any(r["pareto"] == "*" for r in rows)
    smaller = min(rows, key=lambda r: r["size_bytes"])
    assert smaller["pareto"] == "*" or smaller["build_seconds"] > max(r["build_seconds"] for r in rows if r is not smaller)
    header = (sweep_dir / "summary.csv").read_text().splitlines()[0]
    assert header.endswith("latency_ms,p99_ms,stalls,cold_start_ms,padding_overhead,pareto")
    assert "p50 ms" in proc.stdout and "pareto" in proc.stdout


def test_mark_pareto():
    from tripy_build.cli.sweep import mark_pareto

    rows = [{"a": 1, "b": 5}, {"a": 2, "b": 2}, {"a": 3, "b": 3}, {"a": 1, "b": 5}, {"a": "", "b": 1}]
    mark_pareto(rows, ("a", "b"))
    assert [r["pareto"] for r in rows] == ["*", "*", "", "*", ""]


def test_a_dim_without_padding_says_which_sizes_compile_on_first_use(tmp_path, caplog):
    """A function model's seq has no padding declaration: the summary, one warning and ``inspect`` say which
    sizes compile on first use; and a call at such a size does compile."""
    proc = run_cli("--config-dir", str(REPO / "examples" / "conf"), "model=embedding", "shapes.dims.batch=[1,2,4]",
                   "shapes.dims.seq=[1,4,8]", f"artifacts_dir={tmp_path}", "model.vocab=20", "model.width=4",
                   cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert "dim seq [1..8]: not padded, buckets 1 2 4 8; sizes other than 1 2 4 8 compile on first use" in proc.stdout
    assert "dim batch [1..4]: padded (rows), buckets 1 2 4\n" in proc.stdout
    assert log.count("not every in-range shape is precompiled: dim seq: sizes other than 1 2 4 8 compile on first "
                     "use (~") == 1 and "model.padding.<dim>=rows|mask" in log
    (path,) = (tmp_path / "embedding").iterdir()
    shown = run_cli("inspect", str(path), timeout=120)
    row = next(line for line in shown.stdout.splitlines() if line.strip().startswith("seq "))
    assert row.rstrip().endswith("sizes other than 1 2 4 8"), shown.stdout
    exe = tb.load(path, warmup="none")
    with caplog.at_level(logging.INFO, logger="tripy_build"):
        exe(np.zeros((3, 4), np.int32))  # padded along batch, seq 4 precompiled
        assert "seq=4" not in caplog.text
        exe(np.zeros((3, 5), np.int32))  # compiled now (or read from the compile cache an earlier run filled)
        assert "batch=4, seq=5 on first use" in caplog.text or "batch=4, seq=5 loaded from the compile cache" in caplog.text


@pytest.mark.parametrize("model", ["geglu", "mlp", "transformer", "convnet"])
def test_default_dynamic_build_serves_the_whole_range_without_compiling(model):
    """The default shapes=dynamic config: every dim padded up to its max, within the default budget."""
    from tripy_build.compiler.export import make_symbols
    from tripy_build.core.profiles import plan_dims, profiles

    request = config.validate(compose_cfg([f"model={model}", "shapes=dynamic"]))
    m = instantiate_model(request.model)
    infos = input_infos(m, request.shapes, "float32")
    leaves = list(infos.items())
    _, symbols = make_symbols(leaves)
    used = {d for info in infos.values() for d in info.dimension_names.values()}
    dims = plan_dims(symbols, [p for p, _ in leaves], {d: b for d, b in request.buckets.items() if d in used},
                     model_padding(m, request.model, request.shapes))
    assert dims and all(d.strategy == "padded" and d.buckets[-1] == d.bounds[2] for d in dims)
    assert len(profiles(dims, request.max_profiles)) <= request.max_profiles == 64


def test_bench_plot_draws_latency_against_shape(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (pip install -e '.[plot]'); CI installs it")
    cfg = compose_cfg(["model=geglu", "model.dim_in=16", "model.dim_out=8", "shapes=dynamic",
                       "shapes.dims.batch=[1,2,8]", f"artifacts_dir={tmp_path / 'arts'}"])
    path = build(config.validate(cfg)).path
    png = tmp_path / "latency.png"
    proc = run_cli("bench", str(path), "--plot", str(png), "--stream", "10", "--shapes", "1", "--cold-rounds", "0",
                   "--budget", "0.02", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "padding overhead" in proc.stdout


def test_bench_plot_of_two_dims_is_a_heatmap_with_a_cell_per_profile(tmp_path):
    """The transformer's (batch, seq): a cell per pair of buckets a call runs, its median steady latency."""
    pytest.importorskip("matplotlib", reason="the plot extra (pip install -e '.[plot]'); CI installs it")
    from tripy_build.cli.bench import cells

    cfg = compose_cfg(["model=transformer", *SMALL["transformer"], "shapes=dynamic", "shapes.dims.batch=[1,2,4]",
                       "shapes.dims.seq=[1,4,8]", f"artifacts_dir={tmp_path / 'arts'}"])
    path = build(config.validate(cfg)).path
    png, out = tmp_path / "latency.png", tmp_path / "bench.json"
    proc = run_cli("bench", str(path), "--plot", str(png), "--stream", "30", "--shapes", "1", "--cold-rounds", "0",
                   "--budget", "0.02", "--json", str(out), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    result = json.loads(out.read_text())
    xs, ys, grid = cells(result)
    assert xs == [0.5, 1.5, 2.5, 4.5] and ys == [0.5, 1.5, 2.5, 4.5, 8.5]  # buckets 1 2 4 and 1 2 4 8
    for j, row in enumerate(grid):
        for i, value in enumerate(row):
            inside = [p["steady_ms"] for p in result["stream"]["points"]
                      if xs[i] < p["sizes"][0] < xs[i + 1] and ys[j] < p["sizes"][1] < ys[j + 1]]
            assert (value is None) == (not inside) and (not inside or value == float(np.median(inside)))


def test_model_padding_in_the_config_overrides_the_class_per_dim():

    request = config.validate(compose_cfg(["model=transformer", "shapes=dynamic", "model.padding.seq=none"]))
    assert model_padding(instantiate_model(request.model), request.model, request.shapes) == {"batch": "rows"}
    request = config.validate(compose_cfg(["model=geglu", "shapes=dynamic"]))
    assert model_padding(instantiate_model(request.model), request.model, request.shapes) == {"batch": "rows"}
    request = config.validate(compose_cfg(["model=geglu", "shapes=dynamic", "model.padding.batch=none"]))
    assert model_padding(instantiate_model(request.model), request.model, request.shapes) == {}
    request = config.validate(compose_cfg(["model=geglu", "shapes=dynamic", "+model.padding.seq=mask"]))
    with pytest.raises(ConfigError, match="model.padding: 'seq' is not a dim of this model's inputs"):
        model_padding(instantiate_model(request.model), request.model, request.shapes)


def test_help_lists_groups_keys_and_commands(tmp_path):
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for command in ("verify PATH", "inspect PATH", "show PATH", "list [ARTIFACTS_DIR]", "bench PATH", "-m KEY=A,B"):
        assert command in out, command
    for option in ("geglu", "transformer", "dynamic", "static", "bfloat16", "submitit_local"):
        assert option in out, option
    # every key of the schema, with its type, default and meaning
    assert re.search(r"optimization_level\s+int\s+3\s+0\.\.5", out)
    assert re.search(r"params\.checkpoint\s+str or null\s+null\s+the model's params: a Hugging Face save_pretrained", out)
    # the Hugging Face architectures model=hf builds: zoo model, class names, heads and tasks
    assert re.search(r"model=bert\s+BertModel, BertForSequenceClassification.*heads: none, sequence_classification", out)
    assert re.search(r"model=qwen2\s+Qwen2ForCausalLM, Qwen2Model, Qwen2ForSequenceClassification, "
                     r"Qwen2ForTokenClassification, Qwen2ForQuestionAnswering\s+heads: causal_lm, none, "
                     r"sequence_classification, token_classification, question_answering; task: forward, generate "
                     r"\(causal_lm\)", out)
    assert re.search(r"model=gpt2\s+GPT2LMHeadModel, GPT2Model, GPT2ForSequenceClassification, GPT2ForTokenClassific"
                     r"ation, GPT2ForQuestionAnswering\s+heads: causal_lm, none, sequence_classification, "
                     r"token_classification, question_answering; task: forward, generate \(causal_lm\)\n", out)
    assert re.search(r"model=olmo2\s+Olmo2ForCausalLM, Olmo2Model, Olmo2ForSequenceClassification\s+heads: causal_lm, "
                     r"none, sequence_classification; task: forward, generate \(causal_lm\)\n", out)
    assert re.search(r"precision\.dtype\s+float32\|bfloat16\|float16\s+float32", out)
    assert "mlp: dim_in=512, hidden=1024" in out and "model.inputs" in out
    assert "schema" not in out  # Hydra's internal schema/* groups stay hidden


def test_list_and_show_describe_what_was_built(tmp_path):
    arts = tmp_path / "arts"
    for overrides in (["model=geglu", "optimization_level=0"], ["model=mlp", "precision=bfloat16"]):
        proc = run_cli(*overrides, *SMALL[overrides[0].split("=")[1]], "shapes=static", f"artifacts_dir={arts}",
                       cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Unable to initialize backend" not in proc.stdout + proc.stderr  # jax's TPU probe is not shown
        assert re.search(r"\[\s*\d+\.\d s\] compile 1 profile", proc.stdout + proc.stderr)  # progress, elapsed
    (arts / "mlp" / "0000000000000000").mkdir()
    (arts / "mlp" / "0000000000000000" / "manifest.json").write_text("{not json")
    proc = run_cli("list", str(arts), cwd=tmp_path, env={"COLUMNS": "400"})  # whole lines, whatever the terminal
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    geglu = next(ln for ln in lines if ln.strip().startswith("geglu"))
    assert "x float32[8, 16]" in geglu and "cpu O0 float32" in geglu
    mlp = [ln for ln in lines if ln.strip().startswith("mlp")]
    assert any("O3 bfloat16" in ln for ln in mlp) and any("damaged" in ln for ln in mlp)
    assert "3 artifact(s)" in proc.stdout
    path = next(p.parent for p in (arts / "geglu").glob("*/manifest.json"))
    shown = run_cli("show", str(path), cwd=tmp_path)
    assert shown.returncode == 0 and "inputs" in shown.stdout and "float32[8, 16]" in shown.stdout
    assert run_cli("list", str(tmp_path / "nowhere"), cwd=tmp_path).returncode == 2

    newest = run_cli("list", "--latest", str(arts), "model=geglu", cwd=tmp_path)  # for ART=$(...) in scripts
    assert newest.returncode == 0 and newest.stdout.strip() == str(path), newest.stderr
    assert run_cli("list", "--latest", str(arts), "model=mlp", "precision=bfloat16", cwd=tmp_path).stdout.strip() \
        == str(next(p.parent for p in (arts / "mlp").glob("*/manifest.json") if "bfloat16" in p.read_text()))
    none = run_cli("list", "--latest", str(arts), "model=geglu", "shapes=dynamic", cwd=tmp_path)
    assert none.returncode == 2 and none.stdout == ""
    assert "no artifact under" in none.stderr and "built with model=geglu shapes=dynamic" in none.stderr
    bad = run_cli("list", str(arts), "modle=geglu", cwd=tmp_path)
    assert bad.returncode == 2 and "modle=... is not a setting an artifact records" in bad.stderr


def test_list_fits_the_terminal_and_names_each_checkpoint():
    """Rows are cut to the terminal's width in the inputs column; a checkpoint is named by its folder and params."""
    from tripy_build.cli.listing import fit

    cells = [["bert", "input_ids int32[batch=[1..8, opt 1], seq=[1..128, opt 64]]; " * 4, "cpu O3 float32 "
              "ckpt=sst2@3f2a9c1d", "28", "1.2 MB", "2026-11-27 06:23", "0123456789abcdef"]]
    lines = fit(cells, 120)
    assert max(map(len, lines)) <= 120 and "…" in lines[2] and "ckpt=sst2@3f2a9c1d" in lines[2]
    assert fit(cells, 1000) == fit(cells, 2000) and "…" not in "".join(fit(cells, 1000))


def test_ctrl_c_stops_a_build_with_one_line_and_leaves_nothing(tmp_path):
    import signal

    arts = tmp_path / "arts"
    # A runner started in the background ignores SIGINT and its children inherit that, so the child puts
    # Python's handler back before running the command as `python -m tripy_build` would.
    shim = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv[0] = 'tripy_build'; runpy.run_module('tripy_build', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", shim, "model=transformer", f"artifacts_dir={arts}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TRIPY_BUILD_NO_MEMO": "1"})
    seen = []
    for line in proc.stdout:  # interrupt it mid-build: once the first profile has compiled
        seen.append(line)
        if "profile 1/" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stdout.read()
    proc.wait(timeout=120)
    assert proc.returncode == 130, "".join(seen)[-2000:] + rest[-2000:]
    assert "Traceback" not in rest and rest.strip().splitlines()[-1].startswith("interrupted:"), rest[-2000:]
    assert not any(arts.rglob("manifest.json")) and not any(arts.rglob(".*tmp*"))


def test_tripy_local_launcher_gives_the_same_artifacts_as_the_basic_one(tmp_path):
    """Jobs on a pool of reused worker processes: same keys and bytes, progress, failures counted."""
    sweeps, orders = {}, {}
    for launcher in ("basic", "tripy_local"):
        proc, rows = run_sweep(tmp_path, "model=geglu,mlp", "shapes=static,dynamic", "optimization_level=0,9",
                               "model.dim_in=16", *SMALL_SHAPES["dynamic"][:1], f"artifacts_dir={tmp_path / launcher}",
                               f"hydra/launcher={launcher}",
                               name="basic-sweep" if launcher == "basic" else None)  # tripy_local: Hydra's default dir
        assert proc.returncode == 1, proc.stderr[-3000:]  # the optimization_level=9 jobs fail
        assert "[sweep] 8/8 done, 4 failed" in proc.stdout and "8 builds, 4 failed;" in proc.stdout
        orders[launcher] = [[o for o in r["overrides"].split() if not o.startswith("artifacts_dir=")] for r in rows]
        assert not (tmp_path / "basic-sweep" / sweep.SHARED_INIT).exists()  # the jobs' shared init is removed
        sweeps[launcher] = reproducible_files(tmp_path / launcher)
    assert len(sweeps["basic"]) > 8 and sweeps["basic"] == sweeps["tripy_local"]
    # tripy_local starts the dynamic jobs first (the largest), and reports every job in the sweep's order
    assert orders["basic"] == orders["tripy_local"] and orders["basic"][0][:2] == ["model=geglu", "shapes=static"]
    pids = {json.loads(p.read_text())["pid"] for p in default_sweep_dir(tmp_path).glob("*/build_result.json")}
    assert 1 < len(pids) <= (os.cpu_count() or 1)  # jobs ran in more than one worker, never more than the cores


def test_tripy_local_starts_the_largest_jobs_first():
    from hydra_plugins.tripy_build_launcher.launcher import estimated_work

    work = {name: estimated_work(compose_cfg(overrides)) for name, overrides in {
        "static": ["shapes=static"],
        "dynamic": ["shapes=dynamic"],
        "dynamic bfloat16": ["shapes=dynamic", "precision=bfloat16"],
        "batch only": ["shapes=dynamic", "shapes.dims.batch=[1,2,4]", "shapes.dims.seq=4", "shapes.dims.height=8",
                       "shapes.dims.width=8"],
        "listed buckets": ["shapes=dynamic", "shapes.dims.batch=[1,2,4]", "shapes.dims.seq=4", "shapes.dims.height=8",
                           "shapes.dims.width=8", "shapes.buckets.batch=[1,4]"],
    }.items()}
    # profiles the shapes allow (batch 1,2,4: 3; listed: 2), capped at max_profiles; x2 for a reduced precision
    assert work == {"static": 1, "dynamic": 64, "dynamic bfloat16": 128, "batch only": 3, "listed buckets": 2}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux's sched_setaffinity and two cores")
def test_tripy_local_pins_each_worker_to_its_core():
    from hydra_plugins.tripy_build_launcher.launcher import _stop_forkserver, _Worker

    cores = sorted(os.sched_getaffinity(0))[:2]
    workers = [_Worker(core, fresh=False) for core in cores]
    try:
        assert [w.pool.submit(os.sched_getaffinity, 0).result(timeout=120) for w in workers] == [{c} for c in cores]
    finally:
        for w in workers:
            w.pool.shutdown()
        _stop_forkserver()


def test_tripy_local_gives_a_free_worker_the_largest_job_and_then_a_model_it_has_built():
    from hydra_plugins.tripy_build_launcher.launcher import _Job, next_job

    jobs = [_Job({}, {}, work, model) for work, model in [(4, "a"), (4, "a"), (4, "b"), (4, "b"), (1, "a"), (1, "b")]]
    assert next_job([0, 1, 2, 3, 4, 5], jobs, set(), set()) == 0  # no model built anywhere: the first largest
    assert next_job([1, 2, 3, 4, 5], jobs, set(), {"a"}) == 2  # a model no other worker has
    assert next_job([1, 3, 4, 5], jobs, {"b"}, {"a"}) == 3  # its own model among the largest
    assert next_job([3, 4, 5], jobs, {"a"}, {"b"}) == 3  # never a smaller job for its model's sake


KILLER = """
import os, signal
from dataclasses import dataclass

from tripy_build.models.geglu import GEGLU


@dataclass(frozen=True)
class Killer(GEGLU):
    def init(self, key):
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does to a build
"""


def test_tripy_local_fails_only_the_job_whose_worker_died(tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "killer.yaml").write_text("_target_: killer.Killer\nname: killer\ndim_in: 16\ndim_out: 32\n")
    proc, rows = run_sweep(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=killer,geglu",
                           "model.dim_in=16", "model.dim_out=32", "shapes=static", "hydra/launcher=tripy_local",
                           "hydra.launcher.workers=1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "[sweep] 2/2 done, 1 failed" in proc.stdout
    assert [r["status"] for r in rows] == ["failed", "built"]  # one worker: its successor built the next job
    assert "the worker process building it died: killed by SIGKILL (signal 9)" in rows[0]["error"]
    assert len(list((tmp_path / "arts").rglob("manifest.json"))) == 1


def test_tripy_local_builds_cpu_targets_on_reused_workers(tmp_path):
    """target.cpu sets nothing process-wide (a compile-only device, not XLA_FLAGS): its jobs share workers."""
    proc, _ = run_sweep(tmp_path, "target.cpu=host,portable", "model=geglu", "shapes=static", "model.dim_in=16",
                        "hydra/launcher=tripy_local", "hydra.launcher.workers=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fresh one per job" not in proc.stdout + proc.stderr
    targets = sorted(json.loads(p.read_text())["metadata"]["build_key_parts"]["config"]["target_cpu"]
                     for p in (tmp_path / "arts").rglob("manifest.json"))
    assert targets == ["host", "portable"]


def test_builds_in_one_process_share_the_models_init(tmp_path, monkeypatch):
    """Jobs differing only in how they compile take the init params the first one made: identical weights,
    one init call, read-only arrays; another seed or another width inits again."""
    from tripy_build.builder import init_cache as build_module
    from tripy_build.models.geglu import GEGLU

    calls = []
    init = GEGLU.init
    monkeypatch.setattr(GEGLU, "init", lambda self, key: calls.append(1) or init(self, key))
    monkeypatch.setattr(build_module, "_INIT_MEMO", type(build_module._INIT_MEMO)())
    common = ["model=geglu", "model.dim_in=16", "model.dim_out=32", "shapes=static", f"artifacts_dir={tmp_path}"]
    paths = [build(config.validate(compose_cfg([*common, *extra]))).path
             for extra in (["optimization_level=0"], ["optimization_level=3"], ["precision=bfloat16"])]
    assert len(calls) == 1
    weights = [{p.name: p.read_bytes() for p in (Path(path) / "weights").iterdir()} for path in paths[:2]]
    assert weights[0] and weights[0] == weights[1]
    (params, _), = build_module._INIT_MEMO.values()
    assert not any(leaf.flags.writeable for leaf in jax.tree_util.tree_leaves(params))
    build(config.validate(compose_cfg([*common, "params.seed=1"])))
    build(config.validate(compose_cfg([*common[:2], "model.dim_out=64", *common[3:]])))
    assert len(calls) == 3 and len(build_module._INIT_MEMO) == 3


def test_builds_in_other_processes_share_the_models_init_through_a_directory(tmp_path, monkeypatch, caplog):
    """A build with ``shared_init_dir`` writes its init there; a build in another process (here: this one
    with its memo emptied) reads it instead of initializing: the same weight bytes. A file there that is
    not this model's tree is ignored, and replaced."""
    import dataclasses
    import logging

    from tripy_build.builder import init_cache as build_module

    shared = tmp_path / "shared"
    common = ["model=geglu", "model.dim_in=16", "model.dim_out=32", "shapes=static", f"artifacts_dir={tmp_path}"]

    def build_fresh(*extra: str) -> Path:
        monkeypatch.setattr(build_module, "_INIT_MEMO", type(build_module._INIT_MEMO)())
        request = dataclasses.replace(config.validate(compose_cfg([*common, *extra])), shared_init_dir=str(shared))
        with caplog.at_level(logging.INFO, logger="tripy_build.builder"):
            caplog.clear()
            return Path(build(request).path)

    first = build_fresh("optimization_level=0")
    (stored,) = shared.glob("*.npz")
    assert "shared by another process" not in caplog.text
    second = build_fresh("optimization_level=3")
    assert "init params shared by another process" in caplog.text
    weights = [{p.name: p.read_bytes() for p in (path / "weights").iterdir()} for path in (first, second)]
    assert weights[0] and weights[0] == weights[1]

    np.savez(stored, np.zeros(3, np.float32))  # another tree: initialized again, same bytes, and shared again
    third = build_fresh("optimization_level=1")
    assert "shared by another process" not in caplog.text
    assert {p.name: p.read_bytes() for p in (third / "weights").iterdir()} == weights[0]
    build_fresh("optimization_level=2")
    assert "init params shared by another process" in caplog.text
