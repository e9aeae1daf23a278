"""InputInfo and NamedDimension: accepted forms, and errors when a spec is built."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tripy_build as tb


# --- accepted shapes ------------------------------------------------------------------------------

def test_static_shape():
    info = tb.InputInfo((2, 16), "float32")
    assert info.shape_bounds.min == (2, 16)
    assert info.shape_bounds.opt == (2, 16)
    assert info.shape_bounds.max == (2, 16)
    assert info.dimension_names == {}


def test_dynamic_triple():
    info = tb.InputInfo(((1, 4, 8), 16), "float32")
    assert info.shape_bounds.min == (1, 16)
    assert info.shape_bounds.opt == (4, 16)
    assert info.shape_bounds.max == (8, 16)
    assert info.dimension_names == {}


def test_triple_as_list_and_shape_as_list():
    info = tb.InputInfo([[2, 3, 5], 7, (1, 1, 1)], "int32")
    assert info.shape_bounds.min == (2, 7, 1)
    assert info.shape_bounds.opt == (3, 7, 1)
    assert info.shape_bounds.max == (5, 7, 1)
    assert isinstance(info.shape_bounds.min, tuple)


def test_numpy_integer_sizes_are_accepted():
    info = tb.InputInfo((np.int64(3), (np.int32(1), 2, np.int64(4))), "float32")
    assert info.shape_bounds.min == (3, 1)
    assert info.shape_bounds.max == (3, 4)
    assert all(type(v) is int for v in info.shape_bounds.min + info.shape_bounds.opt + info.shape_bounds.max)


def test_scalar_shape():
    info = tb.InputInfo((), "float32")
    assert info.shape_bounds.min == ()
    assert info.shape_bounds.opt == ()
    assert info.shape_bounds.max == ()


def test_named_dimension():
    nd = tb.NamedDimension("batch", 1, 4, 8)
    assert nd.name == "batch"
    assert nd.bounds == (1, 4, 8)
    info = tb.InputInfo((nd, 16, nd), "float32")
    assert info.dimension_names == {0: "batch", 2: "batch"}
    assert info.shape_bounds.min == (1, 16, 1)
    assert info.shape_bounds.opt == (4, 16, 4)
    assert info.shape_bounds.max == (8, 16, 8)


def test_named_dimension_equality():
    assert tb.NamedDimension("n", 1, 2, 3) == tb.NamedDimension("n", 1, 2, 3)
    assert tb.NamedDimension("n", 1, 2, 3) != tb.NamedDimension("n", 1, 2, 4)
    assert tb.NamedDimension("n", 1, 2, 3) != tb.NamedDimension("m", 1, 2, 3)


def test_same_name_same_range_twice_in_one_input_is_fine():
    info = tb.InputInfo((tb.NamedDimension("n", 1, 2, 4), tb.NamedDimension("n", 1, 2, 4)), "float32")
    assert info.dimension_names == {0: "n", 1: "n"}


# --- dtypes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "dtype, expected",
    [
        pytest.param("float32", np.float32, id="str-float32"),
        pytest.param("bfloat16", ml_dtypes.bfloat16, id="str-bfloat16"),
        pytest.param("int32", np.int32, id="str-int32"),
        pytest.param("float16", np.float16, id="str-float16"),
        pytest.param("bool", np.bool_, id="str-bool"),
        pytest.param(np.float32, np.float32, id="np.float32"),
        pytest.param(np.int32, np.int32, id="np.int32"),
        pytest.param(np.dtype("int32"), np.int32, id="np.dtype-int32"),
        pytest.param(jnp.float32, np.float32, id="jnp.float32"),
        pytest.param(jnp.bfloat16, ml_dtypes.bfloat16, id="jnp.bfloat16"),
        pytest.param(jnp.int32, np.int32, id="jnp.int32"),
    ],
)
def test_dtype_forms(dtype, expected):
    info = tb.InputInfo((2,), dtype)
    assert isinstance(info.dtype, np.dtype)
    assert info.dtype == np.dtype(expected)


@pytest.mark.parametrize("dtype", ["notadtype", "object", object, 3.5], ids=repr)
def test_bad_dtype(dtype):
    with pytest.raises(tb.TripyBuildError, match="dtype"):
        tb.InputInfo((2,), dtype)


# --- invalid specs --------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [(1, 2), (1, 2, 3, 4), (), [5]])
def test_triple_of_wrong_length(dim):
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.InputInfo((4, dim), "float32")
    msg = str(excinfo.value)
    assert "(min, opt, max)" in msg
    assert f"{len(dim)} entries" in msg
    assert "dim 1" in msg


@pytest.mark.parametrize(
    "shape",
    [
        (2.0, 3),
        (2, "3"),
        (None,),
        (True, 3),
        ((1, 2.5, 4),),
        ((1, 2, "4"),),
        ((False, 2, 4),),
    ],
    ids=repr,
)
def test_non_integer_size(shape):
    with pytest.raises(tb.TripyBuildError, match="must be an integer"):
        tb.InputInfo(shape, "float32")


@pytest.mark.parametrize("args", [(1, 2.0, 4), ("1", 2, 4), (1, 2, None), (True, 2, 4)], ids=repr)
def test_named_dimension_non_integer(args):
    with pytest.raises(tb.TripyBuildError, match="must be an integer"):
        tb.NamedDimension("n", *args)


@pytest.mark.parametrize("shape", [(0, 3), (3, -1), ((0, 1, 2),), ((-2, 1, 2),)], ids=repr)
def test_size_below_one(shape):
    with pytest.raises(tb.TripyBuildError, match="at least 1"):
        tb.InputInfo(shape, "float32")


def test_named_dimension_size_below_one():
    with pytest.raises(tb.TripyBuildError, match="at least 1"):
        tb.NamedDimension("n", 0, 1, 2)


@pytest.mark.parametrize("triple", [(4, 2, 8), (1, 8, 4), (5, 3, 1)], ids=repr)
def test_unordered_bounds(triple):
    with pytest.raises(tb.TripyBuildError, match="min <= opt <= max") as excinfo:
        tb.InputInfo((triple, 3), "float32")
    lo, opt, hi = triple
    assert f"min={lo}" in str(excinfo.value) and f"opt={opt}" in str(excinfo.value) and f"max={hi}" in str(excinfo.value)


@pytest.mark.parametrize("triple", [(4, 2, 8), (1, 8, 4)], ids=repr)
def test_named_dimension_unordered_bounds(triple):
    with pytest.raises(tb.TripyBuildError, match="min <= opt <= max") as excinfo:
        tb.NamedDimension("seq", *triple)
    assert "'seq'" in str(excinfo.value)


@pytest.mark.parametrize("name", ["", None, 3])
def test_named_dimension_bad_name(name):
    with pytest.raises(tb.TripyBuildError, match="name"):
        tb.NamedDimension(name, 1, 2, 3)


@pytest.mark.parametrize("shape", [16, "16", None])
def test_shape_not_a_sequence(shape):
    with pytest.raises(tb.TripyBuildError, match="shape"):
        tb.InputInfo(shape, "float32")


def test_one_name_two_ranges_within_one_input():
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.InputInfo((tb.NamedDimension("n", 1, 2, 4), tb.NamedDimension("n", 1, 2, 8)), "float32")
    msg = str(excinfo.value)
    assert "'n'" in msg
    assert "two different ranges" in msg
    assert "(1, 2, 4)" in msg and "(1, 2, 8)" in msg


def test_one_name_two_ranges_across_inputs_fails_at_compile():
    a = tb.InputInfo((tb.NamedDimension("n", 1, 2, 4),), "float32")
    b = tb.InputInfo((tb.NamedDimension("n", 2, 2, 4),), "float32")  # each InputInfo alone is valid

    def f(a, b):
        return a + b

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(f, args=(a, b))
    msg = str(excinfo.value)
    assert "'n'" in msg and "two different ranges" in msg
    assert "'a'" in msg and "'b'" in msg
    assert "(1, 2, 4)" in msg and "(2, 2, 4)" in msg


def test_errors_are_exceptions():
    assert issubclass(tb.TripyBuildError, Exception)
    with pytest.raises(Exception) as e:
        tb.NamedDimension("n", 3, 2, 1)
    assert isinstance(e.value, tb.TripyBuildError)


def test_holds_is_a_value_every_row_must_hold_checked_on_every_call(tmp_path):
    """``InputInfo(holds=N)``: each row (the last axis) must hold N somewhere; a call whose row does not is one line
    naming the row, before anything runs, on the compiled model and after a save and load. Declared on an integer
    input within its values, never with a default."""
    from tripy_build.errors import CallError, SpecError

    info = tb.InputInfo(((1, 2, 4), 6), "int32", values=(0, 10), holds=2)
    assert tb.InputInfo.from_json(info.to_json()) == info and info.to_json()["holds"] == 2 and "holds=2" in repr(info)
    exe = tb.compile(lambda ids: jnp.argmax(ids == 2, axis=-1), args=[info])
    rows = np.array([[5, 2, 7, 1, 1, 1], [2, 3, 3, 3, 3, 3]], np.int32)
    assert np.asarray(exe(rows)).tolist() == [1, 0]
    bad = rows.copy()
    bad[1, 0] = 4
    exe.save(tmp_path / "holds")
    for model in (exe, tb.load(tmp_path / "holds")):
        with pytest.raises(CallError, match=r"input 'ids' row 1 holds no 2, and every row must \(1 do not\); "
                                            r"declared as int32\[\[1\.\.4, opt 2\], 6\] in \[0, 10\), every row "
                                            r"holding 2\."):
            model(bad)
        assert np.asarray(model(rows)).tolist() == [1, 0]  # the fast path after a good call checks too
        with pytest.raises(CallError, match="row 1 holds no 2"):
            model(bad)
    for kwargs in ({"dtype": "float32", "holds": 2}, {"dtype": "int32", "values": (0, 2), "holds": 2},
                   {"dtype": "int32", "holds": 1, "default": 1}, {"dtype": "int32", "holds": True}):
        dtype = kwargs.pop("dtype")
        with pytest.raises(SpecError, match="InputInfo holds="):
            tb.InputInfo((2, 3), dtype, **kwargs)
