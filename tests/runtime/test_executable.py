"""Calling an Executable: dynamic ranges, output specs, call validation, chaining executables."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from conftest import BATCH, DIM_IN, DIM_OUT, assert_close, geglu, info_summary, make_geglu_params

II = tb.InputInfo


def _x(rng, batch, dim=DIM_IN, dtype=np.float32):
    return rng.standard_normal((batch, dim)).astype(dtype)


# --- dynamic ranges -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [BATCH[0], 2, 3, BATCH[1], 5, 7, BATCH[2]])
def test_geglu_over_its_dynamic_range(geglu_exe, geglu_ref, rng, batch):
    x = _x(rng, batch)
    out = geglu_exe(x)
    assert isinstance(out, jax.Array)
    assert out.shape == (batch, DIM_OUT)
    assert_close(out, geglu_ref(x))


def test_opt_shape_is_precompiled(geglu_exe, rng, compile_counter):
    assert ((BATCH[1], DIM_IN),) in geglu_exe.precompiled_shapes
    x = _x(rng, BATCH[1])
    x_jax = jnp.asarray(x)
    before = compile_counter.count
    geglu_exe(x)
    geglu_exe(x_jax)
    assert compile_counter.count == before


def test_jax_and_numpy_inputs(geglu_exe, geglu_ref, rng):
    x = _x(rng, 3)
    expected = geglu_ref(x)
    for _ in range(2):  # the second round goes through the checked-shapes fast path
        assert_close(geglu_exe(x), expected)
        assert_close(geglu_exe(jnp.asarray(x)), expected)
        assert_close(geglu_exe(x=x), expected)


def test_geglu_infos(geglu_exe):
    (name, info), = geglu_exe.input_infos.items()
    assert name == "x"
    assert info.shape_bounds.min == (BATCH[0], DIM_IN)
    assert info.shape_bounds.opt == (BATCH[1], DIM_IN)
    assert info.shape_bounds.max == (BATCH[2], DIM_IN)
    assert info.dtype == np.float32
    (out,) = geglu_exe.output_infos
    assert isinstance(out, tb.InputInfo)
    assert out.shape_bounds.min == (BATCH[0], DIM_OUT)
    assert out.shape_bounds.opt == (BATCH[1], DIM_OUT)
    assert out.shape_bounds.max == (BATCH[2], DIM_OUT)
    assert out.dtype == np.float32
    assert out.dimension_names == {}
    assert info_summary(geglu_exe.get_input_info()) == info_summary([info])
    assert info_summary(geglu_exe.get_output_info()) == info_summary([out])


def test_output_shape_depends_on_dynamic_dims(rng):
    def twice(x):
        return jnp.concatenate([x, x], axis=0)

    exe = tb.compile(twice, args=(II(((1, 3, 5), 4), "float32"),))
    (out,) = exe.output_infos
    assert out.shape_bounds.min == (2, 4)
    assert out.shape_bounds.opt == (6, 4)
    assert out.shape_bounds.max == (10, 4)
    assert out.dimension_names == {}
    for batch in (1, 3, 4, 5):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        y = exe(x)
        assert y.shape == (2 * batch, 4)
        assert_close(y, twice(jnp.asarray(x)))


def test_output_shape_from_two_dynamic_dims(rng):
    def outer(a, b):
        return a[:, None] * b[None, :]

    exe = tb.compile(outer, args=(II(((1, 2, 3),), "float32"), II(((4, 5, 6),), "float32")))
    (out,) = exe.output_infos
    assert out.shape_bounds == ((1, 4), (2, 5), (3, 6))
    a = rng.standard_normal(3).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    assert_close(exe(a, b), outer(jnp.asarray(a), jnp.asarray(b)))


def test_named_dims_shared_between_inputs(pair_exe, rng):
    infos = pair_exe.input_infos
    assert list(infos) == ["a", "b"]
    for info in infos.values():
        assert info.dimension_names == {0: "batch"}
        assert info.shape_bounds == ((1, 5), (3, 5), (6, 5))
    assert len(pair_exe.output_infos) == 2
    for out in pair_exe.output_infos:
        assert out.dimension_names == {0: "batch"}
        assert out.shape_bounds == ((1, 5), (3, 5), (6, 5))
    for batch in (1, 3, 4, 6):
        a = rng.standard_normal((batch, 5)).astype(np.float32)
        b = rng.standard_normal((batch, 5)).astype(np.float32)
        s, p = pair_exe(a, b)
        assert_close(s, jnp.asarray(a) + jnp.asarray(b))
        assert_close(p, jnp.asarray(a) * jnp.asarray(b))


def test_named_dim_in_output_of_different_rank(rng):
    seq = tb.NamedDimension("seq", 2, 4, 8)

    def f(tokens, mask):
        return (tokens * mask[:, None]).sum(axis=1), jnp.tile(mask, 2)

    exe = tb.compile(f, args=(II((seq, 3), "float32"), II((seq,), "float32")))
    summed, tiled = exe.output_infos
    assert summed.dimension_names == {0: "seq"} and summed.shape_bounds.max == (8,)
    assert tiled.dimension_names == {} and tiled.shape_bounds == ((4,), (8,), (16,))
    t = rng.standard_normal((5, 3)).astype(np.float32)
    m = (rng.random(5) > 0.5).astype(np.float32)
    for got, want in zip(exe(t, m), f(jnp.asarray(t), jnp.asarray(m))):
        assert_close(got, want)


def test_scalar_inputs_and_outputs(rng):
    def f(x, s):
        return (x * s).sum()

    exe = tb.compile(f, args=(II(((1, 2, 3),), "float32"), II((), "float32")))
    assert exe.output_infos[0].shape_bounds.max == ()
    x = rng.standard_normal(3).astype(np.float32)
    for s in (np.array(2.0, np.float32), np.float32(2.0), jnp.float32(2.0)):
        out = exe(x, s)
        assert out.shape == ()
        assert_close(out, f(jnp.asarray(x), jnp.asarray(s)))


# --- call validation ------------------------------------------------------------------------------

def _raises(fn, *needles):
    with pytest.raises(tb.TripyBuildError) as excinfo:
        fn()
    msg = str(excinfo.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in message: {msg}"
    return msg


def test_missing_argument(pair_exe):
    a = np.zeros((2, 5), np.float32)
    _raises(lambda: pair_exe(a), "'b'", "missing")
    _raises(lambda: pair_exe(b=a), "'a'", "missing")


def test_too_many_positional(pair_exe):
    a = np.zeros((2, 5), np.float32)
    _raises(lambda: pair_exe(a, a, a), "positional", "a, b", "3")


def test_unknown_keyword(pair_exe):
    a = np.zeros((2, 5), np.float32)
    _raises(lambda: pair_exe(a, b=a, c=a), "'c'")


def test_duplicate_argument(pair_exe):
    a = np.zeros((2, 5), np.float32)
    _raises(lambda: pair_exe(a, a, a=a), "'a'", "multiple")


def test_wrong_rank(geglu_exe):
    _raises(lambda: geglu_exe(np.zeros((1, 2, DIM_IN), np.float32)), "'x'", "rank 3", "rank 2")
    _raises(lambda: geglu_exe(np.zeros((DIM_IN,), np.float32)), "'x'", "rank 1")


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_wrong_dtype_is_not_cast(geglu_exe, dtype):
    x = np.zeros((2, DIM_IN), dtype)
    _raises(lambda: geglu_exe(x), "'x'", np.dtype(dtype).name, "float32")


@pytest.mark.parametrize("batch", [0, BATCH[2] + 1, 100])
def test_dim_outside_range(geglu_exe, batch):
    x = np.zeros((batch, DIM_IN), np.float32)
    msg = _raises(lambda: geglu_exe(x), "'x'", "dim 0", f"[{BATCH[0]}, {BATCH[2]}]")
    assert f"is {batch}" in msg


def test_static_dim_wrong(geglu_exe):
    x = np.zeros((2, DIM_IN - 1), np.float32)
    _raises(lambda: geglu_exe(x), "'x'", "dim 1", str(DIM_IN), str(DIM_IN - 1))


def test_named_dimension_sizes_differ(pair_exe):
    a = np.zeros((3, 5), np.float32)
    b = np.zeros((4, 5), np.float32)
    _raises(lambda: pair_exe(a, b), "'batch'", "'a'", "'b'", "3", "4")


def test_named_dimension_differs_within_one_input(rng):
    n = tb.NamedDimension("n", 1, 2, 4)

    def sym(x):
        return x + x.T

    exe = tb.compile(sym, args=(II((n, n), "float32"),))
    _raises(lambda: exe(np.zeros((3, 4), np.float32)), "'n'", "'x'", "dim 0", "dim 1", "3", "4")
    x = rng.standard_normal((3, 3)).astype(np.float32)
    assert_close(exe(x), sym(jnp.asarray(x)))


def test_output_dimension_names_that_are_not_identifiers(rng):
    seq = tb.NamedDimension("seq len", 1, 2, 4)
    lead = tb.NamedDimension("_b", 1, 2, 3)

    def f(x, y):
        return x * 2, y + 1

    exe = tb.compile(f, args=(II((seq, 3), "float32"), II((lead,), "float32")))
    assert [o.dimension_names for o in exe.output_infos] == [{0: "seq len"}, {0: "_b"}]
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal(1).astype(np.float32)
    for got, want in zip(exe(x, y), f(jnp.asarray(x), jnp.asarray(y))):
        assert_close(got, want)


def test_named_dimension_out_of_range(pair_exe):
    a = np.zeros((7, 5), np.float32)
    _raises(lambda: pair_exe(a, a), "'a'", "dim 0", "[1, 6]", "7", "batch")


def test_python_list_instead_of_array(geglu_exe):
    x = np.zeros((2, DIM_IN), np.float32).tolist()
    _raises(lambda: geglu_exe(x), "'x'", "list", "array")


def _nested_inputs():
    return {
        "a": np.ones((2, 3), np.float32),
        "b": [np.ones(3, np.float32), (np.ones(2, np.int32), np.ones(2, np.int32))],
    }


def test_nested_wrong_structure(nested_exe):
    exe, _ = nested_exe
    exe(_nested_inputs())  # the well-formed call works

    d = _nested_inputs()
    d["b"][1] = np.ones(2, np.int32)
    _raises(lambda: exe(d), "d.b[1]", "tuple of 2")

    d = _nested_inputs()
    d["b"] = d["b"][:1]
    _raises(lambda: exe(d), "d.b", "list of 2")

    d = _nested_inputs()
    del d["a"]
    _raises(lambda: exe(d), "'d'", "'a'")

    d = _nested_inputs()
    d["extra"] = np.ones(1, np.float32)
    _raises(lambda: exe(d), "'d'", "extra")

    _raises(lambda: exe(np.ones((2, 3), np.float32)), "'d'", "dict")


def test_nested_leaf_errors_name_the_path(nested_exe):
    exe, _ = nested_exe
    d = _nested_inputs()
    d["b"][1] = (np.ones(2, np.float32), np.ones(2, np.int32))
    _raises(lambda: exe(d), "d.b[1][0]", "float32", "int32")

    d = _nested_inputs()
    d["a"] = np.ones((5, 3), np.float32)
    _raises(lambda: exe(d), "d.a", "dim 0", "[1, 4]", "5")

    d = _nested_inputs()
    d["b"][0] = [1.0, 2.0, 3.0]
    _raises(lambda: exe(d), "d.b[0]", "list")


def test_validation_is_not_skipped_after_a_successful_call(geglu_exe, pair_exe):
    """Repeated calls take a fast path; it must still reject what the first call would reject."""
    x = np.zeros((3, DIM_IN), np.float32)
    geglu_exe(x)
    geglu_exe(x)
    _raises(lambda: geglu_exe(x.astype(np.float64)), "'x'", "float64")
    _raises(lambda: geglu_exe(np.zeros((BATCH[2] + 1, DIM_IN), np.float32)), "'x'", "dim 0")
    _raises(lambda: geglu_exe(x.tolist()), "'x'", "list")

    a3, a4 = np.zeros((3, 5), np.float32), np.zeros((4, 5), np.float32)
    pair_exe(a3, a3)
    pair_exe(a4, a4)
    pair_exe(a3, a3)
    _raises(lambda: pair_exe(a3, a4), "'batch'")


def test_errors_do_not_break_later_calls(geglu_exe, geglu_ref, rng):
    with pytest.raises(tb.TripyBuildError):
        geglu_exe(np.zeros((2, DIM_IN), np.float64))
    x = _x(rng, 2)
    assert_close(geglu_exe(x), geglu_ref(x))


# --- composition ----------------------------------------------------------------------------------

def test_output_of_one_executable_feeds_another(geglu_exe, geglu_params, rng):
    params2 = make_geglu_params(DIM_OUT, 8, seed=7)
    exe2 = tb.compile(geglu, args=(II((BATCH, DIM_OUT), "float32"), params2))
    for batch in (2, BATCH[1]):
        x = _x(rng, batch)
        hidden = geglu_exe(x)
        out = exe2(hidden)
        expected = geglu(geglu(jnp.asarray(x), geglu_params), params2)
        assert out.shape == (batch, 8)
        assert_close(out, expected)


def test_tuple_outputs_feed_another_executable(pair_exe, rng):
    a = rng.standard_normal((2, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    s, p = pair_exe(*pair_exe(a, b))
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    assert_close(s, (ja + jb) + (ja * jb))
    assert_close(p, (ja + jb) * (ja * jb))


def test_repr_mentions_function_and_inputs(geglu_exe):
    text = repr(geglu_exe)
    assert "geglu" in text and "x" in text


def test_repr_lists_the_visible_inputs_only():
    exe = tb.compile(lambda x, y: x + y, args=[tb.InputInfo((2,), "float32"), tb.InputInfo((2,), "float32")])
    bound = exe.bind(y=np.ones(2, np.float32))
    assert "y:" in repr(exe) and "y:" not in repr(bound) and "x: InputInfo(shape=(2,)" in repr(bound)


def test_bind_of_a_runtime_input_refuses_another_dtype_as_a_call_does():
    """float64 for an input declared float32: refused by bind() as by a call (device_put would cast it)."""
    exe = tb.compile(lambda x, y: x + y, args=[tb.InputInfo((2,), "float32"), tb.InputInfo((2,), "float32")])
    wide = np.ones(2, np.float64)
    with pytest.raises(tb.TripyBuildError, match=r"input 'y' has dtype float64 but expected float32.*no silent casts"):
        exe(np.ones(2, np.float32), wide)
    with pytest.raises(tb.TripyBuildError, match=r"input 'y' has dtype float64 but expected float32.*no silent casts"):
        exe.bind(y=wide)
    with pytest.raises(tb.TripyBuildError, match=r"input 'y' dim 0 is 3"):
        exe.bind(y=np.ones(3, np.float32))
    assert_close(exe.bind(y=np.ones(2, np.float32))(np.ones(2, np.float32)), jnp.full((2,), 2.0, jnp.float32))


def test_executable_load_is_the_seed_apis_name_for_load(tmp_path):
    """``tb.Executable.load(path)`` (Tripy's ``Executable.load``) loads what ``save`` wrote, as ``tb.load`` does."""
    import numpy as np

    exe = tb.compile(lambda x: x * 2.0 + 1.0, args=[tb.InputInfo(((1, 2, 4), 3), "float32")])
    path = exe.save(tmp_path / "art")
    loaded = tb.Executable.load(path, warmup="none")
    assert isinstance(loaded, tb.Executable) and loaded.input_infos == exe.input_infos
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(loaded(x)), x * 2 + 1)
    with pytest.raises(tb.TripyBuildError, match="manifest"):
        tb.Executable.load(tmp_path / "nothing")
