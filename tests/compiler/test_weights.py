"""The weight split: prep cut into chunks that share no weight, and what a loaded executable holds."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from tripy_build.compiler import weights as weights_lib
from tripy_build.errors import ArtifactError
from tripy_build.runtime.program import Stored

II = tb.InputInfo
D = 32


def _params(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"table": rng.standard_normal((10, D)).astype(np.float32),  # gathered as stored: no prep
            "shared": rng.standard_normal((D, D)).astype(np.float32),  # two prepared arrays from one weight
            "layers": [rng.standard_normal((D, D)).astype(np.float32) for _ in range(3)]}


def _model(params, ids, x):
    h = x + jnp.take(params["table"], ids, axis=0, mode="clip")
    h = h @ params["shared"].T + h @ (params["shared"] * 2.0)
    for w in params["layers"]:
        h = jnp.tanh(h @ w.T)
    return h


def _by_hand(params, ids, x):
    h = x + params["table"][ids]
    h = h @ params["shared"].T + h @ (params["shared"] * 2.0)
    for w in params["layers"]:
        h = np.tanh(h @ w.T)
    return h


@pytest.fixture
def chunked(monkeypatch, tmp_path):
    # one chunk per group: each transpose is 2 x 4 KB, the shared weight's group 3 x 4 KB
    monkeypatch.setattr(weights_lib, "PREP_CHUNK_BYTES", 9 * 1024)
    batch = tb.NamedDimension("batch", 1, 2, 4)
    exe = tb.compile(_model, args=[_params(0), II((batch,), "int32", values=(0, 10)), II((batch, D), "float32")],
                     padding={"batch": "rows"})
    return exe, Path(exe.save(tmp_path / "art", weights="raw"))


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.integers(0, 10, n).astype(np.int32), rng.standard_normal((n, D)).astype(np.float32)


def test_prep_runs_in_chunks_that_share_no_weight_and_every_loader_agrees(chunked):
    exe, path = chunked
    m = json.loads((path / "manifest.json").read_text())
    chunks = m["prep"]["chunks"]
    paths = [w["path"] for w in m["weights"]]
    read = [[paths[i] for i in c["weights"]] for c in chunks]
    assert len(chunks) == 4, read  # the shared weight's two arrays together, each layer alone
    assert ["params['shared']"] in read and all([f"params['layers'][{i}]"] in read for i in range(3))
    made = sorted(k for c in chunks for k in c["outputs"])
    assert made == sorted(i for entry in m["leading"] for kind, i in entry.items() if kind == "prep")
    assert {"weight": paths.index("params['table']")} in m["leading"]  # gathered as stored
    assert {f"executables/prep_{n}.xla" for n in range(4)} <= set(json.loads((path / "index.json").read_text())["files"])
    for n in (1, 3):
        ids, x = _inputs(n)
        want = _by_hand(_params(0), ids, x)
        for loaded in (exe, tb.load(path, warmup="none"), runtime.load(path)):
            np.testing.assert_allclose(np.asarray(loaded(ids, x)), want, rtol=1e-4, atol=1e-4)


def test_a_loaded_executable_keeps_only_what_main_takes_and_reads_the_rest_back(chunked, tmp_path):
    exe, path = chunked
    loaded = tb.load(path, warmup="none")
    stored = {w.path for w in loaded.compiled.program.weights if isinstance(w.value, Stored)}
    assert stored == {"params['shared']", *(f"params['layers'][{i}]" for i in range(3))}  # not held: prep read them
    want = {"params" + jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(_params(0))[0]}
    got = loaded.weights  # the prep-only ones read back from the artifact, checked
    assert set(got) == set(want)
    for name, value in got.items():
        np.testing.assert_array_equal(np.asarray(value), want[name])
    again = Path(loaded.save(tmp_path / "again", weights="raw"))
    for w in json.loads((path / "manifest.json").read_text())["weights"]:
        assert (again / w["file"]).read_bytes() == (path / w["file"]).read_bytes()
    ids, x = _inputs(3)
    swapped = loaded.bind(params=_params(1))
    np.testing.assert_allclose(np.asarray(swapped(ids, x)), _by_hand(_params(1), ids, x), rtol=1e-4, atol=1e-4)


def test_a_weight_changed_after_load_is_refused_when_read_back(chunked):
    _, path = chunked
    loaded = tb.load(path, warmup="none")
    m = json.loads((path / "manifest.json").read_text())
    layer = next(w for w in m["weights"] if w["path"] == "params['layers'][1]")
    target = path / layer["file"]
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    ids, x = _inputs(2)
    loaded(ids, x)  # the prepared weights are in memory: calls go on
    with pytest.raises(ArtifactError, match=r"weights/\d+\.npy: blake3 .* does not match .*params\['layers'\]\[1\]"):
        _ = loaded.weights


def test_a_manifest_whose_chunks_do_not_cover_prep_is_refused(chunked):
    _, path = chunked
    mpath = path / "manifest.json"
    m = json.loads(mpath.read_text())
    m["prep"]["chunks"][0]["outputs"] = m["prep"]["chunks"][1]["outputs"]
    mpath.write_text(json.dumps(m))
    for load in (lambda: tb.load(path, warmup="none"), lambda: runtime.load(path)):
        with pytest.raises(ArtifactError, match=r"prep.chunks make the prepared weights .* but leading takes"):
            load()


def test_an_artifact_with_one_prep_executable_still_loads(tmp_path):
    """Before chunks, the manifest named one executable that took every weight ("executable")."""
    def layers(params, x):
        h = x @ params["shared"].T + x @ (params["shared"] * 2.0)
        for w in params["layers"]:
            h = jnp.tanh(h @ w.T)
        return h

    batch = tb.NamedDimension("batch", 1, 2, 4)
    params = {k: v for k, v in _params(0).items() if k != "table"}
    exe = tb.compile(layers, args=[params, II((batch, D), "float32")], padding={"batch": "rows"})
    path = Path(exe.save(tmp_path / "art", weights="raw"))
    mpath = path / "manifest.json"
    m = json.loads(mpath.read_text())
    (chunk,) = m["prep"]["chunks"]  # all of prep fits one chunk at the default size, and it reads every weight
    assert chunk["weights"] == list(range(len(m["weights"])))
    m["prep"] = {"file": m["prep"]["file"], "format": m["prep"]["format"], "executable": chunk["executable"]}
    mpath.write_text(json.dumps(m))
    _, x = _inputs(3)
    want = np.asarray(exe(x))
    for loaded in (tb.load(path, warmup="none"), runtime.load(path)):
        np.testing.assert_allclose(np.asarray(loaded(x)), want, rtol=1e-5, atol=1e-5)


def test_a_concatenate_of_weights_is_prepared_once_and_a_broadcast_to_a_batch_is_not():
    """A fused QKV matrix is as large as its parts together: made once by prep, not on every call (BERT-base
    and ViT-B paid ~35 ms a call at batch 1 for it); a weight broadcast to a batch would hold 4x its bytes."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(3))  # 64 KB each

    def f(x):
        qkv = jnp.concatenate([q.T, k.T, v.T], axis=1)
        per_row = jnp.broadcast_to(q, (4, 128, 128))
        return x @ qkv, jnp.einsum("bij,bj->bi", per_row, x)

    closed, tree = weights_lib.trace(f, [jax.ShapeDtypeStruct((4, 128), jnp.float32)])
    s = weights_lib.split(closed, tree, {id(q): ("w", "q"), id(k): ("w", "k"), id(v): ("w", "v")})
    assert [tuple(a.shape) for a in s.prep_avals] == [(128, 384)]
    main_prims = {str(e.primitive) for e in jax.make_jaxpr(s.main)(*s.prepare([w.value for w in s.weights]),
                                                                    jnp.zeros((4, 128), jnp.float32)).eqns}
    assert "concatenate" not in main_prims and "broadcast_in_dim" in main_prims
    x = rng.standard_normal((4, 128)).astype(np.float32)
    got = s.main(*s.prepare([w.value for w in s.weights]), x)
    np.testing.assert_allclose(got[0], x @ np.concatenate([q.T, k.T, v.T], axis=1), rtol=1e-4, atol=1e-3)


def test_a_weight_times_a_vector_made_in_the_function_is_prepared_once():
    """``w * concatenate([full(d, s), ones(2d)])`` (GPT-2's query scale folded into its fused projection) only
    depends on the weight: it is prepared at load, and the program takes the product, not the weight."""
    def scaled(params, x):
        scale = jnp.concatenate([jnp.full((D,), 0.125, jnp.float32), jnp.ones((2 * D,), jnp.float32)])
        return x @ (params["w"] * scale) + jnp.arange(3 * D, dtype=jnp.float32)

    w = np.random.default_rng(0).standard_normal((D, 3 * D)).astype(np.float32)
    exe = tb.compile(scaled, args=[{"w": w}, II((tb.NamedDimension("batch", 1, 2, 4), D), "float32")])
    assert [s.kind for s in exe.compiled.program.sources] == ["prep"]  # the product, prepared: not the raw weight
    assert exe.compiled.program.prep.out_avals[0].shape == (D, 3 * D)
    main = exe.compiled.program.main.mlir_module()
    products = [line for line in main.splitlines() if "stablehlo.multiply" in line and "f32>" in line]
    assert not products and "stablehlo.iota" in main  # the arange stays in main, as a constant
    x = np.random.default_rng(1).standard_normal((3, D)).astype(np.float32)
    want = x @ (w * np.concatenate([np.full(D, 0.125), np.ones(2 * D)]).astype(np.float32)) + np.arange(3 * D)
    np.testing.assert_allclose(np.asarray(exe(x)), want, rtol=1e-5, atol=1e-5)


def test_the_same_weight_only_work_done_twice_is_prepared_once():
    """A tied embedding table transposed for the inputs' embeddings and again for the logits is one prepared array
    (a second held another copy of the table: 545 MB for Qwen2.5-0.5B), as is work on top of the repeat; work
    that differs (another permutation, another weight) stays apart."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, D)).astype(np.float32)
    other = rng.standard_normal((10, D)).astype(np.float32)

    def f(ids, x):
        t, o = jnp.asarray(table), jnp.asarray(other)  # traced: numpy's .T would be a new constant
        h = x + jnp.take(t.T, ids, axis=1).T  # the inputs' embeddings, as columns of the transposed table
        return h @ t.T * 2.0, (h @ (t.T * 2.0)), h @ o.T

    closed, tree = weights_lib.trace(f, [jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((3, D), jnp.float32)])
    s = weights_lib.split(closed, tree, {id(table): ("w", "table"), id(other): ("w", "other")})
    assert sorted(tuple(a.shape) for a in s.prep_avals) == [(D, 10), (D, 10), (D, 10)]  # table.T, table.T * 2, other.T
    ids, x = np.array([1, 9, 4], np.int32), rng.standard_normal((3, D)).astype(np.float32)
    got = s.main(*s.prepare([w.value for w in s.weights]), ids, x)
    h = x + table[ids]
    for g, want in zip(got, (h @ table.T * 2.0, h @ (table.T * 2.0), h @ other.T)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)


def test_chunks_saved_prepared_are_placed_as_stored_and_bind_still_works(chunked, tmp_path, monkeypatch):
    """weights="prepared" (the default): a chunk is stored as what it makes, and loaders place that instead
    of reading its raw weights and running it; the raw weights are not in the artifact, and say so."""
    from tripy_build.runtime import pjrt

    exe, _ = chunked
    path = Path(exe.save(tmp_path / "prepared"))
    m = json.loads((path / "manifest.json").read_text())
    files = {w["path"]: w["file"] for w in m["weights"]}
    assert files["params['table']"].startswith("weights/")  # main gathers it as stored
    assert {p for p, f in files.items() if not f} == {"params['shared']", *(f"params['layers'][{i}]" for i in range(3))}
    at_rest = [a for c in m["prep"]["chunks"] for a in c["at_rest"]]
    assert sorted(a["file"] for a in at_rest) == sorted(f"weights/prepared_{k}.npy" for c in m["prep"]["chunks"]
                                                      for k in c["outputs"])
    raw = json.loads((chunked[1] / "manifest.json").read_text())["weights"]
    assert sum((path / a["file"]).stat().st_size for a in at_rest) < 2 * sum(
        (chunked[1] / w["file"]).stat().st_size for w in raw if w["path"] != "params['table']")
    runs = []
    device_outputs = pjrt.Compiled.device_outputs
    monkeypatch.setattr(pjrt.Compiled, "device_outputs", lambda self, args: runs.append(1) or device_outputs(self, args))
    rt = runtime.load(path)
    assert runs == []  # no chunk ran
    for n in (1, 3):
        ids, x = _inputs(n)
        want = _by_hand(_params(0), ids, x)
        for loaded in (tb.load(path, warmup="none"), rt):
            np.testing.assert_allclose(np.asarray(loaded(ids, x)), want, rtol=1e-4, atol=1e-4)
    loaded = tb.load(path, warmup="none")
    with pytest.raises(ArtifactError, match=r"the weight params\['shared'\] is not in this artifact.*weights=raw"):
        _ = loaded.weights
    with pytest.raises(ArtifactError, match=r"is not in this artifact"):
        loaded.save(tmp_path / "raw again", weights="raw")
    assert not (tmp_path / "raw again").exists()
    again = Path(loaded.save(tmp_path / "again"))
    for a in at_rest:
        assert (again / a["file"]).read_bytes() == (path / a["file"]).read_bytes()
    ids, x = _inputs(3)
    swapped = loaded.bind(params=_params(1))
    np.testing.assert_allclose(np.asarray(swapped(ids, x)), _by_hand(_params(1), ids, x), rtol=1e-4, atol=1e-4)
    assert set(swapped.weights) == set(files)  # all given anew: readable again
    with pytest.raises(tb.TripyBuildError, match=r"save\(weights='packed'\): must be one of 'prepared', 'raw'"):
        exe.save(tmp_path / "bad", weights="packed")


def test_a_damaged_prepared_weight_is_refused_by_both_loaders(chunked, tmp_path):
    exe, _ = chunked
    path = Path(exe.save(tmp_path / "prepared"))
    target = path / "weights" / "prepared_0.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    for load in (lambda: tb.load(path, warmup="none"), lambda: runtime.load(path)):
        with pytest.raises(ArtifactError, match=r"weights/prepared_0\.npy: blake3 .* does not match"):
            load()


def test_a_chunk_reading_two_arguments_is_saved_raw(tmp_path, monkeypatch):
    """bind(p=...) must run such a chunk again with q's raw weights, so they stay in the artifact."""
    monkeypatch.setattr(weights_lib, "PREP_CHUNK_BYTES", 9 * 1024)  # a chunk per group of arrays
    rng = np.random.default_rng(0)
    p = {"w": rng.standard_normal((D, D)).astype(np.float32)}
    q = {"w": rng.standard_normal((D, D)).astype(np.float32), "v": rng.standard_normal((D, D)).astype(np.float32)}

    def f(p, q, x):
        return jnp.tanh(x @ (p["w"] + q["w"]).T) @ q["v"].T

    exe = tb.compile(f, args=[p, q, II((2, D), "float32")])
    path = Path(exe.save(tmp_path / "art"))
    m = json.loads((path / "manifest.json").read_text())
    files = {w["path"]: w["file"] for w in m["weights"]}
    assert files["p['w']"] and files["q['w']"] and not files["q['v']"], files  # q['v'] alone: prepared
    x = rng.standard_normal((2, D)).astype(np.float32)
    p2 = {"w": p["w"] * 2}
    loaded = tb.load(path, warmup="none").bind(p=p2)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(f(p2, q, x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["prep"]["chunks"][-1]["at_rest"].pop(), r"stores 1 prepared array\(s\) that are not the 2"),
    (lambda m: m["prep"]["chunks"][0]["at_rest"][0].__setitem__("shape", [3, 3]), r"that are not the 1 its executable"),
    (lambda m: m["prep"]["chunks"][0].pop("at_rest"), r"have no file, and the program needs them"),
])
def test_a_manifest_whose_prepared_weights_contradict_its_chunks_is_refused(chunked, tmp_path, edit, match):
    exe, _ = chunked
    path = Path(exe.save(tmp_path / "prepared"))
    mpath = path / "manifest.json"
    m = json.loads(mpath.read_text())
    m["prep"]["chunks"].sort(key=lambda c: len(c["at_rest"]))  # the shared weight's chunk (two arrays) last
    edit(m)
    mpath.write_text(json.dumps(m))
    for load in (lambda: tb.load(path, warmup="none"), lambda: runtime.load(path)):
        with pytest.raises(ArtifactError, match=match):
            load()
