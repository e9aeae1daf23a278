"""Task heads and the BERT-like families (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, ELECTRA, ALBERT) from
Hugging Face checkpoints.

Every family and head (the bare model, sequence and token classification, question answering, masked LM) as a
tiny ``save_pretrained`` checkpoint: read by ``models/hf.py`` (the architecture from ``config.json``) and run
eagerly, its outputs, named as Hugging Face names them, against the PyTorch model's within 1e-4 of the output's
scale. One artifact per head built through the command line with ``model=hf`` and called through both loaders at an
unpadded and a padded shape; the class names (id2label) in the manifest and ``inspect``. A checkpoint whose head
the model does not build is refused naming the tensor; the encoder alone (``model.head=none``) skips them, said once.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 60
ENCODER = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
FAMILIES = {  # zoo name -> (HF class stem, config class, config)
    "bert": ("Bert", transformers.BertConfig, dict(ENCODER, max_position_embeddings=32)),
    "roberta": ("Roberta", transformers.RobertaConfig, dict(ENCODER, max_position_embeddings=34, type_vocab_size=1)),
    "xlm-roberta": ("XLMRoberta", transformers.XLMRobertaConfig,
                    dict(ENCODER, max_position_embeddings=34, type_vocab_size=1)),
    "camembert": ("Camembert", transformers.CamembertConfig,
                  dict(ENCODER, max_position_embeddings=34, type_vocab_size=1)),
    "distilbert": ("DistilBert", transformers.DistilBertConfig,
                   dict(dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32)),
    # embeddings narrower than the layers: embeddings_project
    "electra": ("Electra", transformers.ElectraConfig, dict(ENCODER, embedding_size=8, max_position_embeddings=32)),
    # three layers over two shared groups of two layers each (groups 0, 0, 1), embeddings projected
    "albert": ("Albert", transformers.AlbertConfig, dict(ENCODER, num_hidden_layers=3, num_hidden_groups=2,
                                                         inner_group_num=2, embedding_size=8, max_position_embeddings=32)),
}
HEADS = {"Model": "none", "ForSequenceClassification": "sequence_classification",
         "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering",
         "ForMaskedLM": "masked_lm"}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def save(tmp_path_factory, family: str, suffix: str):
    """The PyTorch model and its save_pretrained directory (three named classes for a classifier)."""
    stem, config_class, settings = FAMILIES[family]
    labels = {"id2label": LABELS} if "Classification" in suffix else {}
    torch.manual_seed(0)
    model = getattr(transformers, stem + suffix)(config_class(vocab_size=VOCAB, **settings, **labels)).eval()
    path = tmp_path_factory.mktemp(f"{family}-{suffix}")
    model.save_pretrained(path)
    return model, path


def inputs(batch: int, seq: int, real: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(3, VOCAB, (batch, seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask}


def compare(ours: dict, theirs, mask: np.ndarray) -> None:
    """Each output against PyTorch's within SCALE_TOL of its scale, at the real positions."""
    assert set(ours) == {k for k in ("last_hidden_state", "pooler_output", "logits", "start_logits", "end_logits")
                         if getattr(theirs, k, None) is not None}
    for name, got in ours.items():
        got, want = np.asarray(got), getattr(theirs, name).numpy()
        assert got.shape == want.shape, name
        if got.ndim >= 2 and got.shape[1] == mask.shape[1]:  # per position: only the real ones
            got, want = got[mask.astype(bool)], want[mask.astype(bool)]
        assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max(), name


def torch_run(model, x: dict) -> object:
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()})


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("suffix", list(HEADS))
def test_every_family_and_head_matches_pytorch(family, suffix, tmp_path_factory):
    model, path = save(tmp_path_factory, family, suffix)
    assert hf.model_name(path) == family
    zoo, params = hf.load_pretrained(MODELS[family], path)
    assert zoo.task == HEADS[suffix]
    x = inputs(2, 7, [7, 4])
    feed = [x["input_ids"], x["attention_mask"]] + ([np.zeros_like(x["input_ids"])] if zoo.type_vocab_size else [])
    compare(zoo.apply(params, *feed), torch_run(model, x), x["attention_mask"])
    want = {"sequence_classification": ["negative", "neutral", "positive"],
            "token_classification": ["negative", "neutral", "positive"]}.get(HEADS[suffix])
    assert zoo.output_labels() == ({"logits": want} if want else {})


BUILT = {"bert": "ForSequenceClassification", "roberta": "ForMaskedLM", "xlm-roberta": "ForTokenClassification",
         "distilbert": "ForQuestionAnswering", "electra": "ForSequenceClassification", "albert": "ForSequenceClassification"}


@pytest.mark.parametrize("family", list(BUILT))
def test_model_hf_builds_the_checkpoints_architecture_with_its_head(family, tmp_path_factory, tmp_path):
    """model=hf reads config.json's architectures: the artifact (under the zoo model's name) has the head's
    outputs, Hugging Face's names; both loaders match PyTorch at an unpadded and a padded (batch, seq)."""
    model, path = save(tmp_path_factory, family, BUILT[family])
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.seq=[8,16]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / family).iterdir())
    manifest = json.loads((art / "manifest.json").read_text())
    config = manifest["metadata"]["build_key_parts"]["config"]["model"]
    assert config["head"] == HEADS[BUILT[family]] and config["name"] == family
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for batch, seq, real in [(2, 8, [8, 8]), (2, 11, [11, 6]), (1, 5, [3])]:  # 11 and 5 run padded
            x = inputs(batch, seq, real, seed=seq)
            if family != "distilbert":
                x["token_type_ids"] = np.zeros_like(x["input_ids"])
            ours = exe(**x)
            assert sorted(ours) == (["end_logits", "start_logits"] if family == "distilbert" else ["logits"])
            compare({k: np.asarray(v) for k, v in ours.items()}, torch_run(model, x), x["attention_mask"])
    if family == "xlm-roberta":  # a token classifier: its classes are named, not scored as one row's
        assert manifest["metadata"]["labels"] == {"logits": ["negative", "neutral", "positive"]}
        assert "scores" not in manifest["metadata"]
        shown = run_cli("inspect", str(art), timeout=300).stdout
        assert "0 negative, 1 neutral, 2 positive" in shown and "scored by" not in shown
    if family == "bert":  # a sequence classifier of three classes: softmax, as transformers' pipeline picks
        assert manifest["metadata"]["scores"] == {"logits": "softmax"}
        assert "2 positive; scored by softmax" in run_cli("inspect", str(art), timeout=300).stdout


def test_electras_pretraining_checkpoint_is_its_encoder_and_its_discriminator_head_is_named_skipped(
        tmp_path_factory, caplog):
    """google/electra-*-discriminator name ``ElectraForPreTraining`` (replaced-token detection): read as the encoder,
    as BERT's pre-training model is, its ``discriminator_predictions`` skipped and named in the log."""
    model, path = save(tmp_path_factory, "electra", "ForPreTraining")
    assert hf.model_name(path) == "electra"
    with caplog.at_level("INFO"):
        zoo, params = hf.load_pretrained(MODELS["electra"], path)
    assert zoo.task == "none" and "discriminator_predictions.dense.weight" in caplog.text
    x = inputs(2, 7, [7, 4])
    got = zoo.apply(params, x["input_ids"], x["attention_mask"], np.zeros_like(x["input_ids"]))
    compare(got, torch_run(model.electra, x), x["attention_mask"])


def test_a_head_the_model_does_not_build_is_refused_and_the_encoder_alone_skips_it_once(tmp_path_factory, tmp_path):
    """A classifier's tensors are never dropped without a word: model=bert with head=masked_lm refuses the
    checkpoint naming both heads; head=none builds the encoder and names what it skipped."""
    _, path = save(tmp_path_factory, "bert", "ForSequenceClassification")
    other = run_cli("model=bert", f"params.checkpoint={path}", "model.head=masked_lm", "shapes.dims.batch=[1,1,2]",
                    "shapes.dims.seq=[1,8,8]", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert other.returncode == 2 and "head='masked_lm' was given, but the checkpoint" in other.stderr
    assert "says head='sequence_classification'" in other.stderr
    alone = run_cli("model=bert", f"params.checkpoint={path}", "model.head=none", "shapes.dims.batch=[1,1,2]",
                    "shapes.dims.seq=[1,8,8]", "shapes.buckets.seq=[8]",  # nothing is called: 2 profiles, not 8
                    f"artifacts_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "2 tensor(s) of a head not built (head=none: the model alone) skipped: classifier.bias, " \
           "classifier.weight" in alone.stdout + alone.stderr
    exe = runtime.load(next((tmp_path / "b" / "bert").iterdir()))
    assert exe.output_names == ["last_hidden_state", "pooler_output"]


def test_an_unknown_tensor_or_architecture_is_one_line(tmp_path_factory, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, path = save(tmp_path_factory, "roberta", "ForTokenClassification")
    tensors = load_file(str(path / "model.safetensors"))
    save_file({**tensors, "classifier_extra.weight": np.zeros((2, 2), np.float32)}, str(path / "model.safetensors"))
    proc = run_cli("model=hf", f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "unexpected tensor classifier_extra.weight" in proc.stderr and "no head is dropped" in proc.stderr
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["RobertaForMultipleChoice"]}))
    proc = run_cli("model=hf", f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and "'RobertaForMultipleChoice' is not an architecture the zoo builds" in proc.stderr
    assert "RobertaForSequenceClassification" in proc.stderr and "model._target_" in proc.stderr
    assert not (tmp_path / "a").exists()


def test_positions_and_max_length_beyond_the_table_are_refused_and_defaults_derived(tmp_path):
    """A seq longer than the position table (or a generate.max_length) is one line naming both numbers; left at
    its default, it is derived from the checkpoint instead (said in the log), so the build fits its table."""
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=32, **ENCODER)
                           ).save_pretrained(tmp_path / "bert")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2,
                                                         n_positions=64)).save_pretrained(tmp_path / "gpt2")
    arts = f"artifacts_dir={tmp_path / 'arts'}"
    refused = run_cli("model=hf", f"params.checkpoint={tmp_path / 'bert'}", "shapes.dims.seq=[1,8,64]", arts,
                      cwd=tmp_path)
    assert refused.returncode == 2 and "shapes.dims.seq=[1,8,64]: Bert's position table holds 32 positions " \
                                      "(max_position_embeddings=32); set it to at most 32." in refused.stderr
    random = run_cli("model=bert", "model.max_position_embeddings=32", "model.num_hidden_layers=1",
                     "shapes.dims.seq=[1,8,33]", arts, cwd=tmp_path)
    assert random.returncode == 2 and "holds 32 positions" in random.stderr
    long = run_cli("model=gpt2", "task=generate", f"params.checkpoint={tmp_path / 'gpt2'}", "generate.max_length=100",
                   arts, cwd=tmp_path)
    assert long.returncode == 2 and "generate.max_length=100: GPT2's position table holds 64 positions " \
                                    "(n_positions=64); set it to at most 64." in long.stderr
    assert not (tmp_path / "arts").exists()

    # buckets given (the sizes the derived range compiles, not what this checks): 2 profiles each, not 6 and 7
    derived = run_cli("model=hf", f"params.checkpoint={tmp_path / 'bert'}", "shapes.dims.batch=[1,1,1]",
                      "shapes.buckets.seq=[1,32]", arts, cwd=tmp_path, timeout=600)
    said = derived.stdout + derived.stderr
    assert derived.returncode == 0, said[-3000:]
    assert "shapes.dims.seq: [1,128,512] -> [1,32,32] (the default, derived: Bert's position table" in said
    assert "dim seq [1..32]" in said
    generate = run_cli("model=gpt2", "task=generate", f"params.checkpoint={tmp_path / 'gpt2'}",
                       "shapes.dims.batch=[1,1,1]", "shapes.buckets.seq=[1,63]", arts, cwd=tmp_path, timeout=600)
    said = generate.stdout + generate.stderr
    assert generate.returncode == 0, said[-3000:]
    assert "generate.max_length: 256 -> 64 (the default, derived" in said
    assert "shapes.dims.seq: [1,128,128] -> [1,63,63] (the default, derived: a prompt chunk of 128 tokens" in said
    art = next((tmp_path / "arts" / "gpt2").iterdir())
    assert json.loads((art / "manifest.json").read_text())["metadata"]["generate"]["max_length"] == 64


def test_inputs_as_tokenizers_give_them(tmp_path_factory, tmp_path):
    """int64 ids (a tokenizer's return_tensors="np") are taken where they fit int32 and refused where not, never
    wrapped; token_type_ids and attention_mask may be left out (Hugging Face's zeros and ones), by both loaders
    and over HTTP (INT64 for an INT32 input, an input left out)."""
    import urllib.request

    from tripy_build.serve.http import Server

    model, path = save(tmp_path_factory, "bert", "ForSequenceClassification")
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,8]",
                   "shapes.buckets.seq=[8]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "bert").iterdir())
    ids = np.random.default_rng(5).integers(3, VOCAB, (2, 6))  # int64
    want = torch_run(model, {"input_ids": ids}).logits.numpy()
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for x in ({"input_ids": ids}, {"input_ids": ids, "attention_mask": np.ones_like(ids)},
                  {"input_ids": ids.astype(np.int32), "token_type_ids": np.zeros((2, 6), np.int32)}):
            got = np.asarray(exe(**x)["logits"])
            assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()
        with pytest.raises(tb.TripyBuildError, match=r"input 'input_ids' is int64 and holds 4294967296, which int32"):
            exe(input_ids=np.full((1, 3), 2**32))
        with pytest.raises(tb.TripyBuildError, match=r"missing input\(s\) 'input_ids'"):
            exe(attention_mask=np.ones((1, 3), np.int32))
    body = {"inputs": [{"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64",
                        "data": ids.ravel().tolist()}]}
    with Server([art], port=0).start() as server:
        req = urllib.request.Request(f"{server.url}/v2/models/bert/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    assert out["name"] == "logits" and np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()


def test_a_classifier_answers_with_its_labels_over_http_and_grpc(tmp_path_factory, tmp_path):
    """The server's metadata names the classes (id2label); an output's "classification": k (Triton's
    classification extension) answers with the top k as "score:index:label", over HTTP and through
    tritonclient's gRPC client (class_count), the same classes as the logits' argmax; the output "classes" with
    their softmax, from token ids as from texts."""
    import urllib.request

    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tripy_build.serve.http import Server

    model, path = save(tmp_path_factory, "distilbert", "ForSequenceClassification")
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,8]",
                   "shapes.buckets.seq=[8]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "distilbert").iterdir())
    ids = np.random.default_rng(6).integers(3, VOCAB, (2, 5)).astype(np.int32)
    logits = torch_run(model, {"input_ids": ids}).logits.numpy()
    names = ["negative", "neutral", "positive"]
    want = [[f"{names[i]}" for i in np.argsort(-row)[:2]] for row in logits]
    body = {"inputs": [{"name": "input_ids", "shape": [2, 5], "datatype": "INT32", "data": ids.ravel().tolist()}],
            "outputs": [{"name": "logits", "parameters": {"classification": 2}}]}
    with Server([art], port=0, grpc_port=0).start() as server:
        with urllib.request.urlopen(f"{server.url}/v2/models/distilbert", timeout=60) as r:
            assert json.loads(r.read())["labels"] == {"logits": names}
        req = urllib.request.Request(f"{server.url}/v2/models/distilbert/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())["outputs"][0]
        assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
        got = np.asarray(out["data"]).reshape(2, 2)
        assert [[s.split(":")[2] for s in row] for row in got] == want
        assert abs(float(got[0][0].split(":")[0]) - logits[0].max()) <= 1e-4 * np.abs(logits).max()
        # the output "classes" from token ids too (no tokenizer stored): the text-classification pipeline's scores
        body["outputs"] = [{"name": "classes", "parameters": {"top_k": 2}}]
        req = urllib.request.Request(f"{server.url}/v2/models/distilbert/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            rows = [json.loads(row) for row in json.loads(r.read())["outputs"][0]["data"]]
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        assert [[c["label"] for c in row] for row in rows] == want
        assert np.allclose([[c["score"] for c in row] for row in rows], -np.sort(-probs)[:, :2], rtol=0, atol=1e-5)
        client = grpcclient.InferenceServerClient(server.grpc.address)
        x = grpcclient.InferInput("input_ids", [2, 5], "INT32")
        x.set_data_from_numpy(ids)
        result = client.infer("distilbert", [x], outputs=[grpcclient.InferRequestedOutput("logits", class_count=2)])
        top = result.as_numpy("logits")
        assert [[s.decode().split(":")[2] for s in row] for row in top] == want


@pytest.mark.parametrize("problem_type, function", [(None, "softmax"), ("multi_label_classification", "sigmoid")])
def test_an_image_classifier_answers_with_its_scored_classes(tmp_path_factory, tmp_path, problem_type, function):
    """A ``ViTForImageClassification`` built through ``model=hf`` and served: the output ``classes`` from pixels, each
    image's top classes scored as the image-classification pipeline scores the logits (softmax for one label, sigmoid
    for a multi-label checkpoint)."""
    from tripy_build.serve.http import Server

    labels = {0: "cat", 1: "dog", 2: "fox", 3: "owl"}
    torch.manual_seed(0)
    hf_model = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        id2label=labels, problem_type=problem_type)).eval()
    path = tmp_path_factory.mktemp("vit-classifier")
    hf_model.save_pretrained(path)
    # the one call below is of 3 images, padded to the one batch bucket 4 (1 profile, not 3)
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,4,4]", "shapes.buckets.batch=[4]",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "vit").iterdir())
    pixels = np.random.default_rng(8).standard_normal((3, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        logits = hf_model(pixel_values=torch.tensor(pixels)).logits.numpy().astype(np.float64)
    if function == "softmax":
        scores = np.exp(logits - logits.max(1, keepdims=True))
        scores /= scores.sum(1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    order = np.argsort(-scores, axis=1, kind="stable")[:, :3]
    body = {"inputs": [{"name": "pixel_values", "shape": [3, 3, 16, 16], "datatype": "FP32",
                        "data": pixels.ravel().tolist()}],
            "outputs": [{"name": "classes", "parameters": {"top_k": 3}}]}
    with Server([art], port=0).start() as server:
        req = urllib.request.Request(f"{server.url}/v2/models/vit/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())["outputs"][0]
    assert out["name"] == "classes" and out["shape"] == [3]
    rows = [json.loads(row) for row in out["data"]]
    assert [[c["label"] for c in row] for row in rows] == [[labels[int(i)] for i in row] for row in order]
    assert np.allclose([[c["score"] for c in row] for row in rows], np.take_along_axis(scores, order, 1), rtol=0,
                       atol=1e-5)
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["metadata"]["scores"] == {"logits": function}


def test_sentence_embeddings_mean_pool_over_the_mask(tmp_path_factory, tmp_path):
    """model.pooling=mean model.normalize=true: sentence-transformers' mean pooling over the real tokens, scaled to
    unit length, from the PyTorch model's states; padding (to a bucket, or the caller's) never counts."""
    model, path = save(tmp_path_factory, "roberta", "Model")
    # the one call below is (2, 11), padded along seq to the one bucket 16 (1 profile, not 4)
    proc = run_cli("model=hf", f"params.checkpoint={path}", "model.pooling=mean", "model.normalize=true",
                   "shapes.dims.batch=[1,2,2]", "shapes.buckets.batch=[2]", "shapes.dims.seq=[1,16,16]",
                   "shapes.buckets.seq=[16]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    x = inputs(2, 11, [11, 4], seed=3)
    states = torch_run(model, x).last_hidden_state.numpy()
    mask = x["attention_mask"][..., None]
    want = (states * mask).sum(1) / mask.sum(1)
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    for loader in (tb.load, runtime.load):
        got = np.asarray(loader(next((tmp_path / "arts" / "roberta").iterdir()))(**x)["sentence_embedding"])
        assert got.shape == (2, 16) and np.abs(got - want).max() <= SCALE_TOL
    bad = run_cli("model=bert", "model.pooling=max", f"artifacts_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert bad.returncode == 2 and "pooling='max' is not a pooling of Bert; one of none, mean, cls" in bad.stderr


def test_model_hf_needs_a_checkpoint(tmp_path):
    proc = run_cli("model=hf", f"artifacts_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "model=hf builds the architecture a Hugging Face checkpoint's config.json names: give " \
           "params.checkpoint=DIR" in proc.stderr and not (tmp_path / "a").exists()


def test_a_key_config_json_leaves_out_is_read_as_transformers_reads_it(tmp_path_factory):
    """Every ``Architecture.defaults`` entry is the value the family's config class gives a key config.json lacks
    (DeBERTa's modules read some with getattr: not the config's attributes); a RoBERTa config.json without
    ``layer_norm_eps`` is read with RobertaConfig's 1e-12, not roberta-base's 1e-5."""
    config_classes = {"roberta": transformers.RobertaConfig, "xlm-roberta": transformers.XLMRobertaConfig,
                      "camembert": transformers.CamembertConfig, "electra": transformers.ElectraConfig,
                      "albert": transformers.AlbertConfig,
                      "deberta": transformers.DebertaConfig, "deberta-v2": transformers.DebertaV2Config,
                      "modernbert": transformers.ModernBertConfig, "marian": transformers.MarianConfig,
                      "whisper": transformers.WhisperConfig}
    assert {name for name, arch in hf.NAMES.items() if arch.defaults} == set(config_classes)
    for name, config_class in config_classes.items():
        made = config_class()
        for key, value in hf.NAMES[name].defaults:
            if name != "deberta-v2" or hasattr(made, key):
                assert hf.normalized(getattr(made, key)) == hf.normalized(value), (name, key)
    model, path = save(tmp_path_factory, "roberta", "ForTokenClassification")
    config = json.loads((path / "config.json").read_text())
    config["layer_norm_eps"] = 1e-5
    (path / "config.json").write_text(json.dumps(config))
    assert hf.load_pretrained(MODELS["roberta"], path)[0].layer_norm_eps == 1e-5
    del config["layer_norm_eps"]
    (path / "config.json").write_text(json.dumps(config))
    assert hf.load_pretrained(MODELS["roberta"], path)[0].layer_norm_eps == \
        transformers.AutoConfig.from_pretrained(path).layer_norm_eps == 1e-12
