"""Executables with several entry points over one set of weights: ``compile({name: tb.Entry(...)})``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from tripy_build.cli.verify import verify
from tripy_build.errors import CallError, SpecError

BATCH = tb.NamedDimension("batch", 1, 2, 8)
SLOTS = 16


def make_params():
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((64, 64), np.float32)), "b": jnp.asarray(rng.standard_normal(64, np.float32))}


def encode(params, x):
    return {"h": jnp.tanh(x @ params["w"].T + params["b"])}


def write(params, x, memory, slot):
    """Encode ``x`` and store it in ``memory`` at ``slot`` (``memory`` donated: written in place)."""
    h = jnp.tanh(x @ params["w"].T + params["b"])
    return {"h": h, "memory": jax.lax.dynamic_update_slice(memory, h[:, None, :], (0, slot, 0))}


@pytest.fixture(scope="module")
def params():
    return make_params()


@pytest.fixture(scope="module")
def exe(params):
    return tb.compile({
        "encode": tb.Entry(encode, args=[params, tb.InputInfo((BATCH, 64), "float32")], padding={"batch": "rows"}),
        "write": tb.Entry(write, args=[params, tb.InputInfo((BATCH, 64), "float32"),
                                       tb.InputInfo((BATCH, SLOTS, 64), "float32"), tb.InputInfo((), "int32", (0, SLOTS))],
                          buckets="none", donate=["memory"]),
    })


@pytest.fixture(scope="module")
def artifact(exe, tmp_path_factory):
    return Path(exe.save(tmp_path_factory.mktemp("entries") / "art"))


def reference(params, x):
    return np.tanh(x @ np.asarray(params["w"]).T + np.asarray(params["b"]))


def test_entries_by_name_and_the_first_is_the_call(exe, params):
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    assert list(exe.entries) == ["encode", "write"] and exe.entry("encode") is exe
    np.testing.assert_allclose(np.asarray(exe(x)["h"]), reference(params, x), rtol=1e-5, atol=1e-5)
    memory = np.zeros((2, SLOTS, 64), np.float32)
    out = exe.entries["write"](x[:2], memory, np.int32(5))
    np.testing.assert_allclose(np.asarray(out["memory"])[:, 5], reference(params, x[:2]), rtol=1e-5, atol=1e-5)
    assert not memory.any()  # a host array given to a donated input is never written
    with pytest.raises(CallError, match="no entry 'decode'; its entries: 'encode', 'write'"):
        exe.entry("decode")


def test_the_artifact_stores_each_weight_once(artifact):
    m = json.loads((artifact / "manifest.json").read_text())
    assert m["entry"] == "encode" and [e["name"] for e in m["entries"]] == ["write"]
    # stored as the prep makes them (w transposed), once for both entries
    assert sorted(p.name for p in (artifact / "weights").iterdir()) == ["prepared_0.npy", "prepared_1.npy"]
    assert [w["file"] for w in m["entries"][0]["weights"]] == [w["file"] for w in m["weights"]] == ["", ""]
    assert m["entries"][0]["prep"] == m["prep"]
    assert not (artifact / "entries" / "write" / "weights").exists()
    assert m["entries"][0]["donated"] == ["memory"] and "donated" not in m
    assert "entries/write/executables/" in m["index"]["covers"]


@pytest.mark.parametrize("loader", [tb.load, runtime.load])
def test_both_loaders_serve_every_entry_with_the_weights_placed_once(artifact, params, loader):
    loaded = loader(artifact, warmup="none")
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(loaded(x)["h"]), reference(params, x), rtol=1e-5, atol=1e-5)
    out = loaded.entry("write")(x, np.zeros((2, SLOTS, 64), np.float32), np.int32(15))
    np.testing.assert_allclose(np.asarray(out["memory"])[:, 15], reference(params, x), rtol=1e-5, atol=1e-5)
    assert all(a is b for a, b in zip(loaded._leading, loaded.entry("write")._leading))
    with pytest.raises(CallError, match=r"cache_index|slot.*\[0, 16\)"):
        loaded.entry("write")(x, np.zeros((2, SLOTS, 64), np.float32), np.int32(16))


@pytest.fixture
def background_warm_up(monkeypatch):
    """Loads as a large model's (``warmup.prepare_at_load`` says no: its profiles' preparation would break the
    cold start): ``load`` returns at once and the background warm-up prepares the profiles."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "PREPARE_AT_LOAD_S", 0.0)


@pytest.mark.parametrize("loader", [tb.load, runtime.load])
def test_wait_warmed_waits_for_every_entrys_warm_up(artifact, loader, background_warm_up):
    loaded = loader(artifact)  # warmup="background": a thread per entry
    threads = [e._warming for e in loaded.entries.values()]
    assert len(threads) == 2 and all(t is not None for t in threads)
    assert loaded.entry("write").wait_warmed(timeout=30) is True  # any entry waits for all of them
    assert not any(t.is_alive() for t in threads)


def test_a_donated_device_array_is_consumed_and_reused(artifact):
    write_entry = tb.load(artifact, warmup="none").entry("write")
    memory = jnp.zeros((2, SLOTS, 64), jnp.float32)
    where = memory.unsafe_buffer_pointer()
    out = write_entry(np.ones((2, 64), np.float32), memory, np.int32(0))
    assert memory.is_deleted() and out["memory"].unsafe_buffer_pointer() == where


def test_verify_checks_every_entry(artifact):
    out = io.StringIO()
    assert verify(artifact, out=out)
    text = out.getvalue()
    assert "entry encode: self-test opt" in text and "entry write: self-test opt" in text


def test_bad_entries_are_refused_naming_them(params):
    x = tb.InputInfo((BATCH, 64), "float32")
    with pytest.raises(SpecError, match="entry name 'bad name' is not usable"):
        tb.compile({"bad name": tb.Entry(encode, args=[params, x])})
    with pytest.raises(SpecError, match="entry 'e' is a tuple; wrap the function"):
        tb.compile({"e": (encode, [params, x])})
    with pytest.raises(SpecError, match="non-empty dict"):
        tb.compile({})
    with pytest.raises(SpecError, match="donate=\\['y'\\] names 'y', which is not a runtime input; its inputs: x"):
        tb.compile({"e": tb.Entry(encode, args=[params, x], donate=["y"])})
    with pytest.raises(SpecError, match="give args=, kwargs=, buckets=, padding= and max_profiles= to each tb.Entry"):
        tb.compile({"e": tb.Entry(encode, args=[params, x])}, args=[params, x])


def test_bind_gives_every_entry_the_new_weights(exe, artifact):
    new = {"w": jnp.asarray(np.eye(64, dtype=np.float32)), "b": jnp.zeros(64, jnp.float32)}
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    for start in (exe, tb.load(artifact, warmup="none")):
        bound = start.entry("write").bind(params=new)
        assert list(bound.entries) == ["encode", "write"] and bound.entry("write") is bound
        np.testing.assert_allclose(np.asarray(bound.entry("encode")(x)["h"]), np.tanh(x), rtol=1e-6, atol=1e-6)
        out = bound(x, np.zeros((2, SLOTS, 64), np.float32), np.int32(1))
        np.testing.assert_allclose(np.asarray(out["memory"])[:, 1], np.tanh(x), rtol=1e-6, atol=1e-6)
        assert not np.allclose(np.asarray(start(x)["h"]), np.tanh(x))  # the original keeps its weights
