"""tripy-build gc and the cache budget: least recently used first, never an artifact being loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tripy_build as tb
from tripy_build.artifact.layout import disk_size
from tripy_build.artifact import lock, store
from tripy_build.artifact.store import parse_size
from tripy_build.builder import memo


def _artifacts(root: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        w = np.full((64, 64), i, np.float32)
        path = root / "m" / f"{i:016x}"
        tb.compile(lambda x, w=w: x @ w, args=[tb.InputInfo((2, 64), "float32")]).save(path)
        os.utime(path / "manifest.json", (time.time() - 1000 * (n - i), (path / "manifest.json").stat().st_mtime))
        paths.append(path)
    return paths  # paths[0] the least recently used


def test_least_recently_used_go_first_and_a_load_counts_as_use(tmp_path):
    paths = _artifacts(tmp_path, 4)
    tb.load(paths[0], warmup="none")  # now the most recently used
    size = disk_size(paths[1])
    result = store.collect(tmp_path, max_bytes=int(2.5 * size))
    assert [p for p, _ in result.removed] == [paths[1], paths[2]]
    assert all(p.is_dir() for p in (paths[0], paths[3])) and not paths[1].exists() and not paths[2].exists()
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".")]


def test_age_budget_and_dry_run(tmp_path):
    paths = _artifacts(tmp_path, 3)
    dry = store.collect(tmp_path, max_age_days=1500 / 86400, dry_run=True)
    assert [p for p, _ in dry.removed] == [paths[0], paths[1]] and paths[0].is_dir()
    store.collect(tmp_path, max_age_days=1500 / 86400)
    assert [p.exists() for p in paths] == [False, False, True]


def test_an_artifact_being_loaded_is_never_removed(tmp_path):
    paths = _artifacts(tmp_path, 2)
    held, release = threading.Event(), threading.Event()

    def loader():
        with lock.reading(paths[0]):
            held.set()
            release.wait(30)

    t = threading.Thread(target=loader)
    t.start()
    held.wait(10)
    result = store.collect(tmp_path, max_bytes=0)
    release.set()
    t.join()
    assert result.in_use == [paths[0]] and paths[0].is_dir() and not paths[1].exists()


def test_command_and_config_budget(tmp_path):
    _artifacts(tmp_path / "arts", 3)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    dry = subprocess.run([sys.executable, "-m", "tripy_build", "gc", str(tmp_path / "arts"), "--max-bytes", "1",
                          "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0 and dry.stdout.startswith("would remove 3 artifact(s)"), dry.stdout
    assert " removed" not in dry.stdout and len(list((tmp_path / "arts").rglob("manifest.json"))) == 3
    listed = subprocess.run([sys.executable, "-m", "tripy_build", "list", str(tmp_path / "arts")], capture_output=True,
                            text=True, env=env, timeout=120)
    for line in dry.stdout.splitlines()[1:]:  # gc and list give an artifact the same size, in the same units
        key, size = line.split("/")[-1].split(" (")
        assert any(key[:16] in row and size.rstrip(")") in row for row in listed.stdout.splitlines()), (line, listed.stdout)
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "gc", str(tmp_path / "arts"), "--max-bytes", "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "removed 3 artifact(s)" in proc.stdout, proc.stderr
    _artifacts(tmp_path / "arts", 2)
    build = subprocess.run([sys.executable, "-m", "tripy_build", "model.dim_in=8", "model.dim_out=8", "shapes=static",
                            f"artifacts_dir={tmp_path / 'arts'}", "cache.max_bytes=1"],
                           capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    left = [p for p in (tmp_path / "arts").rglob("manifest.json")]
    assert len(left) == 1 and left[0].parent.parent.name == "geglu"  # only the artifact just built
    bad = subprocess.run([sys.executable, "-m", "tripy_build", "cache.max_bytes=lots"], capture_output=True,
                         text=True, env=env, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "cache.max_bytes: 'lots' is not a size" in bad.stderr


def test_memo_entries_of_removed_artifacts_are_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths = _artifacts(tmp_path / "arts", 1)
    from tripy_build.builder.memo import memo_dir

    memo_dir().mkdir(parents=True)
    (memo_dir() / "a.json").write_text(json.dumps({"path": str(paths[0])}))
    (memo_dir() / "b.json").write_text(json.dumps({"path": str(tmp_path / "gone")}))
    assert memo.prune() == 1 and (memo_dir() / "a.json").exists()


@pytest.mark.parametrize("text,size", [("500MB", 500 * 2**20), ("2G", 2 * 2**30), ("1.5GiB", int(1.5 * 2**30)), ("10", 10)])
def test_sizes(text, size):
    assert parse_size(text) == size
