"""``tripy-build serve``: built artifacts over HTTP, with dynamic batching.

The protocol is KServe's v2 inference protocol (the Open Inference Protocol, also Triton's HTTP API),
so existing clients work unchanged: ``GET /v2/health/ready``, ``GET /v2/models/NAME`` (inputs,
outputs, datatypes; ``-1`` for a dynamic axis), ``POST /v2/models/NAME/infer`` and
``GET /v2/models/NAME/stats``, plus ``GET /metrics`` for Prometheus. Tensors travel as JSON lists or,
with the binary tensor data extension (``Inference-Header-Content-Length``), as raw bytes after the JSON
header, which costs no parsing.

The HTTP layer is uvicorn with httptools on one asyncio loop (``protocol.py``: the connection and its
limits; ``app.py``: routes and bodies), so an idle or slow connection costs a socket, not a thread.
Every artifact is loaded with the jax-free runtime; its profiles warm up in the background once the port is
open, ``/v2/health/ready`` answering 400 until they have (with ``wait_ready`` the ports open only once they
have). Each request is checked on its own against the declared ranges before it joins a batch
(``batching.py``), whose thread runs the model while the loop goes on serving.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import uvicorn

from ..errors import ConfigError
from .access import Access
from .app import App
from .endpoint import Endpoint
from .limits import Limits
from .metrics import Metrics
from .protocol import LimitedProtocol


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose signals (in the main thread) stop it gracefully and are then remembered,
    not raised again: ``tripy-build serve`` exits 0 after SIGTERM's drain, 130 after Ctrl-C."""

    serving: threading.Event  # set once the port is open

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.serving.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Server:
    """Artifacts served over HTTP (KServe v2), each with its own batcher.

    Args:
        paths: artifact directories; each is served under its model's name.
        host: the address to listen on (``0.0.0.0`` for every interface).
        port: the port; 0 picks a free one (see ``url``).
        batch_dim: the dim requests are gathered along (``"auto"``: the one rows-padded dim every input and
            output has; ``"none"``: no batching).
        max_batch: most rows in one call (default: the largest precompiled size of the dim).
        max_delay_ms: longest a request waits for others to join its batch.
        limits: bytes, connections and timeouts a client may use (``Limits``); a ``max_connections`` of None (the
            default) is set by the file limit, which is raised to its hard limit, and the memory (``Limits.resolved``).
        allowed_hosts: the ``Host`` names answered (``["*"]``: any); default: loopback names when ``host`` is
            loopback, else any.
        allowed_origins: web page origins whose requests are answered (default none: a request carrying an
            ``Origin`` is refused).
        token_file: a file holding a bearer token that every request but the health probes must carry (over
            gRPC too).
        grpc_port: also serve KServe v2 over gRPC on this port (0 picks a free one; see ``grpc``), with the
            same batchers; None: HTTP only. Needs the ``grpc`` extra.
        wait_ready: open the ports (HTTP's, gRPC's) only once every model's profiles are warmed: a client that
            polls the port never sees the server not ready. The HTTP port is bound at once (a port in use is
            refused here) but not listened on, so a connection is refused until then; the gRPC server is made
            then (its port checked free here). ``serving`` is set once the ports answer.
        expose_entries: a ``task=generate`` artifact is served by ``/generate`` and ``/generate_stream``; with this
            its first entry (``prefill``: cache and positions among its inputs) is also on ``/infer`` (and gRPC's
            ModelInfer) and described in its metadata, for debugging. Without it, those answer 404
            (``UNIMPLEMENTED``) naming ``/generate``.
        loader: what runs each artifact (``endpoint.loader_for``): ``"runtime"`` (no jax; a GPU's through jax's CUDA
            plugin, not yet run on a card), ``"jax"`` (``tb.load``), or ``"auto"`` (default: jax for a CUDA program
            on a GPU host).

    Example::

        from tripy_build.serve.http import Server
        with Server(["artifacts/geglu/2bb85d9bc22e7905"], port=0).start() as s:
            print(s.url)  # POST {url}/v2/models/geglu/infer
    """

    def __init__(self, paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8000,
                 batch_dim: str = "auto", max_batch: int | None = None, max_delay_ms: float = 0.0,
                 limits: Limits | None = None, allowed_hosts: Sequence[str] | None = None,
                 allowed_origins: Sequence[str] = (), token_file: str | Path | None = None,
                 grpc_port: int | None = None, wait_ready: bool = False, expose_entries: bool = False,
                 loader: str = "auto"):
        if not paths:
            raise ConfigError("serve: give at least one artifact directory (e.g. artifacts/geglu/<key>).")
        self.limits = limits or Limits()
        access = Access.for_server(host, allowed_hosts, allowed_origins, token_file)
        self.endpoints: dict[str, Endpoint] = {}
        self.grpc: Any = None  # the GrpcServer beside HTTP, if grpc_port is given (with wait_ready: once ready)
        self._grpc_later: Any = None  # with wait_ready: how to make it
        self._wait_ready = wait_ready
        self._stop_waiting = threading.Event()
        self._stopped_by: str | None = None  # the signal that stopped the wait for readiness
        self.serving = threading.Event()  # set once the ports answer
        try:
            for path in paths:
                ep = Endpoint.load(path, loader, batch_dim=batch_dim, max_batch=max_batch, max_delay_ms=max_delay_ms,
                                   expose_entries=expose_entries)
                if ep.name in self.endpoints:
                    ep.close()
                    raise ConfigError(f"{path} and {self.endpoints[ep.name].path} are both named {ep.name!r}; "
                                      "serve one artifact per model name.")
                self.endpoints[ep.name] = ep
            self.metrics = Metrics(self.endpoints)
            if grpc_port is not None:
                from .grpc import GrpcServer, check_free

                make = functools.partial(GrpcServer, self.endpoints, host, grpc_port,
                                         max_message_bytes=self.limits.max_body_bytes, token_file=token_file,
                                         metrics=self.metrics)
                if wait_ready:
                    check_free(host, grpc_port)
                    self._grpc_later = make
                else:
                    self.grpc = make()
            self.limits = self.limits.resolved()  # once the artifacts' files are open: they count against the limit
            self._socket = _bind(host, port, listen=not wait_ready)
            self._address = self._socket.getsockname()
        except BaseException:
            self._close_endpoints()
            raise
        app = App(self.endpoints, self.limits, access, self.metrics)
        logging.getLogger("uvicorn.error").setLevel(logging.ERROR)  # a line per refused client would flood the log
        protocol = LimitedProtocol.for_limits(self.limits, self.metrics.response, self.metrics.closed_idle)
        config = uvicorn.Config(app, http=protocol, ws="none",
                                lifespan="off", log_config=None, access_log=False, server_header=False,
                                timeout_keep_alive=int(max(1, round(self.limits.idle_timeout))),
                                timeout_graceful_shutdown=int(max(1, round(self.limits.drain_timeout))))
        self._uvicorn = _Uvicorn(config)
        self._uvicorn.serving = self.serving
        self.metrics.connections = lambda: len(self._uvicorn.server_state.connections) - len(protocol.making_room)
        self.metrics.max_connections = self.limits.max_connections
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> str | None:
        """Serve until SIGTERM or SIGINT (in the main thread) or ``close``; then stop accepting, let the requests
        in flight finish (at most ``limits.drain_timeout``) and stop the batchers. The name of the signal that
        stopped it, if one did. With ``wait_ready`` the ports open once every model is warmed (a signal or
        ``close`` meanwhile stops it without opening them)."""
        try:
            if self._wait_ready:
                if not self._until_ready():
                    self._socket.close()
                    return self._stopped_by
                self._open()
            if self.grpc is not None:
                self.grpc.start()
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._close_endpoints()
        captured = self._uvicorn._captured_signals
        return signal.Signals(captured[0]).name if captured else None

    def _open(self) -> None:
        """With ``wait_ready``, once ready: make the gRPC server and listen on the HTTP port, here rather than in
        uvicorn so that a port another process took meanwhile is refused in one line (``ConfigError``)."""
        try:
            if self._grpc_later is not None:
                self.grpc, self._grpc_later = self._grpc_later(), None
            try:
                self._socket.listen(2048)
            except OSError as e:
                host, port = self._address[:2]
                raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port (0 picks a "
                                  "free one).") from None
        except BaseException:
            self._socket.close()
            raise

    def _until_ready(self) -> bool:
        """Wait until every model is warmed (True), or until SIGTERM or SIGINT (in the main thread) or ``close``
        (False)."""
        def stop(signum: int, frame: Any) -> None:
            self._stopped_by = signal.Signals(signum).name
            self._stop_waiting.set()

        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            for ep in self.endpoints.values():
                while not ep.ready(0.1):
                    if self._stop_waiting.is_set():
                        return False
            return not self._stop_waiting.is_set()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def start(self) -> "Server":
        """Serve on a background thread (tests, notebooks), returning once the port answers (with ``wait_ready``,
        once every model is warmed); ``close`` stops it."""
        self._thread = thread = threading.Thread(target=self.serve_forever, name="tripy_build-http", daemon=True)
        thread.start()
        while not self.serving.wait(0.01) and thread.is_alive():
            pass
        if not self.serving.is_set():
            raise ConfigError(f"the server on {self.url} did not start; its log says why.")
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every model's background warm-up is done (what ``/v2/health/ready`` reports); False if
        ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(ep.ready(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for ep in self.endpoints.values())

    def close(self) -> None:
        """Stop accepting, let the requests in flight finish, then stop the batchers."""
        self._stop_waiting.set()
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout=self.limits.drain_timeout + 10)
            self._thread = None
        else:
            self._socket.close()
            self._close_endpoints()

    def _close_endpoints(self) -> None:
        """gRPC's calls in flight finish first (within the drain timeout), then every batcher stops."""
        if self.grpc is not None:
            self.grpc.stop(self.limits.drain_timeout)
        for ep in self.endpoints.values():
            ep.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _bind(host: str, port: int, listen: bool) -> socket.socket:
    """The HTTP server's socket, bound (and listened on where ``listen``; else uvicorn listens when it starts)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if hasattr(socket, "SO_REUSEADDR") and sys.platform != "win32":  # as socket.create_server does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port "
                          "(0 picks a free one).") from None
    return sock
