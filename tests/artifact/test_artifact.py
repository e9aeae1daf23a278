"""Artifacts: manifest contents, save/load round trips (also in a fresh process), integrity checks."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import blake3
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import CompatibilityWarning, runtime
from conftest import BATCH, DIM_IN, DIM_OUT, assert_close, info_summary

PROGRAM = "program.jaxexport"
XLA = "executables/0.xla"


def _read_manifest(path: Path) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (Path(path) / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _signature(exe) -> list[tuple[str, str]]:
    return [(p.name, p.kind.name) for p in inspect.signature(exe).parameters.values()]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _blake3(path: Path) -> str:
    return blake3.blake3(Path(path).read_bytes()).hexdigest()


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# --- what is written ------------------------------------------------------------------------------

def test_artifact_layout(geglu_artifact):
    files = {p.relative_to(geglu_artifact).as_posix() for p in geglu_artifact.rglob("*") if p.is_file()}
    assert {"manifest.json", PROGRAM, XLA} <= files


def test_save_returns_path(geglu_exe, tmp_path):
    target = tmp_path / "nested" / "dir" / "art"
    result = geglu_exe.save(target)
    assert Path(result).resolve() == target.resolve()
    assert (target / "manifest.json").is_file()


def _io_bounds(manifest: dict, section: str, index: int, name: str | None = None) -> dict:
    """min/opt/max of one input or output, wherever the manifest keeps them for that entry."""
    entry = manifest[section][index]
    if all(k in entry for k in ("min", "opt", "max")):
        return entry
    # inputs may keep their per-leaf shapes in a separate table keyed by the input's path
    for table in ("input_specs",):
        for spec in manifest.get(table, []):
            if spec.get("path") == name:
                return spec
    raise AssertionError(f"no min/opt/max for {section}[{index}] in the manifest")


def test_manifest_contents(geglu_artifact):
    m = _read_manifest(geglu_artifact)
    assert m["schema_version"] == 5
    assert m["function"] == "geglu"
    assert m["optimization_level"] == 3
    assert m["platforms"] == ["cpu"]

    assert [i["name"] for i in m["inputs"]] == ["x"]
    x = _io_bounds(m, "inputs", 0, "x")
    assert (list(x["min"]), list(x["opt"]), list(x["max"])) == (
        [BATCH[0], DIM_IN], [BATCH[1], DIM_IN], [BATCH[2], DIM_IN])
    assert x["dtype"] == "float32"
    assert len(m["outputs"]) == 1
    out = m["outputs"][0]
    assert (out["min"], out["opt"], out["max"]) == ([BATCH[0], DIM_OUT], [BATCH[1], DIM_OUT], [BATCH[2], DIM_OUT])
    assert out["dtype"] == "float32"

    tc = m["toolchain"]
    assert tc["python"] == platform.python_version()
    assert tc["jax"] == jax.__version__
    assert tc["jaxlib"] == jaxlib.__version__
    assert tc["tripy_build"] == tb.__version__
    assert tc["xla_flags"] == os.environ.get("XLA_FLAGS", "")


def test_manifest_and_index_file_tables_cover_every_file(geglu_artifact):
    m = _read_manifest(geglu_artifact)
    index = json.loads((geglu_artifact / "index.json").read_text())
    on_disk = {p.relative_to(geglu_artifact).as_posix() for p in geglu_artifact.rglob("*") if p.is_file()}
    assert set(m["files"]) | set(index["files"]) == on_disk - {"manifest.json", "index.json"}
    # executables are not byte-reproducible, so their digests live in the sidecar index
    assert XLA in index["files"] and XLA not in m["files"] and "program.jaxexport" in m["files"]
    assert m["index"] == {"file": "index.json", "covers": ["executables/"]}
    # the weights are stored once, as .npy files (raw, or what prep makes of them), and they are byte-reproducible
    chunks = m["prep"]["chunks"] if m["prep"] else []
    stored = [w["file"] for w in m["weights"] if w["file"]] + [a["file"] for c in chunks for a in c.get("at_rest", [])]
    assert sorted(stored) == sorted(f for f in m["files"] if f.startswith("weights/"))
    compiled = [*m["executables"], *[c["executable"] for c in (m["prep"]["chunks"] if m["prep"] else [])]]
    assert set(index["compile_seconds"]) == {e["file"] for e in compiled} == set(index["files"])
    for rel, entry in {**m["files"], **index["files"]}.items():
        path = geglu_artifact / rel
        assert entry["size"] == path.stat().st_size
        assert entry == {"size": path.stat().st_size, "blake3": _blake3(path)}


def test_manifest_executables(geglu_artifact):
    m = _read_manifest(geglu_artifact)
    assert len(m["executables"]) >= 1
    entry = m["executables"][0]
    assert entry["file"] == XLA
    deps = entry["depends_on"]
    assert deps["jaxlib"] == jaxlib.__version__
    assert isinstance(deps["cpu_features"], str)
    if sys.platform.startswith("linux"):
        assert deps["cpu_features"].split()  # the host's CPU flags are recorded
    # the first profile is opt; the program's inputs are the (prepared) weights, then x
    assert entry["target"] == [BATCH[1]]
    *weights, x = entry["input_shapes"]
    assert x == [BATCH[1], DIM_IN]
    assert sorted(math.prod(s) for s in weights) == sorted(math.prod(w["shape"]) for w in m["weights"])
    assert [e["target"] for e in m["executables"]] == [[4], [1], [2], [8]]  # opt, then pow2 buckets


def test_manifest_records_named_dims_and_nested_structure(nested_exe, pair_exe, tmp_path):
    pair_exe.save(tmp_path / "pair")
    m = _read_manifest(tmp_path / "pair")
    assert [i["name"] for i in m["inputs"]] == ["a", "b"]
    assert "batch" in json.dumps(m["inputs"]) + json.dumps(m.get("input_specs", []))
    assert all("batch" in json.dumps(o) for o in m["outputs"])

    exe, _ = nested_exe
    exe.save(tmp_path / "nested")
    m = _read_manifest(tmp_path / "nested")
    assert [i["name"] for i in m["inputs"]] == ["d"]
    assert len(m["outputs"]) == 2


# --- loading in this process ----------------------------------------------------------------------

def test_load_round_trip(geglu_exe, geglu_artifact, geglu_ref, rng, compile_counter):
    loaded = tb.load(geglu_artifact)
    assert isinstance(loaded, tb.Executable)
    assert _signature(loaded) == _signature(geglu_exe)
    assert info_summary(loaded.input_infos) == info_summary(geglu_exe.input_infos)
    assert info_summary(loaded.output_infos) == info_summary(geglu_exe.output_infos)
    assert ((BATCH[1], DIM_IN),) in loaded.precompiled_shapes

    x = rng.standard_normal((BATCH[1], DIM_IN)).astype(np.float32)
    expected = np.asarray(geglu_ref(x))  # eager JAX compiles its ops: count only the loaded calls
    x_jax = jnp.asarray(x)
    before = compile_counter.count
    out = loaded(x)
    out_jax = loaded(x_jax)
    assert compile_counter.count == before, "the opt shape must run without compiling"
    assert isinstance(out, jax.Array)
    assert_close(out, expected)
    assert_close(out_jax, expected)
    for batch in (BATCH[0], 3, BATCH[2]):
        x = rng.standard_normal((batch, DIM_IN)).astype(np.float32)
        assert_close(loaded(x), geglu_ref(x))


def test_loaded_executable_validates_calls(geglu_artifact):
    loaded = tb.load(geglu_artifact)
    with pytest.raises(tb.TripyBuildError, match=r"\[1, 8\]"):
        loaded(np.zeros((BATCH[2] + 1, DIM_IN), np.float32))
    with pytest.raises(tb.TripyBuildError, match="float64"):
        loaded(np.zeros((2, DIM_IN), np.float64))
    with pytest.raises(tb.TripyBuildError, match="'y'"):
        loaded(np.zeros((2, DIM_IN), np.float32), y=1)


def test_load_accepts_str_and_path(geglu_artifact):
    assert tb.load(str(geglu_artifact)).input_infos.keys() == tb.load(Path(geglu_artifact)).input_infos.keys()


def test_resave_of_loaded_artifact(geglu_artifact, geglu_ref, tmp_path, rng):
    loaded = tb.load(geglu_artifact)
    loaded.save(tmp_path / "again")
    assert _sha256(tmp_path / "again" / PROGRAM) == _sha256(geglu_artifact / PROGRAM)
    again = tb.load(tmp_path / "again")
    x = rng.standard_normal((2, DIM_IN)).astype(np.float32)
    assert_close(again(x), geglu_ref(x))


_PICKLE_AUDIT = {"active": False, "events": []}


def _pickle_audit_hook(event, args):
    # "pickle.find_class" is raised by every unpickler (C or Python) when it resolves a global.
    if _PICKLE_AUDIT["active"] and event == "pickle.find_class":
        _PICKLE_AUDIT["events"].append(args)


def test_load_never_unpickles(geglu_artifact, geglu_ref, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while loading an artifact")

    if not getattr(sys, "_tripy_build_test_audit_hook", False):
        sys.addaudithook(_pickle_audit_hook)  # audit hooks cannot be removed; it records only when active
        sys._tripy_build_test_audit_hook = True

    class ForbiddenUnpickler:
        def __init__(self, *args, **kwargs):
            forbidden()

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", ForbiddenUnpickler)
    inputs = {b: np.random.default_rng(b).standard_normal((b, DIM_IN)).astype(np.float32) for b in (BATCH[1], 2)}
    expected = {b: np.asarray(geglu_ref(x)) for b, x in inputs.items()}
    _PICKLE_AUDIT["events"].clear()
    _PICKLE_AUDIT["active"] = True
    try:
        loaded = tb.load(geglu_artifact)
        outputs = {b: loaded(x) for b, x in inputs.items()}
    finally:
        _PICKLE_AUDIT["active"] = False
    assert _PICKLE_AUDIT["events"] == [], "an unpickler resolved globals while loading"
    for b in inputs:
        assert_close(outputs[b], expected[b])


# --- loading in a fresh process -------------------------------------------------------------------

FRESH_SCRIPT = textwrap.dedent(
    """
    import inspect, json, sys
    import jax, numpy as np
    import tripy_build as tb

    unpickled = []
    sys.addaudithook(lambda event, args: unpickled.append(str(args)) if event == "pickle.find_class" else None)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)

    def summary(v):
        if isinstance(v, tb.InputInfo):
            return {"min": list(v.shape_bounds.min), "opt": list(v.shape_bounds.opt),
                    "max": list(v.shape_bounds.max), "dtype": np.dtype(v.dtype).name,
                    "names": {str(k): n for k, n in v.dimension_names.items()}}
        if isinstance(v, dict):
            return {"dict": {k: summary(x) for k, x in v.items()}}
        return {type(v).__name__: [summary(x) for x in v]}

    def decode(v):
        if "npy" in v:
            return np.load(v["npy"])
        if "dict" in v:
            return {k: decode(x) for k, x in v["dict"].items()}
        if "tuple" in v:
            return tuple(decode(x) for x in v["tuple"])
        return [decode(x) for x in v["list"]]

    jobs = json.load(open(sys.argv[1]))
    results = []
    for job in jobs:
        before_load = len(unpickled)
        exe = tb.load(job["artifact"])
        res = {
            "signature": [[p.name, p.kind.name] for p in inspect.signature(exe).parameters.values()],
            "inputs": summary(exe.input_infos),
            "outputs": summary(exe.output_infos),
            "precompiled": [[list(s) for s in shapes] for shapes in exe.precompiled_shapes],
            "unpickled": unpickled[before_load:],
            "calls": [],
        }
        for call in job["calls"]:
            before = len(compiles)
            out = exe(*[decode(a) for a in call["args"]])
            leaves = jax.tree_util.tree_leaves(out)
            for leaf, path in zip(leaves, call["out"]):
                np.save(path, np.asarray(leaf))
            res["calls"].append({"compiles": len(compiles) - before, "type": type(out).__name__,
                                 "n_out": len(leaves),
                                 "array_types": sorted({type(l).__module__.split(".")[0] for l in leaves})})
        results.append(res)
    print("RESULTS=" + json.dumps(results))
    """
)


def _summary_json(value):
    """info_summary in the subprocess's JSON form (lists, str keys)."""
    s = info_summary(value)
    return json.loads(json.dumps(s, default=list))


def _encode(value, tmp: Path, prefix: str):
    if isinstance(value, dict):
        return {"dict": {k: _encode(v, tmp, f"{prefix}_{k}") for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v, tmp, f"{prefix}_{i}") for i, v in enumerate(value)]}
    path = tmp / f"{prefix}.npy"
    np.save(path, np.asarray(value))
    return {"npy": str(path)}


@pytest.fixture(scope="module")
def fresh_process(geglu_exe, geglu_artifact, pair_exe, nested_exe, tmp_path_factory):
    """Save several executables, then load and call them all in one fresh Python process."""
    tmp = tmp_path_factory.mktemp("fresh")
    rng = np.random.default_rng(99)
    nested, nested_fn = nested_exe
    pair_exe.save(tmp / "pair")
    nested.save(tmp / "nested")

    def one_list(x):
        return [x * 2.0 - 1.0]

    one = tb.compile(one_list, args=(tb.InputInfo((tb.NamedDimension("n", 1, 2, 3), 2), "float32"),))
    one.save(tmp / "one_list")

    def geglu_x(b):
        return rng.standard_normal((b, DIM_IN)).astype(np.float32)

    def pair_ab(b):
        return [rng.standard_normal((b, 5)).astype(np.float32) for _ in range(2)]

    def nested_d(b):
        return [{"a": rng.standard_normal((b, 3)).astype(np.float32),
                 "b": [rng.standard_normal(3).astype(np.float32),
                       (rng.integers(-9, 9, 2).astype(np.int32), rng.integers(-9, 9, 2).astype(np.int32))]}]

    plan = [
        ("geglu", geglu_exe, geglu_artifact, [[geglu_x(b)] for b in (BATCH[1], BATCH[0], 3, BATCH[2])]),
        ("pair", pair_exe, tmp / "pair", [pair_ab(b) for b in (3, 1, 6)]),
        ("nested", nested, tmp / "nested", [nested_d(b) for b in (2, 1, 4)]),
        ("one_list", one, tmp / "one_list",
         [[rng.standard_normal((b, 2)).astype(np.float32)] for b in (2, 3)]),
    ]
    jobs, expected = [], []
    for name, exe, path, calls in plan:
        job = {"artifact": str(path), "calls": []}
        exp = []
        for ci, args in enumerate(calls):
            want = jax.tree_util.tree_leaves(exe(*args))
            job["calls"].append({
                "args": [_encode(a, tmp, f"{name}{ci}_in{ai}") for ai, a in enumerate(args)],
                "out": [str(tmp / f"{name}{ci}_out{k}.npy") for k in range(len(want))],
            })
            exp.append((args, want, type(exe(*args)).__name__))
        jobs.append(job)
        expected.append((name, exe, exp))
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    (tmp / "script.py").write_text(FRESH_SCRIPT)

    proc = subprocess.run(
        [sys.executable, str(tmp / "script.py"), str(tmp / "jobs.json")],
        capture_output=True, text=True, timeout=300, cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS="))
    return json.loads(line[len("RESULTS="):]), jobs, expected


def test_fresh_process_same_signature_and_infos(fresh_process):
    results, _, expected = fresh_process
    for res, (name, exe, _) in zip(results, expected):
        assert res["signature"] == [list(s) for s in _signature(exe)], name
        assert res["inputs"] == _summary_json(exe.input_infos), name
        assert res["outputs"] == _summary_json(exe.output_infos), name


def test_fresh_process_load_does_not_unpickle(fresh_process):
    results, _, expected = fresh_process
    for res, (name, _, _) in zip(results, expected):
        assert res["unpickled"] == [], name


def test_fresh_process_same_outputs(fresh_process):
    results, jobs, expected = fresh_process
    for res, job, (name, _, exp) in zip(results, jobs, expected):
        for call_res, call, (_, want, want_type) in zip(res["calls"], job["calls"], exp):
            assert call_res["type"] == want_type, name
            assert call_res["n_out"] == len(want), name
            assert call_res["array_types"] == ["jaxlib"], name  # jax arrays come out
            for path, w in zip(call["out"], want):
                assert_close(np.load(path), np.asarray(w))


def test_fresh_process_runs_opt_shape_without_compiling(fresh_process):
    results, _, expected = fresh_process
    geglu_res = results[0]
    assert [[BATCH[1], DIM_IN]] in geglu_res["precompiled"]
    assert geglu_res["calls"][0]["compiles"] == 0  # first call: the opt shape
    for res, (name, exe, _) in zip(results, expected):
        opt = [list(info.shape_bounds.opt) for info in jax.tree_util.tree_leaves(
            exe.input_infos, is_leaf=lambda v: isinstance(v, tb.InputInfo))]
        assert opt in res["precompiled"], name
        assert res["calls"][0]["compiles"] == 0, name


# --- damaged, foreign and unsafe artifacts --------------------------------------------------------

@pytest.mark.parametrize("rel", [PROGRAM, XLA])
def test_tampered_file_is_rejected(artifact_copy, rel):
    _flip_byte(artifact_copy / rel)
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.load(artifact_copy)
    assert rel in str(excinfo.value)


@pytest.mark.parametrize("rel", [PROGRAM, XLA])
def test_truncated_file_is_rejected(artifact_copy, rel):
    path = artifact_copy / rel
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.load(artifact_copy)
    assert rel in str(excinfo.value)


def test_missing_listed_file_is_rejected(artifact_copy):
    (artifact_copy / XLA).unlink()
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.load(artifact_copy)
    assert XLA in str(excinfo.value)


@pytest.mark.parametrize("version", [1, 2, 0, "3", None])
def test_unknown_schema_version(artifact_copy, version):
    m = _read_manifest(artifact_copy)
    if version is None:
        del m["schema_version"]
    else:
        m["schema_version"] = version
    _write_manifest(artifact_copy, m)
    with pytest.raises(tb.TripyBuildError, match="schema_version"):
        tb.load(artifact_copy)


def _record_by_sha256(path: Path) -> None:
    """Rewrite an artifact's file tables as schema 4 wrote them: each file by sha256."""
    m = _read_manifest(path)
    index = json.loads((path / "index.json").read_text())
    for table in (m["files"], index["files"]):
        for rel in table:
            table[rel] = {"size": (path / rel).stat().st_size, "sha256": _sha256(path / rel)}
    m["schema_version"] = 4
    _write_manifest(path, m)
    (path / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("loader", ["tb.load", "runtime.load"])
def test_files_recorded_by_sha256_are_still_checked(artifact_copy, loader):
    """An artifact written before schema 5 records sha256 digests: it loads, and a damaged file is refused
    with sha256 named."""

    from tripy_build import runtime
    from tripy_build.cli.verify import verify

    load = tb.load if loader == "tb.load" else runtime.load
    x = np.random.default_rng(0).standard_normal((3, DIM_IN)).astype(np.float32)
    expected = np.asarray(tb.load(artifact_copy)(x))
    _record_by_sha256(artifact_copy)
    assert_close(np.asarray(load(artifact_copy)(x)), expected)
    out = io.StringIO()
    assert verify(artifact_copy, out=out), out.getvalue()
    assert "schema_version 4," in out.getvalue() and " sha256 " in out.getvalue() and " blake3 " not in out.getvalue()
    weight = sorted(artifact_copy.glob("weights/*.npy"))[0]
    _flip_byte(weight, weight.stat().st_size - 1)
    with pytest.raises(tb.TripyBuildError, match=f"{weight.name}: sha256 .* does not match"):
        load(artifact_copy)


def test_file_entry_without_a_digest(artifact_copy):
    m = _read_manifest(artifact_copy)
    del m["files"]["program.jaxexport"]["blake3"]
    _write_manifest(artifact_copy, m)
    with pytest.raises(tb.TripyBuildError, match="without a digest"):
        tb.load(artifact_copy)


def test_missing_manifest(artifact_copy):
    (artifact_copy / "manifest.json").unlink()
    with pytest.raises(tb.TripyBuildError, match="manifest.json"):
        tb.load(artifact_copy)


def test_missing_directory(tmp_path):
    with pytest.raises(tb.TripyBuildError, match="manifest.json"):
        tb.load(tmp_path / "does-not-exist")


def test_manifest_not_json(artifact_copy):
    (artifact_copy / "manifest.json").write_text("{not json")
    with pytest.raises(tb.TripyBuildError, match="manifest.json"):
        tb.load(artifact_copy)


@pytest.mark.parametrize("rel", ["../evil", "executables/../../evil", "/tmp/evil"])
def test_unsafe_path_in_manifest(artifact_copy, rel):
    # The file exists and its digest is right, so only the path check can refuse it.
    evil = artifact_copy.parent / "evil"
    evil.write_bytes(b"evil")
    if rel.startswith("/"):
        rel = str(evil)
    m = _read_manifest(artifact_copy)
    m["files"][rel] = {"size": 4, "blake3": blake3.blake3(b"evil").hexdigest()}
    _write_manifest(artifact_copy, m)
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.load(artifact_copy)
    assert rel in str(excinfo.value)


def test_executable_path_outside_artifact(artifact_copy):
    m = _read_manifest(artifact_copy)
    m["executables"][0]["file"] = "../evil"
    _write_manifest(artifact_copy, m)
    with pytest.raises(tb.TripyBuildError, match="evil"):
        tb.load(artifact_copy)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda deps: deps.update(isa=[*deps["isa"], "future-isa-9000"]), id="isa-this-host-lacks"),
        pytest.param(lambda deps: (deps.pop("isa"), deps.update(cpu_features=deps["cpu_features"] + " future_isa_9000")),
                     id="no-isa-recorded-build-host-flag-this-host-lacks"),
    ],
)
def test_incompatible_executable_falls_back_to_program(artifact_copy, geglu_ref, rng, edit):
    m = _read_manifest(artifact_copy)
    edit(m["executables"][0]["depends_on"])
    _write_manifest(artifact_copy, m)  # the manifest is not in its own file table
    with pytest.warns(CompatibilityWarning) as record:
        loaded = tb.load(artifact_copy)
    assert any(XLA in str(w.message) for w in record)
    assert ((BATCH[1], DIM_IN),) not in loaded.precompiled_shapes
    for batch in (BATCH[1], 2):
        x = rng.standard_normal((batch, DIM_IN)).astype(np.float32)
        assert_close(loaded(x), geglu_ref(x))


def test_an_executable_from_another_jaxlib_is_refused_in_one_line(artifact_copy, geglu_ref, rng):
    """XLA's executables load only in the jaxlib that compiled them: the load names both versions and the fixes, and
    the portable program still runs here when the executables are not trusted."""
    m = _read_manifest(artifact_copy)
    m["executables"][0]["depends_on"]["jaxlib"] = "0.10.2"
    _write_manifest(artifact_copy, m)
    here = jaxlib.__version__
    for load in (tb.load, runtime.load):
        with pytest.raises(tb.TripyBuildError) as excinfo:
            load(artifact_copy)
        message = str(excinfo.value)
        assert "\n" not in message and f"compiled by jaxlib 0.10.2, and this is jaxlib {here}" in message
        assert f"tripy-build rebuild {artifact_copy}" in message and "trust_executables=False" in message
    x = rng.standard_normal((BATCH[1], DIM_IN)).astype(np.float32)
    assert_close(tb.load(artifact_copy, trust_executables=False)(x), geglu_ref(x))


def test_compatibility_is_judged_by_the_executables_own_isa_not_the_build_hosts_flags(artifact_copy, geglu_ref, rng):
    m = _read_manifest(artifact_copy)
    deps = m["executables"][0]["depends_on"]
    assert deps["isa"] and deps["target_cpu"]  # what LLVM compiled for, read from the executable's bytes
    deps["cpu_features"] += " future_isa_9000"  # a build host with more than the code uses
    deps["isa"] = [f for f in deps["isa"] if not f.startswith("avx512")]  # e.g. a portable (AVX2) build
    _write_manifest(artifact_copy, m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = tb.load(artifact_copy)
    assert ((BATCH[1], DIM_IN),) in loaded.precompiled_shapes


def test_compatible_artifact_loads_without_warnings(geglu_artifact):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tb.load(geglu_artifact)


# --- saving over existing paths -------------------------------------------------------------------

def test_save_refuses_non_artifact_directory(geglu_exe, tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("do not delete")
    (target / "sub").mkdir()
    (target / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before, parent_before = _snapshot(target), sorted(os.listdir(tmp_path))
    with pytest.raises(tb.TripyBuildError, match="precious"):
        geglu_exe.save(target)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == parent_before  # no temporary directories left behind


def test_save_refuses_existing_file(geglu_exe, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(tb.TripyBuildError):
        geglu_exe.save(target)
    assert target.read_text() == "x"


def test_save_into_empty_directory(geglu_exe, geglu_ref, tmp_path, rng):
    target = tmp_path / "empty"
    target.mkdir()
    geglu_exe.save(target)
    x = rng.standard_normal((2, DIM_IN)).astype(np.float32)
    assert_close(tb.load(target)(x), geglu_ref(x))


def test_save_replaces_existing_artifact(artifact_copy, pair_exe, rng):
    parent_before = sorted(os.listdir(artifact_copy.parent))
    pair_exe.save(artifact_copy)
    assert sorted(os.listdir(artifact_copy.parent)) == parent_before
    loaded = tb.load(artifact_copy)
    assert _signature(loaded) == _signature(pair_exe)
    a = rng.standard_normal((2, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    for got, want in zip(loaded(a, b), pair_exe(a, b)):
        assert_close(got, want)


def test_selftest_stays_within_its_size_budget_and_still_catches_a_wrong_output(tmp_path):
    """Inputs over 64 KB are stored as seeds, outputs over 4096 elements as samples plus sums."""

    from tripy_build.artifact import selftest
    from tripy_build.cli.verify import verify

    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    exe = tb.compile(lambda x: jnp.tanh(x @ w), args=[tb.InputInfo(((1, 8, 128), 256), "float32")], buckets="none")
    path = tmp_path / "a"
    exe.save(path)
    m = _read_manifest(path)
    big = next(e for e in m["selftest"] if e["name"] == "max")
    assert isinstance(big["inputs"][0], dict) and big["inputs"][0]["shape"] == [128, 256]
    assert isinstance(big["outputs"][0], dict) and big["outputs"][0]["shape"] == [128, 256]
    stored = sum(p.stat().st_size for p in (path / "selftest").rglob("*.npy"))
    full = sum(4 * 256 * n * 2 for n in (1, 8, 128))  # every input and output as an .npy
    assert stored < full / 4, (stored, full)
    assert verify(path, out=io.StringIO())
    # a wrong value at a sampled element fails verify (the manifest's digest updated, as an editor would)
    rel = big["outputs"][0]["file"]
    values = np.load(path / rel)
    values[len(values) // 2] += 1.0
    np.save(path / rel, values)
    data = (path / rel).read_bytes()
    m["files"][rel] = {"blake3": blake3.blake3(data).hexdigest(), "size": len(data)}
    _write_manifest(path, m)
    out = io.StringIO()
    assert not verify(path, out=out) and "FAIL  self-test max" in out.getvalue()
    assert len(selftest.sample_indices(128 * 256)) == selftest.OUTPUT_SAMPLE


def test_an_output_sketch_made_from_slices_matches_the_whole_output():
    """The self-test keeps a large output as a sample plus sums; folding it in row by row (as the reference runs
    along a rows dim) keeps the same elements and the same sums; a small one comes back whole, exactly."""
    from tripy_build.artifact import selftest

    rng = np.random.default_rng(0)
    for shape, axis in (((6, 40, 37), 0), ((5, 900), 0), ((3, 7), 0), ((40, 6, 30), 1)):
        a = rng.standard_normal(shape).astype(np.float32)
        whole = selftest.sketch(a)
        folded = selftest.OutputSketch(shape, a.dtype, axis)
        for start in range(shape[axis]):
            folded.add(np.take(a, [start], axis=axis), start)
        got = folded.result()
        if a.size <= selftest.OUTPUT_SAMPLE:
            assert isinstance(got, np.ndarray) and np.array_equal(got, a)
            continue
        assert isinstance(got, selftest.Sampled) and got.shape == shape
        np.testing.assert_array_equal(got.sample, a.reshape(-1)[selftest.sample_indices(a.size)])
        np.testing.assert_array_equal(got.sample, whole.sample)
        assert got.sum == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-9, abs=1e-9)
        assert got.abs_sum == pytest.approx(float(np.abs(a.astype(np.float64)).sum()), rel=1e-9)


def _tanh_layer(w: np.ndarray, traced: list) -> Callable:
    """``tanh(x @ w)``, noting the shape of each ``x`` it is traced at in ``traced``."""
    def f(x):
        traced.append(tuple(x.shape))
        return jnp.tanh(x @ w)
    return f


def _saved_with_rows(tmp_path: Path, f: Callable, batch: Any, width: int, traced: list) -> Path:
    """``f`` over ``(batch, width)`` with ``batch`` declared rows, saved (so its self-test made) with ``traced``
    holding only what the save traced."""
    exe = tb.compile(f, args=[tb.InputInfo((batch, width), "float32")], padding={"batch": "rows"})
    traced.clear()
    exe.save(tmp_path / "a")
    return tmp_path / "a"


def test_the_selftest_reference_runs_a_row_at_a_time_along_a_rows_dim(tmp_path):
    """Along a dim declared rows, the reference is traced at one row (BERT-base at (16, 512) took 1.2 GB of working
    memory run whole); the artifact's profile, run on the whole batch by verify, must agree with it, and a
    wrong value in the row-by-row sums fails it."""

    from tripy_build.cli.verify import verify

    traced = []
    f = _tanh_layer(np.random.default_rng(1).standard_normal((16, 1000)).astype(np.float32), traced)
    batch = tb.NamedDimension("batch", 1, 2, 6)
    _saved_with_rows(tmp_path, f, batch, 16, traced)
    assert (1, 16) in traced and (6, 16) not in traced and (2, 16) not in traced, traced
    m = _read_manifest(tmp_path / "a")
    big = next(e for e in m["selftest"] if e["name"] == "max")
    assert big["outputs"][0]["shape"] == [6, 1000]  # 6000 elements: sampled, its sums folded in row by row
    assert verify(tmp_path / "a", out=io.StringIO())
    big["outputs"][0]["sum"] += 10.0  # the bound: 1e-4 x (6000 + the absolute sum), ~1.1
    _write_manifest(tmp_path / "a", m)
    out = io.StringIO()
    assert not verify(tmp_path / "a", out=out) and "FAIL  self-test max" in out.getvalue()
    # without a rows declaration the reference runs on the whole batch
    traced.clear()
    tb.compile(f, args=[tb.InputInfo((batch, 16), "float32")], buckets="none").save(tmp_path / "b")
    assert (6, 16) in traced, traced


def test_rows_of_one_element_run_two_at_a_time_in_the_selftest_reference(tmp_path):
    """A row of one element (BERT's (1, 1)) would make every matrix product a matrix-vector one, for which XLA
    copies the weights transposed: the reference runs two such rows at a time, an odd last one beside a copy
    of itself, and keeps one copy's outputs."""

    from tripy_build.cli.verify import verify

    traced = []
    f = _tanh_layer(np.random.default_rng(2).standard_normal((1, 300)).astype(np.float32), traced)
    _saved_with_rows(tmp_path, f, tb.NamedDimension("batch", 1, 2, 5), 1, traced)
    assert set(traced) == {(2, 1)}, traced  # the min case's one row and the max case's fifth ran as pairs
    assert verify(tmp_path / "a", out=io.StringIO())  # each case's outputs kept at its own rows, and right


def test_npy_files_are_written_from_the_arrays_with_the_same_bytes():
    """Weights are written from the arrays (``NpyFile``), not held again as bytes: the file is what ``npy`` makes."""
    import ml_dtypes

    from tripy_build.artifact.digest import digest_bytes, digest_parts
    from tripy_build.artifact.npy import NpyFile, npy

    for a in (np.arange(12, dtype=np.float32).reshape(3, 4), np.float32(3.0), np.asfortranarray(np.ones((3, 5))),
              np.ones((2, 3), ml_dtypes.bfloat16), np.zeros((0, 4), np.int32), np.arange(10)[::2],
              jnp.arange(6.0).reshape(2, 3)):
        parts = NpyFile(a).parts()
        assert b"".join(bytes(p) for p in parts) == npy(a)
        assert digest_parts(parts) == digest_bytes(npy(a))


def test_npy_headers_are_read_without_ast(monkeypatch):
    """numpy reads a header with ``ast.literal_eval``, which fails at random on CPython 3.11 when two threads
    parse at once (gh-106905: ``SystemError: AST constructor recursion depth mismatch``, seen in CI while an
    artifact's two reader threads loaded it). The headers numpy writes are read here without ``ast``."""
    import ast

    import ml_dtypes

    from tripy_build.artifact.npy import from_npy, npy

    parsed, parse = [], ast.parse

    def recorded(source, *args, **kwargs):
        parsed.append(source)
        return parse(source, *args, **kwargs)

    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.float64(3.0), np.asfortranarray(np.arange(15.0).reshape(3, 5)),
              np.zeros((0, 4), np.int32), np.array([True, False]), np.arange(6, dtype=np.int8).reshape(1, 2, 3),
              np.ones((2, 3), ml_dtypes.bfloat16)]
    files = [npy(a) for a in arrays]
    monkeypatch.setattr(ast, "parse", recorded)
    got = [from_npy(given, "w.npy", a.dtype) for a, data in zip(arrays, files) for given in (data, memoryview(data))]
    monkeypatch.undo()
    assert parsed == []
    for a, one in zip([a for a in arrays for _ in range(2)], got):
        assert one.dtype == a.dtype and one.shape == a.shape and one.tobytes() == np.asarray(a).tobytes()
        assert not one.flags.writeable  # a view of the file's bytes, not a copy


def test_npy_headers_in_other_forms_are_read_by_numpy():
    """A header in another form than the one matched (a structured dtype, version 2.0) goes to numpy's reader."""
    from tripy_build.artifact.npy import from_npy

    for a, version in [(np.zeros(3, [("a", "<f4"), ("b", "<i2")]), None), (np.arange(6.0).reshape(2, 3), (2, 0))]:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, version=version)
        got = from_npy(buf.getvalue(), "w.npy")
        assert got.dtype == a.dtype and got.tobytes() == a.tobytes()


def _npy_with_header(header: str, data: bytes = bytes(48)) -> bytes:
    """A version 1.0 ``.npy`` file with ``header`` padded as numpy pads it, then ``data``."""
    text = header.encode("latin1")
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


F4_34 = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"


@pytest.mark.parametrize("data,needle", [
    (_npy_with_header(F4_34, bytes(44)), "shape (3, 4) of float32 needs 48 bytes after the header, but the file has 44"),
    (_npy_with_header(F4_34.replace("<f4", "|O8")), "object arrays are never read"),
    (_npy_with_header(F4_34.replace("<f4", "<q9")), "descr '<q9' is not a dtype"),
    (_npy_with_header(F4_34)[:6] + b"\x09\x00" + _npy_with_header(F4_34)[8:], "version 9.0"),
    (_npy_with_header(F4_34)[:20], "the file ends 10 bytes into its 118-byte header"),
    (_npy_with_header(F4_34)[:8] + (20000).to_bytes(2, "little") + _npy_with_header(F4_34)[10:] + bytes(20000),
     "its header is 20000 bytes, over numpy's limit of 10000"),
    (b"PK\x03\x04" + _npy_with_header(F4_34)[4:], "no .npy magic string"),
    (_npy_with_header(F4_34.replace("(3, 4)", "(3, 5)")), "shape (3, 5) of float32 needs 60 bytes"),
    (_npy_with_header(F4_34.replace("(3, 4)", "(3, 4")), "numpy cannot read its header"),
    (_npy_with_header(F4_34.replace("(3, 4)", "(99999999999999, 999999)")), "needs 399999599999996000004 bytes"),
], ids=["truncated", "object dtype", "unknown dtype", "unknown version", "header cut", "header too long", "not npy",
        "shape larger than data", "unparseable", "shape overflowing int64"])
def test_damaged_npy_headers_are_refused_naming_the_file_and_the_damage(data, needle):
    from tripy_build.artifact.npy import from_npy
    from tripy_build.errors import ArtifactError

    assert from_npy(_npy_with_header(F4_34), "w.npy").shape == (3, 4)  # the undamaged file reads
    with pytest.raises(ArtifactError) as e:
        from_npy(data, "weights/w.npy")
    assert str(e.value).startswith("weights/w.npy: not a readable .npy array") and needle in str(e.value), str(e.value)
