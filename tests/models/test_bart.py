"""BART from Hugging Face checkpoints (``models/bart.py``): every head against PyTorch's, and an NLI classifier (as
facebook/bart-large-mnli, the zero-shot pipeline's default) built through ``model=hf`` with its tokenizer, answering
``zero_shot()`` as transformers' zero-shot pipeline does on both loaders and on the server; a row without the
end-of-sequence token the classifier reads is refused, as Hugging Face refuses it."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.nli_checkpoint import LABELS as NLI, TINY as SIZES, checkpoint as nli_checkpoint  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 60


def inputs(lengths: list[int], seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows as BART's tokenizer makes them: ``<s>`` (0), ids, ``</s>`` (2), then ``<pad>`` (1) to ``seq``."""
    ids = np.ones((len(lengths), seq), np.int32)
    rng = np.random.default_rng(seed)
    for row, n in enumerate(lengths):
        ids[row, :n] = [0, *rng.integers(3, VOCAB, n - 2), 2]
    return {"input_ids": ids, "attention_mask": (ids != 1).astype(np.int32)}


def torch_run(model, x: dict):
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()})


@pytest.mark.parametrize("suffix", ["Model", "ForSequenceClassification", "ForQuestionAnswering"])
def test_every_head_matches_pytorch(suffix, tmp_path):
    torch.manual_seed(0)
    model = getattr(transformers, "Bart" + suffix)(transformers.BartConfig(vocab_size=VOCAB, **SIZES, id2label=NLI))
    model.eval().save_pretrained(tmp_path)
    assert hf.model_name(tmp_path) == "bart"
    zoo, params = hf.load_pretrained(MODELS["bart"], tmp_path)
    assert zoo.task == {"Model": "none", "ForSequenceClassification": "sequence_classification",
                        "ForQuestionAnswering": "question_answering"}[suffix]
    x = inputs([7, 4, 6], 9)  # padded rows: the decoder's causal states and the cross-attention's mask
    if suffix == "ForSequenceClassification":  # the classifier reads the </s>, not the last real token
        for row, n in enumerate([7, 4, 6]):
            x["input_ids"][row, n - 2:n] = [2, 9]
    ours, theirs = zoo.apply(params, x["input_ids"], x["attention_mask"]), torch_run(model, x)
    real = x["attention_mask"].astype(bool)
    assert set(ours) == {"Model": {"last_hidden_state", "encoder_last_hidden_state"}, "ForSequenceClassification":
                         {"logits"}, "ForQuestionAnswering": {"start_logits", "end_logits"}}[suffix]
    for name, got in ours.items():
        got, want = np.asarray(got), getattr(theirs, name).numpy()
        assert got.shape == want.shape, name
        if got.ndim >= 2 and got.shape[1] == real.shape[1]:
            got, want = got[real], want[real]
        assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max(), name
    assert zoo.output_labels() == ({"logits": list(NLI.values())} if suffix == "ForSequenceClassification" else {})


def test_an_nli_classifier_builds_and_answers_zero_shot_as_the_pipeline_and_refuses_a_row_without_eos(tmp_path):
    model, tok = nli_checkpoint(tmp_path / "nli")
    proc = run_cli("model=hf", f"params.checkpoint={tmp_path / 'nli'}", "shapes.dims.batch=[1,2,4]",
                   "shapes.dims.seq=[1,16,32]", "shapes.buckets.seq=[16,32]", f"artifacts_dir={tmp_path / 'arts'}",
                   cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "bart").iterdir())
    pipe = transformers.pipeline("zero-shot-classification", model=model, tokenizer=tok)
    texts = ["the quick brown fox jumps", "hello world, don't"]
    for load in (runtime.load, tb.load):
        exe = load(art)
        for multi in (False, True):
            want = pipe(texts, candidate_labels=["fox", "dog", "world"], multi_label=multi)
            got = exe.zero_shot(texts, ["fox", "dog", "world"], multi_label=multi)
            assert [g["labels"] for g in got] == [w["labels"] for w in want]
            assert np.allclose([g["scores"] for g in got], [w["scores"] for w in want], rtol=0, atol=1e-5)
        x = inputs([11, 5, 9], 11, seed=3)  # 11 runs the 16 bucket, padded
        logits = np.asarray(exe(**x)["logits"])
        want = torch_run(model, x).logits.numpy()
        assert np.abs(logits - want).max() <= SCALE_TOL * np.abs(want).max()
        x["input_ids"][1, 4] = 5  # row 1's </s> replaced: Hugging Face refuses the batch, and so does the call
        with pytest.raises(CallError, match=r"input 'input_ids' row 1 holds no 2, and every row must \(1 do not\)"):
            exe(**x)
    with Server([art], port=0).start() as srv:  # the server: texts in, the zero-shot answer out; ids without </s>
        want = pipe(texts, candidate_labels=["fox", "dog"])
        status, data = post(srv, {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}],
                                  "outputs": [{"name": "zero_shot", "parameters": {"candidate_labels": ["fox", "dog"]}}]})
        assert status == 200, data
        got = [json.loads(row) for row in json.loads(data)["outputs"][0]["data"]]
        assert [g["labels"] for g in got] == [w["labels"] for w in want]
        assert np.allclose([g["scores"] for g in got], [w["scores"] for w in want], rtol=0, atol=1e-5)
        ids = [{"name": n, "datatype": "INT32", "shape": list(x[n].shape), "data": x[n].ravel().tolist()}
               for n in ("input_ids", "attention_mask")]
        status, data = post(srv, {"inputs": ids})
        assert status == 400 and "input 'input_ids' row 1 holds no 2" in json.loads(data)["error"], data


def post(server, body) -> tuple[int, bytes]:
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/v2/models/bart/infer", body=json.dumps(body), headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data
