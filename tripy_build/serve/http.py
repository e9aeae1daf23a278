"""``tripy-build serve``: built artifacts over HTTP, with dynamic batching.

The protocol is KServe's v2 inference protocol (the Open Inference Protocol, also Triton's HTTP API),
so existing clients work unchanged: ``GET /v2/health/ready``, ``GET /v2/models/NAME`` (inputs,
outputs, datatypes; ``-1`` for a dynamic axis), ``POST /v2/models/NAME/infer`` and
``GET /v2/models/NAME/stats``. Tensors travel as JSON lists or, with the binary tensor data extension
(``Inference-Header-Content-Length``), as raw bytes after the JSON header, which costs no parsing.

Every artifact is loaded with the jax-free runtime, every profile warmed before the port opens, and
each request is checked on its own against the declared ranges (a 400 naming the input, the dim and
the range) before it joins a batch (``batching.py``), so one bad request never fails another.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import batching
from ..errors import CallError, ConfigError, TripyBuildError

MAX_BODY_BYTES = 1 << 30  # a request larger than this is refused (413) before it is read

# KServe v2 datatypes <-> numpy dtype names (BYTES, strings, has no tensor here).
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BF16": "bfloat16"}
_BY_DTYPE = {v: k for k, v in DATATYPES.items()}


def datatype(dtype: Any) -> str:
    """The v2 datatype of a numpy dtype (its upper-cased name where v2 has none, e.g. ``FLOAT8_E4M3FN``)."""
    name = np.dtype(dtype).name
    return _BY_DTYPE.get(name, name.upper())


def _shape(info: Any) -> list[int]:
    """An input's shape as v2 metadata gives it: ``-1`` for an axis whose size varies."""
    return [lo if lo == hi else -1 for lo, hi in zip(info.shape_bounds.min, info.shape_bounds.max)]


def _ranges(info: Any) -> list[Any]:
    out = []
    for i, (lo, hi) in enumerate(zip(info.shape_bounds.min, info.shape_bounds.max)):
        name = info.dimension_names.get(i)
        out.append(lo if lo == hi else {"name": name, "min": lo, "max": hi} if name else {"min": lo, "max": hi})
    return out


class Endpoint:
    """One artifact served under its name: its metadata, requests decoded, batched and answered."""

    def __init__(self, model: Any, version: str, path: Path | None = None, batch_dim: str = "auto",
                 max_batch: int | None = None, max_delay_ms: float = 0.0):
        """``model``: what ``runtime.Runtime`` offers (``__name__``, ``flat_args``, ``output_infos``, ``dims``,
        ``call_flat``, ``check_flat``); ``Endpoint.load`` makes one of an artifact."""
        self.runtime, self.path, self.version = model, path, version
        self.name = model.__name__
        self.args = model.flat_args
        self.outputs = model.output_infos
        self.output_names = [f"output{i}" for i in range(len(self.outputs))]
        self.plan, self.batching = batching.plan(self.args, self.outputs, model.dims, batch_dim, max_batch,
                                                 max_delay_ms)
        self.batcher = batching.Batcher(model.call_flat, self.plan, self.name)
        self.last_inference_ms = 0

    @classmethod
    def load(cls, path: str | Path, **options: Any) -> "Endpoint":
        """An artifact loaded by the jax-free runtime, every profile warmed; its version is its build key."""
        from .. import runtime

        path = Path(path)
        return cls(runtime.load(path, warmup="now"), path.resolve().name, path, **options)

    def metadata(self) -> dict[str, Any]:
        def tensor(name: str, info: Any) -> dict[str, Any]:
            return {"name": name, "datatype": datatype(info.dtype), "shape": _shape(info), "ranges": _ranges(info)}

        return {"name": self.name, "versions": [self.version], "platform": "tripy_build",
                "inputs": [tensor(p, info) for p, info in self.args],
                "outputs": [tensor(n, info) for n, info in zip(self.output_names, self.outputs)],
                "batching": ({"dim": self.plan.dim, "max_batch": self.plan.max_batch,
                              "max_delay_ms": self.plan.max_delay_s * 1e3} if self.plan else None),
                "batching_note": self.batching}

    def decode(self, request: Any, binary: memoryview) -> list[np.ndarray]:
        """A request's flat inputs, in the model's order, each checked against its declaration."""
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise CallError('the request must be a JSON object with an "inputs" list '
                            '(KServe v2: {"inputs": [{"name", "shape", "datatype", "data"}]}).')
        expected = {p: (i, info) for i, (p, info) in enumerate(self.args)}
        leaves: list[Any] = [None] * len(self.args)
        offset = 0
        for item in request["inputs"]:
            if not isinstance(item, dict) or "name" not in item:
                raise CallError(f'every entry of "inputs" must be an object with a "name", got {item!r:.200}.')
            name = item["name"]
            if name not in expected:
                raise CallError(f"input {name!r}: {self.name} has no such input; it takes "
                                f"{', '.join(repr(p) for p in expected)}.")
            index, info = expected[name]
            if leaves[index] is not None:
                raise CallError(f"input {name!r} is given twice; give it once.")
            leaves[index], offset = self._tensor(item, info, binary, offset)
        missing = [p for (p, _), v in zip(self.args, leaves) if v is None]
        if missing:
            raise CallError(f"{self.name} needs input(s) {', '.join(repr(m) for m in missing)}, which the request lacks "
                            f"(expected: {', '.join(f'{p}: {i!r}' for p, i in self.args)}).")
        if offset != len(binary):
            raise CallError(f"the request carries {len(binary)} bytes of binary tensor data but its inputs' "
                            f"binary_data_size add up to {offset}.")
        self.runtime.check_flat(*leaves)
        return leaves

    @staticmethod
    def _tensor(item: dict[str, Any], info: Any, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
        name, want = item["name"], datatype(info.dtype)
        shape = item.get("shape")
        if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                 for n in shape)):
            raise CallError(f"input {name!r}: \"shape\" must be a list of non-negative integers, got {shape!r:.200}.")
        if item.get("datatype") != want:
            raise CallError(f"input {name!r}: datatype {item.get('datatype')!r} given, but it is {want} "
                            f"({info!r}); send it as {want}.")
        count = int(np.prod(shape, dtype=np.int64))
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            need = count * info.dtype.itemsize
            if size != need or offset + need > len(binary):
                raise CallError(f"input {name!r}: shape {shape} of {want} is {need} bytes, but binary_data_size is "
                                f"{size!r} with {len(binary) - offset} bytes left in the request.")
            array = np.frombuffer(binary[offset:offset + need], dtype=info.dtype).reshape(shape)
            return array, offset + need
        if "data" not in item:
            raise CallError(f'input {name!r}: has neither "data" nor a "binary_data_size" parameter.')
        try:
            array = np.asarray(item["data"], dtype=info.dtype)
        except (TypeError, ValueError) as e:
            raise CallError(f"input {name!r}: \"data\" is not a list of {want} values ({e}).") from None
        if array.size != count:
            raise CallError(f"input {name!r}: shape {shape} holds {count} values, but \"data\" has {array.size}.")
        return array.reshape(shape), offset

    def infer(self, request: Any, binary: memoryview) -> tuple[dict[str, Any], list[bytes]]:
        """Run one request: the v2 response, and the binary output data that follows it."""
        leaves = self.decode(request, binary)
        wanted = self._wanted(request)
        outs = self.batcher.submit(leaves).result()
        self.last_inference_ms = int(time.time() * 1000)
        response: dict[str, Any] = {"model_name": self.name, "model_version": self.version, "outputs": []}
        if "id" in request:
            response["id"] = request["id"]
        blobs = []
        for name, as_binary in wanted:
            out = np.ascontiguousarray(outs[self.output_names.index(name)])
            entry: dict[str, Any] = {"name": name, "datatype": datatype(out.dtype), "shape": list(out.shape)}
            if as_binary:
                blob = out.tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = (out.astype(np.float32) if out.dtype.kind == "V" or out.dtype.name == "bfloat16"
                                 else out).ravel().tolist()
            response["outputs"].append(entry)
        return response, blobs

    def _wanted(self, request: dict[str, Any]) -> list[tuple[str, bool]]:
        """(output name, as binary) for each output to return: the requested ones, else all."""
        default = bool((request.get("parameters") or {}).get("binary_data_output", False))
        asked = request.get("outputs")
        if asked is None:
            return [(n, default) for n in self.output_names]
        if not isinstance(asked, list) or not all(isinstance(o, dict) and "name" in o for o in asked):
            raise CallError(f'"outputs" must be a list of objects with a "name", got {asked!r:.200}.')
        for o in asked:
            if o["name"] not in self.output_names:
                raise CallError(f"output {o['name']!r}: {self.name} has no such output; it has "
                                f"{', '.join(self.output_names)}.")
        return [(o["name"], bool((o.get("parameters") or {}).get("binary_data", default))) for o in asked]

    def statistics(self) -> dict[str, Any]:
        s = self.batcher.stats
        with s.lock:
            ok = s.requests - s.failed
            return {"name": self.name, "version": self.version, "last_inference": self.last_inference_ms,
                    "inference_count": s.rows, "execution_count": s.calls,
                    "inference_stats": {"success": {"count": ok}, "fail": {"count": s.failed},
                                        "queue": {"count": s.requests, "ns": s.queue_ns},
                                        "compute_infer": {"count": s.calls, "ns": s.compute_ns}},
                    "batch_stats": [{"batch_size": n, "compute_infer": {"count": c, "ns": ns}}
                                    for n, (c, ns) in sorted(s.batches.items())]}

    def close(self) -> None:
        self.batcher.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's requests reuse one connection
    # Without TCP_NODELAY a response written in parts waits for the client's delayed ACK: ~40 ms a request.
    disable_nagle_algorithm = True
    server: "_HTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would cost more than the request

    def _send(self, status: int, body: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
        head = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not blobs else "application/octet-stream")
        if blobs:
            self.send_header("Inference-Header-Content-Length", str(len(head)))
        self.send_header("Content-Length", str(len(head) + sum(map(len, blobs))))
        self.end_headers()
        self.wfile.write(b"".join([head, *blobs]) if blobs else head)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message})

    def _endpoint(self, parts: list[str]) -> tuple[Endpoint | None, list[str]]:
        """The model a ``/v2/models/NAME[/versions/V]/...`` path names and the rest of the path, or None
        once a 404 is sent."""
        ep = self.server.endpoints.get(parts[2])
        rest = parts[3:]
        if ep is None:
            self._error(404, f"model {parts[2]!r} is not served here; served: {', '.join(self.server.endpoints)}.")
            return None, []
        if rest[:1] == ["versions"]:
            if len(rest) < 2 or rest[1] != ep.version:
                self._error(404, f"model {ep.name!r} has version {ep.version!r} only, not "
                                 f"{rest[1] if len(rest) > 1 else ''!r}.")
                return None, []
            rest = rest[2:]
        return ep, rest

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
        if parts in (["v2", "health", "live"], ["v2", "health", "ready"]):
            return self._send(200, {"live" if parts[2] == "live" else "ready": True})
        if parts == ["v2"]:
            from .. import __version__

            return self._send(200, {"name": "tripy_build", "version": __version__, "extensions": [
                "binary_tensor_data", "statistics"]})
        if parts == ["v2", "models", "stats"]:
            return self._send(200, {"model_stats": [e.statistics() for e in self.server.endpoints.values()]})
        if len(parts) >= 3 and parts[:2] == ["v2", "models"]:
            ep, rest = self._endpoint(parts)
            if ep is None:
                return None
            if rest == []:
                return self._send(200, ep.metadata())
            if rest == ["ready"]:
                return self._send(200, {"name": ep.name, "ready": True})
            if rest == ["stats"]:
                return self._send(200, {"model_stats": [ep.statistics()]})
        return self._error(404, f"no such resource: GET {self.path}.")

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            return self._error(411, "a request needs a Content-Length header.")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(413, f"the request is {int(length)} bytes; at most {MAX_BODY_BYTES} are accepted.")
        body = self.rfile.read(int(length))
        if len(parts) < 3 or parts[:2] != ["v2", "models"]:
            return self._error(404, f"no such resource: POST {self.path}.")
        ep, rest = self._endpoint(parts)
        if ep is None:
            return None
        if rest != ["infer"]:
            return self._error(404, f"no such resource: POST {self.path}; inference is POST /v2/models/{ep.name}/infer.")
        try:
            head_len = self.headers.get("Inference-Header-Content-Length")
            split = len(body) if head_len is None else int(head_len)
            if not 0 <= split <= len(body):
                raise ValueError(f"Inference-Header-Content-Length {head_len} is outside the body's {len(body)} bytes")
            try:
                request = json.loads(body[:split])
            except (ValueError, UnicodeDecodeError) as e:
                raise CallError(f"the request's JSON is malformed: {e}.") from None
            response, blobs = ep.infer(request, memoryview(body)[split:])
        except TripyBuildError as e:
            return self._error(400, str(e))
        except ValueError as e:
            return self._error(400, f"{e}.")
        except Exception as e:  # noqa: BLE001 - the client gets the reason; the server goes on
            return self._error(500, f"{type(e).__name__}: {e}")
        return self._send(200, response, blobs)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (socketserver's 5 resets a burst of new clients)
    endpoints: dict[str, Endpoint]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer is no error of the server's; anything else is printed."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class Server:
    """Artifacts served over HTTP (KServe v2), each with its own batcher.

    Args:
        paths: artifact directories; each is served under its model's name.
        host: the address to listen on (``0.0.0.0`` for every interface).
        port: the port; 0 picks a free one (see ``url``).
        batch_dim: the dim requests are gathered along (``"auto"``: the one rows-padded dim every input and
            output has; ``"none"``: no batching).
        max_batch: most rows in one call (default: the batch dim's max).
        max_delay_ms: longest a request waits for others to join its batch.

    Example::

        from tripy_build.server import Server
        with Server(["artifacts/geglu/2bb85d9bc22e7905"], port=0) as s:
            print(s.url)  # POST {url}/v2/models/geglu/infer
            s.serve_forever()
    """

    def __init__(self, paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8000,
                 batch_dim: str = "auto", max_batch: int | None = None, max_delay_ms: float = 0.0):
        if not paths:
            raise ConfigError("serve: give at least one artifact directory (e.g. artifacts/geglu/<key>).")
        self.endpoints: dict[str, Endpoint] = {}
        try:
            for path in paths:
                ep = Endpoint.load(path, batch_dim=batch_dim, max_batch=max_batch, max_delay_ms=max_delay_ms)
                if ep.name in self.endpoints:
                    ep.close()
                    raise ConfigError(f"{path} and {self.endpoints[ep.name].path} are both named {ep.name!r}; "
                                      "serve one artifact per model name.")
                self.endpoints[ep.name] = ep
            try:
                self._http = _HTTPServer((host, port), _Handler)
            except OSError as e:
                raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port "
                                  "(0 picks a free one).") from None
        except BaseException:
            for ep in self.endpoints.values():
                ep.close()
            raise
        self._http.endpoints = self.endpoints
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._http.serve_forever(poll_interval=0.2)

    def start(self) -> "Server":
        """Serve on a background thread (tests, notebooks); ``close`` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="tripy_build-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening, then stop the batchers (a request still queued gets an error)."""
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._http.server_close()
        for ep in self.endpoints.values():
            ep.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tripy-build serve", description="Serve built artifacts over HTTP (KServe v2 protocol), with "
        "dynamic batching along a rows-padded dim.")
    parser.add_argument("artifacts", nargs="+", help="artifact directories (artifacts/MODEL/KEY)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--batch-dim", default="auto", help="dim to gather requests along: a rows-padded dim's "
                        "name, 'auto' (the one such dim in every input and output) or 'none'")
    parser.add_argument("--max-batch", type=int, default=None, help="most rows in one call (default: the dim's max)")
    parser.add_argument("--max-delay-ms", type=float, default=0.0,
                        help="longest a request waits for others to join its batch (default 0: a batch is what "
                        "queued while the last call ran)")
    args = parser.parse_args(argv)
    try:
        server = Server(args.artifacts, args.host, args.port, args.batch_dim, args.max_batch, args.max_delay_ms)
    except TripyBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for ep in server.endpoints.values():
        print(f"{ep.name} ({ep.path}): POST {server.url}/v2/models/{ep.name}/infer; {ep.batching}", flush=True)
    print(f"serving on {server.url} (Ctrl-C stops)", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server._http.shutdown, daemon=True).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.close()
        print("\ninterrupted: stopped serving.", file=sys.stderr, flush=True)
        return 130
    server.close()
    print("stopped serving.", flush=True)
    return 0
