"""``/generate`` and ``/generate_stream``: token ids in and out, one running batch shared by every client."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import tripy_build as tb
from tripy_build.serve.http import Server
from conftest import run_cli
from serve.serving import concurrently

TINY = ["model=gpt2", "task=generate", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.vocab_size=96",
        "model.n_positions=64", "generate.max_length=32", "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,4,8]",
        "shapes.buckets.batch=[1,4]"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gen-serve")
    r = run_cli(*TINY, f"artifacts_dir={root}", cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return next((root / "gpt2").iterdir())


@pytest.fixture(scope="module")
def server(gpt2):
    with Server([gpt2], port=0).start() as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(gpt2):
    exe = tb.load(gpt2, warmup="none")
    return lambda ids, n, **kw: exe.generate([ids], n, **kw)[0].tolist()


def post(server, path: str, body) -> tuple[int, bytes]:
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, body=json.dumps(body) if not isinstance(body, bytes) else body,
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def test_generate_returns_the_new_ids(server, reference):
    status, data = post(server, "/v2/models/gpt2/generate", {"input_ids": [5, 17, 33], "max_new_tokens": 9, "id": "a"})
    assert status == 200
    answer = json.loads(data)
    assert answer["output_ids"] == reference([5, 17, 33], 9) and answer["id"] == "a" and answer["model_name"] == "gpt2"
    sampled = {"input_ids": [1, 2], "parameters": {"max_new_tokens": 6, "temperature": 0.8, "top_k": 10, "seed": 4}}
    assert json.loads(post(server, "/v2/models/gpt2/generate", sampled)[1])["output_ids"] == \
        reference([1, 2], 6, temperature=0.8, top_k=10, seed=4)


def test_the_jax_loader_generates_the_same_ids(gpt2, reference):
    """``/generate`` over ``tb.load``'s executable (what a GPU's artifact is served by): its steps, its cache."""
    with Server([gpt2], port=0, loader="jax").start() as srv:
        assert srv.endpoints["gpt2"].loader == "jax"
        for ids, n in (([5, 17, 33], 9), ([1, 2, 3, 4, 5, 6], 4)):
            status, data = post(srv, "/v2/models/gpt2/generate", {"input_ids": ids, "max_new_tokens": n})
            assert status == 200 and json.loads(data)["output_ids"] == reference(ids, n)


def test_generate_stream_sends_one_event_per_token(server, reference):
    status, data = post(server, "/v2/models/gpt2/generate_stream", {"input_ids": [7, 8, 9, 10, 11], "max_new_tokens": 7})
    assert status == 200
    events = [json.loads(line[len(b"data: "):]) for line in data.split(b"\n\n") if line]
    assert [e["index"] for e in events] == list(range(7))
    assert [t for e in events for t in e["output_ids"]] == reference([7, 8, 9, 10, 11], 7)


def test_concurrent_requests_share_decode_steps_and_get_their_own_answers(server, reference):
    generator = server.endpoints["gpt2"].generator
    steps, rows = generator.steps_run, generator.rows_run
    prompts = [[i + 1, 3 * i % 96, 40] + [i] * (i % 5) for i in range(8)]  # 8 clients, batch buckets up to 4
    lengths = [6 + i for i in range(8)]
    answers = concurrently(8, lambda i: post(server, "/v2/models/gpt2/generate",
                                             {"input_ids": prompts[i], "max_new_tokens": lengths[i]}))
    for i, (status, data) in enumerate(answers):
        assert status == 200, data
        assert json.loads(data)["output_ids"] == reference(prompts[i], lengths[i]), i
    ran, carried = generator.steps_run - steps, generator.rows_run - rows
    assert carried > 1.5 * ran  # decode steps carried several requests' rows at once
    assert not generator.rows and generator.session is None  # every row freed, the batch dropped


def test_a_running_batch_grows_into_the_next_bucket_and_its_rows_go_on(gpt2):
    """A request that finds every row of the running batch busy moves the batch into the next bucket (the cache
    copied once, with what each row holds): the running request goes on where it was, the new one joins, and each
    gets the ids, and the log probabilities, it gets alone."""
    from tripy_build import runtime
    from tripy_build.serve.generation import Generator

    steps = runtime.load(gpt2).generation_steps()

    def run(requests, grow_after=None):
        """Each request's (ids, log probabilities); the second submitted once the first made ``grow_after`` tokens
        (None: each alone, one after the other). Also the batch sizes the generator grew from."""
        generator = Generator(steps, steps.spec(), "gpt2")
        grown, grow = [], generator._grown
        generator._grown = lambda session: grown.append(session.batch) or grow(session)
        seqs, ended = [], [threading.Event() for _ in requests]

        def submit(i):
            def took(token):
                if i == 0 and grow_after is not None and len(seqs[0].tokens) == grow_after:
                    submit(1)
            seqs.append(generator.submit(requests[i][0], requests[i][1], took, lambda e: ended[i].set(),
                                         eos_token_id=[], logprobs=1))
        try:
            for i in ([0] if grow_after is not None else range(len(requests))):
                submit(i)
                if grow_after is None:
                    assert ended[i].wait(60)
            assert all(e.wait(60) for e in ended)
        finally:
            generator.close()
        return [(s.tokens, [lp for lp, _ in s.scored]) for s in seqs], grown

    requests = [([5, 6, 7], 20), ([9, 8], 6)]
    alone, _ = run(requests)
    together, grown = run(requests, grow_after=3)
    assert grown == [1]
    for (ids, logprobs), (want_ids, want) in zip(together, alone):
        assert ids == want_ids
        np.testing.assert_allclose(logprobs, want, atol=1e-5)


def test_a_request_stops_at_any_of_its_eos_ids(server, reference):
    """``eos_token_id``: one id, or several (an instruct model's end of text and end of turn); a row stops after
    the first of them it generates. Without it, the artifact's (none here: a build without a checkpoint)."""
    full = reference([5, 17, 33], 9)
    assert len(full) == 9
    for stops in ([full[6], full[2]], full[4]):
        first = min(full.index(t) for t in (stops if isinstance(stops, list) else [stops]))
        status, data = post(server, "/v2/models/gpt2/generate", {"input_ids": [5, 17, 33], "max_new_tokens": 9,
                                                                 "eos_token_id": stops})
        assert status == 200 and json.loads(data)["output_ids"] == full[:first + 1], stops


def test_a_requests_options_leave_its_prompt_as_it_is():
    """``eos_token_id`` (a list, or an empty one) is an option beside ``input_ids``, never in its place."""
    from tripy_build.serve.generation import parse_request

    for stops, want in (([7, 9], [7, 9]), ([], []), (4, [4])):
        ids, options = parse_request({"input_ids": [5, 17, 33], "parameters": {"eos_token_id": stops}})
        assert ids == [5, 17, 33] and options["eos_token_id"] == want


def test_bad_generate_requests_are_one_line_400s(server):
    cases = [({"input_ids": [5, 17], "max_new_tokens": 40}, "generate.max_length=32"),
             ({"input_ids": [5, 96]}, "token id 96, outside [0, 96)"),
             ({"input_ids": []}, '"input_ids" must be a non-empty list'),
             ({"input_ids": [1], "max_tokens": 3}, "'max_tokens' is not a generate option"),
             ({"input_ids": [1], "temperature": "hot"}, "'temperature' must be a number"),
             ({"input_ids": [1], "max_new_tokens": 0}, "max_new_tokens=0"),
             ({"input_ids": [1], "eos_token_id": [2, "x"]}, "'eos_token_id' must be a token id or a list of them"),
             (b"{not json", "malformed")]
    for body, fragment in cases:
        status, data = post(server, "/v2/models/gpt2/generate", body)
        message = json.loads(data)["error"]
        assert status == 400 and fragment in message and "\n" not in message, (body, message)


def test_a_client_that_leaves_a_stream_frees_its_row(server, reference, monkeypatch):
    generator = server.endpoints["gpt2"].generator
    run = generator.steps.run

    def slow_run(*args):  # a step as long as a real model's, so the stream cannot finish before its client leaves
        time.sleep(0.03)
        return run(*args)
    monkeypatch.setattr(generator.steps, "run", slow_run)
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v2/models/gpt2/generate_stream", body=json.dumps({"input_ids": [3, 4], "max_new_tokens": 25}),
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.read(6) == b"data: "
    conn.sock.close()  # gone after the first token
    conn.close()
    status, data = post(server, "/v2/models/gpt2/generate", {"input_ids": [3, 4], "max_new_tokens": 5})
    assert status == 200 and json.loads(data)["output_ids"] == reference([3, 4], 5)
    for _ in range(200):  # the stream was cancelled at its next step, not run to its 25 tokens
        if not generator.rows:
            break
        time.sleep(0.05)
    assert not generator.rows
    assert generator.cancelled >= 1


def test_generate_on_a_model_that_does_not_generate_is_404(artifact):
    with Server([artifact], port=0).start() as srv:
        name = next(iter(srv.endpoints))
        status, data = post(srv, f"/v2/models/{name}/generate", {"input_ids": [1]})
    assert status == 404 and b"not built with task=generate" in data


def test_requests_reaching_an_idle_server_together_prefill_as_one_batch(gpt2, reference, monkeypatch):
    """Three prompts of 9-12 tokens sent at once: their common 8 tokens run as one decode call over every row
    (the generator waits for requests arriving with the first), the rest of each row by prefill. The join window
    is widened from its few ms here: on a loaded host the test's own submits can be further apart than that."""
    import threading

    from tripy_build import runtime
    from tripy_build.serve import generation
    from tripy_build.serve.generation import Generator

    monkeypatch.setattr(generation, "JOIN_WINDOW_S", 0.5)

    steps = runtime.load(gpt2).generation_steps()
    calls, run = [], steps.run
    steps.run = lambda entry, profile, leaves: calls.append((entry, profile["seq"])) or run(entry, profile, leaves)
    generator = Generator(steps, steps.spec(), "gpt2")
    prompts = [list(range(10, 19)), list(range(30, 40)), list(range(50, 62))]
    tokens = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]
    try:
        for i, prompt in enumerate(prompts):
            generator.submit(prompt, 4, tokens[i].append, lambda error, i=i: done[i].set())
        assert all(d.wait(60) for d in done)
    finally:
        generator.close()
    assert tokens == [reference(p, 4) for p in prompts]
    assert [c for c in calls if c[0] == "decode" and c[1] > 1] == [("decode", 8)]
    assert [seq for entry, seq in calls if entry == "prefill"] == [1, 2, 4]  # the rows' 1, 2 and 4 tokens left


def test_generate_requests_count_in_the_metrics_refused_ones_too(server):
    def count(outcome):
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        line = f'tripy_build_requests_total{{model="gpt2",outcome="{outcome}"}} '
        return float(next(ln for ln in text.splitlines() if ln.startswith(line)).rsplit(" ", 1)[1])

    before = {o: count(o) for o in ("success", "failure", "refused")}
    assert post(server, "/v2/models/gpt2/generate", {"input_ids": [5, 17], "max_new_tokens": 3})[0] == 200
    assert post(server, "/v2/models/gpt2/generate_stream", {"input_ids": [5, 17], "max_new_tokens": 3})[0] == 200
    assert post(server, "/v2/models/gpt2/generate", {"input_ids": [5, 96]})[0] == 400
    assert post(server, "/v2/models/gpt2/generate_stream", {"input_ids": [1], "max_new_tokens": 40})[0] == 400
    assert post(server, "/v2/models/gpt2/generate", b"{not json")[0] == 400
    assert count("success") == before["success"] + 2
    assert count("refused") == before["refused"] + 3 and count("failure") == before["failure"]


def test_a_prompt_that_extends_the_last_one_is_prefilled_from_where_the_cache_ends(server, reference):
    """A conversation's next turn after the server went idle: the cache the last request left still holds its
    prompt and reply, so only the new tokens run (counted as vLLM counts them, in tokens: the prefix cache's
    queries and hits), and the ids equal a fresh generation's."""
    def counted():
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        return [float(next(ln for ln in text.splitlines() if ln.startswith(f'{name}{{model="gpt2"}} ')).split()[-1])
                for name in ("tripy_build_prefix_cache_queries_total", "tripy_build_prefix_cache_hits_total")]

    first = [7, 3, 41, 9, 22, 13]
    status, data = post(server, "/v2/models/gpt2/generate", {"input_ids": first, "max_new_tokens": 5, "eos_token_id": []})
    assert status == 200, data
    turn = first + json.loads(data)["output_ids"] + [30, 31]
    before = counted()
    status, data = post(server, "/v2/models/gpt2/generate", {"input_ids": turn, "max_new_tokens": 4, "eos_token_id": []})
    assert status == 200 and json.loads(data)["output_ids"] == reference(turn, 4, eos_token_id=[])
    queries, hits = (b - a for a, b in zip(before, counted()))
    assert (queries, hits) == (len(turn), len(first) + 4)  # the reply's last token was never fed back


def test_a_generate_artifact_is_announced_by_its_generate_routes_and_keeps_its_entries_off_infer(gpt2, tmp_path):
    """``tripy-build serve`` on a task=generate artifact names /generate and /generate_stream; /infer and the
    metadata show none of the entries' internal inputs (cache, cache_index, row)."""
    from serve.serving import start_serve

    proc, lines = start_serve([str(gpt2), "--port", "0"], tmp_path)
    try:
        url = lines[-1].split()[2]
        model_line = next(line for line in lines if line.startswith("gpt2 "))
        assert f"POST {url}/v2/models/gpt2/generate and {url}/v2/models/gpt2/generate_stream" in model_line, lines
        assert "/infer" not in model_line and "--expose-entries" not in model_line, model_line
        with urllib.request.urlopen(f"{url}/v2/models/gpt2", timeout=30) as r:
            meta = json.loads(r.read())
        assert [i["name"] for i in meta["inputs"]] == ["input_ids"] and [o["name"] for o in meta["outputs"]] == ["output_ids"]
        assert meta["inputs"][0]["ranges"] == [{"name": "prompt", "min": 1, "max": 31}]
        assert meta["generate"]["routes"] == ["POST /v2/models/gpt2/generate", "POST /v2/models/gpt2/generate_stream"]
        assert meta["generate"]["max_length"] == 32 and meta["generate"]["vocab_size"] == 96
        text = json.dumps(meta)
        assert not any(f"\"{word}\"" in text for word in ("cache", "cache_index", "row", "prefill", "decode")), text
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v2/models/gpt2/infer", body=json.dumps({"inputs": []}),
                     headers={"content-type": "application/json"})
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        conn.close()
        assert response.status == 404 and "model 'gpt2' generates tokens: POST /v2/models/gpt2/generate" in error, error
        assert "--expose-entries" in error
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v2/models/gpt2/generate", body=json.dumps({"input_ids": [5, 6], "max_new_tokens": 2}),
                     headers={"content-type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    help_text = " ".join(run_cli("serve", "--help", cwd=tmp_path).stdout.split())
    assert "--expose-entries" in help_text and "also served on /infer" in help_text


def test_the_first_entry_is_served_on_infer_over_http_and_grpc_only_when_exposed(gpt2):
    import grpc
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    from tripy_build import runtime

    with Server([gpt2], port=0, grpc_port=0).start() as srv:
        client = triton.InferenceServerClient(srv.grpc.address)
        meta = client.get_model_metadata("gpt2", as_json=True)
        assert [i["name"] for i in meta["inputs"]] == ["input_ids"] and [o["name"] for o in meta["outputs"]] == ["output_ids"]
        with pytest.raises(InferenceServerException) as refused:
            client.infer("gpt2", [triton.InferInput("input_ids", [1, 1], "INT32").set_data_from_numpy(
                np.zeros((1, 1), np.int32))])
        assert refused.value.status() == str(grpc.StatusCode.UNIMPLEMENTED), refused.value
        assert "generates tokens: POST /v2/models/gpt2/generate" in refused.value.message()
        client.close()
    direct = runtime.load(gpt2)
    with Server([gpt2], port=0, grpc_port=0, expose_entries=True).start() as srv:
        ep = srv.endpoints["gpt2"]
        assert "its 'prefill' entry on POST" in ep.routes(srv.url) and "(--expose-entries)" in ep.routes(srv.url)
        status, data = _get(srv, "/v2/models/gpt2")
        meta = json.loads(data)
        names = [i["name"] for i in meta["inputs"]]
        assert names == ["input_ids", "position_ids", "attention_mask", "cache", "cache_index", "row"], names
        assert meta["entry"] == "prefill" and meta["generate"]["entries"] == ["prefill", "decode"]
        # a real prefill call: every input at its smallest shape, zeros (in every declared range)
        leaves = [np.zeros([r if isinstance(r, int) else r["min"] for r in i["ranges"]],
                           {"INT32": np.int32, "FP32": np.float32}[i["datatype"]]) for i in meta["inputs"]]
        body = {"inputs": [{"name": n, "shape": list(x.shape), "datatype": i["datatype"], "data": x.ravel().tolist()}
                           for n, x, i in zip(names, leaves, meta["inputs"])]}
        status, data = post(srv, "/v2/models/gpt2/infer", body)
        assert status == 200, data
        got = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(data)["outputs"]}
        want = direct.call_flat(*leaves)
        for name, w in zip(direct.output_names, want):
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)
        client = triton.InferenceServerClient(srv.grpc.address)
        assert [i.name for i in client.get_model_metadata("gpt2").inputs] == names
        client.close()


def _get(server, path: str) -> tuple[int, bytes]:
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data
