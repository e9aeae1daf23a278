"""Models from Flax NNX, Flax Linen and Equinox, and plain functions, built from a config as they are.

Each is built by the build command's code path, loaded in a fresh process and compared with the
module constructed and applied by its own library, eagerly; checkpoints written by orbax as a
training loop would are restored; wrong checkpoints and binds are refused naming the leaf.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

nnx = pytest.importorskip("flax.nnx", reason="flax is an optional extra: pip install -e '.[flax]'")
linen = pytest.importorskip("flax.linen", reason="flax is an optional extra: pip install -e '.[flax]'")
eqx = pytest.importorskip("equinox", reason="equinox is an optional extra: pip install -e '.[equinox]'")
import orbax.checkpoint as ocp  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build.cli import config  # noqa: E402
from tripy_build.builder.pipeline import build  # noqa: E402
from tripy_build.errors import CallError, ConfigError  # noqa: E402
from tripy_build.builder.model import framework_of, instantiate  # noqa: E402
from conftest import run_cli  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from examples.embedding import apply as emb_apply, init as emb_init  # noqa: E402
from examples.flax_linen import DenseStack  # noqa: E402
from examples.flax_nnx import MLP as NNXMLP  # noqa: E402

SEED = 3
X = np.random.default_rng(0).standard_normal((3, 12)).astype(np.float32)  # batch 3: padded to bucket 4
IDS = np.random.default_rng(1).integers(0, 50, (3, 5)).astype(np.int32)

# name -> (model config, the same model made and applied by its own library: params seed -> callable)
CASES = {
    "nnx.Linear": (
        {"_target_": "flax.nnx.Linear", "in_features": 12, "out_features": 5, "inputs": {"inputs": ["batch", 12]}},
        lambda seed: nnx.Linear(12, 5, rngs=nnx.Rngs(seed))),
    "nnx_mlp": (
        {"_target_": "examples.flax_nnx.MLP", "din": 12, "hidden": 16, "dout": 5, "dropout": 0.5,
         "inputs": {"x": ["batch", 12]}, "padding": {"batch": "rows"}},
        lambda seed: _nnx_eval(NNXMLP(12, 16, 5, 0.5, rngs=nnx.Rngs(seed)))),
    "linen_dense": (
        {"_target_": "examples.flax_linen.DenseStack", "features": [16, 16, 5], "inputs": {"x": ["batch", 12]},
         "padding": {"batch": "rows"}},
        lambda seed: _linen(DenseStack((16, 16, 5)), seed)),
    "eqx.nn.MLP": (
        {"_target_": "equinox.nn.MLP", "in_size": 12, "out_size": 5, "width_size": 16, "depth": 2, "vmap": "batch",
         "inputs": {"x": ["batch", 12]}, "padding": {"batch": "rows"}},
        lambda seed: jax.vmap(eqx.nn.MLP(12, 5, 16, 2, key=jax.random.key(seed)))),
    "embedding": (
        {"_target_": "examples.embedding.apply", "init": "examples.embedding.init", "vocab": 50, "width": 8,
         "classes": 4, "inputs": {"ids": ["batch", 5]}, "input_dtypes": {"ids": "int32"}},
        lambda seed: (lambda ids: emb_apply(emb_init(jax.random.key(seed), 50, 8, 4), ids))),
}


def _nnx_eval(module):
    module.eval()
    return module


def _linen(module, seed):
    variables = module.init(jax.random.key(seed), np.zeros((2, 12), np.float32))
    return lambda x: module.apply(variables, x)


def request(model_cfg: dict, tmp_path: Path, *overrides: str):
    config.register()
    with initialize_config_module(config_module="tripy_build.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "shapes.dims.batch=[1,2,4]", f"params.seed={SEED}", f"artifacts_dir={tmp_path / 'artifacts'}",
            *overrides])
    OmegaConf.set_struct(cfg, False)
    cfg.model = OmegaConf.create(model_cfg)
    return config.validate(cfg)


def run_fresh(path: Path, x: np.ndarray, tmp_path: Path) -> np.ndarray:
    """Load the artifact in a new process (no model code imported) and run it on ``x``."""
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import sys, numpy as np, tripy_build as tb
        exe = tb.load({str(path)!r})
        assert not any(m in sys.modules for m in ("flax", "equinox", "examples")), "model code was imported"
        np.save({str(tmp_path / 'y.npy')!r}, np.asarray(exe(np.load({str(tmp_path / 'x.npy')!r}))))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(tmp_path / "y.npy")


@pytest.mark.parametrize("name", list(CASES))
def test_library_model_builds_as_it_is(name, tmp_path):
    model_cfg, reference = CASES[name]
    result = build(request(model_cfg, tmp_path))
    x = IDS if name == "embedding" else X
    want = np.asarray(reference(SEED)(x))
    np.testing.assert_allclose(run_fresh(result.path, x, tmp_path), want, rtol=1e-5, atol=1e-5)
    exe = tb.load(result.path)
    assert list(exe.input_infos) == list(model_cfg["inputs"])  # named as the config declares them
    assert "params" not in repr(exe)


def test_framework_detection_does_not_need_an_instance():
    assert framework_of(nnx.Linear) == "nnx"
    assert framework_of(DenseStack) == "linen"
    assert framework_of(eqx.nn.MLP) == "equinox"
    assert framework_of(emb_apply) == "function"
    from tripy_build.models import GEGLU

    assert framework_of(GEGLU) == "protocol"


def _save(directory: Path, tree) -> Path:
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute(), tree)
        ckpt.wait_until_finished()
    return directory


def test_nnx_checkpoint_from_a_training_loop(tmp_path):
    """``nnx.state(model)`` saved by orbax, RNG streams included, restores into the build."""
    trained = NNXMLP(12, 16, 5, 0.5, rngs=nnx.Rngs(42))  # not the build's seed: the checkpoint must win
    ckpt = _save(tmp_path / "ckpt", nnx.state(trained))
    model_cfg = CASES["nnx_mlp"][0]
    result = build(request(model_cfg, tmp_path, f"params.checkpoint={ckpt}"))
    np.testing.assert_allclose(run_fresh(result.path, X, tmp_path), np.asarray(_nnx_eval(trained)(X)), rtol=1e-5, atol=1e-5)


def test_linen_checkpoint_of_its_variables(tmp_path):
    module = DenseStack((16, 16, 5))
    variables = module.init(jax.random.key(9), X)
    ckpt = _save(tmp_path / "ckpt", variables)
    result = build(request(CASES["linen_dense"][0], tmp_path, f"params.checkpoint={ckpt}"))
    np.testing.assert_allclose(run_fresh(result.path, X, tmp_path), np.asarray(module.apply(variables, X)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["shape", "dtype"])
def test_wrong_checkpoint_is_refused_naming_the_leaf(case, tmp_path):
    if case == "shape":
        other = NNXMLP(12, 10, 5, 0.5, rngs=nnx.Rngs(0))  # hidden 10, the config says 16
        tree, leaf = nnx.state(other, nnx.Param), "['fc1']['bias']"
        expected = "(10,) and dtype float32, but the model needs shape (16,)"
    else:
        model = NNXMLP(12, 16, 5, 0.5, rngs=nnx.Rngs(0))
        tree = jax.tree_util.tree_map(lambda a: a.astype(np.float16), nnx.state(model, nnx.Param))
        leaf, expected = "['fc1']['bias']", "dtype float16, but the model needs shape (16,) and dtype float32"
    ckpt = _save(tmp_path / "ckpt", tree)
    with pytest.raises(ConfigError) as e:
        build(request(CASES["nnx_mlp"][0], tmp_path, f"params.checkpoint={ckpt}"))
    assert leaf in str(e.value) and expected in str(e.value), str(e.value)
    assert not (tmp_path / "artifacts").exists() or not any((tmp_path / "artifacts").rglob("manifest.json"))


def test_bind_swaps_library_params_and_refuses_casts(tmp_path):
    result = build(request(CASES["nnx_mlp"][0], tmp_path))
    exe = tb.load(result.path)
    other = _nnx_eval(NNXMLP(12, 16, 5, 0.5, rngs=nnx.Rngs(11)))
    new_params = nnx.split(other, nnx.RngState, ...)[2]
    np.testing.assert_allclose(np.asarray(exe.bind(params=new_params)(X)), np.asarray(other(X)), rtol=1e-5, atol=1e-5)
    as_f64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), new_params)
    with pytest.raises(tb.TripyBuildError, match=r"params\['fc\d'\]\['(bias|kernel)'\]\.value must be an array of "
                                                 r"shape .* and dtype float32, got ndarray .* float64 \(no silent casts\)"):
        exe.bind(params=as_f64)
    narrow = nnx.split(NNXMLP(12, 8, 5, 0.5, rngs=nnx.Rngs(0)), nnx.RngState, ...)[2]
    with pytest.raises(tb.TripyBuildError, match=r"must be an array of shape \((16,|12, 16)\)"):
        exe.bind(params=narrow)


BAD = [
    # a library module whose inputs the config does not declare
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2}, "model.inputs: flax.nnx.Linear does not declare"),
    # a constructor argument the module does not take, with its signature
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "outs": 2, "inputs": {"x": ["batch", 4]}},
     "does not accept these settings"),
    # vmap is for Equinox modules only
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2, "vmap": "batch",
      "inputs": {"inputs": ["batch", 4]}}, "model.vmap: only Equinox"),
    # vmap over a dim no input has
    ({"_target_": "equinox.nn.MLP", "in_size": 4, "out_size": 2, "width_size": 4, "depth": 1, "vmap": "seq",
      "inputs": {"x": ["batch", 4]}}, "model.vmap: 'seq' must name a dim"),
    # a function without its init
    ({"_target_": "examples.embedding.apply", "inputs": {"ids": ["batch", 5]}},
     "model.init: examples.embedding.apply is a function"),
    # an unknown input dtype
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2, "inputs": {"inputs": ["batch", 4]},
      "input_dtypes": {"inputs": "float99"}}, "model.input_dtypes.inputs: unknown dtype 'float99'"),
    # 'mask' padding needs a model that takes lengths=
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2, "inputs": {"inputs": ["batch", 4]},
      "padding": {"batch": "mask"}}, "model.padding.batch: 'mask' needs"),
    # inputs are passed by name: one the call does not take, a parameter left without a value
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2, "inputs": {"x": ["batch", 4]}},
     "model.inputs.x: flax.nnx.Linear.__call__ has no parameter 'x' (its parameters: inputs, out_sharding)"),
    ({"_target_": "user_models.NNXMasked", "din": 4, "dout": 2, "inputs": {"x": ["batch", 4]}},
     "model: user_models.NNXMasked.__call__ needs its parameter 'mask', which is neither an input nor a constant"),
    # call constants: a keyword the call does not take, one that is also an input, not a mapping
    ({"_target_": "user_models.NNXMasked", "din": 4, "dout": 2, "inputs": {"x": ["batch", 4], "mask": ["batch", 4]},
      "call": {"training": False}}, "model.call.training: user_models.NNXMasked.__call__ has no keyword parameter"),
    ({"_target_": "user_models.NNXMasked", "din": 4, "dout": 2, "inputs": {"x": ["batch", 4], "mask": ["batch", 4]},
      "call": {"mask": 1}}, "model.call.mask: 'mask' is also an input"),
    ({"_target_": "user_models.NNXMasked", "din": 4, "dout": 2, "inputs": {"x": ["batch", 4], "mask": ["batch", 4]},
      "call": "train"}, "model.call: must map the call's keyword arguments"),
    # a shape that is not a list of dims
    ({"_target_": "flax.nnx.Linear", "in_features": 4, "out_features": 2, "inputs": {"x": "batch"}},
     "model.inputs.x: a shape is a list"),
]


@pytest.mark.parametrize("model_cfg,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_library_configs(model_cfg, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        instantiate(model_cfg, {"batch": tb.NamedDimension("batch", 1, 2, 4)})


XM = np.random.default_rng(2).integers(0, 2, (3, 12)).astype(np.float32)


def test_call_constants_reach_the_call_and_inputs_go_by_name(tmp_path):
    """``call: {train: false}`` for a Linen module with batch norm and dropout, ``{deterministic: true}`` for an
    NNX one; inputs declared in another order than the call's parameters reach them by name."""
    from user_models import LinenTrainFlag, NNXMasked, masked_apply, masked_init

    linen_cfg = {"_target_": "user_models.LinenTrainFlag", "features": 8, "call": {"train": False},
                 "inputs": {"x": ["batch", 12]}, "padding": {"batch": "rows"}}
    module = LinenTrainFlag(8)
    variables = module.init(jax.random.key(SEED), np.zeros((2, 12), np.float32), train=False)
    variables = jax.tree_util.tree_map(lambda a: a + 0.1, variables)  # running stats not at their init values
    ckpt = _save(tmp_path / "linen", variables)
    result = build(request(linen_cfg, tmp_path, f"params.checkpoint={ckpt}"))
    np.testing.assert_allclose(np.asarray(tb.load(result.path)(X)), np.asarray(module.apply(variables, X, train=False)),
                               rtol=1e-5, atol=1e-5)

    nnx_cfg = {"_target_": "user_models.NNXMasked", "din": 12, "dout": 5, "call": {"deterministic": True},
               "inputs": {"mask": ["batch", 12], "x": ["batch", 12]}}  # the call takes (x, mask)
    exe = tb.load(build(request(nnx_cfg, tmp_path)).path)
    assert list(exe.input_infos) == ["mask", "x"]
    reference = NNXMasked(12, 5, rngs=nnx.Rngs(SEED))
    np.testing.assert_allclose(np.asarray(exe(XM, X)), np.asarray(reference(X, XM, deterministic=True)),
                               rtol=1e-5, atol=1e-5)

    fn_cfg = {"_target_": "user_models.masked_apply", "init": "user_models.masked_init", "width": 12,
              "inputs": {"x": ["batch", 12], "mask": ["batch", 12]}}  # the function takes (params, mask, x)
    exe = tb.load(build(request(fn_cfg, tmp_path)).path)
    params = masked_init(jax.random.PRNGKey(SEED), 12)
    np.testing.assert_allclose(np.asarray(exe(X, XM)), np.asarray(masked_apply(params, XM, X)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["equinox without vmap", "inputs by position in the wrong order"])
def test_an_error_while_tracing_names_the_models_line_and_the_likely_cause(case, tmp_path):
    from tripy_build.errors import TraceError

    if case == "equinox without vmap":
        model_cfg = {k: v for k, v in CASES["eqx.nn.MLP"][0].items() if k != "vmap"}
        line, cause = "equinox/nn/_linear.py", "add `vmap: batch` to the model config"
    else:
        model_cfg = {"_target_": "user_models.positional_apply", "init": "user_models.positional_init", "width": 12,
                     "inputs": {"bias": ["batch", 3], "features": ["batch", 12]}}
        line, cause = "user_models.py", "the inputs are passed by position in the order model.inputs lists them (bias, features)"
    with pytest.raises(TraceError) as e:
        build(request(model_cfg, tmp_path))
    text = str(e.value)
    assert "while tracing, raised TypeError" in text and line in text and "\nLikely cause: " in text and cause in text, text
    assert len(text.splitlines()) <= 5, text


@pytest.mark.parametrize("layout", ["dict", "nnx tuple"])
def test_checkpoint_saved_with_the_optimizer_is_read_through_checkpoint_key(layout, tmp_path):
    """A training loop's checkpoint of the model and its optimizer: refused naming the key that selects the
    model's sub-tree, then built with it."""
    import optax

    trained = NNXMLP(12, 16, 5, 0.5, rngs=nnx.Rngs(42))
    optimizer = nnx.Optimizer(trained, optax.adam(1e-3), wrt=nnx.Param)
    if layout == "dict":
        tree, key = {"model": nnx.state(trained), "optimizer": nnx.state(optimizer)}, "model"
    else:
        tree, key = nnx.state((trained, optimizer)), "0"
    ckpt = _save(tmp_path / "ckpt", tree)
    with pytest.raises(ConfigError, match=rf"the model's leaves are under '{key}' .*set params\.checkpoint_key={key}\."):
        build(request(CASES["nnx_mlp"][0], tmp_path, f"params.checkpoint={ckpt}"))
    result = build(request(CASES["nnx_mlp"][0], tmp_path, f"params.checkpoint={ckpt}", f"params.checkpoint_key={key}"))
    np.testing.assert_allclose(run_fresh(result.path, X, tmp_path), np.asarray(_nnx_eval(trained)(X)), rtol=1e-5,
                               atol=1e-5)
    wrong_key = rf"no leaf params\['fc1'\]\['bias'\]\.value under 'optimizer'.*set params\.checkpoint_key={key}\."
    with pytest.raises(ConfigError, match=wrong_key):
        build(request(CASES["nnx_mlp"][0], tmp_path, f"params.checkpoint={ckpt}", "params.checkpoint_key=optimizer",
                      "force=true"))


def test_a_library_module_with_an_attention_mask_pads_seq_through_it(tmp_path):
    """``padding: {seq: {mask_input: attention_mask}}`` on a user's NNX module: every seq runs padded,
    and its real positions match the module run by NNX at the true length."""
    from tests.user_models import NNXAttention

    model_cfg = {"_target_": "tests.user_models.NNXAttention", "width": 8, "heads": 2,
                 "inputs": {"x": ["batch", "seq", 8], "attention_mask": ["batch", "seq"]},
                 "input_dtypes": {"attention_mask": "int32"}, "input_values": {"attention_mask": [0, 2]},
                 "padding": {"batch": "rows", "seq": {"mask_input": "attention_mask"}}}
    result = build(request(model_cfg, tmp_path, "+shapes.dims.seq=[1,4,8]"))
    exe = tb.load(result.path)
    assert exe.dims[[d.name for d in exe.dims].index("seq")].strategy == "padded"
    module = NNXAttention(8, 2, rngs=nnx.Rngs(SEED))
    rng = np.random.default_rng(2)
    for batch, seq, real in [(3, 3, [3, 3, 3]), (2, 5, [5, 2]), (1, 7, [4])]:  # 3, 5, 7 are past a bucket
        x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
        mask = (np.arange(seq)[None, :] < np.array(real)[:, None]).astype(np.int32)
        got = np.asarray(exe(x, mask))
        assert got.shape == (batch, seq, 8)
        for b, n in enumerate(real):  # each row alone, at its true length, by NNX
            want = np.asarray(module(x[b:b + 1, :n], mask[b:b + 1, :n]))
            np.testing.assert_allclose(got[b:b + 1, :n], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(CallError, match=r"attention_mask.*\[0, 2\)"):
        exe(np.zeros((1, 3, 8), np.float32), np.full((1, 3), 2, np.int32))



def test_integer_inputs_without_declared_values_are_warned_of_and_declared_ones_checked(tmp_path):
    """An nnx.Embed(500) called with id 600 returns NaN: the build names the undeclared integer input and the key
    that declares it; declared (model.input_values), a call with 600 is refused by both loaders, naming it."""
    from tripy_build import runtime

    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "embed.yaml").write_text(
        "_target_: tests.user_models.NNXEmbed\nname: embed\nvocab: 500\nwidth: 4\ninputs:\n  ids: [batch, 3]\n"
        "input_dtypes:\n  ids: int32\npadding:\n  batch: rows\n")
    model = ["--config-dir", str(tmp_path / "conf"), "model=embed", "shapes=dynamic", "shapes.dims.batch=[1,2,4]",
             f"artifacts_dir={tmp_path / 'arts'}"]
    env = {"PYTHONPATH": str(REPO)}
    silent = run_cli(*model, cwd=tmp_path, env=env)
    assert silent.returncode == 0, silent.stderr[-3000:]
    said = silent.stdout + silent.stderr  # Hydra logs to stdout
    assert "integer input(s) 'ids' of embed have no declared values" in said and "model.input_values.ids=[lo,hi]" in said
    ids = np.array([[1, 600, 2]], np.int32)
    assert np.isnan(np.asarray(tb.load(next((tmp_path / "arts").glob("*/*")))(ids))).any()  # what the warning is for

    declared = run_cli(*model, "+model.input_values.ids=[0,500]", cwd=tmp_path, env=env)
    assert declared.returncode == 0, declared.stderr[-3000:]
    assert "no declared values" not in declared.stdout + declared.stderr
    path = next(p for p in (tmp_path / "arts").glob("*/*") if "values" in (p / "manifest.json").read_text())
    for loader in (tb.load, runtime.load):
        exe = loader(path)
        assert np.isfinite(np.asarray(exe(np.array([[1, 499, 2]], np.int32)))).all()
        with pytest.raises(CallError, match=r"'ids'.*\[0, 500\)") as e:
            exe(ids)
        assert "600" in str(e.value)


def test_compile_warns_of_integer_inputs_without_values(caplog):
    """The Python API names the InputInfo argument to declare them with."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    with caplog.at_level("WARNING", logger="tripy_build.compiler.pipeline"):
        tb.compile(lambda t, i: t[i], args=[table, tb.InputInfo((3,), "int32")])
    assert "integer input(s) 'i' have no declared values" in caplog.text and "values=(lo, hi)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tripy_build.compiler.pipeline"):
        tb.compile(lambda t, i: t[i], args=[table, tb.InputInfo((3,), "int32", values=(0, 6))])
    assert "no declared values" not in caplog.text
