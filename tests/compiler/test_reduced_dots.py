"""A reduced-precision build computes a function's products in its dtype, whatever the function's code does
(``compiler/reduced_dots.py``): products lifted to float32 by a float32 constant, and one-row products that XLA's
CPU backend would run by converting the whole matrix to float32 on every call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.compiler.optimization import compiler_options
from tripy_build.compiler.reduced_dots import in_dtype
from tripy_build.models._layers import matmul

D, HIDDEN, OUT = 64, 96, 32
SCALE = np.linspace(0.5, 1.5, D, dtype=np.float32)  # a float32 constant the function closes over


def user_model(x, params):
    """An ordinary user model: its float32 constant lifts ``x`` to float32, so both products take a float32 operand
    and a bfloat16 weight when the build casts the weights."""
    h = jnp.tanh((x * SCALE) @ params["w1"])
    return h @ params["w2"]


def make_params(dtype=np.float32):
    rng = np.random.default_rng(0)
    return {"w1": (rng.standard_normal((D, HIDDEN)) / 8).astype(dtype),
            "w2": (rng.standard_normal((HIDDEN, OUT)) / 10).astype(dtype)}


def optimized_hlo(f, *args) -> str:
    return jax.jit(f).lower(*args).compile(compiler_options=compiler_options(3, "cpu")).as_text()


def weight_copies(hlo: str) -> list[str]:
    """The float32 arrays of a weight's shape the compiled program holds: a copy converted on every call."""
    return [s for s in (f"f32[{D},{HIDDEN}]", f"f32[{HIDDEN},{OUT}]") if s in hlo]


def test_a_user_models_float32_constant_no_longer_lifts_its_bfloat16_build_to_float32(tmp_path):
    params = make_params()
    exe = tb.compile(user_model, args=[tb.InputInfo(((1, 2, 4), D), "float32"), params], precision="bfloat16")
    assert exe.metadata["precision"]["rewritten"] == {"lifted": 2, "one row": 2}
    # every profile (batch 1, 2 and 4) holds its weights in bfloat16 only; the function as written would not
    texts = [p.ready().as_text() for p in exe.compiled.profiles]
    assert len(texts) == 3 and [weight_copies(t) for t in texts] == [[], [], []]
    half = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.bfloat16), params)
    x1 = jnp.asarray(np.random.default_rng(1).standard_normal((1, D)), jnp.bfloat16)
    assert weight_copies(optimized_hlo(user_model, x1, half)) == [f"f32[{D},{HIDDEN}]", f"f32[{HIDDEN},{OUT}]"]
    # the result is float32's, within the budget the build measured and enforced
    x = np.random.default_rng(2).standard_normal((3, D)).astype(np.float32)
    want = np.asarray(user_model(x, params))
    got = np.asarray(exe(x))
    assert got.dtype == np.float32 and got.shape == (3, OUT)
    assert np.abs(got - want).max() <= exe.metadata["precision"]["max_error"] * np.abs(want).max()
    # inspect says what the build did
    from tripy_build.cli.show import describe

    text = describe(exe.save(tmp_path / "art"))
    assert "products the build kept in bfloat16: 2 that the function lifted to float32, 2 of one row" in text


def test_a_float32_build_and_a_clean_function_are_left_as_they_are():
    params = make_params()
    exe = tb.compile(user_model, args=[tb.InputInfo(((1, 2, 4), D), "float32"), params])
    assert "precision" not in exe.metadata
    # the zoo's layers pad their own rows: nothing to rewrite, the function traced is the function given
    w = jnp.ones((D, HIDDEN), jnp.bfloat16)
    b, = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((b, D), jnp.bfloat16)
    clean = in_dtype(matmul, "bfloat16")
    assert str(jax.make_jaxpr(clean)(x, w)) == str(jax.make_jaxpr(matmul)(x, w)) and clean.counts == {}


def test_products_inside_jit_remat_scan_while_and_cond_are_rewritten():
    w = jnp.asarray(np.random.default_rng(3).standard_normal((D, D)) / 8, jnp.bfloat16)

    @jax.jit
    def inner(h, w):
        return jnp.tanh(h.astype(jnp.float32) @ w.astype(jnp.float32))

    @jax.checkpoint
    def remat(h, w):
        return jnp.tanh(h @ w)

    def f(x, w):
        h = remat(inner(x, w), w)
        h = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=2)[0]
        h = jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (jnp.tanh(c[0] @ w), c[1] + 1), (h, 0))[0]
        return jax.lax.cond(h.sum() > 0, lambda h: h @ w, lambda h: -(h @ w), h)

    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, D)), jnp.bfloat16)
    g = in_dtype(f, "bfloat16")
    want, got = np.asarray(f(x, w)), np.asarray(jax.jit(g)(x, w))
    assert g.counts == {"lifted": 6}  # jit, remat, scan, while, and both branches of cond; two rows: none padded
    assert got.dtype == np.float32 and np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    assert f"f32[{D},{D}]" in optimized_hlo(f, x, w) and f"f32[{D},{D}]" not in optimized_hlo(g, x, w)


@pytest.mark.parametrize("rows, padded", [(1, True), ("b", True), ("b+1", False), (2, False)])
def test_a_product_gets_a_row_of_zeros_where_its_rows_may_number_one(rows, padded):
    """Static 1 and a symbolic dim of range [1, ...] may be one row; ``b + 1`` and 2 cannot."""
    n = jax.export.symbolic_shape(rows)[0] if isinstance(rows, str) else rows
    w = jax.ShapeDtypeStruct((D, HIDDEN), jnp.bfloat16)
    g = in_dtype(jnp.matmul, "bfloat16")
    jax.make_jaxpr(g)(jax.ShapeDtypeStruct((n, D), jnp.bfloat16), w)
    assert g.counts == ({"one row": 1} if padded else {})


def test_the_row_of_zeros_is_for_the_cpu_and_the_product_is_unchanged():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((1, D)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((D, HIDDEN)), jnp.bfloat16)
    g = in_dtype(jnp.matmul, "bfloat16")
    assert f"f32[{D},{HIDDEN}]" in optimized_hlo(jnp.matmul, x, w)
    assert f"f32[{D},{HIDDEN}]" not in optimized_hlo(g, x, w)
    want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    got = np.asarray(jax.jit(g)(x, w), np.float32)
    assert got.shape == (1, HIDDEN) and np.abs(got - want).max() <= 0.01 * np.abs(want).max()
    # exported for a GPU the product is as written: the row is added by the CPU's branch only
    spec = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w)]
    cuda = jax.export.export(jax.jit(g), platforms=["cuda"])(*spec).mlir_module()
    cpu = jax.export.export(jax.jit(g), platforms=["cpu"])(*spec).mlir_module()
    assert "concatenate" in cpu and "concatenate" not in cuda


def test_float16_rewrites_lifted_products_and_pads_none():
    """float16 has no CPU kernel a row would reach (``compiler/precision.py``): only lifted products change."""
    w = jnp.asarray(make_params()["w1"], jnp.float16)
    x = jnp.ones((1, D), jnp.float16)
    g = in_dtype(lambda x, w: (x * SCALE) @ w, "float16")
    jax.make_jaxpr(g)(x, w)
    assert g.counts == {"lifted": 1}
