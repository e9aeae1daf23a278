"""MPNet (``models/mpnet.py``) from Hugging Face checkpoints, against transformers' PyTorch MPNet on CPU.

Each head (the bare model, sequence and token classification, question answering, masked LM) as a tiny
``save_pretrained`` checkpoint (its relative position bias drawn at std 1, where Hugging Face's init of 0.02 would
hide it): read through ``models/hf.py`` and run under ``jax.jit``, its outputs within 1e-4 of the output's scale of
PyTorch's at two shapes, right-padded rows (pad ids, ``attention_mask`` 0) compared at their real positions; the
buckets of the relative position bias against transformers' own; padding with random ids changes nothing. Through
the command line: all-mpnet-base-v2's use (``model.pooling=mean model.normalize=true``) against sentence-transformers'
definition from PyTorch's states, by both loaders; ``model=mpnet`` at random weights; unsupported settings refused
in one line.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import transformers  # noqa: E402
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, MPNet, hf  # noqa: E402
from tripy_build.models.mpnet import position_bias, relative_position_bucket  # noqa: E402

from conftest import compare_outputs, run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4  # against PyTorch: max abs error / max abs reference value
SAME_TOL = 1e-5   # padded against unpadded, both ours
VOCAB = 60
PAD = 1  # MPNet's pad id, where its positions count from
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=40)
HEADS = {"Model": "none", "ForSequenceClassification": "sequence_classification",
         "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering",
         "ForMaskedLM": "masked_lm"}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SHAPES = [(2, 7, [7, 4]), (3, 20, [20, 13, 1])]  # 20 tokens reach the logarithmic buckets (distance 8 and more)
MAX_ERRORS: dict[str, float] = {}


def save(tmp_path_factory, suffix: str, **settings):
    """The PyTorch model and its save_pretrained directory (three named classes for a classifier)."""
    labels = {"id2label": LABELS} if "Classification" in suffix else {}
    torch.manual_seed(0)
    model = getattr(transformers, "MPNet" + suffix)(transformers.MPNetConfig(**{**CONFIG, **settings}, **labels)).eval()
    with torch.no_grad():
        model.base_model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
    path = tmp_path_factory.mktemp(f"mpnet-{suffix}")
    model.save_pretrained(path)
    return model, path


def inputs(batch: int, seq: int, real: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids, the pad id once among the real ones (a pad row, as Hugging Face counts it); right-padded rows
    hold the pad id where ``attention_mask`` is 0, as a tokenizer pads them."""
    ids = np.random.default_rng(seed).integers(2, VOCAB, (batch, seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)
    ids[0, seq // 2] = PAD
    ids[mask == 0] = PAD
    return {"input_ids": ids, "attention_mask": mask}


def torch_run(model, x: dict) -> object:
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()})


def compare(ours: dict, theirs, mask: np.ndarray) -> float:
    return compare_outputs(ours, theirs, mask, ("last_hidden_state", "pooler_output", "logits", "start_logits",
                                                "end_logits"), SCALE_TOL)


def sentence_transformers_embedding(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling (mean over attention_mask) and Normalize, from PyTorch's states."""
    keep = mask[..., None].astype(np.float32)
    mean = (states * keep).sum(1) / np.maximum(keep.sum(1), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


def test_relative_position_buckets_and_bias_are_transformers():
    distance = np.arange(-700, 701)
    np.testing.assert_array_equal(relative_position_bucket(distance),
                                  MPNetEncoder.relative_position_bucket(torch.tensor(distance)).numpy())
    encoder = MPNetEncoder(transformers.MPNetConfig(**CONFIG))
    with torch.no_grad():
        encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
        want = encoder.compute_position_bias(torch.zeros(1, 150, 32)).numpy()  # distances past 128 included
    got = np.asarray(position_bias(encoder.relative_attention_bias.weight.detach().numpy(), 150))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("suffix", list(HEADS))
def test_every_head_matches_pytorch(suffix, tmp_path_factory):
    settings = {"ForTokenClassification": {"relative_attention_num_buckets": 40},  # the rows past 32: never read
                "ForMaskedLM": {"hidden_act": "relu"}}.get(suffix, {})  # the LM head's own GELU all the same
    model, path = save(tmp_path_factory, suffix, **settings)
    assert hf.model_name(path) == "mpnet"
    zoo, params = hf.load_pretrained(MODELS["mpnet"], path)
    assert type(zoo) is MPNet and zoo.task == HEADS[suffix]
    run = jax.jit(zoo.apply)
    for batch, seq, real in SHAPES:
        x = inputs(batch, seq, real, seed=seq)
        error = compare(run(params, x["input_ids"], x["attention_mask"]), torch_run(model, x), x["attention_mask"])
        MAX_ERRORS[suffix] = max(MAX_ERRORS.get(suffix, 0.0), error)
    want = LABELS.values() if "Classification" in suffix else None
    assert zoo.output_labels() == ({"logits": list(want)} if want else {})


def test_right_padding_with_random_ids_changes_nothing(tmp_path_factory):
    """Each row alone against the rows padded to 12 with random ids (the pad id among them) and mask 0 there:
    the relative bias sees only j - i, and no padding moves a real position."""
    _, path = save(tmp_path_factory, "Model")
    zoo, params = hf.load_pretrained(MPNet, path)
    run = jax.jit(zoo.apply)
    rng = np.random.default_rng(3)
    lengths, seq = [9, 2, 5], 12
    ids = rng.integers(0, VOCAB, (3, seq)).astype(np.int32)
    ids[:, -1] = PAD
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    padded = run(params, ids, mask)
    for i, n in enumerate(lengths):
        alone = run(params, ids[i:i + 1, :n], np.ones((1, n), np.int32))
        got = np.asarray(padded["last_hidden_state"][i, :n])
        want = np.asarray(alone["last_hidden_state"][0])
        assert np.abs(got - want).max() <= SAME_TOL * np.abs(want).max(), i
        np.testing.assert_allclose(padded["pooler_output"][i], alone["pooler_output"][0], atol=SAME_TOL)


def test_all_mpnet_base_v2_sentence_embeddings_build_and_match(tmp_path_factory, tmp_path):
    """model=hf model.pooling=mean model.normalize=true: sentence-transformers' embedding (mean over the mask,
    unit length) of PyTorch's MPNetModel states, from both loaders, unpadded and padded (to a bucket, and the
    caller's pad ids); the encoder's own outputs beside it."""
    model, path = save(tmp_path_factory, "Model")
    proc = run_cli("model=hf", f"params.checkpoint={path}", "model.pooling=mean", "model.normalize=true",
                   "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[8,16]",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "mpnet").iterdir())
    config = json.loads((art / "manifest.json").read_text())["metadata"]["build_key_parts"]["config"]["model"]
    assert config["name"] == "mpnet" and config["head"] == "none" and config["pooling"] == "mean"
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for batch, seq, real in [(2, 8, [8, 8]), (2, 11, [11, 4]), (1, 5, [3])]:  # 11 and 5 run padded
            x = inputs(batch, seq, real, seed=seq)
            ours = {k: np.asarray(v) for k, v in exe(**x).items()}
            theirs = torch_run(model, x)
            want = sentence_transformers_embedding(theirs.last_hidden_state.numpy(), x["attention_mask"])
            got = ours.pop("sentence_embedding")
            assert got.shape == (batch, 32) and np.abs(got - want).max() <= SCALE_TOL, (seq, np.abs(got - want).max())
            MAX_ERRORS["sentence_embedding"] = max(MAX_ERRORS.get("sentence_embedding", 0.0),
                                                   float(np.abs(got - want).max()))
            compare(ours, theirs, x["attention_mask"])


def test_a_config_naming_the_masked_lm_beside_the_encoders_tensors(tmp_path_factory):
    """all-mpnet-base-v2's config.json names MPNetForMaskedLM, its weights are MPNetModel's: a sentence embedding
    reads the encoder alone, as sentence-transformers does; without one, the head the config names is built and
    the encoder's pooler (which no masked LM has) is refused in one line."""
    model, path = save(tmp_path_factory, "Model")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["MPNetForMaskedLM"]}))
    zoo, params = hf.load_pretrained(MPNet, path, {"pooling": "mean", "normalize": True})
    assert zoo.task == "none"
    x = inputs(2, 9, [9, 6])
    got = np.asarray(zoo.apply(params, x["input_ids"], x["attention_mask"])["sentence_embedding"])
    want = sentence_transformers_embedding(torch_run(model, x).last_hidden_state.numpy(), x["attention_mask"])
    assert np.abs(got - want).max() <= SCALE_TOL
    with pytest.raises(hf.CheckpointError, match=r"^unexpected tensor pooler\.dense\.(weight|bias) in .*: MPNet \(head "
                                                 r"masked_lm\) with these settings has no parameter") as e:
        hf.load_pretrained(MPNet, path)
    assert len(str(e.value).splitlines()) == 1


def test_unsupported_settings_and_architectures_are_one_line(tmp_path_factory, tmp_path):
    _, path = save(tmp_path_factory, "ForMaskedLM", tie_word_embeddings=False)
    proc = run_cli("model=hf", f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "tie_word_embeddings=False, but MPNet implements only tie_word_embeddings=True" in proc.stderr
    assert not (tmp_path / "a").exists()
    _, path = save(tmp_path_factory, "Model", relative_attention_num_buckets=16)
    with pytest.raises(hf.CheckpointError, match=r"relative_attention_num_buckets=16: MPNetModel looks relative "
                                                 r"positions up in 32 buckets") as e:
        hf.load_pretrained(MPNet, path)
    assert len(str(e.value).splitlines()) == 1
    torch.manual_seed(0)
    transformers.MPNetForMultipleChoice(transformers.MPNetConfig(**CONFIG)).save_pretrained(tmp_path / "choice")
    with pytest.raises(hf.CheckpointError, match="'MPNetForMultipleChoice' is not an architecture the zoo builds"):
        hf.model_name(tmp_path / "choice")


def test_model_mpnet_builds_at_random_weights_and_help_lists_it(tmp_path):
    proc = run_cli("model=mpnet", "model.hidden_size=32", "model.num_attention_heads=4", "model.num_hidden_layers=1",
                   "model.intermediate_size=37", "model.vocab_size=60", "model.max_position_embeddings=18",
                   "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[16]",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exe = runtime.load(next((tmp_path / "arts" / "mpnet").iterdir()))
    assert exe.output_names == ["last_hidden_state", "pooler_output"]
    out = exe(**inputs(2, 11, [11, 6]))
    assert np.asarray(out["last_hidden_state"]).shape == (2, 11, 32)
    too_long = run_cli("model=mpnet", "model.max_position_embeddings=18", "shapes.dims.seq=[1,8,17]",
                       f"artifacts_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert too_long.returncode == 2 and "MPNet's position table holds 16 positions (max_position_embeddings=18)" \
        in too_long.stderr
    shown = run_cli("--help", timeout=300).stdout
    assert "model=mpnet" in shown and "MPNetForSequenceClassification" in shown


def test_fields_are_mpnet_config_keys_with_mpnet_base_sizes():
    """Every setting is MPNetConfig's key with its default, but for mpnet-base's checkpoint's 514 positions and
    layer_norm_eps 1e-5 (MPNetConfig's 512 and 1e-12 are no released model's); every parameter has a name."""
    hf_default, model = transformers.MPNetConfig(), MPNet()
    ours = {"head", "num_labels", "labels", "pooling", "normalize"}  # the head from architectures, pooling ours
    checkpoint = {"max_position_embeddings": 514, "layer_norm_eps": 1e-5}
    for f in dataclasses.fields(MPNet):
        if f.name not in ours:
            assert getattr(model, f.name) == checkpoint.get(f.name, getattr(hf_default, f.name)), f.name
    assert model.inputs() == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert model.max_positions() == 512
    names = hf.checkpoint_names(model)
    assert len(names) == len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0))))
    assert names["encoder.relative_attention_bias.weight"] == ("relative_attention_bias", (32, 12))
