"""KServe v2 over gRPC (``serve/grpc.py``), spoken to by NVIDIA's own client, ``tritonclient.grpc``, and, for the
requests that client never makes (typed contents, mismatched raw contents), by the protocol's generated stub."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

import tripy_build as tb
from tripy_build.errors import ConfigError
from tripy_build.serve.endpoint import Endpoint
from tripy_build.serve.grpc import MAX_MESSAGE_BYTES, GrpcServer
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from serve.serving import concurrently, sample, start_serve






@contextmanager
def serving(artifact: Path, max_workers: int = 8, max_message_bytes: int = MAX_MESSAGE_BYTES, **options):
    """A GrpcServer on a free port serving the artifact, and Triton's client for it; the endpoint closed after."""
    ep = Endpoint.load(artifact, **options)
    ep.runtime.wait_warmed(30)  # ready (tests of readiness during the warm-up hold it back themselves)
    try:
        with GrpcServer({ep.name: ep}, port=0, max_workers=max_workers, max_message_bytes=max_message_bytes) as server:
            client = triton.InferenceServerClient(server.address)
            try:
                yield server, client
            finally:
                client.close()
    finally:
        ep.close()



def inputs(x: np.ndarray, t: np.ndarray, x_type: str = "FP32", t_type: str = "INT32") -> list:
    """Triton's client's inputs (raw_input_contents on the wire)."""
    out = [triton.InferInput("x", list(x.shape), x_type), triton.InferInput("t", list(t.shape), t_type)]
    out[0].set_data_from_numpy(x)
    out[1].set_data_from_numpy(t)
    return out


def infer(client, x, t, **kwargs) -> list[np.ndarray]:
    result = client.infer("two_heads", inputs(x, t), **kwargs)
    return [result.as_numpy("output0"), result.as_numpy("output1")]


def assert_matches(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [g.dtype for g in got] == [w.dtype for w in want] and [g.shape for g in got] == [w.shape for w in want]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


def status(call) -> tuple[str, str]:
    """(status code's name, message) of a call expected to fail, through Triton's client or the stub."""
    try:
        call()
    except InferenceServerException as e:
        return e.status().removeprefix("StatusCode."), e.message()
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError("the call succeeded")



def test_health_and_metadata_as_triton_reads_them(artifact):
    with serving(artifact) as (server, client):
        version = server.endpoints["two_heads"].version
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("two_heads") and client.is_model_ready("two_heads", version)
        assert not client.is_model_ready("nope") and not client.is_model_ready("two_heads", "v9")
        meta = client.get_server_metadata()
        assert meta.name == "tripy_build" and list(meta.extensions) == ["statistics"]
        meta = client.get_model_metadata("two_heads", as_json=True)
        assert meta["name"] == "two_heads" and meta["versions"] == [version] and meta["platform"] == "tripy_build"
        # shapes: -1 where an axis varies (protobuf's JSON writes int64 as strings)
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "-1", "4"]},
                                  {"name": "t", "datatype": "INT32", "shape": ["-1"]}]
        assert meta["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": ["-1", "3"]},
                                   {"name": "output1", "datatype": "INT32", "shape": ["-1"]}]
        assert client.get_model_metadata("two_heads", version).name == "two_heads"
        code, message = status(lambda: client.get_model_metadata("nope"))
        assert code == "NOT_FOUND" and message == "model 'nope' is not served here."
        code, message = status(lambda: client.get_model_metadata("two_heads", "v9"))
        assert code == "NOT_FOUND" and f"model 'two_heads' has version {version!r} only, not 'v9'" in message


def test_infer_equals_the_artifact_called_directly(artifact, direct):
    rng = np.random.default_rng(1)
    with serving(artifact) as (server, client):
        for rows, seq in ((1, 2), (3, 2), (5, 4), (16, 3)):
            x, t = sample(rng, rows, seq)
            assert_matches(infer(client, x, t), direct.call_flat(x, t))
        # the request's id and a version are echoed
        x, t = sample(rng, 2)
        version = server.endpoints["two_heads"].version
        result = client.infer("two_heads", inputs(x, t), model_version=version, request_id="r1")
        response = result.get_response()
        assert (response.id, response.model_name, response.model_version) == ("r1", "two_heads", version)
        assert_matches([result.as_numpy("output0"), result.as_numpy("output1")], direct.call_flat(x, t))
        # typed contents (fp32_contents, int_contents), which Triton's Python client never sends
        request = pb.ModelInferRequest(model_name="two_heads", id="typed")
        request.inputs.add(name="x", datatype="FP32", shape=x.shape).contents.fp32_contents.extend(x.ravel().tolist())
        request.inputs.add(name="t", datatype="INT32", shape=t.shape).contents.int_contents.extend(t.tolist())
        with grpc.insecure_channel(server.address) as channel:
            response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        assert response.id == "typed" and [o.name for o in response.outputs] == ["output0", "output1"]
        got = [np.frombuffer(raw, np.float32 if o.datatype == "FP32" else np.int32).reshape(o.shape)
               for o, raw in zip(response.outputs, response.raw_output_contents)]
        assert_matches(got, direct.call_flat(x, t))


def test_requested_outputs_only_are_returned(artifact, direct):
    x, t = sample(np.random.default_rng(2), 3)
    with serving(artifact) as (_, client):
        result = client.infer("two_heads", inputs(x, t), outputs=[triton.InferRequestedOutput("output1")])
        assert [o.name for o in result.get_response().outputs] == ["output1"]
        assert result.as_numpy("output0") is None
        np.testing.assert_array_equal(result.as_numpy("output1"), direct.call_flat(x, t)[1])


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(artifact, direct):
    """16 requests of 1-3 rows at once: each answer equals its own direct call, in fewer calls than requests."""
    rng = np.random.default_rng(3)
    cases = [sample(rng, int(rng.integers(1, 4))) for _ in range(16)]
    with serving(artifact, max_workers=16, max_delay_ms=500) as (_, client):
        answers = concurrently(16, lambda i: infer(client, *cases[i]))
        stats = client.get_inference_statistics("two_heads").model_stats
        everyone = client.get_inference_statistics().model_stats
    for (x, t), got in zip(cases, answers):
        assert_matches(got, direct.call_flat(x, t))
    assert len(stats) == 1 and [s.name for s in everyone] == ["two_heads"]
    s = stats[0]
    assert s.inference_count == sum(len(t) for _, t in cases) and s.inference_stats.success.count == 16
    assert s.execution_count < 16 and max(b.batch_size for b in s.batch_stats) > 3, s
    assert s.last_inference > 0


def test_types_without_a_contents_field_travel_raw_and_typed_values_are_range_checked(tmp_path):
    """FP16 has no typed contents field in the protocol: raw bytes in and out, typed refused naming the fix; an
    INT8 input's int_contents must hold INT8 values. (Not BF16: the jax-free runtime cannot return it yet,
    np.from_dlpack knows no bfloat16.)"""
    exe = tb.compile(lambda x, k: (x * 2, k + 1), args=(tb.InputInfo((tb.NamedDimension("batch", 1, 2, 4), 3), "float16"),
                                                       tb.InputInfo((tb.NamedDimension("batch", 1, 2, 4),), "int8")))
    exe.save(tmp_path / "halves")
    x, k = (np.arange(6).reshape(2, 3) / 4).astype(np.float16), np.array([-3, 7], np.int8)
    with serving(tmp_path / "halves") as (server, client), grpc.insecure_channel(server.address) as channel:
        name = next(iter(server.endpoints))
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = client.get_model_metadata(name)
        assert [(i.name, i.datatype) for i in meta.inputs] == [("x", "FP16"), ("k", "INT8")]
        request = pb.ModelInferRequest(model_name=name)
        request.inputs.add(name="x", datatype="FP16", shape=x.shape)
        request.inputs.add(name="k", datatype="INT8", shape=k.shape)
        request.raw_input_contents.extend([x.tobytes(), k.tobytes()])
        response = stub.ModelInfer(request)
        assert [(o.datatype, list(o.shape)) for o in response.outputs] == [("FP16", [2, 3]), ("INT8", [2])]
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float16).reshape(2, 3),
                                      x * 2)
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int8), k + 1)
        typed = pb.ModelInferRequest(model_name=name)
        typed.inputs.add(name="x", datatype="FP16", shape=x.shape).contents.fp32_contents.extend(x.astype(float).ravel())
        typed.inputs.add(name="k", datatype="INT8", shape=k.shape).contents.int_contents.extend(k.tolist())
        code, message = status(lambda: stub.ModelInfer(typed))
        assert code == "INVALID_ARGUMENT" and message == ("input 'x': FP16 has no typed contents field in the protocol; "
                                                          "send it in raw_input_contents.")
        del typed.inputs[0]
        typed.inputs[0].contents.int_contents[:] = [300, 1]
        code, message = status(lambda: stub.ModelInfer(typed))
        assert code == "INVALID_ARGUMENT" and "input 'k': contents.int_contents has a value that is no INT8" in message
        typed.inputs.add(name="x", datatype="FP16", shape=x.shape)
        typed.raw_input_contents.extend([np.array([4, 5], np.int8).tobytes(), x.tobytes()])
        typed.inputs[0].ClearField("contents")
        response = stub.ModelInfer(typed)  # inputs in any order, raw contents in the inputs' order
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int8), [5, 6])


def _stub_request(x: np.ndarray, t: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="two_heads")
    request.inputs.add(name="x", datatype="FP32", shape=x.shape)
    request.inputs.add(name="t", datatype="INT32", shape=t.shape)
    request.raw_input_contents.extend([x.tobytes(), t.tobytes()])
    return request


def test_bad_requests_get_a_status_that_names_the_problem_and_do_not_fail_the_others(artifact, direct):
    rng = np.random.default_rng(4)
    x, t = sample(rng, 2)
    short_raw = _stub_request(x, t)
    short_raw.raw_input_contents[0] = b"\0" * 31
    one_raw = _stub_request(x, t)
    del one_raw.raw_input_contents[1]
    few_values = pb.ModelInferRequest(model_name="two_heads")
    few_values.inputs.add(name="x", datatype="FP32", shape=x.shape).contents.fp32_contents.extend([1.0])
    few_values.inputs.add(name="t", datatype="INT32", shape=t.shape).contents.int_contents.extend(t.tolist())
    wrong_field = pb.ModelInferRequest(model_name="two_heads")
    wrong_field.inputs.add(name="x", datatype="FP32", shape=x.shape).contents.int_contents.extend([1] * x.size)
    wrong_field.inputs.add(name="t", datatype="INT32", shape=t.shape).contents.int_contents.extend(t.tolist())
    rank = _stub_request(x, t)
    rank.inputs[0].shape[:] = [2, 8]
    rank.raw_input_contents[0] = x.tobytes()
    long_name = _stub_request(x, t)
    long_name.inputs[1].name = "u" * 10_000
    huge = _stub_request(x, t)
    huge.inputs[0].shape[:] = [1 << 32, 1 << 32, 4]  # 2**66 values: no int64 wraps it around to a small count
    no_model = _stub_request(x, t)
    no_model.model_name = ""
    bytes_input = triton.InferInput("x", [2], "BYTES")
    bytes_input.set_data_from_numpy(np.array([b"a", b"b"], dtype=object))

    def triton_call(model="two_heads", **kwargs):
        return lambda client, _: client.infer(model, **kwargs)

    def stub_call(request):
        return lambda _, stub: stub.ModelInfer(request)

    bad = {
        "too many rows": (triton_call(inputs=inputs(*sample(rng, 17))), "INVALID_ARGUMENT",
                          "is 17, but it must be in range [1, 16]"),
        "wrong width": (triton_call(inputs=inputs(np.zeros((2, 2, 5), np.float32), t)), "INVALID_ARGUMENT",
                        "dim 2 is 5, but it must be fixed at 4"),
        "rows disagree": (triton_call(inputs=inputs(x, np.zeros(3, np.int32))), "INVALID_ARGUMENT",
                          "NamedDimension 'batch' must have one size"),
        "wrong datatype": (triton_call(inputs=inputs(x.astype(np.float64), t, x_type="FP64")), "INVALID_ARGUMENT",
                           "input 'x': datatype 'FP64' given, but it is FP32"),
        "bytes": (triton_call(inputs=[bytes_input, inputs(x, t)[1]]), "INVALID_ARGUMENT",
                  "input 'x': datatype 'BYTES' given (strings: a tripy_build model takes numeric tensors only), but it is FP32"),
        "unknown input": (triton_call(inputs=[inputs(x, t)[0], triton.InferInput("u", [2], "INT32")
                                              .set_data_from_numpy(t)]), "INVALID_ARGUMENT",
                          "input 'u': two_heads has no such input; it takes 'x', 't'"),
        "missing input": (triton_call(inputs=inputs(x, t)[:1]), "INVALID_ARGUMENT", "two_heads needs input(s) 't'"),
        "unknown output": (triton_call(inputs=inputs(x, t), outputs=[triton.InferRequestedOutput("logits")]),
                           "INVALID_ARGUMENT", "output 'logits': two_heads has no such output; it has output0, output1"),
        "classification": (triton_call(inputs=inputs(x, t), outputs=[triton.InferRequestedOutput("output0", 1000)]),
                           "INVALID_ARGUMENT", 'output \'output0\': parameter "classification" is the number of top '
                           "classes to return, an integer in [1, "),
        "unknown model": (triton_call(model="nope", inputs=inputs(x, t)), "NOT_FOUND", "model 'nope' is not served here."),
        "wrong version": (triton_call(inputs=inputs(x, t), model_version="v9"), "NOT_FOUND",
                          "model 'two_heads' has version"),
        "short raw": (stub_call(short_raw), "INVALID_ARGUMENT",
                      "input 'x': shape [2, 2, 4] of FP32 is 64 bytes, but its raw_input_contents has 31"),
        "one raw for two": (stub_call(one_raw), "INVALID_ARGUMENT",
                            "the request has 1 raw_input_contents for its 2 inputs"),
        "few values": (stub_call(few_values), "INVALID_ARGUMENT",
                       "input 'x': shape [2, 2, 4] holds 16 values, but contents.fp32_contents has 1"),
        "wrong field": (stub_call(wrong_field), "INVALID_ARGUMENT",
                        "input 'x': FP32 values go in contents.fp32_contents, but the request fills contents.int_contents"),
        "huge shape": (stub_call(huge), "INVALID_ARGUMENT", "input 'x': shape [4294967296, 4294967296, 4] of FP32 is "
                       f"{(1 << 66) * 4} bytes, but its raw_input_contents has 64"),
        "wrong rank": (stub_call(rank), "INVALID_ARGUMENT", "input 'x': shape [2, 8] has 2 dims, but the input has 3"),
        "long name": (stub_call(long_name), "INVALID_ARGUMENT", "input 'uuuuuuuu"),
        "no model": (stub_call(no_model), "INVALID_ARGUMENT", "the request names no model"),
    }
    names = list(bad)
    good = 4
    with serving(artifact, max_workers=len(names) + good, max_delay_ms=200) as (server, client):
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            answers = concurrently(len(names) + good, lambda i: status(lambda: bad[names[i]][0](client, stub))
                                   if i < len(names) else infer(client, x, t))
        for name, (code, message) in zip(names, answers):
            assert code == bad[name][1] and bad[name][2] in message, (name, code, message)
        assert "two_heads" not in answers[names.index("unknown model")][1]  # the models served are not listed
        assert len(answers[names.index("long name")][1]) < 300  # a client's value is quoted cut short
        for got in answers[len(names):]:
            assert_matches(got, direct.call_flat(x, t))
        assert_matches(infer(client, x, t), direct.call_flat(x, t))  # still serving
        s = client.get_inference_statistics("two_heads").model_stats[0]
        assert s.inference_stats.fail.count == 0 and s.inference_stats.success.count == good + 1  # refused before queued
        assert status(lambda: client.get_inference_statistics("nope"))[0] == "NOT_FOUND"


def test_the_message_size_limit_is_configurable(artifact, direct):
    rng = np.random.default_rng(5)
    with serving(artifact, max_message_bytes=1000) as (_, client):
        big = sample(rng, 16, 4)  # x alone is 16 * 4 * 4 floats: 1024 bytes
        code, message = status(lambda: infer(client, *big))
        assert code == "RESOURCE_EXHAUSTED", (code, message)
        x, t = sample(rng, 2)
        assert_matches(infer(client, x, t), direct.call_flat(x, t))


def test_stop_finishes_the_request_in_flight_and_refuses_new_ones(artifact, direct):
    """A request waiting 1.5 s for others to join its batch is answered although stop() began meanwhile."""
    x, t = sample(np.random.default_rng(6), 1)
    ep = Endpoint.load(artifact, max_delay_ms=1500)
    try:
        server = GrpcServer({ep.name: ep}, port=0).start()
        client = triton.InferenceServerClient(server.address)
        answer: dict = {}
        thread = threading.Thread(target=lambda: answer.update(out=infer(client, x, t)))
        thread.start()
        deadline = time.monotonic() + 10
        while not ep.batcher.queued() and time.monotonic() < deadline:  # queued in the batcher: in flight
            time.sleep(0.01)
        assert ep.batcher.queued(), "the request never reached the batcher"
        began = time.monotonic()
        server.stop(grace=30)
        assert time.monotonic() - began < 10
        thread.join(timeout=30)
        assert_matches(answer["out"], direct.call_flat(x, t))
        assert status(lambda: client.is_server_live())[0] == "UNAVAILABLE"
        server.stop(grace=1)  # stopping twice does nothing
        with pytest.raises(ConfigError, match="was stopped; make a new one"):
            server.start()
        client.close()
    finally:
        ep.close()


def test_a_closed_endpoint_answers_unavailable_and_the_server_goes_on(artifact):
    """Its owner closed the endpoint before stopping the server: a request is told to go elsewhere."""
    x, t = sample(np.random.default_rng(7), 2)
    with serving(artifact) as (server, client):
        server.endpoints["two_heads"].close()
        code, message = status(lambda: infer(client, x, t))
        assert code == "UNAVAILABLE" and "the server is stopping; send the request again to a running one" in message
        assert client.is_server_live()


def test_ready_once_the_profiles_are_warmed(artifact, warm_up_held):
    ep = Endpoint.load(artifact)
    try:
        with GrpcServer({ep.name: ep}, port=0) as server:
            client = triton.InferenceServerClient(server.address)
            assert client.is_server_live()
            assert not client.is_server_ready() and not client.is_model_ready("two_heads")
            warm_up_held.set()
            assert ep.runtime.wait_warmed(30)
            assert client.is_server_ready() and client.is_model_ready("two_heads")
            client.close()
    finally:
        ep.close()


def test_a_token_file_guards_every_rpc_but_the_health_probes(artifact, direct, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    x, t = sample(np.random.default_rng(8), 2)
    ep = Endpoint.load(artifact)
    ep.runtime.wait_warmed(30)
    try:
        with GrpcServer({ep.name: ep}, port=0, token_file=tmp_path / "token") as server:
            client = triton.InferenceServerClient(server.address)
            assert client.is_server_live() and client.is_server_ready()  # probes carry no token
            for call in (lambda: client.is_model_ready("two_heads"), lambda: client.get_model_metadata("two_heads"),
                         lambda: infer(client, x, t), lambda: client.get_inference_statistics(),
                         lambda: client.get_server_metadata()):
                code, message = status(call)
                assert code == "UNAUTHENTICATED" and message == ("this server needs 'authorization: Bearer <token>' "
                                                                 "metadata (none was given).")
            code, message = status(lambda: client.infer("two_heads", inputs(x, t), headers={"authorization": "Bearer s3"}))
            assert code == "UNAUTHENTICATED" and "the token given is not it" in message
            result = client.infer("two_heads", inputs(x, t), headers={"authorization": "Bearer s3cret"})
            assert_matches([result.as_numpy("output0"), result.as_numpy("output1")], direct.call_flat(x, t))
            assert client.is_model_ready("two_heads", headers={"authorization": "bearer s3cret"})
            client.close()
        with pytest.raises(ConfigError, match="token file .*cannot be read"):
            GrpcServer({ep.name: ep}, port=0, token_file=tmp_path / "nothing")
    finally:
        ep.close()


def test_options_that_cannot_work_are_refused(artifact):
    ep = Endpoint.load(artifact)
    try:
        with GrpcServer({ep.name: ep}, port=0) as server:
            in_use = rf"cannot listen on 127.0.0.1:{server.port} for gRPC: Address already in use; choose another port"
            with pytest.raises(ConfigError, match=in_use):
                GrpcServer({ep.name: ep}, port=server.port)
        with pytest.raises(ConfigError, match="max_message_bytes: must be an integer in 1..2147483647"):
            GrpcServer({ep.name: ep}, port=0, max_message_bytes=1 << 31)
        with pytest.raises(ConfigError, match="max_workers: must be a positive integer, got 0"):
            GrpcServer({ep.name: ep}, port=0, max_workers=0)
        with pytest.raises(ConfigError, match="give at least one endpoint"):
            GrpcServer({}, port=0)
    finally:
        ep.close()


def test_grpc_is_imported_only_by_the_grpc_server_and_its_absence_is_explained():
    """The HTTP server, and the gRPC module itself, import no grpc; without grpcio, GrpcServer says what to install."""
    code = """
import sys
import tripy_build.serve.http, tripy_build.serve.grpc
assert "grpc" not in sys.modules and "google.protobuf" not in sys.modules, sorted(sys.modules)
sys.modules["grpc"] = None  # as if grpcio were not installed
from tripy_build.errors import ConfigError
try:
    tripy_build.serve.grpc.GrpcServer({"m": None}, port=0)
except ConfigError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "serving over gRPC needs grpcio, protobuf and tritonclient" in r.stdout
    assert "pip install 'tripy_build[grpc]'" in r.stdout


def test_the_command_serves_http_and_grpc_with_one_batcher_and_drains_both(artifact, direct, tmp_path):
    """``tripy-build serve --grpc-port 0``: both protocols answer, share the model's statistics, and SIGTERM
    finishes a gRPC request still waiting for its batch before the process exits 0."""
    import json
    import signal
    import urllib.request

    proc, lines = start_serve([str(artifact), "--port", "0", "--grpc-port", "0", "--max-delay-ms", "1500"], tmp_path)
    try:
        client = triton.InferenceServerClient(next(ln for ln in lines if ln.startswith("gRPC")).split()[-1])
        x, t = sample(np.random.default_rng(11), 3)
        done: list = []
        client.async_infer("two_heads", inputs(x, t), callback=lambda result, error: done.append((result, error)))
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stdout.read()
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done and done[0][1] is None, done
        assert_matches([done[0][0].as_numpy("output0"), done[0][0].as_numpy("output1")], direct.call_flat(x, t))
        assert "stopped serving." in proc.stdout.read()
        client.close()
    finally:
        proc.kill()
    # and both protocols, one batcher: what gRPC ran shows in HTTP's statistics
    proc, lines = start_serve([str(artifact), "--port", "0", "--grpc-port", "0"], tmp_path)
    try:
        url = lines[-1].split()[2]
        client = triton.InferenceServerClient(next(ln for ln in lines if ln.startswith("gRPC")).split()[-1])
        x, t = sample(np.random.default_rng(12), 2)
        assert_matches(infer(client, x, t), direct.call_flat(x, t))
        client.close()
        with urllib.request.urlopen(f"{url}/v2/models/two_heads/stats", timeout=30) as r:
            assert json.loads(r.read())["model_stats"][0]["inference_count"] == 2
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_errors_are_written_for_a_client_over_http_and_grpc(tmp_path):
    """A refused request's message names the input, the dim, the range and what was given, the declaration as a
    client reads it: no Python repr (``InputInfo(``, ``NamedDimension(``) reaches a client over either protocol."""
    import json
    import urllib.error
    import urllib.request

    from tripy_build.serve.http import Server

    batch, seq = tb.NamedDimension("batch", 1, 4, 16), tb.NamedDimension("seq", 1, 64, 128)
    exe = tb.compile(lambda x, ids: (x.sum(axis=1), ids * 2),
                     args=(tb.InputInfo((batch, seq), "float32"), tb.InputInfo((batch,), "int32", values=(0, 10))),
                     padding={"batch": "rows"}, buckets={"batch": [4, 16], "seq": [64, 128]})
    exe.save(tmp_path / "m")
    x, ids = np.zeros((1, 512), np.float32), np.array([3], np.int32)
    x_spec = "[batch=[1..16, opt 4], seq=[1..128, opt 64]]"
    cases = {  # (x, ids, x's datatype) -> what the message must say
        "dim out of range": ((x, ids, "FP32"), ["input 'x' dim 1 (NamedDimension 'seq') is 512, but it must be in range "
                                                "[1, 128] (opt 64); the input's shape is [1, 512], declared as "
                                                f"float32{x_spec}."]),
        "wrong rank": ((x[0], ids, "FP32"), [f"input 'x': shape [512] has 1 dims, but the input has 2 (declared as "
                                             f"FP32{x_spec})."]),
        "wrong datatype": ((x[:, :8].astype(np.float64), ids, "FP64"),
                           [f"input 'x': datatype 'FP64' given, but it is FP32 (declared as FP32{x_spec}); send it as "
                            "FP32."]),
        "value out of range": ((x[:, :8], np.array([12], np.int32), "FP32"),
                               ["input 'ids' holds 12, but its values must lie in [0, 10) (min 12, max 12); declared as "
                                "int32[batch=[1..16, opt 4]] in [0, 10)."]),
        "missing input": ((x[:, :8], None, "FP32"), [f"needs input(s) 'ids', which the request lacks (its inputs: 'x' "
                                                     f"FP32{x_spec}; 'ids' INT32[batch=[1..16, opt 4]] in [0, 10))."]),
    }

    def http_body(xv, idv, dt):
        inputs = [{"name": "x", "shape": list(xv.shape), "datatype": dt, "data": xv.ravel().tolist()}]
        if idv is not None:
            inputs.append({"name": "ids", "shape": list(idv.shape), "datatype": "INT32", "data": idv.tolist()})
        return json.dumps({"inputs": inputs}).encode()

    def grpc_inputs(xv, idv, dt):
        out = [triton.InferInput("x", list(xv.shape), dt)]
        out[0].set_data_from_numpy(xv)
        if idv is not None:
            out.append(triton.InferInput("ids", list(idv.shape), "INT32"))
            out[1].set_data_from_numpy(idv)
        return out

    with Server([tmp_path / "m"], port=0, grpc_port=0).start() as server:
        name = next(iter(server.endpoints))
        client = triton.InferenceServerClient(server.grpc.address)
        try:
            for case, (args, fragments) in cases.items():
                req = urllib.request.Request(f"{server.url}/v2/models/{name}/infer", data=http_body(*args),
                                             headers={"Content-Type": "application/json"})
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(req, timeout=30)
                http_message = json.loads(refused.value.read())["error"]
                code, grpc_message = status(lambda args=args: client.infer(name, grpc_inputs(*args)))
                assert refused.value.code == 400 and code == "INVALID_ARGUMENT", (case, http_message, grpc_message)
                for message in (http_message, grpc_message):
                    assert "InputInfo(" not in message and "NamedDimension(" not in message, (case, message)
                    for fragment in fragments:
                        assert fragment in message, (case, message)
        finally:
            client.close()


def test_refused_rpcs_are_counted_in_the_metrics_beside_http(artifact, direct, tmp_path):
    """A ModelInfer refused before its batcher (INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED) counts in
    tripy_build_requests as refused, in the same /metrics as HTTP's; an unknown model's as "(unknown)"."""
    import urllib.request

    from tripy_build.serve.http import Server

    (tmp_path / "token").write_text("s3cret\n")
    auth = {"authorization": "Bearer s3cret"}
    x, t = sample(np.random.default_rng(13), 2)
    with Server([artifact], port=0, grpc_port=0, token_file=tmp_path / "token").start() as server:
        client = triton.InferenceServerClient(server.grpc.address)
        try:
            refused = [lambda: client.infer("two_heads", inputs(*sample(np.random.default_rng(1), 17)), headers=auth),
                       lambda: client.infer("two_heads", inputs(x.astype(np.float64), t, x_type="FP64"), headers=auth),
                       lambda: client.infer("two_heads", inputs(x, t)[:1], headers=auth),
                       lambda: client.infer("two_heads", inputs(x, t), model_version="v9", headers=auth),
                       lambda: client.infer("two_heads", inputs(x, t))]  # no token
            codes = [status(call)[0] for call in refused]
            assert codes == ["INVALID_ARGUMENT"] * 3 + ["NOT_FOUND", "UNAUTHENTICATED"], codes
            assert status(lambda: client.infer("nope", inputs(x, t), headers=auth))[0] == "NOT_FOUND"
            result = client.infer("two_heads", inputs(x, t), headers=auth)
            assert_matches([result.as_numpy("output0"), result.as_numpy("output1")], direct.call_flat(x, t))
        finally:
            client.close()
        request = urllib.request.Request(f"{server.url}/metrics", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, timeout=30) as r:
            text = r.read().decode()
    metrics = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(metrics['tripy_build_requests_total{model="two_heads",outcome="refused"}']) == len(refused)
    assert float(metrics['tripy_build_requests_total{model="(unknown)",outcome="refused"}']) == 1
    assert float(metrics['tripy_build_requests_total{model="two_heads",outcome="success"}']) == 1
    assert float(metrics['tripy_build_requests_total{model="two_heads",outcome="failure"}']) == 0


def test_one_request_checked_in_one_order_over_both_protocols(artifact):
    """Both protocols translate an input into serve/request.InputTensor and check it once, in one order: a request
    wrong in its datatype and its rank, or in its rank and its values, gets the same first error over each."""
    import json
    import urllib.error
    import urllib.request

    from tripy_build.serve.http import Server

    cases = {  # name -> (x's datatype, x's shape, its values, the first error): each wrong in two ways
        "datatype and rank": ("FP64", [2, 8], np.zeros(16, np.float64), "input 'x': datatype 'FP64' given, but it is FP32"),
        "rank and count": ("FP32", [2, 4], np.zeros(3, np.float32), "input 'x': shape [2, 4] has 2 dims, but the input "
                           "has 3"),
    }
    t = np.zeros(2, np.int32)
    with Server([artifact], port=0, grpc_port=0).start() as server:
        client = triton.InferenceServerClient(server.grpc.address)
        for case, (dtype, shape, values, first) in cases.items():
            body = {"inputs": [{"name": "x", "shape": shape, "datatype": dtype, "data": values.tolist()},
                               {"name": "t", "shape": [2], "datatype": "INT32", "data": t.tolist()}]}
            req = urllib.request.Request(f"{server.url}/v2/models/two_heads/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=30)
            http_message = json.loads(refused.value.read())["error"]
            x = triton.InferInput("x", shape, dtype)
            x._raw_content = values.tobytes()  # as sent, whatever its size: the server is what is tested
            ti = triton.InferInput("t", [2], "INT32")
            ti.set_data_from_numpy(t)
            code, grpc_message = status(lambda x=x, ti=ti: client.infer("two_heads", [x, ti]))
            assert refused.value.code == 400 and code == "INVALID_ARGUMENT", case
            assert http_message == grpc_message, (case, http_message, grpc_message)
            assert http_message.startswith(first), (case, http_message)
        client.close()
