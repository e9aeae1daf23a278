"""Damaged and hostile artifacts: each is refused by both loaders with an ``ArtifactError`` naming the
file or manifest field (or, where the damage is outside what a loader reads, loads and fails
``verify``), before anything in it is deserialized or run.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import warnings
from pathlib import Path

import blake3
import jax
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from tripy_build.cli.verify import verify

B = tb.NamedDimension("batch", 1, 2, 8)
W = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
X = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


def model(params, x):
    return x @ params["w"].T.T


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "artifact"
    tb.compile(model, args=[{"w": W}, tb.InputInfo((B, 4), "float32")]).save(path)
    return path


def _manifest(art: Path) -> dict:
    return json.loads((art / "manifest.json").read_text())


def _write_manifest(art: Path, m: dict) -> None:
    (art / "manifest.json").write_text(json.dumps(m))


def _first(art: Path, prefix: str) -> Path:
    return sorted(p for p in art.rglob("*") if p.is_file() and p.relative_to(art).as_posix().startswith(prefix))[0]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _edit(art: Path, fn) -> None:
    m = _manifest(art)
    fn(m)
    _write_manifest(art, m)


def _relink(art: Path, rel: str) -> None:
    """Replace a payload file by a link to an identical copy outside the artifact."""
    outside = art.parent / f"outside-{rel.replace('/', '_')}"
    shutil.copy(art / rel, outside)
    (art / rel).unlink()
    (art / rel).symlink_to(outside)


def _relink_dir(art: Path, rel: str) -> None:
    outside = art.parent / f"outside-dir-{rel}"
    shutil.copytree(art / rel, outside)
    shutil.rmtree(art / rel)
    (art / rel).symlink_to(outside, target_is_directory=True)


def _rehash(art: Path, rel: str) -> None:
    """Make the manifest vouch for ``rel``'s new bytes (as someone editing both would)."""
    data = (art / rel).read_bytes()
    _edit(art, lambda m: m["files"].__setitem__(rel, {"blake3": blake3.blake3(data).hexdigest(), "size": len(data)}))


def _program_version(art: Path, version: int) -> None:
    exported = jax.export.deserialize(bytearray((art / "program.jaxexport").read_bytes()))
    (art / "program.jaxexport").write_bytes(dataclasses.replace(exported, calling_convention_version=version).serialize())
    _rehash(art, "program.jaxexport")


def _deep(art: Path) -> None:
    (art / "manifest.json").write_text("[" * 10_000 + "]" * 10_000)


def _huge(art: Path) -> None:
    with open(art / "manifest.json", "r+b") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB on paper


def _not_an_artifact(art: Path) -> None:
    shutil.rmtree(art)
    art.mkdir()
    (art / "README.txt").write_text("some other directory")


# (id, what to do to a copy of the artifact, what the error must say)
REFUSED = [
    ("manifest missing", lambda a: (a / "manifest.json").unlink(), "manifest.json is missing"),
    ("manifest not JSON", lambda a: (a / "manifest.json").write_text("{not json"), "not valid JSON"),
    ("manifest not an object", lambda a: (a / "manifest.json").write_text("[1, 2]"), "not a tripy_build manifest"),
    ("newer schema version", lambda a: _edit(a, lambda m: m.__setitem__("schema_version", 99)), "schema_version 99"),
    ("another kind", lambda a: _edit(a, lambda m: m.__setitem__("kind", "onnx")), "not a tripy_build manifest"),
    ("manifest of 100 MB", _huge, "refusing to parse it"),
    ("manifest nested 10,000 deep", _deep, "nested too deeply"),
    ("manifest is a link", lambda a: _relink(a, "manifest.json"), "is a symbolic link"),
    ("malformed input spec", lambda a: _edit(a, lambda m: m["input_specs"][0].pop("dtype")), "malformed manifest"),
    ("program truncated", lambda a: _truncate(a / "program.jaxexport"), "program.jaxexport: size"),
    ("program bit flip", lambda a: _flip(a / "program.jaxexport"), "program.jaxexport: blake3"),
    ("program missing", lambda a: (a / "program.jaxexport").unlink(), "program.jaxexport: listed in manifest.json but missing"),
    ("program too new for this jax", lambda a: _program_version(a, 99), "too new"),
    ("program too old for this jax", lambda a: _program_version(a, 1), "too old"),
    ("program not a program (digest updated)", lambda a: ((a / "program.jaxexport").write_bytes(b"\0" * 64),
                                                          _rehash(a, "program.jaxexport")), "cannot deserialize"),
    ("executable truncated", lambda a: _truncate(_first(a, "executables/")), "does not match index.json"),
    ("executable bit flip", lambda a: _flip(_first(a, "executables/")), "does not match index.json"),
    ("executable missing", lambda a: _first(a, "executables/").unlink(), "listed in index.json but missing"),
    ("weight bit flip", lambda a: _flip(_first(a, "weights/")), "weights/"),
    ("weight truncated", lambda a: _truncate(_first(a, "weights/")), "weights/"),
    ("weight replaced by a link", lambda a: _relink(a, _first(a, "weights/").relative_to(a).as_posix()),
     "is a symbolic link"),
    ("weights directory is a link", lambda a: _relink_dir(a, "weights"), "is a symbolic link"),
    ("index missing", lambda a: (a / "index.json").unlink(), "index.json: missing"),
    ("index lists a file outside its prefix", lambda a: (a / "index.json").write_text(json.dumps(
        {**json.loads((a / "index.json").read_text()), "files": {"weights/evil.npy": {"blake3": "0", "size": 1}}})),
     "outside the prefixes"),
    ("a path that leaves the artifact", lambda a: _edit(a, lambda m: m["files"].__setitem__(
        "../../etc/passwd", {"blake3": "0", "size": 1})), "unsafe file path '../../etc/passwd'"),
    ("an absolute path", lambda a: _edit(a, lambda m: m["files"].__setitem__("/etc/passwd", {"blake3": "0", "size": 1})),
     "unsafe file path '/etc/passwd'"),
    ("a range the program does not have", lambda a: _edit(a, lambda m: (m["input_specs"][0]["max"].__setitem__(0, 94),
                                                                        m["dims"][0].__setitem__("max", 94))),
     "exported program has batch in [1, 8]"),
    ("a spec that contradicts its dims", lambda a: _edit(a, lambda m: m["input_specs"][0]["max"].__setitem__(0, 94)),
     "contradicts itself"),
    ("a dtype the program does not take", lambda a: _edit(a, lambda m: m["input_specs"][0].__setitem__("dtype", "float16")),
     "input_specs['x'] is float16"),
    ("a directory that is not an artifact", _not_an_artifact, "is not a tripy_build artifact"),
]


# Damage only the exported program shows: tripy_build.runtime, which never reads it, is not asked to see it.
PROGRAM_ONLY = {"too new", "too old", "cannot deserialize", "exported program has batch in [1, 8]"}


@pytest.fixture
def copy(pristine, tmp_path) -> Path:
    art = tmp_path / "artifact"
    shutil.copytree(pristine, art)
    return art


@pytest.mark.parametrize("damage,needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_by_both_loaders(copy, damage, needle):
    damage(copy)
    with pytest.raises(tb.TripyBuildError) as e:
        tb.load(copy, warmup="none")
    assert type(e.value).__name__ == "ArtifactError" and needle in str(e.value), repr(e.value)
    if needle in PROGRAM_ONLY:
        return  # the jax-free runtime never reads the program; it runs the executables the manifest lists
    with pytest.raises(tb.TripyBuildError) as e:
        runtime.load(copy)
    assert type(e.value).__name__ == "ArtifactError", repr(e.value)
    assert needle in str(e.value) or "contradicts itself" in str(e.value), str(e.value)


# Outside what a loader reads: the artifact loads, and verify fails naming the file.
LOADS_BUT_FAILS_VERIFY = [
    ("self-test bit flip", lambda a: _flip(_first(a, "selftest/")), "selftest/"),
    ("an unlisted file", lambda a: (a / "extra.bin").write_bytes(b"x"), "extra.bin"),
]


@pytest.mark.parametrize("damage,needle", [c[1:] for c in LOADS_BUT_FAILS_VERIFY], ids=[c[0] for c in LOADS_BUT_FAILS_VERIFY])
def test_verify_catches_what_loading_does_not_read(copy, damage, needle):
    damage(copy)
    np.testing.assert_allclose(np.asarray(tb.load(copy)(X)), X @ W, rtol=1e-5, atol=1e-5)
    out = io.StringIO()
    assert not verify(copy, out=out)
    assert any(line.startswith("FAIL") and needle in line for line in out.getvalue().splitlines()), out.getvalue()


def test_executable_for_cpu_features_this_host_lacks_is_skipped_and_compiled_here(copy):
    """An executable whose code uses an instruction set this CPU lacks is never run: a warning, then the
    portable program compiles its shapes here."""
    def isa(m):
        for e in m["executables"]:
            e["depends_on"]["isa"] = [*e["depends_on"].get("isa", []), "avx9000"]
    _edit(copy, isa)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = tb.load(copy, warmup="none")
    assert any("avx9000" in str(w.message) for w in caught), [str(w.message) for w in caught]
    np.testing.assert_allclose(np.asarray(exe(X)), X @ W, rtol=1e-5, atol=1e-5)


def test_untrusted_load_never_reads_the_shipped_executables(copy):
    for path in copy.glob("executables/*"):
        path.write_bytes(b"\xde\xad" * 100)  # machine code we will not run: not even read
    exe = tb.load(copy, warmup="now", trust_executables=False)
    np.testing.assert_allclose(np.asarray(exe(X)), X @ W, rtol=1e-5, atol=1e-5)
    with pytest.raises(tb.TripyBuildError, match="does not match index.json"):
        tb.load(copy)


def test_the_catalogue_is_large_enough():
    assert len(REFUSED) + len(LOADS_BUT_FAILS_VERIFY) + 2 >= 20
    assert os.name == "posix"  # links and sparse files as used above
