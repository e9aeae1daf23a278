"""``tripy-build rebuild``: what a loader refuses (executables from another jaxlib) built again here."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import tripy_build as tb
from conftest import SMALL, run_cli


def test_an_artifact_from_another_jaxlib_is_rebuilt_here(tmp_path):
    r = run_cli("model=geglu", *SMALL["geglu"], "shapes.dims.batch=[1,2,4]", f"artifacts_dir={tmp_path / 'arts'}",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (built,) = (tmp_path / "arts" / "geglu").iterdir()
    old = tmp_path / "elsewhere" / "geglu" / built.name  # as it came from a machine with another jaxlib
    shutil.copytree(built, old)
    m = json.loads((old / "manifest.json").read_text())
    for e in m["executables"]:
        e["depends_on"]["jaxlib"] = "0.10.2"
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(tb.TripyBuildError, match="compiled by jaxlib 0.10.2"):
        tb.load(old)
    r = run_cli("rebuild", str(old), "--artifacts-dir", str(tmp_path / "rebuilt"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    new = tmp_path / "rebuilt" / "geglu" / r.stdout.strip().splitlines()[-1].rsplit("/", 1)[-1]
    assert new.is_dir() and new.name == built.name  # the same config and toolchain: the same build key
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(tb.load(new)(x)), np.asarray(tb.load(built)(x)))


def test_rebuild_of_an_artifact_saved_from_python_says_why_not(geglu_artifact, tmp_path):
    r = run_cli("rebuild", str(geglu_artifact), cwd=tmp_path)
    assert r.returncode == 1 and "records no build config" in r.stderr and "Traceback" not in r.stderr
