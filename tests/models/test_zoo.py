"""The model zoo: parameter shapes, padding declarations, and executables that match eager ``apply``.

Each model is compiled once with small hyperparameters, every named dim a ``NamedDimension``, its own
padding declaration and (for masking models) ``DimSize`` lengths. Every in-range shape then runs a
precompiled profile, padded where needed, and must match the model applied eagerly to the unpadded
input: at each bucket, one above it, and at max.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.models import (
    GPT2, MLP, MODELS, Albert, Bart, Bert, Marian, Camembert, Clip, ClipText, ClipVision, ConvNet, Deberta, DebertaV2,
    DistilBert, Electra, Gemma, Gemma2, Gemma3, GEGLU, GptOss, Granite, GraniteMoe, Llama, Mistral, ModernBert, MPNet,
    Mixtral, MT5Encoder, Olmo2, Olmo3, Olmoe, Phi3, Qwen2, Qwen2Moe, Qwen3, Qwen3Moe, ResNet, Roberta, Siglip, SiglipText,
    SiglipVision, SmolLM3, T5Encoder, TransformerBlock, UMT5Encoder, ViT, Whisper, XLMRoberta, input_infos,
)

KEY = jax.random.PRNGKey(0)
TOL = dict(rtol=1e-5, atol=1e-5)


def shapes_of(params):
    return jax.tree_util.tree_map(lambda a: tuple(a.shape), params)


# model, its dim ranges, explicit buckets (others: pow2), expected param shapes.
CASES = {
    "geglu": (
        GEGLU(16, 32),
        {"batch": (1, 4, 9)},
        {},
        {"proj": {"weight": (64, 16), "bias": (64,)}},
    ),
    "mlp": (
        MLP(dim_in=16, hidden=32, dim_out=8, layers=3),
        {"batch": (1, 4, 9)},
        {},
        {"layers": [{"weight": (32, 16), "bias": (32,)}, {"weight": (32, 32), "bias": (32,)},
                    {"weight": (8, 32), "bias": (8,)}]},
    ),
    "transformer": (
        TransformerBlock(d_model=32, heads=4, d_ff=64),
        {"batch": (1, 2, 4), "seq": (1, 8, 16)},
        {"seq": [4, 8, 16]},
        {"ln1": {"scale": (32,), "bias": (32,)},
         "attn": {n: {"weight": (32, 32), "bias": (32,)} for n in ("q", "k", "v", "out")},
         "ln2": {"scale": (32,), "bias": (32,)},
         "ffn": {"up": {"weight": (64, 32), "bias": (64,)}, "down": {"weight": (32, 64), "bias": (32,)}}},
    ),
    "convnet": (
        ConvNet(channels_in=3, channels=(8, 16), classes=5),
        {"batch": (1, 2, 4), "height": (1, 8, 17), "width": (1, 8, 17)},
        {"batch": [2, 4], "height": [4, 8, 17], "width": [8, 17]},
        {"convs": [{"kernel": (3, 3, 3, 8), "bias": (8,)}, {"kernel": (3, 3, 8, 16), "bias": (16,)}],
         "head": {"weight": (5, 16), "bias": (5,)}},
    ),
}


def concrete_inputs(model, sizes, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in model.inputs().items():
        dims = [sizes[d] if isinstance(d, str) else d for d in shape]
        out.append(rng.standard_normal(dims).astype(model.input_dtypes()[name]))
    return out


def compile_model(model, params, dims, buckets):
    masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}
    return tb.compile(model.apply, args=[params, *input_infos(model, dims).values()],
                      kwargs={"lengths": masks} if masks else None, buckets=buckets, padding=model.padding)


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request):
    model, dims, buckets, expected = CASES[request.param]
    params = model.init(KEY)
    exe = compile_model(model, params, dims, buckets)
    return model, params, exe, expected, dims


def boundary_sizes(exe):
    """Per dim: every bucket, one above each bucket (padded), and max; combined with the other dims at opt."""
    points = []
    for i, d in enumerate(exe.dims):
        lo, _, hi = d.bounds
        for n in sorted({*d.buckets, *(b + 1 for b in d.buckets if b < hi), hi, lo}):
            points.append({e.name: (n if j == i else e.bounds[1]) for j, e in enumerate(exe.dims)})
    return points


def test_registry():
    assert MODELS == {"geglu": GEGLU, "mlp": MLP, "transformer": TransformerBlock, "convnet": ConvNet,
                      "bert": Bert, "roberta": Roberta, "xlm-roberta": XLMRoberta, "camembert": Camembert,
                      "distilbert": DistilBert, "electra": Electra, "albert": Albert, "bart": Bart,
                      "marian": Marian, "deberta": Deberta,
                      "mpnet": MPNet, "deberta-v2": DebertaV2, "modernbert": ModernBert, "gpt2": GPT2, "llama": Llama,
                      "qwen2": Qwen2, "qwen3": Qwen3, "mistral": Mistral, "granite": Granite, "smollm3": SmolLM3,
                      "olmo2": Olmo2, "olmo3": Olmo3, "gemma": Gemma,
                      "gemma2": Gemma2, "gemma3": Gemma3, "phi3": Phi3, "qwen3_moe": Qwen3Moe, "qwen2_moe": Qwen2Moe,
                      "mixtral": Mixtral, "granite_moe": GraniteMoe, "olmoe": Olmoe,
                      "gpt_oss": GptOss, "vit": ViT, "resnet50": ResNet, "clip": Clip, "clip_text": ClipText,
                      "clip_vision": ClipVision, "siglip": Siglip, "siglip_text": SiglipText,
                      "siglip_vision": SiglipVision, "t5": T5Encoder,
                      "mt5": MT5Encoder, "umt5": UMT5Encoder, "whisper": Whisper}
    for key, cls in MODELS.items():
        assert cls.name == key
        model = cls()  # every hyperparameter has a default
        names = list(model.inputs())
        assert names == list(model.input_dtypes())
        dtypes = model.input_dtypes()
        assert set(dtypes.values()) <= {"float32", "int32"}
        # every integer input declares the values it may hold (token ids: [0, vocab))
        assert set(getattr(model, "input_values", dict)()) == {n for n, d in dtypes.items() if d == "int32"}
        # apply(params, *inputs, lengths=None): the inputs follow params, in inputs() order
        params = list(inspect.signature(model.apply).parameters.values())
        assert [p.name for p in params[1:1 + len(names)]] == names
        masked = {d for d, kind in model.padding.items() if kind == "mask"}
        assert (params[-1].name == "lengths") == bool(masked)
        used = {d for shape in model.inputs().values() for d in shape if isinstance(d, str)}
        assert model.padding.get("batch") == "rows" and set(model.padding) == used
        for shape in model.inputs().values():
            assert all(isinstance(d, (int, str)) for d in shape)


def test_params(built):
    model, params, _, expected, _ = built
    assert shapes_of(params) == expected
    for leaf in jax.tree_util.tree_leaves(params):
        assert leaf.dtype == np.float32
    again = model.init(KEY)  # a fixed key gives the same params
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)


def test_every_in_range_shape_runs_precompiled_and_matches_the_model_at_its_shape(built, compile_counter):
    model, params, exe, _, _ = built
    assert list(exe.input_infos) == list(model.inputs())
    assert {d.strategy for d in exe.dims} == {"padded"}
    points = boundary_sizes(exe)
    inputs = [concrete_inputs(model, sizes, seed=i) for i, sizes in enumerate(points)]
    before = compile_counter.count
    results = [exe(*x) for x in inputs]
    assert compile_counter.count == before, "a shape in range compiled at run time"
    assert len(points) > 2 * len(exe.dims)
    reference = jax.jit(model.apply)  # at each point's own shape: unpadded, no lengths (op by op: 3x the compiles)
    for sizes, x, got in zip(points, inputs, results):
        want = reference(params, *[jnp.asarray(a) for a in x])
        assert got.shape == want.shape and got.dtype == want.dtype, sizes
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL, err_msg=str(sizes))


@pytest.mark.parametrize("name", ["transformer", "convnet"])
def test_masking_makes_padding_exact_and_full_lengths_change_nothing(name):
    """The models' own masking: padded input + true lengths == unpadded input; full lengths == no lengths."""
    model = {"transformer": TransformerBlock(d_model=16, heads=2, d_ff=32), "convnet": ConvNet(3, (4, 8), 5)}[name]
    params = model.init(KEY)
    rng = np.random.default_rng(3)
    if name == "transformer":
        x = rng.standard_normal((2, 5, 16)).astype(np.float32)
        padded = np.concatenate([x, 9 * rng.standard_normal((2, 3, 16)).astype(np.float32)], axis=1)
        got = model.apply(params, padded, lengths={"seq": jnp.int32(5)})[:, :5]
        full = model.apply(params, x, lengths={"seq": jnp.int32(5)})
    else:
        x = rng.standard_normal((2, 7, 5, 3)).astype(np.float32)
        padded = 9 * rng.standard_normal((2, 16, 8, 3)).astype(np.float32)
        padded[:, :7, :5] = x
        got = model.apply(params, padded, lengths={"height": jnp.int32(7), "width": jnp.int32(5)})
        full = model.apply(params, x, lengths={"height": jnp.int32(7), "width": jnp.int32(5)})
    want = model.apply(params, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)
    np.testing.assert_allclose(np.asarray(full), np.asarray(want), **TOL)
    unmasked = model.apply(params, padded)
    unmasked = unmasked[:, :5] if name == "transformer" else unmasked
    assert np.abs(np.asarray(unmasked) - np.asarray(want)).max() > 1e-2  # without the mask, padding leaks


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


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reduced_precision_stays_within_its_budget(name, precision):
    model, dims, buckets, _ = CASES[name]
    params = model.init(KEY)
    masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}
    exe = tb.compile(model.apply, args=[params, *input_infos(model, dims).values()],
                     kwargs={"lengths": masks} if masks else None, padding=model.padding,
                     buckets={d: [r[1], r[2]] for d, r in dims.items()}, precision=precision)
    p = exe.metadata["precision"]
    assert p["dtype"] == precision and 0 < p["max_rel_error"] <= p["max_error"]
    # the zoo keeps its products in the reduced dtype (nothing lifted); the transformer block's einsum projections
    # are the products of one row at batch 1, seq 1 that the build pads on the CPU (compiler/reduced_dots.py)
    assert p["rewritten"] == ({"one row": 4} if (name, precision) == ("transformer", "bfloat16") else {})
    assert {np.dtype(v.dtype).name for v in exe.weights.values()} == {precision}
    sizes = {d: r[2] for d, r in dims.items()}
    x = concrete_inputs(model, sizes, seed=5)
    got, want = np.asarray(exe(*x)), np.asarray(model.apply(params, *x))
    assert got.dtype == np.float32 and np.abs(got - want).max() <= p["max_error"] * np.abs(want).max()


def _products(jaxpr: Any) -> list[tuple[str, list[str], str]]:
    """Every dot and convolution in ``jaxpr`` (inner jaxprs included): (primitive, operand dtypes, where)."""
    from jax._src import source_info_util

    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.append((eqn.primitive.name, [str(v.aval.dtype) for v in eqn.invars],
                          source_info_util.summarize(eqn.source_info)))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _products(inner)
    return found


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_bfloat16_model_computes_every_product_in_bfloat16(name):
    """With its weights and inputs in bfloat16 no matrix product of a zoo model takes a float32 operand: one float32
    value (a rotary table, a norm's scale, a constant) lifted every layer after it to float32 and XLA then converted
    each weight matrix to float32 on every call, so that a bfloat16 Qwen2 decoded 7x slower than in float32. Norms
    and softmaxes may compute in float32 inside; what they return is the input's dtype. Traced abstractly at the
    default sizes (no weights are made), with at most six layers: every kind of layer the defaults make is among
    the first six (Gemma 3's sixth is global, SmolLM3's fourth has no rotary positions, ModernBERT's third is
    global), and a Qwen3-MoE of 24 layers of 128 experts took 11 s to trace."""
    model = MODELS[name]()
    if getattr(model, "num_hidden_layers", 0) > 6:
        model = MODELS[name](num_hidden_layers=6)
    half = lambda a: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16 if jnp.issubdtype(a.dtype, jnp.floating) else a.dtype)  # noqa: E731
    params = jax.tree_util.tree_map(half, jax.eval_shape(model.init, KEY))
    sizes = {"batch": 2, "seq": 8, "height": 32, "width": 32, "texts": 3}
    dtypes = model.input_dtypes()
    inputs = [jax.ShapeDtypeStruct(tuple(sizes.get(d, d) for d in shape),
                                   jnp.bfloat16 if dtypes[k] == "float32" else dtypes[k])
              for k, shape in model.inputs().items()]
    masks = {d: jnp.int32(sizes[d]) for d, kind in getattr(model, "padding", {}).items() if kind == "mask"}
    kwargs = {"lengths": masks} if masks else {}
    traced = [jax.make_jaxpr(lambda p, *x: model.apply(p, *x, **kwargs))(params, *inputs)]
    if hasattr(model, "extend"):  # task=generate's entry, over a bfloat16 cache
        step = model.extend_inputs(2, 1, 16, False, "bfloat16")
        traced.append(jax.make_jaxpr(model.extend)(params, *[jax.ShapeDtypeStruct(i.shape_bounds.opt, i.dtype)
                                                              for i in step.values()]))
        assert step["cache"].dtype == "bfloat16"
    for jaxpr in traced:
        products = _products(jaxpr.jaxpr)
        assert products and [p for p in products if "float32" in p[1]] == []
        assert {str(v.aval.dtype) for v in jaxpr.jaxpr.outvars} <= {"bfloat16", "int32"}


def test_a_bfloat16_product_of_one_row_runs_in_bfloat16_on_the_cpu():
    """XLA's CPU backend converts the whole matrix of a one-row bfloat16 product to float32 on every call (no library
    takes it); ``_layers.matmul`` gives it a row of zeros so that YNNPACK's bfloat16 kernel runs it. Read off the
    compiled program: with the project's options, plain ``jnp.matmul`` holds a float32 copy of the matrix (when
    XLA stops doing so, this says the extra row can go), ``matmul`` none, in either layout; its result is the
    product's."""
    from tripy_build.compiler.optimization import compiler_options
    from tripy_build.models._layers import matmul

    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1, 64)), jnp.bfloat16)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((64, 96)), jnp.bfloat16)

    def compiled(f: Any, *args: Any) -> str:
        return jax.jit(f).lower(*args).compile(compiler_options=compiler_options(3, "cpu")).as_text()
    assert "f32[64,96]" in compiled(jnp.matmul, x, w)
    assert "f32[64,96]" not in compiled(matmul, x, w) and "f32[96,64]" not in compiled(
        lambda x, w: matmul(x, w, rows=True), x, w.T)
    want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    for got in (matmul(x, w), jax.jit(matmul)(x, w), jax.jit(lambda x, w: matmul(x, w, rows=True))(x, w.T)):
        assert got.shape == (1, 1, 96) and got.dtype == jnp.bfloat16
        assert np.abs(np.asarray(got, np.float32) - want).max() <= 0.01 * np.abs(want).max()
