"""``tripy-build serve``: an artifact over HTTP (KServe v2), with requests batched along its rows dim."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.errors import ConfigError
from tripy_build.serve.http import Server
from conftest import run_cli
from serve.serving import concurrently, sample, start_serve






def request(x: np.ndarray, t: np.ndarray, binary: bool = False) -> tuple[bytes, dict[str, str]]:
    """A v2 inference request body: JSON data, or the binary tensor data extension."""
    inputs = [{"name": "x", "shape": list(x.shape), "datatype": "FP32"},
              {"name": "t", "shape": list(t.shape), "datatype": "INT32"}]
    if not binary:
        inputs[0]["data"], inputs[1]["data"] = x.ravel().tolist(), t.ravel().tolist()
        return json.dumps({"id": "r1", "inputs": inputs}).encode(), {}
    blobs = [x.tobytes(), t.tobytes()]
    for item, blob in zip(inputs, blobs):
        item["parameters"] = {"binary_data_size": len(blob)}
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """(status, JSON header, the binary data after it)."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, data, head_len = r.status, r.read(), r.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as e:
        status, data, head_len = e.code, e.read(), None
    split = len(data) if head_len is None else int(head_len)
    return status, json.loads(data[:split]), data[split:]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def outputs(response: dict, blob: bytes = b"") -> list[np.ndarray]:
    """The response's tensors, from JSON data or the binary data that follows the header."""
    out, offset = [], 0
    for o in response["outputs"]:
        dtype = {"FP32": np.float32, "INT32": np.int32}[o["datatype"]]
        if "data" in o:
            out.append(np.asarray(o["data"], dtype).reshape(o["shape"]))
        else:
            n = o["parameters"]["binary_data_size"]
            out.append(np.frombuffer(blob[offset:offset + n], dtype).reshape(o["shape"]))
            offset += n
    return out



def infer_url(server: Server) -> str:
    return f"{server.url}/v2/models/two_heads/infer"



def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(artifact, direct):
    """12 requests of 1-3 rows and two seq sizes at once: answers equal direct calls, in fewer calls."""
    rng = np.random.default_rng(1)
    cases = [sample(rng, int(rng.integers(1, 4)), seq=(2, 4)[i % 2]) for i in range(12)]
    with Server([artifact], port=0, max_delay_ms=500).start() as server:
        answers = concurrently(12, lambda i: post(infer_url(server), *request(*cases[i], binary=i % 3 == 0)))
        _, stats = get(f"{server.url}/v2/models/two_heads/stats")
    for (x, t), (status, body, blob) in zip(cases, answers):
        assert status == 200, body
        got, want = outputs(body, blob), direct.call_flat(x, t)
        assert [g.shape for g in got] == [w.shape for w in want]
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    s = stats["model_stats"][0]
    assert s["inference_count"] == sum(len(t) for _, t in cases)
    # requests of the two seq sizes never share a call, and requests of one size were gathered
    assert 2 <= s["execution_count"] < 12, s
    assert max(b["batch_size"] for b in s["batch_stats"]) > 3, s


def test_the_jax_loader_serves_the_same_answers_batched(artifact, direct):
    """``loader="jax"`` (``tb.load``: what serves a GPU's executables) answers as the jax-free runtime does, its
    requests gathered the same way."""
    from tripy_build.runtime.executable import Executable

    rng = np.random.default_rng(3)
    cases = [sample(rng, int(rng.integers(1, 4)), seq=(2, 4)[i % 2]) for i in range(8)]
    with Server([artifact], port=0, max_delay_ms=500, loader="jax").start() as server:
        endpoint = server.endpoints["two_heads"]
        assert endpoint.loader == "jax" and isinstance(endpoint.runtime, Executable)
        answers = concurrently(8, lambda i: post(infer_url(server), *request(*cases[i], binary=i % 2 == 0)))
        _, stats = get(f"{server.url}/v2/models/two_heads/stats")
        status, body, _ = post(infer_url(server), *request(np.ones((2, 5, 4), np.float32), np.ones(2, np.int32)))
        assert status == 400 and "seq" in body["error"] and "[2, 4]" in body["error"], body  # as the runtime checks
    for (x, t), (status, body, blob) in zip(cases, answers):
        assert status == 200, body
        got, want = outputs(body, blob), direct.call_flat(x, t)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    assert stats["model_stats"][0]["execution_count"] < 8


def test_the_loader_is_the_jax_one_for_a_gpu_program_on_a_gpu_host(artifact, monkeypatch):
    from tripy_build import host
    from tripy_build.artifact.read import read_manifest
    from tripy_build.serve.endpoint import loader_for

    cpu = read_manifest(artifact)
    both, cuda = (dataclasses.replace(cpu, platforms=p) for p in (("cpu", "cuda"), ("cuda",)))
    monkeypatch.setattr(host, "gpu_present", lambda: False)
    assert [loader_for(m) for m in (cpu, both, cuda)] == ["runtime", "runtime", "jax"]
    monkeypatch.setattr(host, "gpu_present", lambda: True)
    assert [loader_for(m) for m in (cpu, both, cuda)] == ["runtime", "jax", "jax"]
    assert loader_for(cuda, "runtime") == "runtime" and loader_for(cpu, "jax") == "jax"
    with pytest.raises(ConfigError, match="serve --loader 'pjrt': must be one of auto, runtime, jax"):
        loader_for(cpu, "pjrt")


def test_max_batch_bounds_a_call_and_a_lone_request_waits_at_most_the_delay(artifact, direct):
    rng = np.random.default_rng(2)
    cases = [sample(rng, 1) for _ in range(10)]
    with Server([artifact], port=0, max_batch=4, max_delay_ms=300).start() as server:
        answers = concurrently(10, lambda i: post(infer_url(server), *request(*cases[i])))
        _, stats = get(f"{server.url}/v2/models/two_heads/stats")
    assert all(status == 200 for status, _, _ in answers)
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    assert max(sizes) == 4 and stats["model_stats"][0]["execution_count"] >= 3, stats


def test_batching_off_runs_each_request_alone(artifact, direct):
    rng = np.random.default_rng(3)
    cases = [sample(rng, 2) for _ in range(6)]
    with Server([artifact], port=0, batch_dim="none").start() as server:
        answers = concurrently(6, lambda i: post(infer_url(server), *request(*cases[i])))
        _, meta = get(f"{server.url}/v2/models/two_heads")
        _, stats = get(f"{server.url}/v2/models/two_heads/stats")
    for (x, t), (_, body, _) in zip(cases, answers):
        np.testing.assert_allclose(outputs(body)[0], direct.call_flat(x, t)[0], rtol=1e-6)
    assert meta["batching"] is None and "batching off" in meta["batching_note"]
    assert stats["model_stats"][0]["execution_count"] == 6


def test_metadata_health_and_versions(artifact):
    with Server([artifact], port=0).start() as server:
        assert server.wait_ready(30)
        assert get(f"{server.url}/v2/health/ready") == (200, {"ready": True})
        assert get(f"{server.url}/v2/health/live") == (200, {"live": True})
        status, meta = get(f"{server.url}/v2/models/two_heads")
        assert status == 200
        assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, -1, 4], "ranges": [
            {"name": "batch", "min": 1, "max": 16}, {"name": "seq", "min": 2, "max": 4}, 4]}
        assert [o["datatype"] for o in meta["outputs"]] == ["FP32", "INT32"] and meta["outputs"][1]["shape"] == [-1]
        assert meta["batching"] == {"dim": "batch", "max_batch": 16, "max_delay_ms": 0.0}
        versioned = f"{server.url}/v2/models/two_heads/versions/{meta['versions'][0]}"
        assert get(versioned + "/ready") == (200, {"name": "two_heads", "ready": True})
        x, t = sample(np.random.default_rng(4), 3)
        status, body, _ = post(versioned + "/infer", *request(x, t))
        assert status == 200 and body["id"] == "r1" and body["model_version"] == meta["versions"][0]
        assert get(f"{server.url}/v2/models/two_heads/versions/nope/ready")[0] == 404


def test_the_server_answers_at_once_and_is_ready_once_its_profiles_are_warmed(artifact, direct, warm_up_held):
    """Profiles warm up in the background: /v2/health/ready and the model's ready say 400 (the protocol's 4xx for
    false) until that is done, 200 after; requests are answered meanwhile."""
    with Server([artifact], port=0).start() as server:
        assert get(f"{server.url}/v2/health/ready") == (400, {"ready": False})
        assert get(f"{server.url}/v2/models/two_heads/ready") == (400, {"name": "two_heads", "ready": False})
        assert get(f"{server.url}/v2/health/live") == (200, {"live": True})
        assert server.wait_ready(timeout=0.2) is False
        x, t = sample(np.random.default_rng(9), 3)
        status, body, _ = post(f"{server.url}/v2/models/two_heads/infer", *request(x, t))
        assert status == 200
        for got, want in zip(outputs(body), direct.call_flat(x, t)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        warm_up_held.set()
        assert server.wait_ready(timeout=30) is True
        assert get(f"{server.url}/v2/health/ready") == (200, {"ready": True})
        assert get(f"{server.url}/v2/models/two_heads/ready") == (200, {"name": "two_heads", "ready": True})


def test_wait_ready_opens_the_ports_only_once_every_model_is_warmed(artifact, direct, warm_up_held):
    """``wait_ready``: while the warm-up is held back the HTTP port refuses connections and no gRPC server exists;
    once it is done the ports open, and their first answers say ready."""
    import threading

    import tritonclient.grpc as triton

    server = Server([artifact], port=0, grpc_port=0, wait_ready=True)
    starting = threading.Thread(target=server.start)  # start() returns once the ports answer
    starting.start()
    try:
        starting.join(0.5)
        assert starting.is_alive() and not server.serving.is_set() and server.grpc is None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=5)
        warm_up_held.set()
        starting.join(30)
        assert not starting.is_alive() and server.serving.is_set()
        assert get(f"{server.url}/v2/health/ready") == (200, {"ready": True})
        client = triton.InferenceServerClient(server.grpc.address)
        assert client.is_server_ready() and client.is_model_ready("two_heads")
        client.close()
        x, t = sample(np.random.default_rng(10), 2)
        status, body, _ = post(infer_url(server), *request(x, t))
        assert status == 200
        np.testing.assert_allclose(outputs(body)[0], direct.call_flat(x, t)[0], rtol=1e-6, atol=1e-6)
    finally:
        server.close()


def test_a_server_waiting_to_be_ready_stops_on_close_without_opening_its_port(artifact, warm_up_held):
    import threading

    server = Server([artifact], port=0, wait_ready=True)
    address = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    refused = []

    def start():
        with pytest.raises(ConfigError, match="did not start") as e:
            server.start()
        refused.append(e.value)
    starting = threading.Thread(target=start)
    starting.start()
    starting.join(0.3)
    server.close()
    starting.join(10)
    assert not starting.is_alive() and not server.serving.is_set() and refused
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)
    assert server.endpoints["two_heads"].batcher._closed


def test_sigterm_while_waiting_to_be_ready_stops_the_server_without_opening_its_port(artifact, warm_up_held):
    """serve_forever in the main thread (as the command runs it), the warm-up held back: SIGTERM ends the wait,
    the port never opens, the endpoints are closed, and the signal is named."""
    import threading

    server = Server([artifact], port=0, wait_ready=True)
    address = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert server.serve_forever() == "SIGTERM"
    finally:
        timer.cancel()
    assert not server.serving.is_set() and server.endpoints["two_heads"].batcher._closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler it set is gone


def test_a_port_taken_while_waiting_to_be_ready_is_refused_in_one_line(artifact):
    """With wait_ready the HTTP port is bound at once but listened on only once ready: a process that listens on
    it meanwhile (SO_REUSEADDR lets it bind) makes serve_forever refuse, naming the port."""
    server = Server([artifact], port=0, wait_ready=True)
    p = int(server.url.rsplit(":", 1)[1])
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", p))
        other.listen()
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{p}: Address already in use; choose another "
                                              r"--port \(0 picks a free one\)"):
            server.serve_forever()
    assert not server.serving.is_set() and server.endpoints["two_heads"].batcher._closed


def test_the_command_with_wait_ready_prints_serving_once_ready_and_is_never_seen_not_ready(artifact, tmp_path):
    """``tripy-build serve --wait-ready``: a script polling GET /v2/health/ready from the start sees connections
    refused, then 200, never 400; 'serving on' and 'ready:' come together once the models are warmed."""
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            try:
                seen.append(get(f"http://127.0.0.1:{free}/v2/health/ready")[0])
            except urllib.error.URLError:
                seen.append("refused")
                stop.wait(0.02)
    poller = threading.Thread(target=poll)
    poller.start()
    proc, lines = start_serve([str(artifact), "--port", str(free), "--wait-ready"], tmp_path)
    try:
        ready = proc.stdout.readline()
        assert any(line.startswith("warming every model's profiles up; the ports open once they are") for line in lines)
        assert lines[-1].startswith(f"serving on http://127.0.0.1:{free} ") and "every model is ready" in lines[-1]
        assert ready.startswith("ready: every model's profiles warmed"), (lines, ready)
        deadline = time.monotonic() + 10
        while 200 not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        poller.join(10)
        assert seen[0] == "refused" and 200 in seen and set(seen) == {"refused", 200}, seen
        assert seen.index(200) > max(i for i, v in enumerate(seen) if v == "refused")  # refused, then ready only
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop.set()
        proc.kill()
    help_text = run_cli("serve", "--help", cwd=tmp_path).stdout
    assert "--wait-ready" in help_text and "open the ports only once every model's profiles are warmed" in " ".join(
        help_text.split())


def test_bad_requests_get_a_400_that_names_the_problem_and_do_not_fail_the_others(artifact, direct):
    x, t = sample(np.random.default_rng(5), 2)
    good, _ = request(x, t)
    bad_cases = {
        "too many rows": (request(*sample(np.random.default_rng(6), 17))[0], "is 17, but it must be in range [1, 16]"),
        "wrong width": (request(np.zeros((2, 2, 5), np.float32), t)[0], "dim 2 is 5, but it must be fixed at 4"),
        "rows disagree": (request(x, np.zeros(3, np.int32))[0], "NamedDimension 'batch' must have one size"),
        "wrong datatype": (good.replace(b'"FP32"', b'"FP64"'), "datatype 'FP64' given, but it is FP32"),
        "unknown input": (good.replace(b'"name": "t"', b'"name": "u"'), "input 'u': two_heads has no such input"),
        "missing input": (json.dumps({"inputs": json.loads(good)["inputs"][:1]}).encode(), "needs input(s) 't'"),
        "short data": (json.dumps({"inputs": [dict(json.loads(good)["inputs"][0], data=[1.0]),
                                              json.loads(good)["inputs"][1]]}).encode(),
                       "shape [2, 2, 4] holds 16 values, but \"data\" has 1"),
        "not JSON": (b"{inputs", "the request's JSON is malformed"),
        "no inputs": (b"{}", 'must be a JSON object with an "inputs" list'),
        "unknown output": (json.dumps(dict(json.loads(good), outputs=[{"name": "logits"}])).encode(),
                           "output 'logits': two_heads has no such output; it has output0, output1"),
    }
    with Server([artifact], port=0, max_delay_ms=200).start() as server:
        names = list(bad_cases)
        answers = concurrently(len(names) + 2, lambda i: post(infer_url(server), good if i >= len(names)
                                                               else bad_cases[names[i]][0]))
        for name, (status, body, _) in zip(names, answers):
            assert status == 400 and bad_cases[name][1] in body["error"], (name, body)
        for status, body, _ in answers[len(names):]:
            assert status == 200, body
            np.testing.assert_allclose(outputs(body)[0], direct.call_flat(x, t)[0], rtol=1e-5, atol=1e-5)
        head = json.dumps({"inputs": [{"name": "x", "shape": [2, 2, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 31}}]}).encode()
        status, body, _ = post(infer_url(server), head + b"\0" * 31, {"Inference-Header-Content-Length": str(len(head))})
        assert status == 400 and "shape [2, 2, 4] of FP32 is 64 bytes, but binary_data_size is 31" in body["error"]
        status, body, _ = post(f"{server.url}/v2/models/nope/infer", good)
        assert status == 404 and "model 'nope' is not served here" in body["error"] and "two_heads" not in body["error"]
        assert get(f"{server.url}/v2/nothing")[0] == 404
        assert post(infer_url(server), good)[0] == 200  # still serving
        assert get(f"{server.url}/v2/models/two_heads/stats")[1]["model_stats"][0]["inference_stats"]["fail"][
            "count"] == 0  # refused before they were queued


def test_serve_options_that_cannot_work_are_refused_with_the_fix(artifact, tmp_path):
    refused = (r"batch dim 'seq' is not declared rows-padded \(padding: none\).*model.padding.seq=rows in the build "
               r"config, or compile\(padding=\{'seq': 'rows'\}\)")
    with pytest.raises(ConfigError, match=refused):
        Server([artifact], port=0, batch_dim="seq")
    with pytest.raises(ConfigError, match=r"batch dim 'rows': the model has no such dynamic dim; its dims are 'batch', 'seq'"):
        Server([artifact], port=0, batch_dim="rows")
    with pytest.raises(ConfigError, match=r"max_batch: must be an integer in the range of 'batch', 1..16, got 17"):
        Server([artifact], port=0, max_batch=17)
    with pytest.raises(ConfigError, match=r"max_delay_ms: must be a number of milliseconds in 0..10000, got -1"):
        Server([artifact], port=0, max_delay_ms=-1)
    with pytest.raises(ConfigError, match=r"both named 'two_heads'; serve one artifact per model name"):
        Server([artifact, artifact], port=0)


def test_auto_batching_stays_off_without_a_rows_dim(tmp_path):
    exe = tb.compile(lambda x: x.sum(axis=0), args=(tb.InputInfo((tb.NamedDimension("batch", 1, 2, 8), 3), "float32"),))
    exe.save(tmp_path / "total")
    with Server([tmp_path / "total"], port=0).start() as server:
        name = next(iter(server.endpoints))
        meta = get(f"{server.url}/v2/models/{name}")[1]
        assert meta["batching"] is None
        assert "no dim is declared rows-padded and in every input and output" in meta["batching_note"]
        # a sum over the batch must not be batched: the answer is this request's sum alone
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        body = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.ravel().tolist()}]})
        status, resp, _ = post(f"{server.url}/v2/models/{name}/infer", body.encode())
        assert status == 200 and resp["outputs"][0]["data"] == [3.0, 5.0, 7.0]


def test_outputs_returned_in_a_dict_are_served_by_their_keys(tmp_path):
    """A Hugging Face style model returns {"last_hidden_state", "pooler_output"}: clients ask for those names."""
    def encoder(x):
        return {"last_hidden_state": jnp.tanh(x), "pooler_output": x.sum(axis=1), "extra": [x[:, 0], x[:, 1]]}

    exe = tb.compile(encoder, args=(tb.InputInfo((tb.NamedDimension("batch", 1, 2, 4), 3), "float32"),),
                     padding={"batch": "rows"})
    exe.save(tmp_path / "encoder")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Server([tmp_path / "encoder"], port=0).start() as server:
        meta = get(f"{server.url}/v2/models/encoder")[1]
        assert [o["name"] for o in meta["outputs"]] == ["extra[0]", "extra[1]", "last_hidden_state", "pooler_output"]
        body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.ravel().tolist()}],
                "outputs": [{"name": "pooler_output"}]}
        status, resp, _ = post(f"{server.url}/v2/models/encoder/infer", json.dumps(body).encode())
        assert status == 200 and [o["name"] for o in resp["outputs"]] == ["pooler_output"]
        np.testing.assert_allclose(outputs(resp)[0], x.sum(axis=1))
        body["outputs"] = [{"name": "output0"}]
        status, resp, _ = post(f"{server.url}/v2/models/encoder/infer", json.dumps(body).encode())
        assert status == 400 and "'output0'" in resp["error"] and "pooler_output" in resp["error"]


def test_the_command_serves_until_sigterm(artifact, tmp_path):
    proc, lines = start_serve([str(artifact), "--port", "0", "--max-delay-ms", "1"], tmp_path)
    try:
        url = lines[-1].split()[2]
        assert "batching along 'batch': up to 16 rows a call, a request waiting at most 1 ms" in lines[0], lines
        assert "run by tripy_build.runtime (no jax)" in lines[0], lines
        x, t = sample(np.random.default_rng(7), 5)
        status, body, blob = post(f"{url}/v2/models/two_heads/infer", *request(x, t, binary=True))
        assert status == 200 and all("parameters" in o for o in body["outputs"])
        np.testing.assert_array_equal(outputs(body, blob)[1], t * 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0 and "stopped serving." in proc.stdout.read()
    finally:
        proc.kill()
    bad = run_cli("serve", str(tmp_path / "nothing"), "--port", "0", cwd=tmp_path)
    assert bad.returncode == 2 and str(tmp_path / "nothing") in bad.stderr and "Traceback" not in bad.stderr


def test_the_command_takes_the_loader_it_is_told(artifact, tmp_path):
    proc, lines = start_serve([str(artifact), "--port", "0", "--loader", "jax"], tmp_path)
    try:
        assert "run by tripy_build.load (jax)" in lines[0], lines
        x, t = sample(np.random.default_rng(8), 3)
        status, body, blob = post(f"{lines[-1].split()[2]}/v2/models/two_heads/infer", *request(x, t, binary=True))
        assert status == 200 and np.array_equal(outputs(body, blob)[1], t * 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    bad = run_cli("serve", str(artifact), "--loader", "pjrt", cwd=tmp_path)
    assert bad.returncode == 2 and "--loader: invalid choice: 'pjrt'" in bad.stderr


TRITON_CLIENT = """
import sys, json, numpy as np
import tritonclient.http as http
url, x, t = sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3])
c = http.InferenceServerClient(url)
assert c.is_server_ready() and c.is_model_ready("two_heads")
meta = c.get_model_metadata("two_heads")
out = []
for binary in (False, True):
    inputs = [http.InferInput("x", list(x.shape), "FP32"), http.InferInput("t", list(t.shape), "INT32")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(t, binary_data=binary)
    r = c.infer("two_heads", inputs, outputs=[http.InferRequestedOutput("output0", binary_data=binary)])
    out.append(r.as_numpy("output0"))
np.save(sys.argv[4], np.stack(out))
print(json.dumps(c.get_inference_statistics("two_heads")["model_stats"][0]["inference_count"]))
"""


@pytest.fixture(scope="module")
def triton_client(tmp_path_factory) -> Path | None:
    """NVIDIA's Triton HTTP client: the grpc extra's (tritonclient[grpc,http]; None: nothing to add to the path),
    else installed apart."""
    probe = subprocess.run([sys.executable, "-c", "import tritonclient.http"], capture_output=True)
    if probe.returncode == 0:
        return None
    target = Path(sys.prefix) / "triton-client"
    if not (target / "tritonclient").is_dir():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                            "tritonclient[http]==2.73.0"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"tritonclient could not be installed (no package registry?): {r.stderr[-500:]}")
    return target


def test_nvidia_triton_client_works_unchanged(artifact, direct, triton_client, tmp_path):
    """The server speaks Triton's protocol: its own client, JSON and binary tensors, reads the answers."""
    x, t = sample(np.random.default_rng(8), 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "t.npy", t)
    with Server([artifact], port=0).start() as server:
        assert server.wait_ready(30)  # the client's first question is whether the model is ready
        r = subprocess.run([sys.executable, "-c", TRITON_CLIENT, server.url.removeprefix("http://"),
                            tmp_path / "x.npy", tmp_path / "t.npy", tmp_path / "out.npy"],
                           capture_output=True, text=True,
                           env={**os.environ, **({"PYTHONPATH": str(triton_client)} if triton_client else {})})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == 6
    got = np.load(tmp_path / "out.npy")
    for g in got:
        np.testing.assert_allclose(g, direct.call_flat(x, t)[0], rtol=1e-5, atol=1e-5)


def test_a_burst_of_new_connections_is_answered(artifact):
    """64 clients connecting at once (a listen backlog of 5 resets some of them)."""
    rng = np.random.default_rng(9)
    cases = [sample(rng, 1) for _ in range(64)]
    with Server([artifact], port=0).start() as server:
        answers = concurrently(64, lambda i: post(infer_url(server), *request(*cases[i])))
    assert [a[0] for a in answers] == [200] * 64
