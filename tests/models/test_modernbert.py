"""ModernBERT (``model_type: modernbert``) from Hugging Face checkpoints, against transformers on CPU.

Two tiny configurations, each as a ``save_pretrained`` checkpoint of every head (the bare model, sequence and token
classification, question answering, masked LM), its weights jittered so that no bias is zero and no LayerNorm the
identity: ``plain``, ModernBERT-base's settings (no biases, ``classifier_pooling: cls``) in 3 layers, global ones every
second and a window of 2 keys either side in the local one, the two rotary bases far apart; and ``biased``, every
bias on (``norm_bias``, ``attention_bias``, ``mlp_bias``, ``classifier_bias``; ``decoder_bias`` off), ``mean``
pooling, an odd ``local_attention`` (5: 2 either side), the layer types named (``layer_types``: local, global, local)
and other activations. Outputs match PyTorch's eager attention within 1e-5 of the output's scale at two shapes
longer than the window, at the real positions of right-padded rows (random ids in the padding). A padded batch
equals its rows alone; an older config.json (``global_attn_every_n_layers``, ``global_rope_theta``,
``local_rope_theta``, no ``classifier_pooling``) reads as transformers reads it; sentence embeddings (``pooling``)
of the encoder; one classifier built through the command line (``model=hf``) and called through both loaders,
against PyTorch's default (sdpa) attention; settings the model does not implement are refused in one line naming
the key; the defaults are ModernBERT-base's.
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

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.cli import help as cli_help  # noqa: E402
from tripy_build.models import MODELS, ModernBert, hf  # noqa: E402

from conftest import compare_outputs, run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-5  # against PyTorch: max abs error / max abs reference value
SAME_TOL = 1e-5   # padded against unpadded, both ours
VOCAB = 60
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)  # within the vocabulary
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=40, **IDS)
CONFIGS = {
    "plain": dict(BASE, global_attn_every_n_layers=2, local_attention=4, global_rope_theta=1000.0,
                  local_rope_theta=20.0, classifier_pooling="cls"),
    "biased": dict(BASE, layer_types=["sliding_attention", "full_attention", "sliding_attention"], local_attention=5,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 30.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}},
                   norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=False,
                   classifier_pooling="mean", hidden_activation="gelu_pytorch_tanh", classifier_activation="silu",
                   norm_eps=1e-6),
}
HEADS = {"Model": "none", "ForSequenceClassification": "sequence_classification",
         "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering",
         "ForMaskedLM": "masked_lm"}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SHAPES = [(2, 7, [7, 4]), (3, 13, [13, 9, 1])]  # past the window of 2 either side; a row of one real token
MAX_ERRORS: dict[str, float] = {}


def save(tmp_path_factory, config: str, suffix: str, attn: str = "eager", **changes):
    """The PyTorch model (weights jittered) and its save_pretrained directory."""
    labels = {"id2label": LABELS} if "Classification" in suffix else {}
    torch.manual_seed(0)
    hf_config = transformers.ModernBertConfig(**{**CONFIGS[config], **changes}, **labels)
    model = getattr(transformers, "ModernBert" + suffix)(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(f"modernbert-{config}-{suffix}")
    model.save_pretrained(path)
    model.config._attn_implementation = attn  # read at each call: eager, as the padded computation is written
    return model, path


def inputs(batch: int, seq: int, real: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids (random ids in the padding too, where attention_mask is 0)."""
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(3, VOCAB, (batch, seq)).astype(np.int32),
            "attention_mask": (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)}


def torch_run(model, x: dict) -> object:
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()})


def compare(ours: dict, theirs, mask: np.ndarray) -> float:
    return compare_outputs(ours, theirs, mask, ("last_hidden_state", "logits", "start_logits", "end_logits"), SCALE_TOL)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("suffix", list(HEADS))
def test_every_head_matches_pytorch(config, suffix, tmp_path_factory):
    model, path = save(tmp_path_factory, config, suffix)
    assert hf.model_name(path) == "modernbert"
    zoo, params = hf.load_pretrained(MODELS["modernbert"], path)
    assert type(zoo) is ModernBert and zoo.task == HEADS[suffix]
    assert zoo.kinds() == tuple(model.config.layer_types) and "sliding_attention" in zoo.kinds()
    assert "attn_norm" not in params["layers"][0] and "attn_norm" in params["layers"][1]  # layer 0's: nn.Identity
    apply = zoo.apply  # eagerly: op by op is faster here than compiling each shape
    for batch, seq, real in SHAPES:
        x = inputs(batch, seq, real, seed=seq)
        error = compare(apply(params, **x), torch_run(model, x), x["attention_mask"])
        MAX_ERRORS[f"{config}-{suffix}"] = max(MAX_ERRORS.get(f"{config}-{suffix}", 0.0), error)
    want = list(LABELS.values()) if "Classification" in suffix else None
    assert zoo.output_labels() == ({"logits": want} if want else {})


@pytest.mark.parametrize("suffix", ["Model", "ForSequenceClassification"])
def test_a_padded_batch_equals_its_rows_alone(suffix, tmp_path_factory):
    """Each row alone against the rows padded to 12 with random ids and mask 0 there: rotary positions count from 0,
    the window sees j - i, the mean pools over the real tokens (``biased``: mean pooling)."""
    _, path = save(tmp_path_factory, "biased", suffix)
    zoo, params = hf.load_pretrained(ModernBert, path)
    run = zoo.apply  # eagerly: faster here than compiling four shapes
    lengths, seq = [9, 2, 5], 12
    x = inputs(3, seq, lengths, seed=3)
    padded = run(params, **x)
    name = "last_hidden_state" if suffix == "Model" else "logits"
    for i, n in enumerate(lengths):
        alone = run(params, x["input_ids"][i:i + 1, :n], np.ones((1, n), np.int32))
        got = np.asarray(padded[name][i, :n] if suffix == "Model" else padded[name][i])
        want = np.asarray(alone[name][0])
        assert np.abs(got - want).max() <= SAME_TOL * np.abs(want).max(), i


def test_an_older_config_json_reads_as_transformers_reads_it(tmp_path_factory):
    """ModernBERT-base's config.json (transformers 4): global_attn_every_n_layers, global_rope_theta and
    local_rope_theta, no layer_types or rope_parameters, no classifier_pooling (cls, ModernBertConfig's default,
    where the zoo's is ModernBERT-base's mean); layer_norm_eps beside norm_eps, which transformers never reads."""
    _, path = save(tmp_path_factory, "plain", "ForSequenceClassification")
    config = json.loads((path / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "classifier_pooling"):
        del config[key]
    config.update(global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=20.0, layer_norm_eps=0.5)
    (path / "config.json").write_text(json.dumps(config))
    model = transformers.ModernBertForSequenceClassification.from_pretrained(path, attn_implementation="eager").eval()
    assert model.config.classifier_pooling == "cls" and model.config.layer_types[1] == "sliding_attention"
    zoo, params = hf.load_pretrained(ModernBert, path)
    assert zoo.classifier_pooling == "cls" and (zoo.global_rope_theta, zoo.local_rope_theta) == (1000.0, 20.0)
    assert zoo.kinds() == ("full_attention", "sliding_attention", "full_attention") and zoo.norm_eps == 1e-5
    x = inputs(2, 11, [11, 6], seed=5)
    compare(zoo.apply(params, **x), torch_run(model, x), x["attention_mask"])


def test_sentence_embeddings_of_the_encoder(tmp_path_factory):
    """pooling=mean normalize=true (nomic-ai/modernbert-embed-base's) and pooling=cls (gte-modernbert-base's): the
    encoder alone, from a classifier's checkpoint too (its head skipped), over PyTorch's states."""
    model, path = save(tmp_path_factory, "plain", "Model")
    x = inputs(2, 10, [10, 3], seed=4)
    states = torch_run(model, x).last_hidden_state.numpy()
    mask = x["attention_mask"][..., None]
    mean = (states * mask).sum(1) / mask.sum(1)
    for settings, want in (({"pooling": "mean", "normalize": True}, mean / np.linalg.norm(mean, axis=-1, keepdims=True)),
                           ({"pooling": "cls"}, states[:, 0])):
        zoo, params = hf.load_pretrained(ModernBert, path, settings)
        out = zoo.apply(params, **x)
        assert sorted(out) == ["last_hidden_state", "sentence_embedding"]
        error = float(np.abs(np.asarray(out["sentence_embedding"]) - want).max() / np.abs(want).max())
        assert error <= SCALE_TOL
        MAX_ERRORS["sentence_embedding"] = max(MAX_ERRORS.get("sentence_embedding", 0.0), error)
    _, path = save(tmp_path_factory, "plain", "ForSequenceClassification")
    zoo, _ = hf.load_pretrained(ModernBert, path, {"pooling": "mean"})
    assert zoo.task == "none"


def test_model_hf_builds_a_classifier_with_its_head(tmp_path_factory, tmp_path):
    """model=hf reads config.json's architectures: the artifact (under modernbert) has the head's logits and the
    classes' names; both loaders match PyTorch (its default attention, sdpa) at an unpadded and a padded (batch, seq),
    the build having proven the padding with random ids in it."""
    model, path = save(tmp_path_factory, "biased", "ForSequenceClassification", attn="sdpa")
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,2,2]", "shapes.dims.seq=[1,16,16]",
                   "shapes.buckets.batch=[2]", "shapes.buckets.seq=[16]", f"artifacts_dir={tmp_path / 'arts'}",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "modernbert").iterdir())
    manifest = json.loads((art / "manifest.json").read_text())
    settings = manifest["metadata"]["build_key_parts"]["config"]["model"]
    assert settings["head"] == "sequence_classification" and settings["name"] == "modernbert"
    assert settings["classifier_pooling"] == "mean" and settings["layer_types"][1] == "full_attention"
    assert manifest["metadata"]["labels"] == {"logits": list(LABELS.values())}
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for batch, seq, real in [(2, 16, [16, 16]), (2, 11, [11, 6]), (1, 5, [3])]:  # 11 and 5 run padded
            x = inputs(batch, seq, real, seed=seq)
            ours = exe(**x)
            assert list(ours) == ["logits"]
            compare({k: np.asarray(v) for k, v in ours.items()}, torch_run(model, x), x["attention_mask"])


@pytest.mark.parametrize("change,says", [
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False, but ModernBert implements only tie_word_embeddings=True"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10.0},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0}}),
     "rope_parameters.sliding_attention: rope_type='linear' is not implemented"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling: rope_type='dynamic' is not implemented"),
    (dict(classifier_pooling="max"), "classifier_pooling='max' is not implemented; one of cls, mean"),
    (dict(layer_types=["full_attention", "chunked_attention", "full_attention"]),
     "layer_types holds ['chunked_attention']; ModernBERT implements full_attention, sliding_attention"),
    (dict(layer_types=["full_attention"]), "layer_types names 1 layers, but num_hidden_layers is 3"),
    (dict(hidden_activation="swiglu"), "hidden_activation='swiglu' is not supported"),
    (dict(classifier_activation="swiglu"), "classifier_activation='swiglu' is not supported"),
])
def test_a_setting_not_implemented_is_refused_in_one_line(change, says, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "modernbert", "architectures": [
        "ModernBertForSequenceClassification"], **CONFIGS["plain"], **change}))
    with pytest.raises(hf.CheckpointError) as e:
        hf.model_from_config(MODELS["modernbert"], tmp_path)
    assert says in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_the_command_line_refuses_in_one_line_and_builds_at_random(tmp_path_factory, tmp_path):
    _, path = save(tmp_path_factory, "plain", "ForMaskedLM", tie_word_embeddings=False)
    proc = run_cli("model=hf", f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "tie_word_embeddings=False, but ModernBert implements only" in proc.stderr and not (tmp_path / "a").exists()
    tiny = ["model.num_hidden_layers=2", "model.hidden_size=16", "model.num_attention_heads=2",
            "model.intermediate_size=24", f"model.vocab_size={VOCAB}", "model.local_attention=4",
            "model.max_position_embeddings=16"]
    too_long = run_cli("model=modernbert", *tiny, "shapes.dims.seq=[1,8,17]", f"artifacts_dir={tmp_path / 'b'}",
                       cwd=tmp_path)
    assert too_long.returncode == 2 and "rotary positions were trained up to max_position_embeddings=16" \
        in too_long.stderr, too_long.stderr
    random = run_cli("model=modernbert", *tiny, "shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,8,8]",
                     "shapes.buckets.seq=[8]", f"artifacts_dir={tmp_path / 'c'}", cwd=tmp_path, timeout=600)
    assert random.returncode == 0, random.stderr[-3000:]
    exe = runtime.load(next((tmp_path / "c" / "modernbert").iterdir()))
    assert exe.output_names == ["last_hidden_state"]
    assert np.asarray(exe(**inputs(1, 6, [6]))["last_hidden_state"]).shape == (1, 6, 16)


def test_the_defaults_are_modernbert_bases(tmp_path):
    """answerdotai/ModernBERT-base's config.json (as published, transformers 4's keys) reads as the zoo's defaults with
    its masked-LM head; every setting but classifier_pooling is ModernBertConfig's default; every parameter of the
    full-size model has a checkpoint name (shapes only, nothing allocated); --help lists the architectures."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["ModernBertForMaskedLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 50281, "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
        "classifier_pooling": "mean", "cls_token_id": 50281, "decoder_bias": True, "deterministic_flash_attn": False,
        "embedding_dropout": 0.0, "eos_token_id": 50282, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
        "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 768,
        "initializer_cutoff_factor": 2.0, "initializer_range": 0.02, "intermediate_size": 1152,
        "layer_norm_eps": 1e-05, "local_attention": 128, "local_rope_theta": 10000.0, "max_position_embeddings": 8192,
        "mlp_bias": False, "mlp_dropout": 0.0, "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05,
        "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283, "position_embedding_type": "absolute",
        "sep_token_id": 50282, "tie_word_embeddings": True, "torch_dtype": "float32", "vocab_size": 50368}))
    assert hf.model_from_config(ModernBert, tmp_path) == ModernBert(head="masked_lm")
    hf_default, model = transformers.ModernBertConfig(), ModernBert()
    ours = {"head", "num_labels", "labels", "pooling", "normalize", "layer_types", "rope_parameters", "rope_scaling",
            "global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"}
    for f in dataclasses.fields(ModernBert):
        if f.name not in ours:
            assert getattr(model, f.name) == {"classifier_pooling": "mean"}.get(f.name, getattr(hf_default, f.name)), f.name
    assert model.kinds() == tuple(hf_default.layer_types)
    assert (model.global_rope_theta, model.local_rope_theta) == tuple(
        hf_default.rope_parameters[k]["rope_theta"] for k in ("full_attention", "sliding_attention"))
    model = ModernBert(head="sequence_classification")
    names = hf.checkpoint_names(model)
    assert len(names) == len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0))))
    assert names["layers.0.attn.Wqkv.weight"] == ("layers.0.qkv.weight", (2304, 768))
    assert names["layers.1.mlp.Wi.weight"] == ("layers.1.wi.weight", (2304, 768))
    assert names["/head.dense.weight"] == ("head.dense.weight", (768, 768)) and "/head.dense.bias" not in names
    assert names["/classifier.bias"] == ("head.out.bias", (2,))
    assert model.inputs() == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert model.max_positions() == 8192
    shown = cli_help.text()
    assert "model=modernbert" in shown and "ModernBertForSequenceClassification" in shown
