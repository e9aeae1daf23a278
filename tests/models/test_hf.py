"""The Hugging Face architectures of the zoo (bert, gpt2, vit, resnet50) against transformers on CPU.

Each architecture gets tiny Hugging Face configs, a model made with ``torch.manual_seed(0)`` in eval
mode (ResNet's BatchNorm running statistics and affine parameters randomised, so that inference
BatchNorm is tested), ``save_pretrained`` to a temporary directory, read back with
``tripy_build.models.hf.load_pretrained`` and run under ``jax.jit``: outputs must match PyTorch's to
within 1e-4 of the output's scale (max abs error / max abs reference value), at two shapes, at the
real positions of right-padded rows. Also: padded-vs-unpadded invariance with large random ids in
the padding, export with symbolic dims, and one-line errors for bad checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from tripy_build.errors import ConfigError  # noqa: E402
from tripy_build.models.bert import Bert  # noqa: E402
from tripy_build.models.gpt2 import GPT2  # noqa: E402
from tripy_build.models.hf import CheckpointError, checkpoint_names, load_pretrained  # noqa: E402
from tripy_build.models.resnet import ResNet  # noqa: E402
from tripy_build.models.vit import ViT  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4   # against PyTorch: max abs error / max abs reference value
SAME_TOL = 1e-5    # the zoo model against itself (padded vs unpadded, exported vs eager)
VOCAB = 99
IMAGE = 32

BERT_CFG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=64)
GPT2_CFG = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
VIT_CFG = dict(image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=37)
RESNET_CFG = dict(embedding_size=8, hidden_sizes=[16, 24, 32, 40], depths=[1, 2, 1, 1])

# name -> (HF model class, HF config, zoo class, settings given to the reader)
CASES = {
    "bert": (transformers.BertModel, transformers.BertConfig(**BERT_CFG), Bert, {}),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(**GPT2_CFG), GPT2, {}),
    # not the defaults: inner width, per-layer attention scale, another activation
    "gpt2-variant": (transformers.GPT2LMHeadModel,
                     transformers.GPT2Config(**GPT2_CFG, n_inner=40, scale_attn_by_inverse_layer_idx=True,
                                             activation_function="relu"), GPT2, {}),
    "vit": (transformers.ViTModel, transformers.ViTConfig(**VIT_CFG), ViT, {}),
    "resnet-bottleneck": (transformers.ResNetModel, transformers.ResNetConfig(**RESNET_CFG), ResNet,
                          {"image_size": IMAGE}),
    "resnet-bottleneck-variant": (transformers.ResNetModel,
                                  transformers.ResNetConfig(**RESNET_CFG, downsample_in_bottleneck=True,
                                                            downsample_in_first_stage=True, hidden_act="gelu"),
                                  ResNet, {"image_size": IMAGE}),
    "resnet-basic": (transformers.ResNetModel, transformers.ResNetConfig(**RESNET_CFG, layer_type="basic"),
                     ResNet, {"image_size": IMAGE}),
}
TEXT = {"bert", "gpt2", "gpt2-variant"}
MAX_ERRORS: dict[str, float] = {}


def randomise_batchnorm(model) -> None:
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=gen) * 2 - 1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=gen) - 0.5)


def save_hf(cls, config, path: Path):
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        randomise_batchnorm(model)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """name -> (HF model, checkpoint dir, zoo model, params), each built on first use."""
    root = tmp_path_factory.mktemp("hf")
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            hf_cls, config, zoo_cls, given = CASES[name]
            hf_model = save_hf(hf_cls, config, root / name)
            model, params = load_pretrained(zoo_cls, root / name, given)
            cache[name] = (hf_model, root / name, model, params)
        return cache[name]

    return get


def scale_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.isfinite(got).all()
    return float(np.abs(got - want).max() / np.abs(want).max())


def text_inputs(rng, batch: int, seq: int, pad_some: bool = True):
    ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int32)
    types = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    lengths = rng.integers(1, seq + 1, batch) if pad_some else np.full(batch, seq)
    lengths[0] = seq  # one full row; the others (likely) right-padded
    if pad_some and batch > 1:
        lengths[1] = max(1, seq - 3)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    return ids, mask, types, lengths


def run_hf(name, hf_model, xs):
    with torch.no_grad():
        if name == "bert":
            out = hf_model(input_ids=torch.tensor(xs[0], dtype=torch.long),
                           attention_mask=torch.tensor(xs[1], dtype=torch.long),
                           token_type_ids=torch.tensor(xs[2], dtype=torch.long))
            return {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}
        if name.startswith("gpt2"):
            out = hf_model(input_ids=torch.tensor(xs[0], dtype=torch.long),
                           attention_mask=torch.tensor(xs[1], dtype=torch.long))
            return {"logits": out.logits.numpy()}
        out = hf_model(pixel_values=torch.tensor(xs[0]))
        return {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}


def zoo_inputs(name, model, rng, batch, seq):
    if name in TEXT:
        ids, mask, types, lengths = text_inputs(rng, batch, seq)
        xs = (ids, mask, types) if name == "bert" else (ids, mask)
        return xs, lengths
    c, h, w = model.inputs()["pixel_values"][1:]
    return (rng.standard_normal((batch, c, h, w)).astype(np.float32),), None


# --- numerics against transformers ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_transformers_at_two_shapes(name, ckpt):
    hf_model, _, model, params = ckpt(name)
    run = jax.jit(model.apply)
    rng = np.random.default_rng(0)
    worst = 0.0
    for batch, seq in [(1, 5), (3, 11)]:
        xs, lengths = zoo_inputs(name, model, rng, batch, seq)
        got, want = run(params, *xs), run_hf(name, hf_model, xs)
        assert set(got) == set(want)
        for key in want:
            g, w = np.asarray(got[key]), want[key]
            assert g.shape == w.shape and g.dtype == np.float32, key
            if lengths is not None and key != "pooler_output":
                errs = [scale_error(g[i, :n], w[i, :n]) for i, n in enumerate(lengths)]  # real positions only
                err = max(errs)
            else:
                err = scale_error(g, w)
            assert err < SCALE_TOL, (name, key, batch, seq, err)
            worst = max(worst, err)
    MAX_ERRORS[name] = worst
    print(f"{name}: max error / output scale {worst:.2e}")


def test_bert_from_a_prefixed_head_checkpoint(ckpt, tmp_path):
    """``BertForPreTraining`` writes ``bert.``-prefixed tensors plus its ``cls.*`` heads: same model."""
    hf_model = save_hf(transformers.BertForPreTraining, transformers.BertConfig(**BERT_CFG), tmp_path / "pt")
    model, params = load_pretrained(Bert, tmp_path / "pt")
    xs = text_inputs(np.random.default_rng(1), 2, 7)[:3]
    got = jax.jit(model.apply)(params, *xs)
    want = run_hf("bert", hf_model.bert, xs)
    assert scale_error(got["pooler_output"], want["pooler_output"]) < SCALE_TOL
    assert scale_error(got["last_hidden_state"][0], want["last_hidden_state"][0]) < SCALE_TOL


def test_gpt2_bare_model_and_resnet_classifier_checkpoints(tmp_path):
    """Unprefixed ``GPT2Model`` tensors and ``resnet.``-prefixed ``ResNetForImageClassification`` ones load."""
    hf = save_hf(transformers.GPT2Model, transformers.GPT2Config(**GPT2_CFG), tmp_path / "g")
    model, params = load_pretrained(GPT2, tmp_path / "g")
    np.testing.assert_array_equal(np.asarray(params["wte"]), hf.wte.weight.detach().numpy())
    labels = {0: "cat", 1: "dog", 2: "fox"}
    hf = save_hf(transformers.ResNetForImageClassification, transformers.ResNetConfig(**RESNET_CFG, id2label=labels),
                 tmp_path / "r")
    model, params = load_pretrained(ResNet, tmp_path / "r", {"image_size": IMAGE})
    assert model.task == "image_classification" and model.output_labels() == {"logits": ["cat", "dog", "fox"]}
    x = np.random.default_rng(2).standard_normal((2, 3, IMAGE, IMAGE)).astype(np.float32)
    with torch.no_grad():
        want = hf(pixel_values=torch.tensor(x)).logits.numpy()
    got = jax.jit(model.apply)(params, x)
    assert list(got) == ["logits"] and scale_error(got["logits"], want) < SCALE_TOL
    encoder, params = load_pretrained(ResNet, tmp_path / "r", {"image_size": IMAGE, "head": "none"})
    got = jax.jit(encoder.apply)(params, x)  # the encoder alone: its classifier skipped, said in the log
    assert scale_error(got["last_hidden_state"], run_hf("resnet", hf.resnet, (x,))["last_hidden_state"]) < SCALE_TOL


def test_vit_image_classifier_matches_hugging_face(tmp_path):
    """``ViTForImageClassification``: its ViT has no pooler, its classifier reads the first token's state."""
    hf = save_hf(transformers.ViTForImageClassification, transformers.ViTConfig(**VIT_CFG, num_labels=5), tmp_path)
    model, params = load_pretrained(ViT, tmp_path)
    assert model.task == "image_classification" and model.num_labels == 5
    assert "pooler" not in params and model.output_labels()["logits"][4] == "LABEL_4"
    x = np.random.default_rng(3).standard_normal((2, 3, IMAGE, IMAGE)).astype(np.float32)
    with torch.no_grad():
        want = hf(pixel_values=torch.tensor(x)).logits.numpy()
    assert scale_error(jax.jit(model.apply)(params, x)["logits"], want) < SCALE_TOL


def test_sharded_checkpoint_reads_like_one_file(ckpt, tmp_path):
    hf_model, _, model, params = ckpt("bert")
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _, again = load_pretrained(Bert, tmp_path)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)


# --- padding --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_right_padding_with_large_random_ids_changes_nothing(name, ckpt):
    _, _, model, params = ckpt(name)
    run = jax.jit(model.apply)
    rng = np.random.default_rng(3)
    lengths = [6, 2, 4]
    short = [text_inputs(rng, 1, n, pad_some=False)[:3] for n in lengths]  # each row unpadded, alone
    seq = 10
    ids = rng.integers(VOCAB // 2, VOCAB, (3, seq)).astype(np.int32)      # large ids in the padding
    types = rng.integers(0, 2, (3, seq)).astype(np.int32)
    mask = np.zeros((3, seq), np.int32)
    for i, (n, (i_ids, _, i_types)) in enumerate(zip(lengths, short)):
        ids[i, :n], types[i, :n], mask[i, :n] = i_ids[0], i_types[0], 1
    pick = (lambda a, b, c: (a, b, c)) if name == "bert" else (lambda a, b, c: (a, b))
    padded = run(params, *pick(ids, mask, types))
    for i, n in enumerate(lengths):
        alone = run(params, *pick(*short[i]))
        for key, want in alone.items():
            got = np.asarray(padded[key][i])
            got = got if key == "pooler_output" else got[:n]
            assert scale_error(got, np.asarray(want[0])) < SAME_TOL, (key, i)
    # A fully masked row stays finite (finfo.min, not -inf) and does not disturb the other rows.
    mask[2] = 0
    again = run(params, *pick(ids, mask, types))
    for key, value in again.items():
        assert np.isfinite(np.asarray(value)).all(), key
        np.testing.assert_array_equal(np.asarray(value[:2]), np.asarray(padded[key][:2]))


# --- jax.export with symbolic dims -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "resnet-bottleneck"])
def test_exports_with_symbolic_batch_and_seq(name, ckpt):
    _, _, model, params = ckpt(name)
    specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    if name in TEXT:
        shape = jax.export.symbolic_shape("b, s")
        args = [jax.ShapeDtypeStruct(shape, jnp.int32) for _ in model.inputs()]
        sizes = [(2, 5), (3, 9)]
    else:
        (b,) = jax.export.symbolic_shape("b")
        args = [jax.ShapeDtypeStruct((b, *model.inputs()["pixel_values"][1:]), jnp.float32)]
        sizes = [(1, None), (3, None)]
    exported = jax.export.export(jax.jit(lambda p, *xs: model.apply(p, *xs)))(specs, *args)
    assert "b" in str(exported.in_avals[-1].shape)
    call = jax.jit(exported.call)
    rng = np.random.default_rng(4)
    for batch, seq in sizes:
        xs, _ = zoo_inputs(name, model, rng, batch, seq)
        got, want = call(params, *xs), model.apply(params, *xs)
        for key in want:
            assert scale_error(got[key], want[key]) < SAME_TOL, (key, batch, seq)


# --- bad checkpoints ------------------------------------------------------------------------------

def copy_with(src: Path, dst: Path, edit=None, config_edit=None) -> Path:
    """A copy of a checkpoint dir whose tensors (a dict) and/or config (a dict) are edited in place."""
    shutil.copytree(src, dst)
    if edit is not None:
        tensors = load_file(src / "model.safetensors")
        edit(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if config_edit is not None:
        config = json.loads((src / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def one_line_error(fn, *fragments):
    with pytest.raises(CheckpointError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    return message


def test_missing_extra_misshapen_and_wrong_dtype_tensors(ckpt, tmp_path):
    _, src, _, _ = ckpt("bert")
    key = "encoder.layer.1.attention.self.key.weight"

    bad = copy_with(src, tmp_path / "missing", lambda t: t.pop(key))
    one_line_error(lambda: load_pretrained(Bert, bad), "missing tensor", key, "[32, 32]")

    extra = "encoder.layer.0.attention.self.rotary.weight"
    bad = copy_with(src, tmp_path / "extra", lambda t: t.update({extra: np.zeros((4,), np.float32)}))
    one_line_error(lambda: load_pretrained(Bert, bad), "unexpected tensor", extra)

    # a third layer's tensors in a 2-layer checkpoint: unexpected too
    def add_layer(t):
        t["encoder.layer.2.output.dense.bias"] = np.zeros((32,), np.float32)
    bad = copy_with(src, tmp_path / "layer", add_layer)
    one_line_error(lambda: load_pretrained(Bert, bad), "unexpected tensor", "encoder.layer.2.output.dense.bias")

    shape_key = "encoder.layer.0.intermediate.dense.weight"
    bad = copy_with(src, tmp_path / "shape", lambda t: t.update({shape_key: np.ascontiguousarray(t[shape_key].T)}))
    one_line_error(lambda: load_pretrained(Bert, bad), shape_key, "[32, 37]", "[37, 32]")

    bad = copy_with(src, tmp_path / "dtype", lambda t: t.update({key: t[key].astype(np.float64)}))
    one_line_error(lambda: load_pretrained(Bert, bad), key, "F64", "expected one of F32, BF16, F16")
    half = copy_with(src, tmp_path / "half", lambda t: t.update({key: t[key].astype(np.float16)}))
    _, params = load_pretrained(Bert, half)  # widened to float32: the checkpoint's values, exactly
    np.testing.assert_array_equal(params["layers"][1]["key"]["weight"], load_file(src / "model.safetensors")[key]
                                  .astype(np.float16).astype(np.float32))

    # known buffers are ignored, not reported
    ok = copy_with(src, tmp_path / "buffers",
                   lambda t: t.update({"embeddings.position_ids": np.arange(64, dtype=np.int64)[None]}))
    load_pretrained(Bert, ok)


def test_legacy_layernorm_names(ckpt, tmp_path):
    """``LayerNorm.gamma``/``beta`` (old TensorFlow-converted checkpoints) read as ``weight``/``bias``."""
    _, src, _, params = ckpt("bert")

    def legacy(t):
        for key in [k for k in t if "LayerNorm." in k]:
            old = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
            t[old] = t.pop(key)
    _, again = load_pretrained(Bert, copy_with(src, tmp_path / "legacy", legacy))
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)
    both = copy_with(src, tmp_path / "both", lambda t: t.update(
        {"embeddings.LayerNorm.gamma": t["embeddings.LayerNorm.weight"]}))
    one_line_error(lambda: load_pretrained(Bert, both), "embeddings.LayerNorm.", "second tensor")


def test_tied_and_buffer_tensors_of_gpt2_are_skipped(ckpt, tmp_path):
    _, src, _, params = ckpt("gpt2")

    def old_style(t):  # old GPT-2 checkpoints: attn.bias / attn.masked_bias buffers and an explicit lm_head
        t["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        t["transformer.h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
        t["lm_head.weight"] = t["transformer.wte.weight"].copy()
    _, again = load_pretrained(GPT2, copy_with(src, tmp_path / "old", old_style))
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)
    bad = copy_with(src, tmp_path / "untied", config_edit=lambda c: c.update(tie_word_embeddings=False))
    one_line_error(lambda: load_pretrained(GPT2, bad), "tie_word_embeddings=False")


def test_other_architecture_and_contradicting_sizes(ckpt, tmp_path):
    _, bert_dir, _, _ = ckpt("bert")
    _, gpt2_dir, _, _ = ckpt("gpt2")
    one_line_error(lambda: load_pretrained(Bert, gpt2_dir), "'gpt2'", "GPT2LMHeadModel", "model=bert")
    one_line_error(lambda: load_pretrained(GPT2, bert_dir), "'bert'", "model=gpt2")
    one_line_error(lambda: load_pretrained(Bert, bert_dir, {"hidden_size": 512}), "hidden_size=512",
                   "hidden_size=32")
    one_line_error(lambda: load_pretrained(Bert, bert_dir, {"hidden_dim": 32}), "'hidden_dim'")
    # a setting equal to the checkpoint's, or one the checkpoint lacks, is fine
    model, _ = load_pretrained(Bert, bert_dir, {"hidden_size": 32, "num_hidden_layers": 2})
    assert model.hidden_size == 32
    bad = copy_with(bert_dir, tmp_path / "decoder", config_edit=lambda c: c.update(is_decoder=True))
    one_line_error(lambda: load_pretrained(Bert, bad), "is_decoder=True")
    one_line_error(lambda: load_pretrained(Bert, tmp_path), "config.json")
    bad = copy_with(bert_dir, tmp_path / "noweights")
    (bad / "model.safetensors").unlink()
    one_line_error(lambda: load_pretrained(Bert, bad), "model.safetensors")


def test_checkpoint_without_a_pooler_says_so(tmp_path):
    """``BertForMaskedLM`` (like ``ViTForImageClassification``) saves its model without the pooler: the bare
    encoder (head none), which has one, cannot be read from it."""
    save_hf(transformers.BertForMaskedLM, transformers.BertConfig(**BERT_CFG), tmp_path)
    one_line_error(lambda: load_pretrained(Bert, tmp_path, {"head": "none"}), "missing tensor bert.pooler.dense.",
                   "no pooler")


# --- the dataclasses ------------------------------------------------------------------------------

HF_CONFIGS = {Bert: transformers.BertConfig, GPT2: transformers.GPT2Config, ViT: transformers.ViTConfig,
              ResNet: transformers.ResNetConfig}


@pytest.mark.parametrize("cls", list(HF_CONFIGS), ids=lambda c: c.__name__)
def test_fields_are_config_keys_with_the_default_sizes(cls):
    hf_default = HF_CONFIGS[cls]()
    model = cls()
    for f in dataclasses.fields(cls):
        if (cls is ResNet and f.name == "image_size") or f.name in ("head", "labels", "pooling", "normalize"):
            continue  # not config keys: the head comes from architectures, the labels from id2label, pooling is ours
        want = getattr(hf_default, f.name)
        if cls is ViT and f.name == "pooler_output_size":
            assert model.pooler_size == want
            continue
        got = getattr(model, f.name)
        assert (tuple(want) if isinstance(want, list) else want) == got, f.name
    # every parameter of the full-size model has a checkpoint name (shapes only, nothing allocated)
    names = checkpoint_names(model)
    assert len(names) == len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0))))


def test_shapes_inputs_and_activation_errors():
    assert ViT().inputs() == {"pixel_values": ["batch", 3, 224, 224]}
    assert ResNet().inputs() == {"pixel_values": ["batch", 3, 224, 224]}
    assert ResNet.name == "resnet50" and Bert.name == "bert" and GPT2.name == "gpt2" and ViT.name == "vit"
    assert Bert().inputs() == {n: ["batch", "seq"] for n in ("input_ids", "attention_mask", "token_type_ids")}
    assert GPT2.padding == Bert.padding == {"batch": "rows", "seq": {"mask_input": "attention_mask"}}
    out = jax.eval_shape(ViT().apply, jax.eval_shape(ViT().init, jax.random.PRNGKey(0)),
                         jax.ShapeDtypeStruct((2, 3, 224, 224), jnp.float32))
    assert out["last_hidden_state"].shape == (2, 197, 768) and out["pooler_output"].shape == (2, 768)
    out = jax.eval_shape(ResNet().apply, jax.eval_shape(ResNet().init, jax.random.PRNGKey(0)),
                         jax.ShapeDtypeStruct((2, 3, 224, 224), jnp.float32))
    assert out["last_hidden_state"].shape == (2, 2048, 7, 7) and out["pooler_output"].shape == (2, 2048, 1, 1)
    with pytest.raises(ValueError, match="hidden_act='geglu'.*gelu, gelu_fast"):
        Bert(hidden_act="geglu")
    with pytest.raises(ValueError, match="activation_function='nope'"):
        GPT2(activation_function="nope")
    assert ResNet(hidden_sizes=[8, 16], depths=[1, 1]).hidden_sizes == (8, 16)
    # random init runs and gives float32 trees
    for model in (Bert(**{k: v for k, v in BERT_CFG.items()}), GPT2(**{k: v for k, v in GPT2_CFG.items()
                                                                       if k not in ("bos_token_id", "eos_token_id")})):
        leaves = jax.tree_util.tree_leaves(model.init(jax.random.PRNGKey(0)))
        assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float32)}


def test_gpt2s_attention_mask_may_be_left_out_as_hugging_face_fills_it(ckpt):
    """GPT-2 takes input_ids alone, its attention_mask ones (GPT2Model's default), as the BERT and Llama families do."""
    import tripy_build as tb
    from tripy_build.models import input_infos

    hf_model, _, model, params = ckpt("gpt2")
    infos = input_infos(model, {"batch": (1, 2, 2), "seq": (1, 5, 5)})
    assert infos["attention_mask"].default == 1
    exe = tb.compile(model.apply, args=[params, *infos.values()])
    ids = np.random.default_rng(3).integers(0, model.vocab_size, (2, 5)).astype(np.int32)
    with torch.no_grad():
        want = hf_model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert scale_error(np.asarray(exe(input_ids=ids)["logits"]), want) <= 1e-4
