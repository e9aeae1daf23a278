"""The weights made ready: prep run chunk by chunk, a chunk stored prepared placed as stored, prep run whole
through jax where the chunks cannot run (``runtime/prepare.py``)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.compiler import weights as weights_lib
from tripy_build.runtime.prepare import at_rest, prepare

D = 32


def _model(params, x):
    h = x @ params["shared"].T + x @ (params["shared"] * 2.0)
    for w in params["layers"]:
        h = jnp.tanh(h @ w.T)
    return h


@pytest.fixture
def chunked(monkeypatch):
    monkeypatch.setattr(weights_lib, "PREP_CHUNK_BYTES", 9 * 1024)  # a chunk per layer (each transpose 4 KB)
    rng = np.random.default_rng(0)
    params = {"shared": rng.standard_normal((D, D)).astype(np.float32),
              "layers": [rng.standard_normal((D, D)).astype(np.float32) for _ in range(3)]}
    return tb.compile(_model, args=[params, tb.InputInfo(((1, 2, 4), D), "float32")]), params


def _expected(params) -> list[np.ndarray]:
    return [np.asarray(params["shared"]).T, *[np.asarray(w).T for w in params["layers"]]]


def test_chunks_run_one_by_one_and_prep_run_whole_make_the_same_arrays(chunked):
    exe, params = chunked
    model = exe.compiled
    assert len(model.program.chunks) > 1 and len(model.prep_executables) == len(model.program.chunks)
    by_chunks, whole = prepare(model.program, model.prep_executables), prepare(model.program, ())
    assert len(by_chunks) == len(whole) == len(model.program.prep.out_avals)
    for a, b in zip(by_chunks, whole):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    made = sorted((np.asarray(a) for a in by_chunks), key=lambda a: float(a.ravel()[0]))
    for want in _expected(params):  # every transpose is among prep's outputs, as the chunks made it
        assert any(m.shape == want.shape and np.array_equal(m, want) for m in made)


def test_a_program_without_prep_prepares_nothing():
    exe = tb.compile(lambda w, x: x * w, args=[np.ones(4, np.float32), tb.InputInfo((4,), "float32")])
    assert exe.compiled.program.prep is None and prepare(exe.compiled.program, ()) == ()


def test_a_chunk_stored_prepared_is_placed_as_stored_not_run(chunked, tmp_path):
    exe, params = chunked
    loaded = tb.load(exe.save(tmp_path / "a"), warmup="none").compiled  # weights="prepared": the chunks at rest
    program = loaded.program
    assert all(at_rest(program, chunk) for chunk, _ in program.chunks)

    class NeverRun:
        def ready(self):
            raise AssertionError("a chunk stored prepared was run")

    placed = prepare(program, [NeverRun()] * len(program.chunks))
    for a, b in zip(placed, exe.compiled.prepared):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a weight given anew (bind) is no longer at rest: its chunk runs again
    fresh = [dataclasses.replace(w, value=np.zeros(w.value.shape, w.value.dtype)) for w in program.weights]
    assert not any(at_rest(dataclasses.replace(program, weights=fresh), chunk) for chunk, _ in program.chunks)
