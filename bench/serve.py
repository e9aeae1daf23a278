"""Serving: ``tripy-build serve`` side by side with MLServer 1.7.1, ``jax.jit`` and eager JAX, in one run.

Every contender is a server process speaking KServe v2 (the Open Inference Protocol) on loopback, serving
the same model with the same weights:

- ``batched``     ``tripy-build serve ART``: requests gathered along ``batch`` with no wait (a batch is
                  what queued while the last call ran);
- ``batched-2ms`` ``--max-delay-ms 2``: a request also waits up to 2 ms for others to join it;
- ``unbatched``   ``tripy-build serve ART --batch-dim none`` (one call per request, one at a time);
- ``jax.jit``     the model's ``apply`` under ``jax.jit`` behind tripy_build's HTTP front end
                  (``serve.http.Server``), called per request where the front end hands it over (a handler
                  thread; on the uvicorn server, its event loop), as a hand-written server does; no shape
                  checks, and no gRPC;
- ``eager``       the same without ``jax.jit``;
- ``mlserver``    MLServer 1.7.1 (Seldon's KServe v2 server) with a custom runtime
                  (``bench/serve_mlserver/jax_runtime.py``: the weights' .npz, ``NumpyCodec``,
                  ``jax.jit(apply)``), adaptive batching ``max_batch_size`` 64, ``max_batch_time`` 0.001 s
                  (1 ms), ``parallel_workers`` 0 (inference in the server's own process), its leanest
                  settings (``debug`` off: no access log; no gzip middleware; no metrics server), every batch
                  size compiled before it reports ready.

Requests (one row each, closed loop: a client process runs N threads, each sending its next request as
soon as its last is answered, on its own keep-alive connection) go in three encodings: ``json`` (``"data"``
lists, what the issue's targets are stated on), ``binary`` (the binary tensor data extension,
``Inference-Header-Content-Length``; MLServer has none over REST, its row says what it answered) and
``grpc`` (``tritonclient.grpc``, ``inference.GRPCInferenceService``; tripy_build's row needs
``tripy-build serve --grpc-port``, and says so where the server has none). Reported per model, encoding
and client count: requests/s, median and p99 latency, the ratios to MLServer's (req/s, p99), and the
server's CPU per request (utime + stime of its process tree, from /proc, over the window). Every
contender's answer to one fixed 3-row request is checked in every encoding against ``jax.jit``'s in this
process (max abs diff <= 1e-4 x max |ref|); the timed loop checks each answer's status only.

Hostile scenarios (``--hostile``, by default on geglu only, against ``batched`` and ``mlserver``; each
prints a line with pass/fail against the issue's target), while a normal client (``--hostile-clients``
threads, JSON) runs closed loop:

- 3,000 idle connections, then 3,000 slow-loris ones (one header byte a second, never ending): the
  server's threads (/proc/PID/status, max over the window), the connections it holds (its sockets on the
  port, max and at the end) and the normal client's p99 against its unloaded p99. The window begins once
  the server's count of sockets has settled (the connections held, not their accept burst). Target: threads added
  and connections held <= the connection cap (``--max-connections``, passed to ``tripy-build serve`` when
  it has that option; MLServer has no such setting, it is judged against the same number), p99 within 2x.
- one 200 MB JSON request (a huge ``"data"`` list of a [N, 512] tensor, generated as it is sent): the
  server's RSS before / peak (sampled every 20 ms) / after, the status it answered, and the normal client's
  p99 meanwhile: over its requests in flight at some point while the big one was, or in the ``--seconds``
  after it began if it was answered sooner (both client processes stamp requests with ``time.monotonic``,
  which is system-wide). Target: RSS rise <= 2x the body, or
  refused (413: a documented cap); p99 within 2x. Both servers refuse more than 64 rows (tripy_build's
  artifact declares batch <= 64, the MLServer runtime checks the same), so the request costs its reading
  and decoding, not a 34,000-row call and a gigabyte of JSON back. (MLServer's adaptive batching merges it
  with the requests queued beside it, and they get its 400 too: the client errors its line counts.)

The hostile windows last at least ``--hostile-min-seconds`` (6 s: slow-loris bytes and server timeouts
need time); ``--hostile-scenarios`` picks among idle, slowloris and body. ``tripy-build serve`` options
``--max-body-bytes --max-json-bytes --max-connections --read-timeout --idle-timeout --grpc-port`` are
passed only where its ``--help`` lists them and the bench is given a value (the bench's options of those
names), so the bench runs before and after the server gains them. The connection cap judged against is
``--max-connections``, else the default its ``--help`` states, else 512.
Server and clients share this machine's cores, as they would share a host's; the file-descriptor limit is
raised to the hard limit (servers inherit it).

Install MLServer in its own virtual environment (its pins clash with tripy_build's; uvloop 0.22+ crashed
its workers), outside the repository::

    python3 -m venv /work/venvs/mlserver
    /work/venvs/mlserver/bin/pip install mlserver==1.7.1 'uvloop<0.22' jax==0.10.2 jaxlib==0.10.2 numpy

``--mlserver-python`` names that venv's python (default ``/work/venvs/mlserver/bin/python``; without it
the MLServer rows print why and the rest goes on). The runtime imports this repository's
``tripy_build.models`` (jax only) through PYTHONPATH. The gRPC client is ``tritonclient.grpc`` (tripy_build's
``grpc`` extra installs it, as ``tripy-build serve --grpc-port`` needs it): from this interpreter when it has
it, else from the MLServer venv (MLServer depends on tritonclient), ``--grpc-client-python`` to choose.

    .venv/bin/python bench/serve.py                                # geglu and mlp, 1/8/32 clients, hostile on geglu
    .venv/bin/python bench/serve.py --quick                        # smoke: about a minute
    .venv/bin/python bench/serve.py --models mlp --contenders batched,mlserver --encodings json --clients 16
    .venv/bin/python bench/serve.py --no-hostile --seconds 3
"""

from __future__ import annotations

import argparse
import errno
import http.client
import importlib.util
import json
import os
import platform
import re
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODELS = {"geglu": ("GEGLU", {"dim_in": 512, "dim_out": 2048}),
          "mlp": ("MLP", {"dim_in": 512, "hidden": 2048, "dim_out": 512, "layers": 3})}
TRIPY = ("batched", "batched-2ms", "unbatched")
JAX = ("jax.jit", "eager")
CONTENDERS = (*TRIPY, *JAX, "mlserver")
ENCODINGS = ("json", "binary", "grpc")
WIDTH = 512
BATCH = (1, 8, 64)
OUTPUT = "output0"  # tripy_build's name for a function's one output; the MLServer runtime uses it too
MLSERVER_PYTHON = "/work/venvs/mlserver/bin/python"
LIMITS = ("max-body-bytes", "max-json-bytes", "max-connections", "read-timeout", "idle-timeout")


# --- the model: built, its weights, the reference answer -------------------------------------------------

def zoo_model(name: str):
    import tripy_build.models as zoo

    cls, kwargs = MODELS[name]
    return getattr(zoo, cls)(**kwargs)


def build(name: str, out: Path, artifact: bool) -> None:
    """The same weights as an .npz for the jax servers and MLServer, and (``artifact``) the artifact."""
    import jax

    import tripy_build as tb

    model = zoo_model(name)
    params = model.init(jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_leaves(params)
    np.savez(out / f"{name}.npz", *[np.asarray(x) for x in leaves])
    if not artifact:
        return

    def apply(params, x):
        return model.apply(params, x)
    apply.__name__ = name  # the served model's name
    exe = tb.compile(apply, args=[params, tb.InputInfo([tb.NamedDimension("batch", *BATCH), WIDTH], "float32")],
                     padding=model.padding)
    exe.save(out / name)


def load_params(name: str, out: Path):
    import jax

    model = zoo_model(name)
    template = model.init(jax.random.PRNGKey(0))
    with np.load(out / f"{name}.npz") as data:
        params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template),
                                              [data[f"arr_{i}"] for i in range(len(data.files))])
    return model, jax.device_put(params)


def check_input() -> np.ndarray:
    return np.random.default_rng(99).standard_normal((3, WIDTH), dtype=np.float32)


def reference(name: str, out: Path) -> np.ndarray:
    """``jax.jit(apply)`` on the check request, in this process: what every contender's answer must match."""
    import jax

    model, params = load_params(name, out)
    return np.asarray(jax.jit(model.apply)(params, check_input()))


class _Direct:
    """A batcher stand-in that runs each request in the handler's thread, as a hand-written server does."""

    def __init__(self, fn):
        from tripy_build.serve.batching import Stats

        self.fn, self.stats = fn, Stats()

    def submit(self, leaves):
        f: Future = Future()
        f.set_result([np.asarray(self.fn(*leaves))])
        return f

    def close(self):
        pass


def jax_server(kind: str, name: str, out: Path, port: int) -> None:
    """``jax.jit`` or eager ``apply`` behind tripy_build's HTTP front end: ``serve.http.Server`` given an endpoint
    whose batcher runs each request where the front end hands it over (the handler; on the new server, its
    asyncio loop), as a hand-written server does."""
    import jax

    import tripy_build as tb
    from tripy_build.serve import http as server

    model, params = load_params(name, out)
    apply = jax.jit(model.apply) if kind == "jax.jit" else model.apply
    info = tb.InputInfo([tb.NamedDimension("batch", *BATCH), WIDTH], "float32")
    served = SimpleNamespace(__name__=name, flat_args=[("x", info)], output_infos=[info], output_names=[OUTPUT],
                             dims=[], call_flat=None, check_flat=lambda *leaves: None)  # no checks, as by hand
    ep = server.Endpoint(served, kind, batch_dim="none")
    ep.batcher.close()
    ep.batcher = _Direct(lambda x: apply(params, x))

    class Given(server.Endpoint):
        @classmethod
        def load(cls, path: Any, **options: Any) -> Any:
            return ep

    server.Endpoint = Given  # the Server loads its one "artifact" as this endpoint
    http_server = server.Server([name], host="127.0.0.1", port=port, batch_dim="none")
    print(f"serving on {http_server.url}", flush=True)
    http_server.serve_forever()


# --- requests ---------------------------------------------------------------------------------------------

def json_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    return body, {"Content-Type": "application/json"}


def binary_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    blob = x.tobytes()
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def http_answer(headers: Any, data: bytes) -> np.ndarray:
    """The first output of a v2 response, JSON or with binary tensor data."""
    split = headers.get("Inference-Header-Content-Length")
    if split is None:
        out = json.loads(data)["outputs"][0]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])
    out = json.loads(data[:int(split)])["outputs"][0]
    return np.frombuffer(data[int(split):], np.float32).reshape(out["shape"])


def grpc_answer(result: Any) -> np.ndarray:
    """The first output of a ModelInferResponse: raw_output_contents, or typed contents (MLServer's answer
    to typed inputs; ``InferResult.as_numpy`` reads only raw or bytes contents)."""
    resp = result.get_response()
    out = resp.outputs[0]
    if resp.raw_output_contents:
        return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(list(out.shape))
    return np.asarray(out.contents.fp32_contents, np.float32).reshape(list(out.shape))


class _HTTPSender:
    def __init__(self, address: str, model: str, encoding: str, xs: list[np.ndarray], payloads: list | None = None):
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.path = f"/v2/models/{model}/infer"
        self.payloads = payloads or [(json_body if encoding == "json" else binary_body)(x) for x in xs]
        self.reconnects = 0

    def send(self, k: int) -> np.ndarray | None:
        body, headers = self.payloads[k % len(self.payloads)]
        try:
            self.conn.request("POST", self.path, body, headers)
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            # The server closed the keep-alive connection (an idle timeout, a cap): once more on a new one.
            self.conn.close()
            self.reconnects += 1
            self.conn.request("POST", self.path, body, headers)
            r = self.conn.getresponse()
            data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:300].decode(errors='replace')}")
        self.last = (r.headers, data)
        return None

    def answer(self) -> np.ndarray:
        return http_answer(*self.last)

    def close(self) -> None:
        self.conn.close()


class _GRPCSender:
    def __init__(self, address: str, model: str, xs: list[np.ndarray]):
        import tritonclient.grpc as grpcclient

        # One channel (one connection) per client thread, as separate clients have: grpc would otherwise share
        # one subchannel between channels to the same address.
        self.client = grpcclient.InferenceServerClient(address, channel_args=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)])
        self.model, self.inputs, self.reconnects = model, [], 0
        for x in xs:
            inp = grpcclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            self.inputs.append(inp)

    def send(self, k: int) -> None:
        self.last = self.client.infer(self.model, [self.inputs[k % len(self.inputs)]], client_timeout=120)

    def answer(self) -> np.ndarray:
        return grpc_answer(self.last)

    def close(self) -> None:
        self.client.close()


def _sender(spec: dict, xs: list[np.ndarray], payloads: list | None = None):
    if spec["encoding"] == "grpc":
        return _GRPCSender(spec["address"], spec["model"], xs)
    return _HTTPSender(spec["address"], spec["model"], spec["encoding"], xs, payloads)


def client_child(spec: dict) -> None:
    """The client process. ``check``: print the answer to the check request. Otherwise ``clients`` threads
    connect (one answered request each), print ``ready``, then run a window per ``go SECONDS`` line on stdin
    (``go 0``: until a ``stop`` line), printing ``started`` and then the window's result as JSON."""
    if spec.get("check"):
        deadline, last = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            try:
                s = _sender(spec, [check_input()])
                s.send(0)
                print(json.dumps({"answer": s.answer().tolist()}), flush=True)
                return
            except Exception as e:  # noqa: BLE001 - retried while the port comes up, then reported
                last = f"{type(e).__name__}: {e}"
                if not any(w in last for w in ("UNAVAILABLE", "Connection refused", "ConnectionRefused")):
                    break
                time.sleep(0.2)
        print(json.dumps({"error": " ".join(last.split())[:300]}), flush=True)
        return
    n = spec["clients"]
    xs = [np.random.default_rng(i).standard_normal((1, WIDTH), dtype=np.float32) for i in range(64)]
    payloads = None if spec["encoding"] == "grpc" else [
        (json_body if spec["encoding"] == "json" else binary_body)(x) for x in xs]
    ready, start, end = (threading.Barrier(n + 1) for _ in range(3))
    state = {"deadline": 0.0, "stop": False, "quit": False}
    setup_errors: list[str] = []
    lat: list[list[float]] = [[] for _ in range(n)]
    stamps: list[list[float]] = [[] for _ in range(n)]  # each request's start, time.monotonic() (system-wide)
    errs: list[list[str]] = [[] for _ in range(n)]
    senders: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            senders[i] = _sender(spec, xs, payloads)
            senders[i].send(i)  # connect outside the timed window
        except Exception as e:  # noqa: BLE001 - reported with ready
            setup_errors.append(f"client {i} could not start: {type(e).__name__}: {e}")
            senders[i] = None
        ready.wait()
        while True:
            start.wait()
            if state["quit"]:
                return
            mine, when, bad, k = [], [], [], i
            while senders[i] is not None and not state["stop"] and time.perf_counter() < state["deadline"]:
                t0, m0 = time.perf_counter(), time.monotonic()
                try:
                    senders[i].send(k)
                    mine.append(time.perf_counter() - t0)
                    when.append(m0)
                except Exception as e:  # noqa: BLE001 - counted; a hostile window goes on
                    bad.append(f"{type(e).__name__}: {e}")
                    if not spec.get("tolerate"):
                        break
                    time.sleep(0.01)
                k += 1
            lat[i], stamps[i], errs[i] = mine, when, bad
            end.wait()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    ready.wait()
    print("ready " + json.dumps({"errors": setup_errors[:3], "failed": len(setup_errors)}), flush=True)
    while True:
        words = sys.stdin.readline().split()
        if not words or words[0] != "go":
            break
        seconds = float(words[1])
        state["stop"] = False
        state["deadline"] = time.perf_counter() + (seconds if seconds > 0 else 3600.0)
        start.wait()
        t0 = time.perf_counter()
        print("started", flush=True)
        if seconds <= 0:
            sys.stdin.readline()  # "stop"
            state["stop"] = True
        end.wait()
        wall = time.perf_counter() - t0
        all_lat = np.concatenate([np.asarray(x, np.float64) for x in lat]) * 1e3
        errors = [e for x in errs for e in x]
        record = {"requests": [[round(a, 6), round(b, 6)] for x, y in zip(stamps, lat) for a, b in zip(x, y)]
                  } if spec.get("record") else {}
        print(json.dumps({**record,
            "count": int(all_lat.size), "wall": wall, "rps": all_lat.size / wall,
            "p50_ms": float(np.median(all_lat)) if all_lat.size else float("nan"),
            "p99_ms": float(np.percentile(all_lat, 99)) if all_lat.size else float("nan"),
            "errors": len(errors), "first_error": " ".join(errors[0].split())[:300] if errors else None,
            "reconnects": sum(s.reconnects for s in senders if s is not None)}), flush=True)
    state["quit"] = True
    start.wait()
    for s in senders:
        if s is not None:
            s.close()


# --- hostile clients --------------------------------------------------------------------------------------

def raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def hold_child(spec: dict) -> None:
    """Open ``n`` connections and hold them: idle, or slow-loris (one byte of a header that never ends,
    every second, on each). Prints ``{"opened", "failed"}`` once connected; on a line on stdin prints
    ``{"open", "closed_by_server", "answered"}`` and exits."""
    raise_nofile()
    host, port, n, mode = spec["host"], spec["port"], spec["n"], spec["mode"]
    header = (f"POST /v2/models/{spec['model']}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: 1000\r\nX-Slow: ").encode()
    sel = selectors.DefaultSelector()
    failed, first_error = 0, None
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            err = s.connect_ex((host, port))
        except OSError as e:
            err = e.errno
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            first_error = first_error or os.strerror(err)
            s.close()
            continue
        sel.register(s, selectors.EVENT_WRITE)
    alive: set[socket.socket] = set()
    deadline = time.monotonic() + 15
    while len(sel.get_map()) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            sel.unregister(s)
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                failed += 1
                first_error = first_error or os.strerror(err)
                s.close()
            else:
                alive.add(s)
    for key in list(sel.get_map().values()):  # never connected: the server's backlog was full
        sel.unregister(key.fileobj)
        key.fileobj.close()
        failed += 1
        first_error = first_error or "connect timed out"
    print(json.dumps({"opened": len(alive), "failed": failed, "first_error": first_error}), flush=True)
    for s in alive:
        sel.register(s, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    closed, answered, sent = 0, set(), 0
    next_byte = time.monotonic() + 1.0

    def drop(s: socket.socket) -> None:
        nonlocal closed
        closed += 1
        alive.discard(s)
        sel.unregister(s)
        s.close()

    while True:
        timeout = max(0.0, next_byte - time.monotonic()) if mode == "slowloris" else 1.0
        for key, _ in sel.select(timeout=timeout):
            if key.fileobj is sys.stdin:
                sys.stdin.readline()
                print(json.dumps({"open": len(alive), "closed_by_server": closed, "answered": len(answered)}), flush=True)
                return
            s = key.fileobj
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                answered.add(s.fileno())
            else:
                drop(s)
        if mode == "slowloris" and time.monotonic() >= next_byte:
            byte = header[sent:sent + 1] or b"a"
            sent += 1
            for s in list(alive):
                try:
                    s.send(byte)
                except OSError:
                    drop(s)
            next_byte += 1.0


def body_child(spec: dict) -> None:
    """One huge JSON request (``size`` bytes: a [N, 512] FP32 tensor as a ``"data"`` list), generated as it is
    sent; prints the status it got (or how the connection ended) as JSON."""
    rng = np.random.default_rng(7)
    row = ",".join(f"{v:.8g}" for v in rng.standard_normal(WIDTH).astype(np.float32)).encode()
    head_fmt = '{"inputs":[{"name":"x","shape":[%d,%d],"datatype":"FP32","data":['
    tail = b"]}]}"
    rows = max(1, (spec["size"] - len(head_fmt) - len(tail) - 16) // (len(row) + 1))
    head = (head_fmt % (rows, WIDTH)).encode()
    total = len(head) + rows * len(row) + (rows - 1) + len(tail)
    per_chunk = 256
    chunk = b",".join([row] * per_chunk)
    m0 = time.monotonic()
    s = socket.create_connection((spec["host"], spec["port"]), timeout=300)
    t0 = time.perf_counter()
    sent, send_error = 0, None
    try:
        request = (f"POST /v2/models/{spec['model']}/infer HTTP/1.1\r\nHost: {spec['host']}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {total}\r\n\r\n").encode()
        s.sendall(request + head)
        sent = len(head)
        left = rows
        while left:
            k = min(per_chunk, left)
            piece = chunk if k == per_chunk else b",".join([row] * k)
            left -= k
            piece += b"," if left else tail
            s.sendall(piece)
            sent += len(piece)
    except OSError as e:
        send_error = f"{type(e).__name__}: {e}"
    sent_s = time.perf_counter() - t0
    status, reason = None, ""
    try:
        f = s.makefile("rb")
        line = f.readline(65536)
        if line:
            status = int(line.split()[1])
            length = 0
            while True:
                h = f.readline(65536)
                if h in (b"\r\n", b"\n", b""):
                    break
                if h.lower().startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
            reason = f.read(min(length, 4096)).decode(errors="replace")
    except (OSError, ValueError, IndexError) as e:
        reason = f"no answer: {type(e).__name__}: {e}"
    print(json.dumps({"status": status, "size": total, "sent": sent, "send_error": send_error,
                      "sent_s": sent_s, "answered_s": time.perf_counter() - t0, "t0": m0, "t1": time.monotonic(),
                      "reason": " ".join(reason.split())[:200]}), flush=True)
    s.close()


# --- the server's process tree, from /proc ----------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


class ProcTree:
    """A process and its descendants: CPU time, threads, RSS, the sockets they hold on a port."""

    def __init__(self, pid: int):
        self.pid, self._pids, self._when = pid, [pid], 0.0

    def pids(self, fresh: bool = False) -> list[int]:
        if fresh or time.monotonic() - self._when > 1.0:
            children: dict[int, list[int]] = {}
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        children.setdefault(int(_stat(int(d))[1]), []).append(int(d))
                    except (OSError, IndexError, ValueError):
                        pass
            found, todo = [], [self.pid]
            while todo:
                p = todo.pop()
                found.append(p)
                todo += children.get(p, [])
            self._pids, self._when = found, time.monotonic()
        return self._pids

    def cpu(self) -> float:
        total = 0
        for p in self.pids(fresh=True):
            try:
                f = _stat(p)
                total += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
            except (OSError, IndexError, ValueError):
                pass
        return total / CLK_TCK

    def _status(self, key: str) -> int:
        total = 0
        for p in self.pids():
            try:
                with open(f"/proc/{p}/status") as f:
                    for line in f:
                        if line.startswith(key):
                            total += int(line.split()[1])
                            break
            except (OSError, ValueError):
                pass
        return total

    def threads(self) -> int:
        return self._status("Threads:")

    def rss_mb(self) -> float:
        return self._status("VmRSS:") / 1024

    def sockets(self, port: int) -> int:
        """Connections on ``port`` (any state but LISTEN) whose socket one of the processes holds."""
        suffix, inodes = f":{port:04X}", set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        parts = line.split()
                        if parts[1].endswith(suffix) and parts[3] != "0A":
                            inodes.add(f"socket:[{parts[9]}]")
            except OSError:
                pass
        n = 0
        for p in self.pids():
            try:
                for fd in os.listdir(f"/proc/{p}/fd"):
                    try:
                        n += os.readlink(f"/proc/{p}/fd/{fd}") in inodes
                    except OSError:
                        pass
            except OSError:
                pass
        return n


class Sampler(threading.Thread):
    """Samples a ProcTree in the background: RSS every ``rss_s``, threads every ``threads_s``, the sockets
    on ``port`` every ``sockets_s`` (0: never)."""

    def __init__(self, tree: ProcTree, port: int | None = None, rss_s: float = 0.0, threads_s: float = 0.1,
                 sockets_s: float = 0.5):
        super().__init__(daemon=True)
        self.tree, self.port, self.periods = tree, port, {"rss": rss_s, "threads": threads_s, "sockets": sockets_s}
        self.samples: dict[str, list[float]] = {"rss": [], "threads": [], "sockets": []}
        self._stop_event = threading.Event()

    def run(self) -> None:
        due = dict.fromkeys(self.periods, 0.0)
        read = {"rss": self.tree.rss_mb, "threads": self.tree.threads,
                "sockets": lambda: self.tree.sockets(self.port) if self.port else 0}
        tick = min(p for p in self.periods.values() if p > 0)
        while not self._stop_event.is_set():
            now = time.monotonic()
            for k, period in self.periods.items():
                if period > 0 and now >= due[k]:
                    self.samples[k].append(read[k]())
                    due[k] = now + period
            self._stop_event.wait(tick)

    def stop(self) -> dict[str, list[float]]:
        self._stop_event.set()
        self.join()
        return self.samples


# --- servers ----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(" ".join(x.split())[:200] for x in text[-lines:])


class Server:
    def __init__(self, kind: str, argv: list[str], log: Path, http_port: int, ready_path: str,
                 grpc_port: int | None, grpc_reason: str | None, env: dict | None = None, cwd: Path | None = None,
                 timeout: float = 300.0, options: list[str] = ()):
        self.kind, self.log, self.http_port, self.grpc_port, self.grpc_reason = kind, log, http_port, grpc_port, grpc_reason
        self.options = list(options)
        with open(log, "w") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=cwd)
        self.tree = ProcTree(self.proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}: {tail(log)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
                conn.request("GET", ready_path)
                if conn.getresponse().status == 200:
                    conn.close()
                    break
                conn.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"not ready after {timeout:.0f} s: {tail(log)}")
            time.sleep(0.1)

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str | None:
        return f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_options() -> tuple[set[str], int | None]:
    """The options ``tripy-build serve --help`` lists, and the default of ``--max-connections`` it states."""
    r = subprocess.run([sys.executable, "-m", "tripy_build", "serve", "--help"], capture_output=True, text=True,
                       timeout=300)
    entry = re.search(r"\n\s+--max-connections\b(.*?)(?=\n\s+-|\Z)", r.stdout, re.S)
    default = re.search(r"default:?\s*(\d+)", entry.group(1)) if entry else None
    return set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout)), int(default.group(1)) if default else None


def start_server(kind: str, name: str, out: Path, args: argparse.Namespace, opts: set[str]) -> Server:
    log = out / f"{kind}-{name}.log"
    hp = free_port()
    if kind in TRIPY:
        argv = [sys.executable, "-m", "tripy_build", "serve", str(out / name), "--port", str(hp)]
        argv += {"unbatched": ["--batch-dim", "none"], "batched-2ms": ["--max-delay-ms", "2"]}.get(kind, [])
        passed = []
        for opt in LIMITS:
            value = getattr(args, opt.replace("-", "_"))
            if value is not None and f"--{opt}" in opts:
                passed += [f"--{opt}", str(value)]
        argv += passed
        gp, reason = None, "tripy-build serve has no --grpc-port yet"
        if "--grpc-port" in opts:
            gp, reason = free_port(), None
            argv += ["--grpc-port", str(gp)]
        return Server(kind, argv, log, hp, "/v2/health/ready", gp, reason, options=passed)
    if kind in JAX:
        argv = [sys.executable, __file__, "--child-server", kind, name, str(out), str(hp)]
        return Server(kind, argv, log, hp, "/v2/health/ready", None,
                      f"{kind} runs behind tripy_build's HTTP front end only")
    # MLServer: settings.json and one model folder, the runtime from bench/serve_mlserver on PYTHONPATH.
    python = args.mlserver_python
    if not python or not Path(python).exists():
        raise RuntimeError(f"no MLServer python at {python!r}; install it as bench/serve.py's docstring says, "
                           "or give --mlserver-python")
    root = out / f"mlserver-{name}"
    (root / name).mkdir(parents=True, exist_ok=True)
    gp = free_port()
    settings = {"debug": False, "host": "127.0.0.1", "http_port": hp, "grpc_port": gp, "metrics_endpoint": None,
                "parallel_workers": 0, "gzip_enabled": False, "load_models_at_startup": True}
    cls, kwargs = MODELS[name]
    model_settings = {"name": name, "implementation": "jax_runtime.JaxModel", "max_batch_size": 64,
                      "max_batch_time": 0.001,
                      "parameters": {"uri": str(out / f"{name}.npz"),
                                     "extra": {"class": cls, "kwargs": kwargs, "width": WIDTH,
                                               "max_batch": BATCH[-1], "output": OUTPUT}}}
    (root / "settings.json").write_text(json.dumps(settings, indent=1))
    (root / name / "model-settings.json").write_text(json.dumps(model_settings, indent=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "serve_mlserver"), str(REPO)]),
           "JAX_PLATFORMS": "cpu"}
    argv = [python, "-m", "mlserver.cli.main", "start", str(root)]
    return Server(kind, argv, log, hp, f"/v2/models/{name}/ready", gp, None, env=env, cwd=root)


# --- the client, driven from here -------------------------------------------------------------------------

class Client:
    """A client process (``client_child``) with ``clients`` threads connected to one server."""

    def __init__(self, python: str, encoding: str, address: str, model: str, clients: int, tolerate: bool = False,
                 record: bool = False):
        spec = {"encoding": encoding, "address": address, "model": model, "clients": clients, "tolerate": tolerate,
                "record": record}
        self.err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([python, __file__, "--child-client", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        ready = json.loads(self._line().removeprefix("ready "))
        if ready["failed"]:
            self.close()
            raise RuntimeError(f"{ready['failed']} of {clients} clients could not start; first: {ready['errors'][0]}")

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise RuntimeError(f"the client process exited ({self.proc.wait()}): "
                               + " | ".join(self.err.read().strip().splitlines()[-3:])[:600])
        return line.strip()

    def begin(self, seconds: float, tree: ProcTree | None = None) -> None:
        self.proc.stdin.write(f"go {seconds}\n")
        self.proc.stdin.flush()
        self._line()  # started
        self._cpu0 = tree.cpu() if tree else None
        self._tree = tree

    def end(self, stop: bool = False) -> dict:
        if stop:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        r = json.loads(self._line())
        if self._tree is not None and r["count"]:
            r["cpu_ms"] = (self._tree.cpu() - self._cpu0) * 1e3 / r["count"]
        return r

    def window(self, seconds: float, tree: ProcTree | None = None) -> dict:
        self.begin(seconds, tree)
        return self.end()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.err.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check(python: str, encoding: str, address: str, model: str) -> dict:
    spec = {"encoding": encoding, "address": address, "model": model, "check": True}
    r = subprocess.run([python, __file__, "--child-client", json.dumps(spec)], capture_output=True, text=True,
                       timeout=300)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"the check process exited ({r.returncode}): " + " ".join(r.stderr.split()[-40:])[:300]}


# --- measurements -----------------------------------------------------------------------------------------

def measure(srv: Server, name: str, ref: np.ndarray, args: argparse.Namespace, rows: list[dict]) -> None:
    for enc in args.encodings:
        base = {"model": name, "server": srv.kind, "encoding": enc}
        address = srv.grpc_address if enc == "grpc" else srv.http_address
        python = args.grpc_client_python if enc == "grpc" else sys.executable
        reason = None
        if enc == "grpc" and address is None:
            reason = srv.grpc_reason
        elif python is None:
            reason = "no python with tritonclient.grpc (--grpc-client-python)"
        else:
            got = check(python, enc, address, name)
            if "error" in got:
                reason = f"its answer to the check request: {got['error']}"
                if srv.kind == "mlserver" and enc == "binary":
                    reason = ("MLServer has no binary tensor data extension over REST; " + reason)
            else:
                got = np.asarray(got["answer"], np.float32)
                err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) if got.shape == ref.shape else float("inf")
                if not err <= 1e-4:
                    reason = f"wrong answer: shape {list(got.shape)}, relative error {err:.2e} against jax.jit"
        if reason:
            print(f"{name:6} {srv.kind:11} {enc:6} not measured: {reason}", flush=True)
            rows.append({**base, "skipped": reason})
            continue
        for n in args.clients:
            try:
                with Client(python, enc, address, name, n) as c:
                    c.window(args.warm)  # every batch size the load makes, connections settled
                    r = c.window(args.seconds, srv.tree)
            except RuntimeError as e:
                print(f"{name:6} {srv.kind:11} {enc:6} {n:3} clients  failed: {e}", flush=True)
                rows.append({**base, "clients": n, "skipped": f"{n} clients: {e}"})
                continue
            if r["errors"]:
                print(f"{name:6} {srv.kind:11} {enc:6} {n:3} clients  {r['errors']} errors; first: {r['first_error']}",
                      flush=True)
                rows.append({**base, "clients": n, "skipped": f"{n} clients: {r['errors']} errors: {r['first_error']}"})
                continue
            rows.append({**base, "clients": n, **r})
            print(f"{name:6} {srv.kind:11} {enc:6} {n:3} clients  {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.2f} ms"
                  f"  p99 {r['p99_ms']:7.2f} ms  server CPU {r.get('cpu_ms', float('nan')):6.3f} ms/req", flush=True)


def settle(srv: Server, most: float = 10.0) -> float:
    """Wait until the sockets the server holds on its port stop changing (accepted, refused or dropped) for
    0.6 s, at most ``most`` seconds: the window then measures connections held, not their accept burst."""
    t0 = time.monotonic()
    last, since = srv.tree.sockets(srv.http_port), time.monotonic()
    while time.monotonic() - t0 < most and time.monotonic() - since < 0.6:
        time.sleep(0.2)
        now = srv.tree.sockets(srv.http_port)
        if now != last:
            last, since = now, time.monotonic()
    return time.monotonic() - t0


def judge(checks: list[tuple[bool, str]]) -> str:
    failed = [why for ok, why in checks if not ok]
    return "PASS" if not failed else "FAIL: " + "; ".join(failed)


def hostile(srv: Server, name: str, args: argparse.Namespace, out: list[dict]) -> None:
    """The idle, slow-loris and huge-body scenarios against one server, each judged against the target."""
    n, cap = args.hostile_clients, args.cap
    address = srv.http_address
    cap_note = (f"cap {cap} (passed as --max-connections)" if "--max-connections" in srv.options
                else f"cap {cap} (tripy-build serve's; {srv.kind} has no connection cap setting)" if srv.kind == "mlserver"
                else f"cap {cap} (its default --max-connections)" if "--max-connections" in args.serve_opts
                else f"cap {cap} (this tripy-build serve has no --max-connections)")
    try:
        with Client(sys.executable, "json", address, name, n) as c:
            c.window(args.warm)
            unloaded = c.window(args.seconds, srv.tree)
    except RuntimeError as e:
        print(f"hostile {name} {srv.kind}: no unloaded baseline: {e}", flush=True)
        return
    p99_0 = unloaded["p99_ms"]
    print(f"hostile {name:6} {srv.kind:11} unloaded: {n} JSON clients, p99 {p99_0:.2f} ms ({unloaded['rps']:.0f} req/s); "
          f"{cap_note}", flush=True)
    for mode in [m for m in ("idle", "slowloris") if m in args.hostile_scenarios]:
        label = f"{args.hostile_connections} {'idle' if mode == 'idle' else 'slow-loris'}"
        try:
            with Client(sys.executable, "json", address, name, n, tolerate=True) as c:
                threads0, socks0 = srv.tree.threads(), srv.tree.sockets(srv.http_port)
                holder = subprocess.Popen(
                    [sys.executable, __file__, "--child-hold", json.dumps({
                        "host": "127.0.0.1", "port": srv.http_port, "n": args.hostile_connections, "mode": mode,
                        "model": name})], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                try:
                    opened = json.loads(holder.stdout.readline() or "{}")
                    sampler = Sampler(srv.tree, srv.http_port, threads_s=0.1, sockets_s=0.5)
                    sampler.start()
                    settled = settle(srv)
                    r = c.window(max(args.seconds, args.hostile_min_seconds), srv.tree)
                    socks_end = srv.tree.sockets(srv.http_port)
                    samples = sampler.stop()
                    holder.stdin.write("report\n")
                    holder.stdin.flush()
                    held = json.loads(holder.stdout.readline() or "{}")
                finally:
                    if holder.poll() is None:
                        holder.kill()
                    holder.wait()
        except RuntimeError as e:
            print(f"hostile {name:6} {srv.kind:11} {label}: failed: {e}", flush=True)
            continue
        threads_max = int(max(samples["threads"], default=threads0))
        socks_max = int(max(samples["sockets"] + [socks_end], default=socks_end))
        ratio = r["p99_ms"] / p99_0
        verdict = judge([(threads_max - threads0 <= cap, f"threads +{threads_max - threads0} > cap {cap}"),
                         (socks_max <= cap, f"connections held {socks_max} > cap {cap}"),
                         (ratio <= 2.0, f"p99 {ratio:.1f}x > 2x"),
                         (r["errors"] == 0, f"{r['errors']} client errors ({r['first_error']})")])
        print(f"hostile {name:6} {srv.kind:11} {label}: {opened.get('opened', 0)} opened"
              f"{', %d failed (%s)' % (opened['failed'], opened['first_error']) if opened.get('failed') else ''}; "
              f"server threads max {threads_max} ({threads0} before), connections held max {socks_max} "
              f"({socks0} before, {socks_end} at the end; {held.get('closed_by_server', '?')} closed by the server; "
              f"the window began {settled:.1f} s after they connected, once the server's count settled); "
              f"client p99 {r['p99_ms']:.2f} ms ({ratio:.2f}x unloaded), {r['errors']} errors -> {verdict}", flush=True)
        out.append({"model": name, "server": srv.kind, "scenario": label, "threads": f"{threads_max} ({threads0})",
                    "held": f"{socks_max} / {socks_end}", "rss": "", "answer": "",
                    "p99": f"{r['p99_ms']:.2f} ({p99_0:.2f})", "ratio": ratio, "errors": r["errors"], "verdict": verdict})
    if "body" not in args.hostile_scenarios:
        return
    # The huge body.
    size = int(args.hostile_body_mb * 1e6)
    label = f"{args.hostile_body_mb:g} MB JSON"
    try:
        with Client(sys.executable, "json", address, name, n, tolerate=True, record=True) as c:
            sampler = Sampler(srv.tree, rss_s=0.02, threads_s=0.1, sockets_s=0)
            sampler.start()
            time.sleep(0.3)
            before = float(np.median(sampler.samples["rss"]))
            c.begin(0, srv.tree)
            t0 = time.monotonic()
            b = subprocess.run([sys.executable, __file__, "--child-body", json.dumps({
                "host": "127.0.0.1", "port": srv.http_port, "model": name, "size": size})],
                capture_output=True, text=True, timeout=600)
            left = max(args.seconds, args.hostile_min_seconds) - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
            r = c.end(stop=True)
            time.sleep(1.0)
            samples = sampler.stop()
            after = srv.tree.rss_mb()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"hostile {name:6} {srv.kind:11} {label}: failed: {e}", flush=True)
        return
    try:
        body = json.loads(b.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        body = {"status": None, "size": size, "sent": 0, "send_error": None, "answered_s": float("nan"),
                "t0": t0, "t1": time.monotonic(),
                "reason": f"the sender exited ({b.returncode}): {' '.join(b.stderr.split()[-30:])}"}
    # "Meanwhile": the normal requests in flight at some point while the big one was, or (refused at once)
    # during the --seconds after it began.
    until = max(body["t1"], body["t0"] + args.seconds)
    during = [lat * 1e3 for start, lat in r["requests"] if start < until and start + lat > body["t0"]]
    p99 = float(np.percentile(during, 99)) if during else float("nan")
    peak = max(samples["rss"], default=before)
    rise = (peak - before) * 2**20 / body["size"]
    alive = srv.proc.poll() is None
    refused = body["status"] == 413 or (body["status"] is None and body["sent"] < body["size"] and alive)
    ratio = p99 / p99_0
    how = (f"answered {body['status']} after {body['answered_s']:.1f} s" if body["status"] is not None
           else f"no answer ({body['reason']}); {body['sent'] / 1e6:.0f} of {body['size'] / 1e6:.0f} MB sent")
    verdict = judge([(alive, "the server died"),
                     (refused or rise <= 2.0, f"RSS rise {rise:.1f}x the body > 2x"),
                     (ratio <= 2.0, f"p99 meanwhile {ratio:.1f}x > 2x" if during else "no answers meanwhile"),
                     (r["errors"] == 0, f"{r['errors']} client errors ({r['first_error']})")])
    print(f"hostile {name:6} {srv.kind:11} {label}: {how}"
          f"{(': ' + body['reason'][:120]) if body['status'] is not None and body['reason'] else ''}; "
          f"RSS {before:.0f} MiB before, peak {peak:.0f} MiB (+{peak - before:.0f} MiB, {rise:.2f}x the body), "
          f"{after:.0f} MiB after; client p99 meanwhile {p99:.2f} ms over {len(during)} requests ({ratio:.2f}x "
          f"unloaded; {r['p99_ms']:.2f} ms over the whole {r['wall']:.1f} s), {r['errors']} errors -> {verdict}",
          flush=True)
    out.append({"model": name, "server": srv.kind, "scenario": label, "threads": f"{int(max(samples['threads'], default=0))}",
                "held": "", "rss": f"{before:.0f} / {peak:.0f} / {after:.0f} ({rise:.2f}x)",
                "answer": str(body["status"]) if body["status"] is not None else "none",
                "p99": f"{p99:.2f} ({p99_0:.2f})", "ratio": ratio, "errors": r["errors"], "verdict": verdict})


# --- reports ----------------------------------------------------------------------------------------------

_VERSIONS = ("mlserver", "uvicorn", "fastapi", "starlette", "pydantic", "uvloop", "httptools", "grpcio", "protobuf",
             "tritonclient", "jax", "jaxlib", "numpy", "orjson")


def versions(python: str) -> dict:
    code = ("import json, importlib.metadata as m\nout = {}\n"
            f"for p in {_VERSIONS!r}:\n"
            "    try: out[p] = m.version(p)\n    except m.PackageNotFoundError: out[p] = None\n"
            "print(json.dumps(out))")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def environment(args: argparse.Namespace, opts: set[str]) -> None:
    info, meminfo = Path("/proc/cpuinfo").read_text().splitlines(), Path("/proc/meminfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")
    mem = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0) / 2**20
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except OSError:
        commit = "?"
    here = versions(sys.executable)
    from tripy_build import __version__

    print(f"host: {cpu}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), {mem:.1f} GiB; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; open files {soft}/{hard}")
    print(f"tripy_build {__version__} ({commit}), Python {platform.python_version()}, jax {here.get('jax')}, "
          f"numpy {here.get('numpy')}; tripy-build serve: "
          + ", ".join(f"--{o} {'yes' if f'--{o}' in opts else 'no'}" for o in (*LIMITS, "grpc-port")))
    if args.mlserver_python and Path(args.mlserver_python).exists():
        v = versions(args.mlserver_python)
        print(f"MLServer venv ({args.mlserver_python}): " + ", ".join(f"{k} {v.get(k)}" for k in _VERSIONS)
              + ("; uvicorn parses HTTP with " + ("httptools" if v.get("httptools") else "h11 (no httptools installed)")))
    else:
        print(f"MLServer: no python at {args.mlserver_python!r}: the mlserver rows are skipped")
    if "grpc" not in args.encodings:
        pass
    elif args.grpc_client_python:
        v = versions(args.grpc_client_python)
        print(f"gRPC client: tritonclient {v.get('tritonclient')}, grpcio {v.get('grpcio')} ({args.grpc_client_python})")
    else:
        print("gRPC client: no python with tritonclient.grpc: the grpc rows are skipped")
    print(f"windows: {args.seconds:g} s timed after {args.warm:g} s warm; clients {','.join(map(str, args.clients))}; "
          f"encodings {','.join(args.encodings)}; contenders {','.join(args.contenders)}; models {','.join(args.models)}",
          flush=True)


def fmt_ratio(x: float | None, mark: str = "") -> str:
    return "—" if x is None else f"{x:.2f}x{mark}"


def report(rows: list[dict], hostile_rows: list[dict], args: argparse.Namespace) -> None:
    for name in args.models:
        mine = [r for r in rows if r["model"] == name]
        if not mine:
            continue
        print(f"\n### {name}: one-row requests, closed loop ({args.seconds:g} s windows)\n")
        print("ratios: to MLServer at the same encoding and clients († MLServer has none: to its JSON row); "
              "server CPU: the server's process tree, per request\n")
        print("| server | encoding | clients | req/s | p50 ms | p99 ms | req/s ÷ MLServer | p99 ÷ MLServer | server CPU ms/req |")
        print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
        ml = {(r["encoding"], r["clients"]): r for r in mine if r["server"] == "mlserver" and "rps" in r}
        for r in mine:
            if "rps" not in r:
                continue
            m, mark = ml.get((r["encoding"], r["clients"])), ""
            if m is None and ("json", r["clients"]) in ml:
                m, mark = ml[("json", r["clients"])], "†"
            print(f"| {r['server']} | {r['encoding']} | {r['clients']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {fmt_ratio(m and r['rps'] / m['rps'], mark)} | "
                  f"{fmt_ratio(m and r['p99_ms'] / m['p99_ms'], mark)} | {r.get('cpu_ms', float('nan')):.3f} |")
        for r in mine:
            if "skipped" in r:
                what = r["server"] + (f" {r['encoding']}" if r["encoding"] != "-" else "")
                print(f"\n- not measured: {what}: {r['skipped']}", end="")
        print()
        for n in (8, 32):
            t = next((r for r in mine if r["server"] == "batched" and r["encoding"] == "json" and r.get("clients") == n
                      and "rps" in r), None)
            m = ml.get(("json", n))
            if t and m:
                a, b = t["rps"] / m["rps"], t["p99_ms"] / m["p99_ms"]
                print(f"target, JSON at {n} clients: batched {a:.2f}x MLServer's req/s (>= 2x: {'pass' if a >= 2 else 'FAIL'}), "
                      f"p99 {b:.2f}x MLServer's (<= 1x: {'pass' if b <= 1 else 'FAIL'})")
        jit = {(r["encoding"], r["clients"]): r for r in mine if r["server"] == "jax.jit" and "rps" in r}
        if jit:
            kinds = [k for k in args.contenders if any(r["server"] == k and "rps" in r for r in mine)]
            print("\nthroughput against jax.jit (behind tripy_build's HTTP front end; higher is better):\n")
            print("| encoding | clients | " + " | ".join(kinds) + " |")
            print("|---|--:|" + "--:|" * len(kinds))
            for (enc, n), base in jit.items():
                by = {r["server"]: r for r in mine if r["encoding"] == enc and r.get("clients") == n and "rps" in r}
                print(f"| {enc} | {n} | " + " | ".join(fmt_ratio(by[k]["rps"] / base["rps"]) if k in by else "—"
                                                      for k in kinds) + " |")
    if hostile_rows:
        print(f"\n### hostile scenarios ({args.hostile_clients} normal JSON clients closed loop meanwhile; "
              f"cap {args.cap})\n")
        print("| model | server | scenario | threads max (before) | connections held max / end | "
              "RSS MiB before / peak / after (rise ÷ body) | status | client p99 ms (unloaded; the body: meanwhile) | "
              "p99 ratio | errors | verdict |")
        print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|")
        for h in hostile_rows:
            print(f"| {h['model']} | {h['server']} | {h['scenario']} | {h['threads']} | {h['held']} | {h['rss']} | "
                  f"{h['answer']} | {h['p99']} | {h['ratio']:.2f}x | {h['errors']} | {h['verdict']} |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def has_tritonclient(python: str) -> bool:
    if python == sys.executable:
        try:
            return importlib.util.find_spec("tritonclient.grpc") is not None
        except ImportError:
            return False
    try:
        return subprocess.run([python, "-c", "import tritonclient.grpc"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated (default geglu,mlp; --quick: geglu)")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated, of {','.join(CONTENDERS)} (default all; --quick: batched,jax.jit,mlserver)")
    parser.add_argument("--encodings", default=",".join(ENCODINGS), help="comma-separated, of json,binary,grpc")
    parser.add_argument("--clients", default=None, help="concurrent client threads, comma-separated (default 1,8,32)")
    parser.add_argument("--seconds", type=float, default=None, help="timed window per measurement (default 4)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 s windows, 1 and 8 clients, geglu, hostile with 300 connections and 20 MB")
    parser.add_argument("--hostile", default="geglu", help="models to run the hostile scenarios on ('none': skip)")
    parser.add_argument("--no-hostile", dest="hostile", action="store_const", const="none")
    parser.add_argument("--hostile-scenarios", default="idle,slowloris,body",
                        help="comma-separated, of idle,slowloris,body (default all)")
    parser.add_argument("--hostile-servers", default="batched,mlserver", help="contenders the hostile scenarios hit")
    parser.add_argument("--hostile-connections", type=int, default=None, help="idle / slow connections (default 3000)")
    parser.add_argument("--hostile-body-mb", type=float, default=None, help="the huge JSON request, MB (default 200)")
    parser.add_argument("--hostile-clients", type=int, default=4, help="the normal client's threads (default 4)")
    parser.add_argument("--hostile-min-seconds", type=float, default=None,
                        help="shortest hostile window (default 6 s: the slow-loris bytes and timeouts need time)")
    parser.add_argument("--mlserver-python", default=MLSERVER_PYTHON if Path(MLSERVER_PYTHON).exists() else None,
                        help=f"the python of a venv with mlserver==1.7.1 (default {MLSERVER_PYTHON} if it exists)")
    parser.add_argument("--grpc-client-python", default=None,
                        help="a python with tritonclient.grpc (default: this one if it has it, else --mlserver-python)")
    parser.add_argument("--max-connections", type=int, default=None,
                        help="the connection cap: passed to tripy-build serve if it has the option; what the hostile "
                        "scenarios judge threads and connections against (default: the server's stated default, "
                        "else 512)")
    for opt in ("max-body-bytes", "max-json-bytes", "read-timeout", "idle-timeout"):
        parser.add_argument(f"--{opt}", default=None, help=f"passed to tripy-build serve if it has --{opt} "
                            "(default: the server's own)")
    parser.add_argument("--child-server", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-client", help=argparse.SUPPRESS)
    parser.add_argument("--child-hold", help=argparse.SUPPRESS)
    parser.add_argument("--child-body", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_server:
        kind, name, out, port = args.child_server
        jax_server(kind, name, Path(out), int(port))
        return
    for child, fn in ((args.child_client, client_child), (args.child_hold, hold_child), (args.child_body, body_child)):
        if child:
            fn(json.loads(child))
            return

    q = args.quick
    args.models = (args.models or ("geglu" if q else "geglu,mlp")).split(",")
    args.contenders = (args.contenders or ("batched,jax.jit,mlserver" if q else ",".join(CONTENDERS))).split(",")
    args.encodings = args.encodings.split(",")
    args.clients = [int(c) for c in (args.clients or ("1,8" if q else "1,8,32")).split(",")]
    args.seconds = args.seconds or (1.0 if q else 4.0)
    args.warm = min(0.5 if q else 1.0, args.seconds)
    args.hostile_connections = args.hostile_connections or (300 if q else 3000)
    args.hostile_body_mb = args.hostile_body_mb or (20 if q else 200)
    args.hostile_min_seconds = args.hostile_min_seconds if args.hostile_min_seconds is not None else (3.0 if q else 6.0)
    args.hostile_scenarios = args.hostile_scenarios.split(",")
    hostile_models = [] if args.hostile in ("none", "") else args.hostile.split(",")
    for bad in set(args.contenders) - set(CONTENDERS):
        parser.error(f"--contenders: no contender {bad!r}; they are {', '.join(CONTENDERS)}")
    for bad in set(args.encodings) - set(ENCODINGS):
        parser.error(f"--encodings: no encoding {bad!r}; they are {', '.join(ENCODINGS)}")
    if args.grpc_client_python is None and "grpc" in args.encodings:
        for python in (sys.executable, args.mlserver_python):
            if python and has_tritonclient(python):
                args.grpc_client_python = python
                break
    raise_nofile()
    opts, stated_cap = serve_options() if set(args.contenders) & set(TRIPY) else (set(), None)
    args.cap, args.serve_opts = args.max_connections or stated_cap or 512, opts
    environment(args, opts)
    rows: list[dict] = []
    hostile_rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for name in args.models:
            build(name, out, artifact=bool(set(args.contenders) & set(TRIPY)))
            ref = reference(name, out)
            for kind in args.contenders:
                t0 = time.monotonic()
                try:
                    srv = start_server(kind, name, out, args, opts)
                except RuntimeError as e:
                    print(f"{name:6} {kind:11} not measured: the server did not start: {e}", flush=True)
                    rows.append({"model": name, "server": kind, "encoding": "-", "skipped": f"did not start: {e}"})
                    continue
                print(f"{name:6} {kind:11} ready in {time.monotonic() - t0:.1f} s"
                      + (f" ({' '.join(srv.options)})" if srv.options else ""), flush=True)
                try:
                    measure(srv, name, ref, args, rows)
                    if name in hostile_models and kind in args.hostile_servers.split(","):
                        hostile(srv, name, args, hostile_rows)
                finally:
                    srv.stop()
    report(rows, hostile_rows, args)


if __name__ == "__main__":
    main()
