"""A build cache shared across machines: cache.remote (fsspec), and builders sharing one folder."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

pytest.importorskip("fsspec", reason="cache.remote needs fsspec: pip install -e '.[remote]'")

from tripy_build.artifact.write import FOREIGN_STALE_SECONDS, remove_stale_temporaries
from tripy_build.cli import config
from tripy_build.builder.pipeline import build
from tripy_build.cli.verify import verify

from conftest import run_cli

SMALL = ["model=mlp", "model.dim_in=8", "model.hidden=16", "model.dim_out=8", "model.layers=2",
         "shapes.dims.batch=[1,2,4]"]


def request(arts: Path, remote: str, *extra: str):
    config.register()
    with initialize_config_module(config_module="tripy_build.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*SMALL, f"artifacts_dir={arts}", f"cache.remote={remote}", *extra])
    return config.validate(cfg)


def files_of(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_a_second_host_downloads_instead_of_building(tmp_path, monkeypatch):
    remote = f"memory://tb-cache-{os.getpid()}-{time.time_ns()}"
    monkeypatch.setenv("TRIPY_BUILD_HOSTNAME", "host-a")
    first = build(request(tmp_path / "a", remote))
    assert not first.cache_hit and "trace+export" in first.timings
    monkeypatch.setenv("TRIPY_BUILD_HOSTNAME", "host-b")
    second = build(request(tmp_path / "b", remote))
    assert second.cache_hit and second.remote == remote and "download" in second.timings
    assert "trace+export" not in second.timings and "downloaded from" in second.summary()
    assert files_of(second.path) == files_of(first.path)  # every byte, executables and index included
    assert verify(second.path, out=io.StringIO())
    # a key the store lacks is built, then uploaded
    third = build(request(tmp_path / "b", remote, "params.seed=5"))
    assert not third.cache_hit and build(request(tmp_path / "c", remote, "params.seed=5")).remote == remote


def _tar(entries: dict[str, bytes], link: tuple[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("damage", ["bit flip", "path out", "symlink", "not a tar", "another key"])
def test_a_bad_remote_object_is_a_miss_and_the_build_goes_on(tmp_path, damage, caplog):
    import fsspec

    remote = f"memory://tb-bad-{damage.replace(' ', '')}-{time.time_ns()}"
    built = build(request(tmp_path / "a", remote))
    fs, root = fsspec.core.url_to_fs(remote)
    obj = f"{root}/mlp/{built.key[:16]}.tar"
    good = files_of(built.path)
    if damage == "bit flip":
        name = next(n for n in good if n.startswith("weights/"))
        flipped = bytearray(good[name])
        flipped[-1] ^= 1
        data = _tar({**good, name: bytes(flipped)})
    elif damage == "path out":
        data = _tar({**good, "../../escaped.txt": b"x"})
    elif damage == "symlink":
        data = _tar(good, link=("weights/evil.npy", "/etc/passwd"))
    elif damage == "not a tar":
        data = b"\0" * 1000
    else:
        other = build(request(tmp_path / "o", f"memory://unused-{time.time_ns()}", "params.seed=9"))
        data = _tar(files_of(other.path))
    fs.pipe_file(obj, data)
    again = build(request(tmp_path / "b", remote))
    assert not again.cache_hit and "trace+export" in again.timings  # built locally instead
    assert files_of(again.path).keys() == good.keys()
    assert "is not a usable artifact" in caplog.text
    assert not (tmp_path / "escaped.txt").exists() and not list((tmp_path / "b").rglob(".*tmp*"))


def test_two_processes_on_two_hosts_share_a_folder_cache(tmp_path):
    """Process 1 on host-a builds and uploads to file://; process 2 on host-b gets a cache hit, all of it."""
    remote = (tmp_path / "shared").as_uri()
    outputs = []
    for host, arts in (("host-a", "a"), ("host-b", "b")):
        env = {**os.environ, "TRIPY_BUILD_HOSTNAME": host, "TRIPY_BUILD_NO_MEMO": "1"}
        proc = run_cli(*SMALL, f"artifacts_dir={tmp_path / arts}", f"cache.remote={remote}", cwd=tmp_path, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs.append(proc.stdout + proc.stderr)
    assert "uploaded to the remote cache" in outputs[0] and "downloaded from" in outputs[1]
    assert "trace+export" not in outputs[1]
    assert list((tmp_path / "shared" / "mlp").glob("*.tar")) and not list((tmp_path / "shared").rglob("*.tmp-*"))


def test_temporaries_of_other_hosts_are_judged_by_age_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIPY_BUILD_HOSTNAME", "here")
    dead = 2 ** 22 + 12345  # no such pid
    mine_dead = tmp_path / f".a.tmp-{dead}@here-abc12345"
    theirs_young = tmp_path / f".a.tmp-{os.getpid()}@there-abc12345"
    theirs_old = tmp_path / f".b.tmp-{dead}@there-abc12345"
    for p in (mine_dead, theirs_young, theirs_old):
        p.mkdir()
    old = time.time() - FOREIGN_STALE_SECONDS - 60
    os.utime(theirs_old, (old, old))
    remove_stale_temporaries(tmp_path)
    assert [p.exists() for p in (mine_dead, theirs_young, theirs_old)] == [False, True, False]
