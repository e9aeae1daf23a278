"""``python -m tripy_build inspect``: the manifest as tables, and ``--dump`` of the generated code, per zoo model."""

from __future__ import annotations

import json

import pytest

from tripy_build.cli import config
from tripy_build.builder.pipeline import build

from conftest import SMALL, SMALL_SHAPES, compose_cfg, run_cli


@pytest.fixture(scope="module", params=["geglu", "mlp", "transformer", "convnet"])
def built(request, tmp_path_factory):
    cfg = compose_cfg([f"model={request.param}", *SMALL[request.param], "shapes=dynamic",
                       *SMALL_SHAPES["dynamic"], f"artifacts_dir={tmp_path_factory.mktemp('arts')}"])
    return request.param, build(config.validate(cfg)).path


def test_inspect_and_dump_every_zoo_model(built, tmp_path):
    name, path = built
    manifest = json.loads((path / "manifest.json").read_text())
    proc = run_cli("inspect", str(path), "--dump", str(tmp_path / "dump"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"function '{name}'" in out and "optimization_level 3" in out
    for section in ("inputs", "outputs", "dims", f"profiles ({len(manifest['executables'])})", "weights", "files",
                    "toolchain", "compiler options", "build key"):
        assert section in out, section
    for d in manifest["dims"]:
        assert f"{d['name']}" in out and d["strategy"] in out
    for w in manifest["weights"]:
        assert w["path"] in out
    dumped = sorted(p.name for p in (tmp_path / "dump").iterdir())
    hlo = [p for p in dumped if p.endswith(".hlo")]
    assert len(hlo) == len(manifest["executables"]) and "program.mlir" in dumped and "cost.json" in dumped
    assert "stablehlo" in (tmp_path / "dump" / "program.mlir").read_text()
    assert all((tmp_path / "dump" / h).read_text().startswith("HloModule") for h in hlo)
    costs = json.loads((tmp_path / "dump" / "cost.json").read_text())
    assert set(costs) == {e["file"] for e in manifest["executables"]}
    assert all(c["flops"] > 0 and c["argument_bytes"] > 0 for c in costs.values())
    assert "MFLOP" in out and "-  " not in out.split("profiles")[1].split("weights")[0].splitlines()[3]


def test_inspect_refuses_what_is_not_an_artifact(tmp_path):
    proc = run_cli("inspect", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "is not a tripy_build artifact" in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_names_outputs_as_python_and_the_server_do(tmp_path):
    """A function returning a dict: inspect's outputs are its keys (the names a call's dict and /infer use)."""
    import numpy as np

    import tripy_build as tb
    from tripy_build import runtime

    w = np.ones((4, 3), np.float32)
    exe = tb.compile(lambda x: {"last_hidden_state": x @ w, "pooler_output": (x @ w).sum(-1)},
                     args=[tb.InputInfo(((1, 2, 4), 4), "float32")])
    path = exe.save(tmp_path / "art")
    proc = run_cli("inspect", str(path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = proc.stdout.split("\noutputs\n")[1].split("\n\n")[0].splitlines()[2:]
    names = [line.split()[0] for line in outputs]
    assert names == runtime.load(path).output_names == ["last_hidden_state", "pooler_output"]
