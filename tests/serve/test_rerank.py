"""A cross-encoder (a ``BertForSequenceClassification`` of one class with its WordPiece tokenizer, as
ms-marco-MiniLM and bge-reranker are) built and asked how relevant documents are to a query: ``/v1/rerank`` (Jina's
and Cohere's API, as vLLM serves it), ``classify()`` over text pairs with both loaders, and ``/infer`` with the
inputs ``text`` and ``text_pair`` (JSON, Triton's binary form, gRPC), each equal to PyTorch's
``sigmoid(model(**tokenizer(query, documents)).logits)``; what cannot be answered is one line."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import tripy_build as tb  # noqa: E402
from examples.classifier_checkpoint import checkpoint  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()
QUERY = "where does the quick fox jump"
DOCUMENTS = ["the quick brown fox jumps over the lazy dog", "hello world", "héllo wörld, the lazy dog jumps", "don't",
             "xyzzy fox jumps"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    ckpt = checkpoint(root / "ckpt", num_labels=1, initializer_range=0.2)  # wide weights: relevance apart, not noise
    config = json.loads((ckpt / "tokenizer_config.json").read_text())  # as BertTokenizer's: a pair's token types
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {**config, "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}))
    model = transformers.BertForSequenceClassification.from_pretrained(ckpt).eval()
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,8,32]",
                   "shapes.buckets.seq=[16,32]", f"artifacts_dir={root / 'arts'}", cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    pairs = hf_tok([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    assert (pairs["token_type_ids"] == 1).any()  # the documents' tokens are of type 1: the pair is BERT's
    with torch.no_grad():
        want = torch.sigmoid(model(**pairs).logits[:, 0]).numpy()
    assert np.ptp(want) > 0.02, want  # relevance apart: an order to check (the tokenizer's training, and so the
    # weights, differ between runs: near-ties are compared by score below, not by rank)
    return next((root / "arts" / "bert").iterdir()), want, int(pairs["attention_mask"].sum())


def call(srv, method, path, body=None):
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


@pytest.mark.parametrize("load", [runtime.load, tb.load], ids=["runtime", "jax"])
def test_classify_takes_text_pairs_with_both_loaders(built, load):
    """Five pairs over a batch range of 4 (two padded calls), as (text, pair) and as the pipeline's dicts."""
    art, want, _ = built
    model = load(art)
    got = [c[0]["score"] for c in model.classify([(QUERY, d) for d in DOCUMENTS])]
    assert np.allclose(got, want, rtol=0, atol=1e-5)
    alone = model.classify({"text": QUERY, "text_pair": DOCUMENTS[0]})
    assert alone[0]["label"] == "LABEL_0" and abs(alone[0]["score"] - want[0]) < 1e-5


def test_rerank_answers_as_pytorch_scores_the_pairs(built):
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    art, want, tokens = built
    with Server([art], port=0, grpc_port=0).start() as srv:
        status, answer = call(srv, "POST", "/v1/rerank", {"model": "bert", "query": QUERY, "documents": DOCUMENTS})
        assert status == 200, answer
        order = [r["index"] for r in answer["results"]]  # every document once, by its score, highest first
        got = np.array([r["relevance_score"] for r in answer["results"]])
        assert sorted(order) == list(range(len(DOCUMENTS))) and (np.diff(got) <= 0).all()
        assert np.allclose(got, want[order], rtol=0, atol=1e-5)  # each PyTorch's: the order is PyTorch's but for ties
        assert [r["document"]["text"] for r in answer["results"]] == [DOCUMENTS[i] for i in order]
        assert answer["usage"] == {"total_tokens": tokens} and answer["model"] == "bert"
        status, answer = call(srv, "POST", "/v1/rerank", {"model": "bert", "query": QUERY, "top_n": 2,
                                                          "documents": [{"text": d} for d in DOCUMENTS],
                                                          "return_documents": False})
        assert status == 200 and answer["results"] == [{"index": int(i), "relevance_score": pytest.approx(
            float(want[i]), abs=1e-5)} for i in order[:2]]
        assert [m["id"] for m in call(srv, "GET", "/v1/models")[1]["data"]] == ["bert"]
        texts = {"name": "text", "datatype": "BYTES", "shape": [3], "data": [QUERY] * 3}
        pairs = {"name": "text_pair", "datatype": "BYTES", "shape": [3], "data": DOCUMENTS[:3]}
        status, answer = call(srv, "POST", "/v2/models/bert/infer", {"inputs": [texts, pairs],
                                                                     "outputs": [{"name": "classes"}]})
        assert status == 200, answer
        scores = [json.loads(row)[0]["score"] for row in answer["outputs"][0]["data"]]
        assert np.allclose(scores, want[:3], rtol=0, atol=1e-5)
        host = srv.url.split("//")[1]
        for client, module in ((triton_http.InferenceServerClient(host), triton_http),
                               (triton_grpc.InferenceServerClient(srv.grpc.address), triton_grpc)):
            inputs = []
            for name, values in (("text", [QUERY] * 3), ("text_pair", DOCUMENTS[:3])):
                inputs.append(module.InferInput(name, [3], "BYTES"))
                inputs[-1].set_data_from_numpy(np.array([v.encode() for v in values], dtype=object))  # binary
            logits = client.infer("bert", inputs).as_numpy("logits")[:, 0]
            assert np.allclose(1 / (1 + np.exp(-logits)), want[:3], rtol=0, atol=1e-5), module.__name__
            client.close()
        for path, body, code, fragment in [
                ("/v1/rerank", {"model": "bert", "query": QUERY, "documents": ["fox " * 40]}, 400,
                 "document 0 with the query is 54 tokens, but model 'bert' takes at most 32 (the build's seq range)"),
                ("/v1/rerank", {"model": "bert", "query": "", "documents": DOCUMENTS}, 400,
                 '"query" must be a non-empty text'),
                ("/v1/rerank", {"model": "bert", "query": QUERY, "documents": DOCUMENTS, "top_n": 0}, 400,
                 '"top_n" is how many documents to answer with, an integer from 1, got 0'),
                ("/v1/rerank", {"model": "bert", "query": QUERY, "documents": DOCUMENTS, "rank_fields": ["t"]}, 400,
                 "'rank_fields' is not an option of /v1/rerank; it takes model, query, documents, top_n, "
                 "return_documents"),
                ("/v1/rerank", {"model": "other", "query": QUERY, "documents": DOCUMENTS}, 404,
                 "model 'other': it is not served here; the models that rerank here: bert."),
                ("/v1/chat/completions", {"model": "bert", "messages": [{"role": "user", "content": "hi"}]}, 404,
                 "it is a cross-encoder: POST /v1/rerank"),
                ("/v2/models/bert/infer", {"inputs": [texts, {**pairs, "shape": [2], "data": DOCUMENTS[:2]}]}, 400,
                 "input 'text_pair' has 2 texts and 'text' 3: give one second text per text")]:
            status, answer = call(srv, "POST", path, body)
            message = answer["error"]["message"] if isinstance(answer["error"], dict) else answer["error"]
            assert status == code and fragment in message and "\n" not in message, (body, message)
