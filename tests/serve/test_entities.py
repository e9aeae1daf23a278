"""A token classifier (a ``BertForTokenClassification`` checkpoint with its WordPiece tokenizer) built and asked for
the entities in texts: ``entities()`` with both loaders, and the server's ``entities`` output over HTTP (JSON and
Triton's binary form) and gRPC, each equal to what transformers' token-classification pipeline finds with the
PyTorch model; what cannot be answered is one line. The grouping rules alone, over every kind of tokenizer:
``tests/runtime/test_entities.py``."""

from __future__ import annotations

import http.client
import json
import warnings

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import tripy_build as tb  # noqa: E402
from examples.classifier_checkpoint import checkpoint  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()
LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello", "héllo wörld, the lazy dog jumps", "don't", "xyzzy fox"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("ner")
    ckpt = checkpoint(root / "ckpt", transformers.BertForTokenClassification, id2label=LABELS)
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.seq=[8,16]", f"artifacts_dir={root / 'arts'}", cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = transformers.AutoModelForTokenClassification.from_pretrained(ckpt).eval()
    return next((root / "arts" / "bert").iterdir()), model, transformers.AutoTokenizer.from_pretrained(ckpt)


def pipeline_finds(built, texts, **options):
    _, model, hf_tok = built
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=hf_tok, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [pipe(t) for t in texts]


def same(got, want):
    """The same entities: labels, words, characters and indices equal, scores within float32's rounding."""
    assert [[{k: v for k, v in e.items() if k != "score"} for e in row] for row in got] == \
           [[{k: (int(v) if k == "index" else v) for k, v in e.items() if k != "score"} for e in row] for row in want]
    assert np.allclose([e["score"] for row in got for e in row], [float(e["score"]) for row in want for e in row],
                       rtol=0, atol=1e-5)


@pytest.mark.parametrize("load", [runtime.load, tb.load], ids=["runtime", "jax"])
def test_entities_equal_the_pipelines_with_both_loaders(built, load):
    """Five texts over a batch range of 4 (two padded calls); a text alone answers with its list, as the pipeline."""
    model = load(built[0])
    for strategy in ("simple", "first", "none"):
        same(model.entities(TEXTS, aggregation_strategy=strategy),
             pipeline_finds(built, TEXTS, aggregation_strategy=strategy))
    kept = model.entities(TEXTS[0], aggregation_strategy="none", ignore_labels=[])
    assert kept[0]["index"] == 1 and len(kept) == len(built[2](TEXTS[0])["input_ids"]) - 2  # every token but [CLS], [SEP]
    for call, fragment in [
            (lambda: model.entities(["fox " * 20]), "text 0 is 22 tokens, but the model takes at most 16 (the build's "
                                                    "seq range)"),
            (lambda: model.entities([]), "texts must be a text or a non-empty list of texts"),
            (lambda: model.entities("fox", aggregation_strategy="word"), "aggregation_strategy 'word' is not one of")]:
        with pytest.raises(CallError) as e:
            call()
        assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("load", [runtime.load, tb.load], ids=["runtime", "jax"])
def test_long_texts_in_overlapping_windows_equal_the_pipelines_stride(built, load):
    """Texts past the build's seq of 16 run in windows of 16 tokens as the pipeline's ``stride`` runs them (its
    tokenizer's model_max_length set to the same 16), overlapping entities joined by its rule; short texts alike."""
    _, hf_model, _ = built
    hf_tok = transformers.AutoTokenizer.from_pretrained(built[2].name_or_path, model_max_length=16)
    texts = [" ".join(TEXTS) * 2, TEXTS[0] + " and the fox again, " + TEXTS[2], TEXTS[1]]
    assert [len(built[2](t)["input_ids"]) > 16 for t in texts] == [True, True, False]
    model = load(built[0])
    for strategy, stride in (("simple", 4), ("first", 0), ("average", 7), ("max", 13)):
        pipe = transformers.pipeline("token-classification", model=hf_model, tokenizer=hf_tok,
                                     aggregation_strategy=strategy, stride=stride)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = [pipe(t) for t in texts]
        got = model.entities(texts, aggregation_strategy=strategy, stride=stride)
        same(got, want)
        assert all(e["start"] < f["start"] and e["end"] <= f["start"] for row in got for e, f in zip(row, row[1:]))
    assert model.entities(texts[0], stride=4) == model.entities([texts[0]], stride=4)[0]
    for call, fragment in [
            (lambda: model.entities(texts[0]), f"text 0 is {len(built[2](texts[0])['input_ids'])} tokens, but the model "
                                               "takes at most 16 (the build's seq range): send shorter texts, pass "
                                               "stride=N to find entities in windows"),
            (lambda: model.entities(texts, stride=14), "stride must be a whole number of tokens from 0 to 13 (a window "
                                                       "holds 14 of the text's tokens: the build's seq of 16 less the "
                                                       "tokenizer's added ones), got 14"),
            (lambda: model.entities(texts, stride=-1), "got -1"),
            (lambda: model.entities(texts, stride="4"), "got '4'"),
            (lambda: model.entities(texts, aggregation_strategy="none", stride=4),
             "stride needs an aggregation_strategy that groups tokens (simple, first, average or max)")]:
        with pytest.raises(CallError) as e:
            call()
        assert fragment in str(e.value) and "\n" not in str(e.value)


def call(srv, body):
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v2/models/bert/infer", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_the_server_answers_with_entities_over_http_and_grpc(built):
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    texts = TEXTS[:3]
    width = max(len(built[2](t)["input_ids"]) for t in texts)  # the texts padded to the longest, as a batch is
    want = pipeline_finds(built, texts, aggregation_strategy="average")
    simple = pipeline_finds(built, texts, aggregation_strategy="simple", ignore_labels=["O", "PER"])
    with Server([built[0]], port=0, grpc_port=0).start() as srv:
        text = {"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}
        status, data = call(srv, {"inputs": [text], "outputs": [
            {"name": "entities", "parameters": {"aggregation_strategy": "average"}},
            {"name": "logits", "parameters": {"classification": 1}}]})
        assert status == 200, data
        entities, top = data["outputs"]
        assert entities["datatype"] == "BYTES" and entities["shape"] == [3] and top["shape"] == [3, width, 1]
        same([json.loads(row) for row in entities["data"]], want)
        meta = json.loads(srv_get(srv, "/v2/models/bert"))
        assert meta["entities"]["parameters"]["aggregation_strategy"]["default"] == "simple"
        host = srv.url.split("//")[1]
        grpc_out = triton_grpc.InferRequestedOutput("entities")
        grpc_out._output.parameters["ignore_labels"].string_param = "O, PER"  # gRPC's parameters are scalars
        for client, module, outputs in (
                (triton_http.InferenceServerClient(host), triton_http,  # binary BYTES: tritonclient's default
                 [triton_http.InferRequestedOutput("entities"), triton_http.InferRequestedOutput("logits", class_count=2)]),
                (triton_grpc.InferenceServerClient(srv.grpc.address), triton_grpc,
                 [grpc_out, triton_grpc.InferRequestedOutput("logits", class_count=2)])):
            inp = module.InferInput("text", [3], "BYTES")
            inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
            result = client.infer("bert", [inp], outputs=outputs)
            found = [json.loads(row) for row in result.as_numpy("entities")]
            if module is triton_http:
                same(found, pipeline_finds(built, texts, aggregation_strategy="simple"))
            else:
                same(found, simple)
            assert result.as_numpy("logits").shape == (3, width, 2), module.__name__
            client.close()
        ids = {"name": "input_ids", "datatype": "INT32", "shape": [1, 3], "data": [2, 5, 3]}
        for body, fragment in [
                ({"inputs": [ids], "outputs": [{"name": "entities"}]},
                 "output 'entities' is found in texts: send the texts as the BYTES input 'text' instead of token ids"),
                ({"inputs": [text], "outputs": [{"name": "entities", "parameters": {"aggregation_strategy": "word"}}]},
                 "output 'entities': aggregation_strategy 'word' is not one of none, simple, first, average, max"),
                ({"inputs": [text], "outputs": [{"name": "entities", "parameters": {"classification": 1}}]},
                 "output 'entities' gives entities, not classes"),
                ({"inputs": [text], "outputs": [{"name": "logits", "parameters": {"ignore_labels": ["O"]}}]},
                 "output 'logits': parameter 'ignore_labels' groups entities, which output 'entities' gives."),
                ({"inputs": [text], "outputs": [{"name": "entity"}]},
                 "output 'entity': bert has no such output; it has logits (and 'entities' with texts)")]:
            status, data = call(srv, body)
            assert status == 400 and fragment in data["error"] and "\n" not in data["error"], (body, data)


def test_the_server_finds_entities_in_long_texts_in_windows_over_http_and_grpc(built):
    """``stride`` on the ``entities`` output: each text in windows of the build's seq (16), more windows than the
    build's batch (4) in several calls, equal to the pipeline's ``stride``; such a request asks for entities alone."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    hf_tok = transformers.AutoTokenizer.from_pretrained(built[2].name_or_path, model_max_length=16)
    texts = [" ".join(TEXTS) * 2, TEXTS[1], TEXTS[0] + " and the fox again, " + TEXTS[2]]
    pipe = transformers.pipeline("token-classification", model=built[1], tokenizer=hf_tok,
                                 aggregation_strategy="first", stride=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = [pipe(t) for t in texts]
    with Server([built[0]], port=0, grpc_port=0).start() as srv:
        text = {"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}
        asked = {"name": "entities", "parameters": {"aggregation_strategy": "first", "stride": 5}}
        status, data = call(srv, {"inputs": [text], "outputs": [asked]})
        assert status == 200, data
        (entities,) = data["outputs"]
        assert entities["shape"] == [3]
        same([json.loads(row) for row in entities["data"]], want)
        host = srv.url.split("//")[1]
        for client, module in ((triton_http.InferenceServerClient(host), triton_http),
                               (triton_grpc.InferenceServerClient(srv.grpc.address), triton_grpc)):
            out = module.InferRequestedOutput("entities")
            if module is triton_http:
                out._parameters.update(aggregation_strategy="first", stride=5)
            else:
                out._output.parameters["aggregation_strategy"].string_param = "first"
                out._output.parameters["stride"].int64_param = 5
            inp = module.InferInput("text", [3], "BYTES")
            inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
            same([json.loads(row) for row in client.infer("bert", [inp], outputs=[out]).as_numpy("entities")], want)
            client.close()
        pair = {"name": "text_pair", "datatype": "BYTES", "shape": [3], "data": texts}
        for body, fragment in [
                ({"inputs": [text], "outputs": [asked, {"name": "logits"}]},
                 "output 'logits': a request whose 'entities' run in windows (stride 5) is answered with 'entities' "
                 "alone: ask for 'logits' in a request of its own."),
                ({"inputs": [text], "outputs": [{"name": "entities", "parameters": {"stride": 14}}]},
                 "stride must be a whole number of tokens from 0 to 13"),
                ({"inputs": [text], "outputs": [{"name": "entities", "parameters": {"stride": 2,
                                                                                     "aggregation_strategy": "none"}}]},
                 "output 'entities': stride needs an aggregation_strategy that groups tokens"),
                ({"inputs": [text, pair], "outputs": [asked]}, "send 'text' alone, without 'text_pair'"),
                ({"inputs": [dict(text, shape=[1], data=[TEXTS[0]])], "outputs": [{"name": "logits",
                                                                                    "parameters": {"stride": 2}}]},
                 "output 'logits': parameter 'stride' groups entities, which output 'entities' gives."),
                ({"inputs": [text], "outputs": [{"name": "entities"}]},
                 f"input 0 is {len(built[2](texts[0])['input_ids'])} tokens, but model 'bert' takes at most 16 (the "
                 "build's seq range): send shorter texts, ask output \"entities\" with a \"stride\" to find entities in "
                 "windows of them")]:
            status, data = call(srv, body)
            assert status == 400 and fragment in data["error"] and "\n" not in data["error"], (body, data)


def srv_get(srv, path):
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path)
    return conn.getresponse().read()
