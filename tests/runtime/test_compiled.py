"""``CompiledModel``: what a compile made, as one frozen record that the compiler makes, ``save`` writes, the
loaders make again and ``bind`` replaces (``runtime/compiled.py``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from conftest import BATCH, DIM_IN, assert_close, geglu
from tripy_build.runtime.compiled import CompiledModel, Reference, StoredSelfTest
from tripy_build.runtime.save import save

MANIFEST_FIELDS = ("name", "parameters", "leaves", "sizes", "outputs", "dims", "optimization_level", "platforms",
                   "compiler", "donated")


def test_the_record_is_frozen_and_is_what_the_executable_runs(geglu_exe):
    record = geglu_exe.compiled
    assert isinstance(record, CompiledModel)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.metadata = {"changed": True}
    assert [p.target for p in record.profiles] == [tuple(p.values()) for p in geglu_exe.profiles]
    assert geglu_exe.dims == list(record.dims) and geglu_exe.platforms == record.platforms
    assert isinstance(record.selftest_from, Reference)


def test_save_writes_the_record_and_load_makes_the_same_record_again(geglu_exe, geglu_params, tmp_path, rng):
    path = save(geglu_exe.compiled, tmp_path / "a")
    assert (Path(geglu_exe.save(tmp_path / "b")) / "manifest.json").read_bytes() == (path / "manifest.json").read_bytes()
    loaded = tb.load(path, warmup="none").compiled
    for name in MANIFEST_FIELDS:
        assert getattr(loaded, name) == getattr(geglu_exe.compiled, name), name
    assert loaded.compiler_options == json.loads(json.dumps(geglu_exe.compiled.compiler_options))
    assert loaded.program_bytes == geglu_exe.compiled.program_bytes
    assert [p.target for p in loaded.profiles] == [p.target for p in geglu_exe.compiled.profiles]
    assert [p.blob for p in loaded.profiles] == [p.blob for p in geglu_exe.compiled.profiles]
    assert isinstance(loaded.selftest_from, StoredSelfTest)
    assert loaded.selftest[0] == geglu_exe.compiled.selftest[0]  # the same cases, read back from the files
    x = rng.standard_normal((3, DIM_IN)).astype(np.float32)
    assert_close(tb.load(path, warmup="none")(x), geglu(jnp.asarray(x), geglu_params))


def test_bind_makes_a_new_record_and_leaves_the_old_one_as_it_was(pair_exe, monkeypatch):
    from tripy_build.runtime import executable

    compiles = []
    compile_profile = executable.compile_profile
    monkeypatch.setattr(executable, "compile_profile", lambda model, target: compiles.append(target) or
                        compile_profile(model, target))
    a = np.ones((5, 5), np.float32)
    before = pair_exe.compiled
    pair_exe(np.ones((5, 5), np.float32), a)  # batch 5: no profile; compiled on first use (or taken from before)
    bound = pair_exe.bind(b=a)
    assert pair_exe.compiled is before and not before.bound
    assert set(bound.compiled.bound) == {"b"} and bound.compiled.profiles == before.profiles
    np.testing.assert_array_equal(np.asarray(bound(np.full((5, 5), 2.0, np.float32))[0]), np.full((5, 5), 3.0))
    assert compiles in ([], [(5,)])  # the call-time state (the shape compiled on first use) carried over to ``bound``
    with pytest.raises(dataclasses.FrozenInstanceError):
        bound.compiled.bound = {}


@pytest.mark.parametrize("precision", [None, "bfloat16"])
def test_entries_with_the_same_prep_share_it_from_construction(precision):
    """The second entry takes the first's prepared weights and prep executables as it is made (not patched on
    afterwards): prepared once, held once. The same numpy array given to both is placed on the device once (a
    build's params are numpy: placed per entry, the entries' weights were never the same arrays)."""
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((64, 64), np.float32)}
    batch = tb.NamedDimension("batch", 1, 2, 4)

    def up(params, x):
        return x @ params["w"].T

    def down(params, x):
        return jnp.tanh(x @ params["w"].T)

    exe = tb.compile({"up": tb.Entry(up, args=[params, tb.InputInfo((batch, 64), "float32")]),
                      "down": tb.Entry(down, args=[params, tb.InputInfo((batch, 64), "float32")])},
                     precision=precision, max_error=0.1 if precision else None)
    first, second = exe.entry("up").compiled, exe.entry("down").compiled
    assert first.program.prep is not None and first.prepared  # the transpose is weight-only work: prep
    assert second.prepared is first.prepared and second.prep_executables is first.prep_executables
    assert all(a.value is b.value for a, b in zip(first.program.weights, second.program.weights))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    tolerance = 1e-4 if precision is None else 5e-2  # bfloat16 weights and compute
    assert_close(exe.entry("down")(x), np.tanh(x @ np.asarray(params["w"]).T), rtol=tolerance, atol=tolerance)


def test_the_self_test_is_made_once_and_kept_where_only_metadata_changes(geglu_params):
    exe = tb.compile(geglu, args=(tb.InputInfo((BATCH, DIM_IN), "float32"), geglu_params))
    record = exe.compiled
    cases = record.selftest
    assert record.selftest is cases and [e["name"] for e in cases[0]]
    assert record.replace(metadata={"model": "g"}).selftest is cases
    assert "selftest" not in record.replace(tolerance=0.5).__dict__  # made again from its own fields
