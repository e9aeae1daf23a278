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

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

from ..errors import CallError, ConfigError, TripyBuildError
from .endpoint import Endpoint

MAX_BODY_BYTES = 1 << 30  # a request larger than this is refused (413) before it is read


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

    def do_GET(self) -> None:
        parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
        if parts in (["v2", "health", "live"], ["v2", "health", "ready"]):
            return self._send(200, {"live" if parts[2] == "live" else "ready": True})
        if parts == ["v2"]:
            from ..version import __version__

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

    def do_POST(self) -> None:
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


