"""The self-test at an artifact's first load where its executables were compiled without their device
(runtime/first_run.py). A deviceless build targets a GPU, which this machine lacks: here a CPU artifact's
executables are marked as compiled without the device, which is what the loader reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tripy_build as tb
from conftest import BATCH, DIM_IN, assert_close
from tripy_build import runtime
from tripy_build.artifact import selftest

LOADERS = {"tb.load": tb.load, "runtime": runtime.load}  # both run the self-test, and share its remembered pass


def mark_deviceless(artifact, **case) -> None:
    path = artifact / "manifest.json"
    m = json.loads(path.read_text())
    for e in m["executables"]:
        e["depends_on"]["deviceless"] = True
    for c in m["selftest"]:
        c.update(case)
    path.write_text(json.dumps(m))  # the manifest is not in its own file table


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tripy_build" / "first_run"


@pytest.mark.parametrize("loader", LOADERS)
def test_the_first_load_runs_the_self_test_once(artifact_copy, cache, geglu_ref, rng, monkeypatch, loader):
    mark_deviceless(artifact_copy)
    ran = []
    check = selftest.check
    monkeypatch.setattr(selftest, "check", lambda *a: ran.append(a[1].name) or check(*a))
    exe = LOADERS[loader](artifact_copy, warmup="none")
    cases = [c["name"] for c in json.loads((artifact_copy / "manifest.json").read_text())["selftest"]]
    assert sorted(ran) == sorted(cases) and len(cases) >= 3  # every case the artifact holds
    assert len(list(cache.iterdir())) == 1
    x = rng.standard_normal((BATCH[1], DIM_IN)).astype(np.float32)
    assert_close(exe(x), geglu_ref(x))
    ran.clear()
    for load in LOADERS.values():
        load(artifact_copy, warmup="none")
    assert ran == []  # passed on this device before, by either loader


@pytest.mark.parametrize("loader", LOADERS)
def test_a_failing_first_self_test_refuses_the_artifact(artifact_copy, cache, loader):
    mark_deviceless(artifact_copy, rtol=-1.0, atol=-1.0)  # no output can be within a negative tolerance
    with pytest.raises(tb.TripyBuildError) as e:
        LOADERS[loader](artifact_copy, warmup="none")
    message = str(e.value)
    assert "its self-test fails at its first load on this cpu" in message and "case 'min'" in message
    assert f"tripy-build rebuild {artifact_copy}" in message
    assert not cache.exists() or not list(cache.iterdir())


def test_a_build_that_ran_on_its_device_is_not_tested_at_load(artifact_copy, cache, monkeypatch):
    monkeypatch.setattr(selftest, "check", lambda *a: pytest.fail("the self-test ran"))
    tb.load(artifact_copy, warmup="none")
