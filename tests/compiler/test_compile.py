"""tb.compile: runtime inputs vs constants, signatures, return values, tracing errors, options."""

from __future__ import annotations

import inspect
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tripy_build as tb
from conftest import BATCH, DIM_IN, DIM_OUT, assert_close, geglu, info_summary, sum_tolerance

II = tb.InputInfo


def _line_of(func, needle: str) -> int:
    """The file line number of the first line of ``func``'s source that contains ``needle``."""
    lines, start = inspect.getsourcelines(func)
    for i, line in enumerate(lines):
        if needle in line:
            return start + i
    raise AssertionError(f"{needle!r} not in the source of {func.__name__}")


def _params(exe):
    return list(inspect.signature(exe).parameters.values())


# --- shapes and dtypes ----------------------------------------------------------------------------

def test_geglu_compiles_and_matches_eager(geglu_exe, geglu_ref, rng):
    assert isinstance(geglu_exe, tb.Executable)
    x = rng.standard_normal((BATCH[1], DIM_IN)).astype(np.float32)
    out = geglu_exe(x)
    assert isinstance(out, jax.Array)
    assert out.shape == (BATCH[1], DIM_OUT)
    assert_close(out, geglu_ref(x))


@pytest.mark.parametrize(
    "shape, call_shape",
    [
        pytest.param((3, 5), (3, 5), id="ints"),
        pytest.param(((1, 2, 4), 5), (3, 5), id="triple"),
        pytest.param((tb.NamedDimension("rows", 2, 3, 4), (5, 5, 5)), (2, 5), id="named+degenerate-triple"),
    ],
)
def test_shape_entry_forms(shape, call_shape, rng):
    def f(x):
        return jnp.tanh(x) * 3.0

    exe = tb.compile(f, args=(II(shape, "float32"),))
    x = rng.standard_normal(call_shape).astype(np.float32)
    assert_close(exe(x), f(jnp.asarray(x)))


@pytest.mark.parametrize(
    "dtype, np_dtype",
    [
        pytest.param("float32", np.float32, id="str-float32"),
        pytest.param("bfloat16", ml_dtypes.bfloat16, id="str-bfloat16"),
        pytest.param("int32", np.int32, id="str-int32"),
        pytest.param(np.float32, np.float32, id="np.float32"),
        pytest.param(jnp.float32, np.float32, id="jnp.float32"),
    ],
)
def test_dtypes_compile_and_run(dtype, np_dtype, rng):
    def f(x):
        return x * 2 + 1

    exe = tb.compile(f, args=(II(((1, 2, 4), 6), dtype),))
    assert exe.input_infos["x"].dtype == np.dtype(np_dtype)
    assert exe.output_infos[0].dtype == np.dtype(np_dtype)
    x = (rng.integers(-50, 50, size=(3, 6))).astype(np_dtype)  # exact in every tested dtype
    out = exe(x)
    assert out.dtype == np.dtype(np_dtype)
    expected = f(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out).astype(np.float32), np.asarray(expected).astype(np.float32))


def test_bfloat16_matmul_matches_eager(rng):
    def f(x, w):
        return jnp.tanh(x @ w)

    w = (rng.standard_normal((8, 4)) / 4).astype(ml_dtypes.bfloat16)
    exe = tb.compile(f, args=(II(((1, 2, 3), 8), "bfloat16"), w))
    x = rng.standard_normal((2, 8)).astype(ml_dtypes.bfloat16)
    out = exe(x)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    expected = f(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32), rtol=2e-2, atol=2e-2)


# --- independent vs named dynamic dims ------------------------------------------------------------

def test_unnamed_dynamic_dims_are_independent():
    def add(a, b):
        return a + b

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(add, args=(II(((1, 2, 3), 1), "float32"), II(((1, 2, 3), 1), "float32")))
    msg = str(excinfo.value)
    assert "'a'" in msg and "'b'" in msg
    assert "NamedDimension" in msg


def test_shared_named_dimension_makes_dims_equal(rng):
    def add(a, b):
        return a + b

    n = tb.NamedDimension("n", 1, 2, 3)
    exe = tb.compile(add, args=(II((n, 1), "float32"), II((n, 1), "float32")))
    for size in (1, 2, 3):
        a = rng.standard_normal((size, 1)).astype(np.float32)
        b = rng.standard_normal((size, 1)).astype(np.float32)
        assert_close(exe(a, b), add(jnp.asarray(a), jnp.asarray(b)))
    assert exe.output_infos[0].dimension_names == {0: "n"}


# --- runtime inputs vs constants ------------------------------------------------------------------

def test_non_inputinfo_args_are_constants(rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    bias = jnp.arange(3, dtype=jnp.float32)

    def f(x, w, scale, bias, y):
        return (x @ w) * scale + bias + y

    exe = tb.compile(f, args=(II(((1, 2, 5), 4), "float32"), w, 0.5, bias, II((3,), "float32")))
    assert [p.name for p in _params(exe)] == ["x", "y"]
    assert list(exe.input_infos) == ["x", "y"]
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((3,)).astype(np.float32)
    assert_close(exe(x, y), f(jnp.asarray(x), w, 0.5, bias, jnp.asarray(y)))
    with pytest.raises(tb.TripyBuildError, match="scale"):
        exe(x, y, scale=2.0)


def test_params_pytree_is_constant(geglu_exe, geglu_params):
    assert [p.name for p in _params(geglu_exe)] == ["x"]
    assert info_summary(geglu_exe.input_infos) == {
        "dict": {"x": info_summary(II((BATCH, DIM_IN), "float32"))}
    }


def test_nested_runtime_inputs(nested_exe, rng):
    exe, nested = nested_exe
    assert [p.name for p in _params(exe)] == ["d"]
    infos = exe.input_infos["d"]
    assert isinstance(infos, dict) and set(infos) == {"a", "b"}
    assert isinstance(infos["b"], list) and len(infos["b"]) == 2
    assert isinstance(infos["b"][1], tuple) and len(infos["b"][1]) == 2
    assert infos["a"].shape_bounds == ((1, 3), (2, 3), (4, 3))
    assert infos["b"][1][0].dtype == np.int32

    d = {
        "a": rng.standard_normal((3, 3)).astype(np.float32),
        "b": [rng.standard_normal(3).astype(np.float32),
              (np.array([5, 7], np.int32), np.array([1, 10], np.int32))],
    }
    out = exe(d)
    expected = nested({k: jax.tree_util.tree_map(jnp.asarray, v) for k, v in d.items()}, 2.5)
    assert isinstance(out, tuple) and len(out) == 2
    assert_close(out[0], expected[0])
    np.testing.assert_array_equal(out[1], np.array([4, -3], np.int32))
    assert_close(exe(d=d)[0], expected[0])


def test_signature_follows_function_order_not_kwargs_order(rng):
    def f(x, y, z):
        return x - 2 * y + 3 * z

    exe = tb.compile(f, args=(II((2,), "float32"),), kwargs={"z": II((2,), "float32"), "y": II((2,), "float32")})
    assert [p.name for p in _params(exe)] == ["x", "y", "z"]
    assert list(exe.input_infos) == ["x", "y", "z"]
    x, y, z = (rng.standard_normal(2).astype(np.float32) for _ in range(3))
    expected = f(jnp.asarray(x), jnp.asarray(y), jnp.asarray(z))
    assert_close(exe(x, y, z), expected)
    assert_close(exe(x, z=z, y=y), expected)
    assert_close(exe(z=z, x=x, y=y), expected)


def test_kwargs_as_inputinfo(rng):
    def f(a, b):
        return a * b + a

    exe = tb.compile(f, kwargs={"b": II((3,), "float32"), "a": II((3,), "float32")})
    assert [p.name for p in _params(exe)] == ["a", "b"]
    a, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    expected = f(jnp.asarray(a), jnp.asarray(b))
    assert_close(exe(a=a, b=b), expected)
    assert_close(exe(a, b), expected)


def test_keyword_only_parameter(rng):
    def f(x, *, y, scale):
        return x * scale + y

    exe = tb.compile(f, args=(II((3,), "float32"),), kwargs={"y": II((3,), "float32"), "scale": 3.0})
    params = _params(exe)
    assert [p.name for p in params] == ["x", "y"]
    assert params[1].kind is inspect.Parameter.KEYWORD_ONLY
    x, y = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    assert_close(exe(x, y=y), f(jnp.asarray(x), y=jnp.asarray(y), scale=3.0))
    with pytest.raises(tb.TripyBuildError):
        exe(x, y)


def test_variadic_args_and_kwargs_are_frozen(rng):
    def f(x, *args, **kwargs):
        out = x
        for a in args:
            out = out + a
        return out * kwargs["scale"] + kwargs["extra"]

    vec = II((4,), "float32")
    exe = tb.compile(f, args=(vec, vec, vec), kwargs={"extra": vec, "scale": 2.0})
    names = [p.name for p in _params(exe)]
    assert names == ["x", "args0", "args1", "extra"]
    assert list(exe.input_infos) == names
    x, a0, a1, e = (rng.standard_normal(4).astype(np.float32) for _ in range(4))
    expected = f(*(jnp.asarray(v) for v in (x, a0, a1)), extra=jnp.asarray(e), scale=2.0)
    assert_close(exe(x, a0, a1, extra=e), expected)
    assert_close(exe(x, args1=a1, args0=a0, extra=e), expected)
    # an extra keyword of **kwargs stays keyword-only, as in the original function
    assert _params(exe)[3].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(tb.TripyBuildError, match="positional"):
        exe(x, a0, a1, e)
    with pytest.raises(tb.TripyBuildError, match="scale"):
        exe(x, a0, a1, extra=e, scale=1.0)


def test_container_mixing_inputinfo_and_constants_is_an_error():
    def f(d):
        return d["a"] * d["b"]

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(f, args=({"a": II((3,), "float32"), "b": np.ones(3, np.float32)},))
    msg = str(excinfo.value)
    assert "d.b" in msg
    assert "constant" in msg


def test_container_mixing_in_a_list_is_an_error():
    def f(xs):
        return xs[0] + xs[1]

    with pytest.raises(tb.TripyBuildError, match=r"xs\[1\]"):
        tb.compile(f, args=([II((3,), "float32"), 2.0],))


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        pytest.param((), {}, "'x'", id="missing"),
        pytest.param((II((2,), "float32"), 1.0, 2.0), {}, "positional", id="too-many"),
        pytest.param((II((2,), "float32"),), {"nope": 1}, "nope", id="unknown-kw"),
        pytest.param((II((2,), "float32"),), {"x": 1}, "'x'", id="duplicate"),
    ],
)
def test_compile_argument_binding_errors(args, kwargs, needle):
    def f(x, y=1.0):
        return x * y

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(f, args=args, kwargs=kwargs)
    assert needle in str(excinfo.value)


# --- return values --------------------------------------------------------------------------------

def test_tuple_output(pair_exe, rng):
    a = rng.standard_normal((2, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    out = pair_exe(a, b)
    assert isinstance(out, tuple) and len(out) == 2
    assert_close(out[0], jnp.asarray(a) + jnp.asarray(b))
    assert_close(out[1], jnp.asarray(a) * jnp.asarray(b))
    assert len(pair_exe.output_infos) == 2


@pytest.mark.parametrize("container", [list, tuple])
def test_one_element_container_output_keeps_its_type(container, rng):
    def f(x):
        return container([x + 1])

    exe = tb.compile(f, args=(II(((1, 2, 3),), "float32"),))
    x = rng.standard_normal(2).astype(np.float32)
    out = exe(x)
    assert type(out) is container and len(out) == 1
    assert_close(out[0], jnp.asarray(x) + 1)
    assert len(exe.output_infos) == 1


def test_list_output(rng):
    def f(x):
        return [x + 1, x.sum(), x.astype(jnp.int32)]

    exe = tb.compile(f, args=(II(((1, 2, 3), 2), "float32"),))
    x = rng.standard_normal((3, 2)).astype(np.float32) * 10
    out = exe(x)
    assert isinstance(out, list) and len(out) == 3
    expected = f(jnp.asarray(x))
    for o, e in zip(out, expected):
        assert_close(o, e)
    assert [np.dtype(i.dtype).name for i in exe.output_infos] == ["float32", "float32", "int32"]
    assert exe.output_infos[1].shape_bounds.max == ()


def test_dict_output_as_a_model_library_returns_it(rng, tmp_path):
    """A dict of arrays (nested too), as Hugging Face's models return ``last_hidden_state`` and ``pooler_output``:
    the same structure from the executable, the saved artifact and the jax-free runtime."""
    from tripy_build import runtime

    def f(x):
        return {"last_hidden_state": x * 2, "pooled": {"sum": x.sum(-1), "max": x.max(-1)}}

    batch = tb.NamedDimension("batch", 1, 2, 4)
    exe = tb.compile(f, args=[II((batch, 3), "float32")], padding={"batch": "rows"})
    x = rng.standard_normal((3, 3)).astype(np.float32)
    exe.save(tmp_path / "dict")
    for out in (exe(x), runtime.load(tmp_path / "dict")(x)):
        assert set(out) == {"last_hidden_state", "pooled"} and set(out["pooled"]) == {"sum", "max"}
        assert_close(out["last_hidden_state"], jnp.asarray(x) * 2)
        assert_close(out["pooled"]["max"], jnp.asarray(x).max(-1))
    with pytest.raises(tb.TripyBuildError, match=r"\['pooled'\]\['max'\] is str"):
        tb.compile(lambda x: {"pooled": {"max": "no"}, "y": x}, args=[II((2, 3), "float32")])


@pytest.mark.parametrize(
    "value, needles",
    [
        pytest.param(None, ["None"], id="None"),
        pytest.param({"y": 1}, ["dict", "['y'] is int"], id="dict"),
        pytest.param("hello", ["str", "hello"], id="str"),
        pytest.param((), ["tuple", "empty"], id="empty-tuple"),
        pytest.param([], ["list", "empty"], id="empty-list"),
        pytest.param(3.0, ["float"], id="float"),
    ],
)
def test_bad_return_value(value, needles):
    def f(x):
        return value

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(f, args=(II((2,), "float32"),))
    msg = str(excinfo.value)
    assert "must return" in msg
    for needle in needles:
        assert needle in msg


def test_bad_return_element_named():
    def f(x):
        return x, None

    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(f, args=(II((2,), "float32"),))
    assert "[1]" in str(excinfo.value) and "NoneType" in str(excinfo.value)


# --- evaluating traced values ---------------------------------------------------------------------

def _eval_float(x):
    y = x * 2
    s = float(y.sum())  # offending line
    return y * s


def _eval_numpy(x):
    y = x + 1
    arr = np.asarray(y)  # offending line
    return jnp.asarray(arr)


def _eval_if(x):
    if x.sum() > 0:  # offending line
        return x
    return -x


def _eval_int(x):
    n = int(x[0, 0])  # offending line
    return x * n


@pytest.mark.parametrize("func", [_eval_float, _eval_numpy, _eval_if, _eval_int], ids=lambda f: f.__name__)
def test_evaluating_a_traced_value_is_reported_at_the_users_line(func):
    with pytest.raises(tb.TripyBuildError) as excinfo:
        tb.compile(func, args=(II(((1, 2, 3), 4), "float32"),))
    msg = str(excinfo.value)
    assert "Cannot evaluate a tensor while compiling" in msg
    assert os.path.basename(__file__) in msg
    line = _line_of(func, "# offending line")
    assert f"line {line}" in msg, msg


# --- optimization_level ---------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0, 1, 2, 3, 4, 5])
def test_optimization_levels(level, rng):
    def f(x):
        return jnp.sin(x) * x

    exe = tb.compile(f, level, args=(II(((1, 2, 3), 3), "float32"),))
    assert exe.optimization_level == level
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert_close(exe(x), f(jnp.asarray(x)))


def test_optimization_levels_resolve_to_compiler_options_that_change_the_code(rng):
    """0..2 set LLVM's backend level; 3..5 are XLA's defaults on the CPU but for the convolutions
    (tripy_build/compiler/optimization.py)."""
    from tripy_build.compiler.optimization import compiler_options

    w = rng.standard_normal((8, 8)).astype(np.float32)

    def f(x, w):
        return jnp.tanh(x @ w) * 2.0

    x = rng.standard_normal((4, 8)).astype(np.float32)
    blobs = {}
    for level in (0, 1, 3, 4, 5):
        exe = tb.compile(f, level, args=[II((4, 8), "float32"), w], buckets="none")
        (pre,) = exe.compiled.profiles
        assert pre.entry.compiler_options == compiler_options(level, "cpu")
        assert_close(exe(x), f(jnp.asarray(x), w))
        blobs[level] = pre.blob
    assert compiler_options(0, "cpu")["xla_backend_optimization_level"] == 0
    assert compiler_options(3, "cpu") == compiler_options(4, "cpu") == compiler_options(5, "cpu")
    assert "xla_backend_optimization_level" not in compiler_options(3, "cpu")

    def same_code(a, b):  # two compiles of the same code differ only in a few embedded ids
        return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) < 16

    assert same_code(blobs[3], blobs[4]) and same_code(blobs[3], blobs[5])
    assert not same_code(blobs[0], blobs[3]) and not same_code(blobs[1], blobs[3])


@pytest.mark.parametrize("level", [0, 3])
def test_cpu_levels_give_convolutions_to_xla_and_dots_to_ynnpack(level, rng):
    """XLA's default sends both to YNNPACK; its convolutions ran ResNet-50 ~1.35x slower here."""
    from tripy_build.compiler.optimization import compiler_options

    def f(x, k, w):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.einsum("nhwc,cd->nhwd", jax.nn.relu(y), w)

    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 16, 32), (3, 3, 32, 64), (64, 128))]
    lowered = jax.jit(f).lower(*args)

    def given_to_ynnpack(options):
        compiled = lowered.compile(compiler_options=options)
        ops = [line.split('op_name="')[1].split('"')[0].rsplit("/", 1)[-1]
               for line in compiled.as_text().splitlines() if '"kind":"__ynn_fusion"' in line]
        return compiled, sorted(ops)

    default, default_ops = given_to_ynnpack({})
    ours, our_ops = given_to_ynnpack(compiler_options(level, "cpu"))
    assert default_ops == ["conv_general_dilated", "dot_general"]
    assert our_ops == ["dot_general"]
    expected = default(*args)
    assert_close(ours(*args), expected, rtol=0, atol=sum_tolerance(expected, 3 * 3 * 32 + 64))  # conv, then einsum


@pytest.mark.parametrize("level", [6, -1, 2.0, "3", True, None], ids=repr)
def test_bad_optimization_level(level):
    def f(x):
        return x

    with pytest.raises(tb.TripyBuildError, match="optimization_level"):
        tb.compile(f, optimization_level=level, args=(II((2,), "float32"),))


def test_not_callable():
    with pytest.raises(tb.TripyBuildError, match="callable"):
        tb.compile(42, args=(II((2,), "float32"),))


def test_geglu_other_sizes():
    """A GEGLU with other sizes and a static batch compiles independently of the session one."""
    from conftest import make_geglu_params

    params = make_geglu_params(8, 4, seed=3)
    exe = tb.compile(geglu, args=(II((3, 8), "float32"), params))
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    assert_close(exe(x), geglu(jnp.asarray(x), params))
    assert exe.output_infos[0].shape_bounds.opt == (3, 4)


def test_disable_compile_runs_eagerly_with_the_same_checks(monkeypatch, rng, capsys):
    monkeypatch.setenv("TRIPY_BUILD_DISABLE_COMPILE", "1")
    seen = []

    def f(x, length, scale):
        print("tracing" if isinstance(x, jax.core.Tracer) else f"eager x {x.shape}")
        seen.append(int(length))  # a concrete value: impossible while tracing
        return x * scale

    batch = tb.NamedDimension("batch", 1, 2, 4)
    fn = tb.compile(f, args=[II((batch, 3), "float32"), tb.DimSize(batch), 2.0])
    x = rng.standard_normal((3, 3)).astype(np.float32)
    assert_close(fn(x), x * 2.0)
    assert seen == [3] and "eager x (3, 3)" in capsys.readouterr().out
    assert list(fn.input_infos) == ["x"]
    with pytest.raises(tb.TripyBuildError, match="dim 0 \\(NamedDimension 'batch'\\) is 5"):
        fn(rng.standard_normal((5, 3)).astype(np.float32))
    with pytest.raises(tb.TripyBuildError, match="TRIPY_BUILD_DISABLE_COMPILE"):
        fn.save("nowhere")
    monkeypatch.setenv("TRIPY_BUILD_DISABLE_COMPILE", "0")  # compiled, the same line cannot run
    with pytest.raises(tb.TripyBuildError, match="Cannot evaluate a tensor while compiling"):
        tb.compile(f, args=[II((batch, 3), "float32"), tb.DimSize(batch), 2.0])


def test_a_build_keeps_its_profiles_as_bytes_and_loads_them_only_to_run_them(rng):
    """``keep_loaded=False`` (the command line's builds, which only save): every profile is let go once compiled
    and proven (BERT-base's 50 held ~570 MB loaded), and loads again from its bytes when a call needs it."""
    from tripy_build.compiler.pipeline import build_executable

    w = rng.standard_normal((8, 8)).astype(np.float32)
    batch = tb.NamedDimension("batch", 1, 2, 8)
    args = [II((batch, 8), "float32")]
    lean = build_executable(lambda x: jnp.tanh(x @ w), args=args, padding={"batch": "rows"}, keep_loaded=False)
    full = build_executable(lambda x: jnp.tanh(x @ w), args=args, padding={"batch": "rows"})
    assert len(lean.compiled.profiles) > 1 and all(p.call is None for p in lean.compiled.profiles)
    assert all(p.call is not None for p in full.compiled.profiles)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    assert_close(lean(x), full(x))
    assert sum(p.call is not None for p in lean.compiled.profiles) == 1  # the bucket of 3 rows, loaded for the call
    lean.unload_profiles()
    assert all(p.call is None for p in lean.compiled.profiles)
    assert_close(lean(x), full(x))


def test_a_vmapped_matrix_vector_product_and_sum_over_40000_rows_equals_numpy():
    """jax#39103: jaxlib 0.10.2 compiled this to a wrong sum on the CPU from 32,769 rows on (7,232 wrong elements
    at 40,000), silently; the project requires jaxlib >= 0.11.2."""
    n = 40_000
    i = np.arange(n, dtype=np.float32)
    x = np.stack((i, np.zeros_like(i), np.zeros_like(i)), axis=1)
    matrix = np.eye(3, dtype=np.float32)

    def f(x, matrix):
        return jax.vmap(lambda row: jnp.sum((matrix @ row) ** 2))(x)

    exe = tb.compile(f, args=[tb.InputInfo((n, 3), "float32"), matrix])
    want = ((x @ matrix.T) ** 2).sum(axis=1)
    got = np.asarray(exe(x))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[-1] == np.float32(n - 1) ** 2
