"""Under load and when writing fails: threads calling one executable, two processes racing on one
artifact, and a full disk in the middle of a write. (Killed builds: test_reproducible.)"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import tripy_build as tb
from tripy_build.artifact.read import verify_files
from tripy_build.cli.verify import verify

B = tb.NamedDimension("batch", 1, 4, 32)
W = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)


def model(params, x):
    return np.tanh(1.0) * (x @ params["w"]) + x.sum(axis=1, keepdims=True)


def reference(x):
    return np.tanh(1.0) * (x @ W) + x.sum(axis=1, keepdims=True)


def test_eight_threads_two_thousand_calls_mixed_shapes_all_correct(tmp_path):
    """Buckets 4 and 16 are precompiled, not padded: every other batch compiles on first use, while
    other threads call (the same new shape can arrive in several threads at once)."""
    tb.compile(model, args=[{"w": W}, tb.InputInfo((B, 8), "float32")], buckets={"batch": [4, 16]}).save(tmp_path / "a")
    exe = tb.load(tmp_path / "a", warmup="background")
    errors: list[str] = []
    calls = [0] * 8

    def worker(i: int) -> None:
        rng = np.random.default_rng(i)
        for _ in range(250):
            n = int(rng.choice([4, 16, 1, 5, 17, 32]))  # two precompiled, four compiled here
            x = rng.standard_normal((n, 8)).astype(np.float32)
            try:
                y = np.asarray(exe(x))
                if y.shape != (n, 16) or not np.allclose(y, reference(x), rtol=1e-4, atol=1e-4):
                    errors.append(f"thread {i}: wrong result at batch {n}")
            except Exception as e:  # noqa: BLE001 - every failure is collected and reported
                errors.append(f"thread {i}: {type(e).__name__}: {e}")
            calls[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sum(calls) == 2000 and not errors, errors[:5]


RACER = textwrap.dedent("""
    import sys, numpy as np, tripy_build as tb
    base, rounds = sys.argv[1], int(sys.argv[2])
    w = np.arange(32, dtype=np.float32).reshape(4, 8)
    exe = tb.compile(lambda p, x: x @ p, args=[w, tb.InputInfo(((1, 2, 4), 4), "float32")], buckets="none")
    for i in range(rounds):
        path = f"{base}/round{i}"
        exe.save(path)  # both processes, at about the same time: each replaces atomically
        y = tb.load(path, warmup="none")(np.ones((3, 4), np.float32))
        assert np.allclose(np.asarray(y), np.ones((3, 4)) @ w), i
    print("ok", rounds)
""")


def test_two_processes_build_and_load_the_same_artifact_twenty_rounds(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), "20"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "ok 20" in out, err[-3000:]
    rounds = sorted(tmp_path.iterdir())
    assert [p.name for p in rounds] == sorted(f"round{i}" for i in range(20))  # one artifact per round, no temporaries
    for path in rounds[::5]:
        assert verify(path, out=open(os.devnull, "w"))


def test_a_full_disk_fails_cleanly_and_keeps_the_previous_artifact(tmp_path, monkeypatch):
    exe = tb.compile(model, args=[{"w": W}, tb.InputInfo((B, 8), "float32")], buckets="none")
    target = tmp_path / "a"
    exe.save(target)
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    from tripy_build.artifact import write as artifact_write

    real = artifact_write.write_file
    written = []

    def full_disk(path: Path, parts) -> None:
        if len(written) >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written.append(path)
        real(path, parts)

    monkeypatch.setattr(artifact_write, "write_file", full_disk)
    with pytest.raises(tb.TripyBuildError, match="No space left on device.*Nothing was written; an artifact already "
                                                 "there is untouched"):
        exe.save(target)
    monkeypatch.setattr(artifact_write, "write_file", real)
    after = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary was left behind"
    assert verify_files(target)
