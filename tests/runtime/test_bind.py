"""``bind``'s new records: runtime inputs fixed, or new weights prepared again; the old record untouched
(``runtime/bind.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import tripy_build as tb
from tripy_build.errors import CallError
from tripy_build.runtime.bind import with_inputs, with_weights
from tripy_build.runtime.compiled import Reference


def affine(params, x):
    return x @ params["w"].T + params["b"]


@pytest.fixture(scope="module")
def exe():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    return tb.compile(affine, args=[params, tb.InputInfo(((1, 2, 4), 8), "float32")])


def test_new_weights_are_checked_never_cast_and_prepared_again(exe):
    model = exe.compiled
    assert model.program.prep is not None  # the transpose of w is prepared
    w = np.eye(8, dtype=np.float32)
    new = with_weights(model, {"params": {"w": w, "b": np.zeros(8, np.float32)}})
    np.testing.assert_array_equal(np.asarray(new.prepared[0]), w.T)
    assert not np.array_equal(np.asarray(model.prepared[0]), w.T)  # the old record as it was
    with pytest.raises(CallError, match=r"params\['w'\] must be an array of shape \(8, 8\) and dtype float32, got "
                                        r"ndarray of shape \(8, 8\) and dtype float64"):
        with_weights(model, {"params": {"w": np.eye(8), "b": np.zeros(8, np.float32)}})
    with pytest.raises(CallError, match=r"has no leaf params\['b'\]"):
        with_weights(model, {"params": {"w": w}})


def test_bound_inputs_are_checked_as_given_and_a_stored_self_test_is_dropped(exe, tmp_path):
    x = np.ones((2, 8), np.float32)
    bound = with_inputs(exe.compiled, {"x": x}, {"x": "bound/x"})
    assert set(bound.bound) == {"x"} and isinstance(bound.selftest_from, Reference)  # made again from the source
    with pytest.raises(CallError, match="float64"):
        with_inputs(exe.compiled, {"x": np.ones((2, 8))}, {"x": "bound/x"})
    loaded = tb.load(exe.save(tmp_path / "a"), warmup="none").compiled
    assert with_inputs(loaded, {"x": x}, {"x": "bound/x"}).selftest_from is None  # its outputs were for other inputs
