"""The model zoo: parameter shapes, and tripy_build executables that match eager ``apply``.

Each model is compiled once (params as a compile-time constant, every named dim a
``NamedDimension``) with small hyperparameters, then run at its opt shape (the precompiled
executable) and at a second in-range shape (the exported program, compiled on first use).
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.models import MODELS, MLP, ConvNet, GEGLU, TransformerBlock, input_infos

KEY = jax.random.PRNGKey(0)
TOL = dict(rtol=1e-5, atol=1e-5)


def shapes_of(params):
    return jax.tree_util.tree_map(lambda a: tuple(a.shape), params)


# model, its dim ranges, expected param shapes, and two in-range dim assignments (the first = opt).
CASES = {
    "geglu": (
        GEGLU(16, 32),
        {"batch": (1, 4, 9)},
        {"proj": {"weight": (64, 16), "bias": (64,)}},
        [{"batch": 4}, {"batch": 9}],
    ),
    "mlp": (
        MLP(dim_in=16, hidden=32, dim_out=8, layers=3),
        {"batch": (1, 4, 9)},
        {"layers": [{"weight": (32, 16), "bias": (32,)}, {"weight": (32, 32), "bias": (32,)},
                    {"weight": (8, 32), "bias": (8,)}]},
        [{"batch": 4}, {"batch": 1}],
    ),
    "transformer": (
        TransformerBlock(d_model=32, heads=4, d_ff=64),
        {"batch": (1, 2, 4), "seq": (1, 8, 16)},
        {"ln1": {"scale": (32,), "bias": (32,)},
         "attn": {n: {"weight": (32, 32), "bias": (32,)} for n in ("q", "k", "v", "out")},
         "ln2": {"scale": (32,), "bias": (32,)},
         "ffn": {"up": {"weight": (64, 32), "bias": (64,)}, "down": {"weight": (32, 64), "bias": (32,)}}},
        [{"batch": 2, "seq": 8}, {"batch": 3, "seq": 13}],
    ),
    "convnet": (
        ConvNet(channels_in=3, channels=(8, 16), classes=5),
        {"batch": (1, 2, 4), "height": (1, 8, 17), "width": (1, 8, 17)},
        {"convs": [{"kernel": (3, 3, 3, 8), "bias": (8,)}, {"kernel": (3, 3, 8, 16), "bias": (16,)}],
         "head": {"weight": (5, 16), "bias": (5,)}},
        [{"batch": 2, "height": 8, "width": 8}, {"batch": 3, "height": 17, "width": 5}],
    ),
}


def concrete_inputs(model, sizes, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in model.inputs().items():
        dims = [sizes[d] if isinstance(d, str) else d for d in shape]
        out.append(rng.standard_normal(dims).astype(model.input_dtypes()[name]))
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request):
    model, dims, expected, sizes = CASES[request.param]
    params = model.init(KEY)
    exe = tb.compile(model.apply, args=[params, *input_infos(model, dims).values()])
    return model, params, exe, expected, sizes


def test_registry():
    assert MODELS == {"geglu": GEGLU, "mlp": MLP, "transformer": TransformerBlock, "convnet": ConvNet}
    for key, cls in MODELS.items():
        assert cls.name == key
        model = cls()  # every hyperparameter has a default
        names = list(model.inputs())
        assert names == list(model.input_dtypes())
        assert set(model.input_dtypes().values()) == {"float32"}
        # apply(params, *inputs): the inputs follow params, in inputs() order
        assert list(inspect.signature(model.apply).parameters)[1:] == names
        for shape in model.inputs().values():
            assert all(isinstance(d, (int, str)) for d in shape)


def test_params(built):
    model, params, _, expected, _ = built
    assert shapes_of(params) == expected
    for leaf in jax.tree_util.tree_leaves(params):
        assert leaf.dtype == np.float32
    again = model.init(KEY)  # a fixed key gives the same params
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)


def test_matches_eager(built):
    model, params, exe, _, sizes = built
    assert list(exe.input_infos) == list(model.inputs())
    opt_shapes = exe.precompiled_shapes
    for i, s in enumerate(sizes):
        inputs = concrete_inputs(model, s, seed=i)
        got = exe(*inputs)
        want = model.apply(params, *inputs)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)
        # the first assignment is the opt shape (precompiled), the second runs the exported program
        assert (tuple(tuple(x.shape) for x in inputs) in opt_shapes) == (i == 0)


def test_geglu_by_hand():
    model = GEGLU(16, 32)
    params = model.init(KEY)
    exe = tb.compile(model.apply, args=[params, tb.InputInfo([tb.NamedDimension("batch", 1, 3, 8), 16], "float32")])
    x = np.random.default_rng(7).standard_normal((5, 16)).astype(np.float32)
    w = np.asarray(params["proj"]["weight"], np.float64)
    b = np.asarray(params["proj"]["bias"], np.float64)
    y = x.astype(np.float64) @ w.T + b
    a, gate = y[:, :32], y[:, 32:]
    erf = np.vectorize(math.erf)
    want = a * 0.5 * gate * (1.0 + erf(gate / math.sqrt(2.0)))
    np.testing.assert_allclose(np.asarray(exe(x)), want, **TOL)
    np.testing.assert_allclose(np.asarray(model.apply(params, jnp.asarray(x))), want, **TOL)


def test_transformer_artifact_roundtrip(tmp_path):
    model = TransformerBlock(d_model=16, heads=2, d_ff=32)
    params = model.init(KEY)
    infos = input_infos(model, {"batch": (1, 2, 3), "seq": (1, 4, 6)})
    path = tb.compile(model.apply, args=[params, infos["x"]]).save(tmp_path / "transformer")
    loaded = tb.load(path)
    for shape in [(2, 4, 16), (1, 6, 16)]:
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model.apply(params, x)), **TOL)


def test_input_infos_needs_every_dim():
    with pytest.raises(ValueError, match="'seq'"):
        input_infos(TransformerBlock(), {"batch": (1, 2, 4)})
    infos = input_infos(ConvNet(), {"batch": (1, 2, 4), "height": (8, 32, 64), "width": (8, 32, 64)})
    assert infos["x"] == tb.InputInfo(
        [tb.NamedDimension("batch", 1, 2, 4), tb.NamedDimension("height", 8, 32, 64),
         tb.NamedDimension("width", 8, 32, 64), 3], "float32")


def test_bad_hyperparameters():
    with pytest.raises(ValueError, match="divisible"):
        TransformerBlock(d_model=30, heads=4)
    with pytest.raises(ValueError, match="at least one layer"):
        MLP(layers=0)
    assert ConvNet(channels=[4, 8]).channels == (4, 8)
