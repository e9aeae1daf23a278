"""DeBERTa-v2/v3 (``model_type: deberta-v2``) from Hugging Face checkpoints, against transformers on CPU.

Two tiny configurations, each as a ``save_pretrained`` checkpoint of every head (the bare model, sequence and token
classification, question answering, masked LM; that also with ``legacy: false``, its head as ``lm_predictions``),
its weights jittered so that no bias is zero and no LayerNorm the identity: ``v3``, DeBERTa-v3's settings (relative
attention over log buckets, c2p|p2c through the shared key and query projections, the relative embeddings'
LayerNorm, no absolute positions, no token types), and ``v2``, DeBERTa-v2's (relative positions clipped at
max_relative_positions, their own position projections, absolute positions, token types, the first layer's
convolution, an embedding narrower than the hidden size). Outputs match PyTorch's within 1e-4 of the output's scale
at two shapes, at the real positions of right-padded rows (random ids in the padding). One artifact of each
configuration built through the command line (``model=hf``), called through both loaders at unpadded and padded
shapes. Settings the model does not implement are refused in one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from transformers.models.deberta_v2 import modeling_deberta_v2 as torch_deberta  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, DebertaV2, hf  # noqa: E402
from tripy_build.models.deberta import log_buckets  # noqa: E402

from conftest import compare_outputs, run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 60
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
CONFIGS = {
    "v3": dict(BASE, relative_attention=True, position_buckets=8, max_relative_positions=-1, max_position_embeddings=64,
               pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False),
    "v2": dict(BASE, relative_attention=True, max_relative_positions=6, max_position_embeddings=32, pos_att_type=["c2p", "p2c"],
               share_att_key=False, position_biased_input=True, type_vocab_size=2, conv_kernel_size=3, conv_act="gelu",
               embedding_size=24, pooler_hidden_act="tanh"),
}
HEADS = {"Model": "none", "ForSequenceClassification": "sequence_classification",
         "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering",
         "ForMaskedLM": "masked_lm"}
LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}


def save(tmp_path_factory, config: str, suffix: str, **changes):
    """The PyTorch model (weights jittered: no zero bias, v1's q_bias and v_bias included) and its save_pretrained
    directory; ``config`` one of ``CONFIGS``, or ``v1``: a ``Deberta*`` model of ``V1``."""
    labels = {"id2label": LABELS} if "Classification" in suffix else {}
    stem, config_class, settings = ("Deberta", transformers.DebertaConfig, V1) if config == "v1" else \
        ("DebertaV2", transformers.DebertaV2Config, CONFIGS[config])
    torch.manual_seed(0)
    model = getattr(transformers, stem + suffix)(config_class(**{**settings, **changes}, **labels)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(f"deberta-{config}-{suffix}")
    model.save_pretrained(path)
    return model, path


def inputs(batch: int, seq: int, real: list[int], types: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = {"input_ids": rng.integers(3, VOCAB, (batch, seq)).astype(np.int32),
         "attention_mask": (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)}
    if types:
        x["token_type_ids"] = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    return x


def torch_run(model, x: dict) -> object:
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()})


def compare(ours: dict, theirs, mask: np.ndarray) -> float:
    return compare_outputs(ours, theirs, mask, ("last_hidden_state", "logits", "start_logits", "end_logits"), SCALE_TOL)


@pytest.mark.parametrize("config,suffix,changes", [(c, s, {}) for c in CONFIGS for s in HEADS]
                         + [("v3", "ForMaskedLM", {"legacy": False})],  # its head as lm_predictions: the same math
                         ids=lambda v: ("-".join(f"{k}={x}" for k, x in v.items()) or "as-saved") if isinstance(v, dict) else v)
def test_every_head_matches_pytorch(config, suffix, changes, tmp_path_factory):
    model, path = save(tmp_path_factory, config, suffix, **changes)
    assert hf.model_name(path) == "deberta-v2"
    zoo, params = hf.load_pretrained(DebertaV2, path)
    assert zoo.task == HEADS[suffix] and zoo.relative_attention and zoo.legacy == changes.get("legacy", True)
    apply = zoo.apply  # eagerly: op by op is faster here than compiling each shape
    for batch, seq, real in [(2, 7, [7, 4]), (3, 13, [13, 9, 1])]:  # 13: past the buckets' log range, and the clip
        x = inputs(batch, seq, real, zoo.type_vocab_size > 0, seed=seq)
        compare(apply(params, *x.values()), torch_run(model, x), x["attention_mask"])
    want = list(LABELS.values()) if "Classification" in suffix else None
    assert zoo.output_labels() == ({"logits": want} if want else {})


def test_log_buckets_and_relative_positions_are_pytorchs():
    """The bucket of every distance up to 3000, for deberta-v3-base's (256 buckets of 512 positions) and others;
    the [seq, seq] relative positions as build_relative_position makes them, clipped alike past the table."""
    for buckets, positions in ((256, 512), (8, 64), (7, 30), (64, 128)):
        table = log_buckets(buckets, positions, buckets)
        distance = np.arange(-3000, 3001)
        want = torch_deberta.make_log_bucket_position(torch.tensor(distance), buckets, positions).long().numpy()
        ours = np.sign(distance) * table[np.minimum(np.abs(distance), len(table) - 1)]
        span = buckets  # every index the gathers read, c2p's and p2c's, is the same
        assert (np.clip(ours + span, 0, 2 * span - 1) == np.clip(want + span, 0, 2 * span - 1)).all()
        assert (np.clip(-ours + span, 0, 2 * span - 1) == np.clip(-want + span, 0, 2 * span - 1)).all()
        assert (ours[np.abs(distance) < len(table)] == want[np.abs(distance) < len(table)]).all()
    model = DebertaV2(position_buckets=8, max_position_embeddings=64)
    states = torch.zeros(1, 40, 4)
    want = torch_deberta.build_relative_position(states, states, bucket_size=8, max_position=64)[0].numpy()
    assert (np.asarray(model.relative_positions(40)) == want).all()


@pytest.mark.parametrize("config,suffix", [("v3", "ForSequenceClassification"), ("v2", "ForTokenClassification")])
def test_model_hf_builds_a_deberta_checkpoint_with_its_head(config, suffix, tmp_path_factory, tmp_path):
    """model=hf reads config.json's architectures: the artifact (under deberta-v2) has the head's logits and the
    classes' names; both loaders match PyTorch at an unpadded and a padded (batch, seq), the build having proven
    the padding with random ids in it."""
    model, path = save(tmp_path_factory, config, suffix)
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.seq=[8,16]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "deberta-v2").iterdir())
    manifest = json.loads((art / "manifest.json").read_text())
    settings = manifest["metadata"]["build_key_parts"]["config"]["model"]
    assert settings["head"] == HEADS[suffix] and settings["name"] == "deberta-v2"
    assert manifest["metadata"]["labels"] == {"logits": list(LABELS.values())}
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for batch, seq, real in [(2, 8, [8, 8]), (2, 11, [11, 6]), (1, 5, [3])]:  # 11 and 5 run padded
            x = inputs(batch, seq, real, config == "v2", seed=seq)
            ours = exe(**x)
            assert list(ours) == ["logits"]
            compare({k: np.asarray(v) for k, v in ours.items()}, torch_run(model, x), x["attention_mask"])


def test_a_config_json_without_a_key_means_hugging_faces_default(tmp_path):
    """DebertaV2Config's defaults (no relative attention, absolute positions) are not the zoo's (deberta-v3-base's):
    a config.json that leaves them out (as older transformers wrote only what differs) is read as Hugging Face reads
    it, and the sizes it leaves out are deberta-v2-xlarge's."""
    torch.manual_seed(0)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**BASE)).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    left_out = ("relative_attention", "position_biased_input", "pos_att_type", "share_att_key", "norm_rel_ebd",
                "position_buckets", "max_relative_positions")
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in left_out}))
    zoo, params = hf.load_pretrained(DebertaV2, tmp_path)
    assert not zoo.relative_attention and zoo.position_biased_input and zoo.pos_att_type == ()
    x = inputs(2, 9, [9, 5], False)
    compare(zoo.apply(params, *x.values()), torch_run(model, x), x["attention_mask"])
    del config["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hf.read_config(DebertaV2, tmp_path)["hidden_size"] == 1536


def test_sentence_embeddings_and_the_tensors_hugging_face_skips(tmp_path_factory):
    """pooling=mean over the real tokens, as BERT's; a v3 checkpoint's absolute position table (Hugging Face skips
    it without position_biased_input) and pre-training's heads beside the encoder (head none) are skipped."""
    model, path = save(tmp_path_factory, "v3", "Model")
    tensors = load_file(str(path / "model.safetensors"))
    extra = {"embeddings.position_embeddings.weight": np.zeros((64, 32), np.float32),
             "lm_predictions.lm_head.bias": np.zeros((VOCAB,), np.float32),
             "mask_predictions.classifier.weight": np.zeros((1, 32), np.float32)}
    save_file({**tensors, **extra}, str(path / "model.safetensors"), metadata={"format": "pt"})
    zoo, params = hf.load_pretrained(DebertaV2, path, {"pooling": "mean", "normalize": True})
    x = inputs(2, 10, [10, 3], False, seed=4)
    states = torch_run(model, x).last_hidden_state.numpy()
    mask = x["attention_mask"][..., None]
    want = (states * mask).sum(1) / mask.sum(1)
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    out = zoo.apply(params, *x.values())
    assert np.abs(np.asarray(out["sentence_embedding"]) - want).max() <= SCALE_TOL
    assert sorted(out) == ["last_hidden_state", "sentence_embedding"]


@pytest.mark.parametrize("change,says", [
    (dict(legacy=False, embedding_size=24), "legacy=false with embedding_size=24: the masked-LM head lm_predictions"),
    (dict(pos_att_type="p2c|p2p"), "pos_att_type=p2c|p2p: 'p2p' is not a disentangled term"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False, but DebertaV2 implements only tie_word_embeddings=True"),
    (dict(conv_kernel_size=2), "conv_kernel_size=2, conv_groups=1: the convolution keeps the length only with an odd"),
    (dict(norm_rel_ebd="batch_norm"), "norm_rel_ebd='batch_norm' is not implemented"),
    (dict(attention_head_size=8), "attention_head_size=8: only attention_head_size=16 runs"),
])
def test_a_setting_not_implemented_is_refused_in_one_line(change, says, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "architectures": [
        "DebertaV2ForMaskedLM"], **CONFIGS["v3"], **change}))
    with pytest.raises(hf.CheckpointError) as e:
        hf.model_from_config(MODELS["deberta-v2"], tmp_path)
    assert says in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_the_command_line_refuses_one_in_one_line_and_builds_at_random(tmp_path_factory, tmp_path):
    _, path = save(tmp_path_factory, "v3", "ForSequenceClassification", pos_att_type="p2c|p2p")  # PyTorch skips p2p
    proc = run_cli("model=hf", f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'p2p' is not a disentangled term" in proc.stderr and not (tmp_path / "a").exists()
    random = run_cli("model=deberta-v2", "model.num_hidden_layers=1", "model.hidden_size=16", "model.num_attention_heads=2",
                     "model.intermediate_size=16", "model.vocab_size=50", "model.position_buckets=8",
                     "shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,8,600]", "shapes.buckets.seq=[8,600]",
                     f"artifacts_dir={tmp_path / 'b'}", cwd=tmp_path, timeout=600)
    assert random.returncode == 0, random.stderr[-3000:]  # no absolute positions: past max_position_embeddings
    exe = runtime.load(next((tmp_path / "b" / "deberta-v2").iterdir()))
    assert exe.output_names == ["last_hidden_state"]


def test_the_defaults_are_deberta_v3_bases(tmp_path):
    """microsoft/deberta-v3-base's config.json (as published: a string pos_att_type) reads as the zoo's defaults,
    and every parameter of the full-size model has a checkpoint name (shapes only, nothing allocated)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7,
        "max_relative_positions": -1, "position_biased_input": False, "num_attention_heads": 12,
        "num_hidden_layers": 12, "type_vocab_size": 0, "vocab_size": 128100}))
    assert hf.model_from_config(DebertaV2, tmp_path) == DebertaV2(head="none")  # no architectures: the encoder
    model = DebertaV2(head="sequence_classification")
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    names = hf.checkpoint_names(model)
    assert len(names) == len(jax.tree_util.tree_leaves(shapes))
    assert names["encoder.rel_embeddings.weight"] == ("rel_embeddings", (512, 768))
    assert names["/pooler.dense.weight"] == ("head.dense.weight", (768, 768))
    assert model.inputs() == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    assert model.max_positions() is None


# DeBERTa (v1, model_type deberta: deberta-base, deberta-large-mnli): relative positions clipped at 6, both terms through
# the position projections, absolute positions, token types, embeddings narrower than the layers
V1 = dict(BASE, relative_attention=True, max_relative_positions=6, max_position_embeddings=32, pos_att_type="c2p|p2c",
          position_biased_input=True, type_vocab_size=2, embedding_size=24)


@pytest.mark.parametrize("suffix", list(HEADS))
def test_deberta_v1_every_head_matches_pytorch(suffix, tmp_path_factory):
    """One Linear for the query, key and value (``in_proj``, each head's q | k | v in turn) with the query's and the
    value's own biases, the key's position projection without one: read and split as Hugging Face splits them."""
    model, path = save(tmp_path_factory, "v1", suffix)
    assert hf.model_name(path) == "deberta"
    zoo, params = hf.load_pretrained(MODELS["deberta"], path)
    assert zoo.task == HEADS[suffix] and zoo.max_relative_positions == 6 and zoo.pos_att_type == ("c2p", "p2c")
    for batch, seq, real in [(2, 7, [7, 4]), (3, 13, [13, 9, 1])]:  # 13: relative positions past the clip at 6
        x = inputs(batch, seq, real, True, seed=seq)
        compare(zoo.apply(params, *x.values()), torch_run(model, x), x["attention_mask"])


def test_deberta_v1_nli_classifier_builds_and_v2_settings_are_refused(tmp_path_factory, tmp_path):
    """deberta-large-mnli's kind (three NLI classes) through model=hf on both loaders, padded and not; a
    DeBERTa-v2 setting given to model=deberta is one line naming it, and talking heads (not implemented) too."""
    model, path = save(tmp_path_factory, "v1", "ForSequenceClassification")
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.seq=[8,16]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "deberta").iterdir())
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for batch, seq, real in [(2, 8, [8, 8]), (2, 11, [11, 6])]:  # 11 runs padded
            x = inputs(batch, seq, real, True, seed=seq)
            compare({k: np.asarray(v) for k, v in exe(**x).items()}, torch_run(model, x), x["attention_mask"])
    refused = run_cli("model=deberta", "model.position_buckets=256", f"artifacts_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert refused.returncode == 2 and "position_buckets=256 is a DeBERTa-v2 setting" in refused.stderr
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "talking_head": True}))
    with pytest.raises(hf.CheckpointError, match="talking_head=True, but Deberta implements only talking_head=False"):
        hf.load_pretrained(MODELS["deberta"], path)
