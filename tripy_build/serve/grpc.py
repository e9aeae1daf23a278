"""Built artifacts over gRPC: KServe's v2 inference protocol (``inference.GRPCInferenceService``), as Triton's
gRPC API is, so ``tritonclient.grpc`` and other v2 clients work unchanged.

RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata (``-1`` for a dynamic axis, as the
HTTP metadata gives it), ModelInfer, and Triton's ModelStatistics. ModelInfer takes each input as typed
``contents`` (``fp32_contents``, ``int_contents``, ...) or all of them as ``raw_input_contents`` (what Triton's
clients send), and answers with ``raw_output_contents`` (what they read), the requested outputs only if the
request names some. Every request is checked on its own against the declared ranges before it joins a batch
(the endpoint's batcher, shared with the HTTP server), so a bad one gets ``INVALID_ARGUMENT`` naming the input,
the dim and the range, and never fails another; an unknown model or version is ``NOT_FOUND``; a ``task=generate``
artifact, which generates over HTTP only (``/generate``), is ``UNIMPLEMENTED`` unless the server exposes its
entries; anything else that goes wrong is ``INTERNAL``, and the server goes on.

The messages and the servicer stubs are the protocol's generated code as NVIDIA's ``tritonclient`` ships it
(the ``grpc`` extra: ``pip install 'tripy_build[grpc]'``, which brings grpcio and protobuf), imported only when a
``GrpcServer`` is made: the HTTP server never imports them.
"""

from __future__ import annotations

import functools
import hmac
import threading
import time
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import CallError, ConfigError, TripyBuildError
from .access import read_token
from .codec import datatype, length_prefixed, metadata_shape, quote as _quote
from .endpoint import TEXT, TEXT_PAIR, Texts
from .outputs import Wanted, answer, prefixed, wanted
from .request import InputTensor, check

if TYPE_CHECKING:
    from .endpoint import Endpoint

# Most bytes a request or a response may have: the HTTP server's default max_body_bytes (grpc's own default
# is 4 MiB, too little for a batch of images; protobuf's limit is 2 GiB).
MAX_MESSAGE_BYTES = 256 << 20

# The v2 datatype -> the InferTensorContents field that carries its values; FP16, BF16 (and the types v2 has no
# name for) have none: they travel in raw_input_contents only.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


# Open without a token, as the HTTP server's /v2/health/live and /ready are: probes carry none.
OPEN_RPCS = frozenset({"ServerLive", "ServerReady"})


class _Status(Exception):
    """An RPC's answer that is not OK: a ``grpc.StatusCode``'s name and the message the client reads."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _protocol() -> Any:
    """grpc and the generated protocol modules, imported on first use; a ``ConfigError`` saying how to install
    them where they are missing or too old."""
    try:
        import grpc

        from tritonclient.grpc import service_pb2, service_pb2_grpc
    except ImportError as e:
        raise ConfigError(f"serving over gRPC needs grpcio, protobuf and tritonclient's protocol stubs, which are not "
                          f"installed ({e}); "
                          "pip install 'tripy_build[grpc]'.") from None
    except Exception as e:  # noqa: BLE001 - protobuf's VersionError or grpc's RuntimeError: a version too old
        raise ConfigError(f"serving over gRPC: the installed grpcio or protobuf cannot run the protocol's generated "
                          f"code ({e}); pip install 'tripy_build[grpc]' installs versions that can.") from None

    return SimpleNamespace(grpc=grpc, pb=service_pb2, pb_grpc=service_pb2_grpc, st=service_pb2)


def _rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """An RPC handler that checks the caller's token (but for the health probes) and whose errors become a
    status: ``_Status`` as it says, a tripy_build error (a request the model cannot take) ``INVALID_ARGUMENT``,
    anything else ``INTERNAL``; the server goes on. A ModelInfer that ends so before its batcher took it counts
    in the metrics as refused (failure where ``INTERNAL``); once taken, the batcher counts it."""
    @functools.wraps(method)
    def handler(self: "_Servicer", request: Any, context: Any) -> Any:
        queued = self.queued
        queued.flag = False
        try:
            if method.__name__ not in OPEN_RPCS:
                self.authorize(context)
            return method(self, request, context)
        except _Status as e:
            code, message = e.code, e.message
        except TripyBuildError as e:
            code, message = "INVALID_ARGUMENT", str(e)
        except Exception as e:  # noqa: BLE001 - the client gets the reason; the server goes on
            code, message = "INTERNAL", f"{type(e).__name__}: {e}"
        if method.__name__ == "ModelInfer" and not queued.flag:
            self.server.metrics.outcome(request.model_name, "failure" if code == "INTERNAL" else "refused")
        context.abort(getattr(self.p.grpc.StatusCode, code), message)  # raises: the RPC ends with this status
    return handler


def _tensor(item: Any, raw: bytes | None) -> InputTensor:
    """One input of a ModelInferRequest as the typed request's: its values from typed contents or raw bytes."""
    name = item.name
    filled = [field.name for field, _ in item.contents.ListFields()] if item.HasField("contents") else []

    def values(dtype: np.dtype, count: int, want: str) -> np.ndarray:
        shape = list(item.shape)
        if raw is not None:
            if filled:
                raise CallError(f"input {name!r}: has both contents.{filled[0]} and raw_input_contents; give every "
                                "input's values one way, raw_input_contents or typed contents.")
            need = count * dtype.itemsize
            if len(raw) != need:
                raise CallError(f"input {name!r}: shape {shape} of {want} is {need} bytes, but its "
                                f"raw_input_contents has {len(raw)}.")
            return np.frombuffer(raw, dtype=dtype)
        field = _CONTENTS.get(want)
        if field is None:
            raise CallError(f"input {name!r}: {want} has no typed contents field in the protocol; send it in "
                            "raw_input_contents.")
        wrong = [f for f in filled if f != field]
        if wrong:
            raise CallError(f"input {name!r}: {want} values go in contents.{field}, but the request fills "
                            f"contents.{wrong[0]}.")
        given = getattr(item.contents, field)
        if len(given) != count:
            if not given:
                raise CallError(f"input {name!r}: has no values; give its {count} values in contents.{field} or in "
                                "raw_input_contents.")
            raise CallError(f"input {name!r}: shape {shape} holds {count} values, but contents.{field} has "
                            f"{len(given)}.")
        try:
            return np.array(given, dtype=dtype)
        except (OverflowError, ValueError) as e:
            raise CallError(f"input {name!r}: contents.{field} has a value that is no {want} ({e}).") from None
    def strings() -> list[Any]:
        return length_prefixed(raw, name) if raw is not None else list(item.contents.bytes_contents)
    shared = "shared_memory_region" in item.parameters
    return InputTensor(name, item.datatype, [int(n) for n in item.shape], values,
                       "shared memory (Triton's extension) is not served here; send the tensor in the request."
                       if shared else None, strings)


def _decode(ep: "Endpoint", request: Any) -> tuple[list[list[np.ndarray]], Texts | None]:
    """A ModelInferRequest's calls (one: its flat inputs, in the model's order, each checked against its declaration;
    its texts may need more: as windows, or with hypotheses), and its texts, where it sent them instead of token
    ids."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise CallError(f"the request has {len(raw)} raw_input_contents for its {len(request.inputs)} inputs; give one "
                        "per input, in the inputs' order (or every input's typed contents instead).")
    at = {item.name: k for k, item in reversed(list(enumerate(request.inputs)))}  # each name's first input
    if ep.takes_text and TEXT in at:
        text, pair = (_tensor(request.inputs[at[n]], raw[at[n]] if raw else None) if n in at else None
                      for n in (TEXT, TEXT_PAIR))
        asked = [(o.name, {k: _value(v) for k, v in o.parameters.items()}) for o in request.outputs]
        return ep.from_text(text, pair, len(request.inputs), asked)
    leaves = ep.in_order((item.name, functools.partial(check, _tensor(item, raw[k] if raw else None)))
                         for k, item in enumerate(request.inputs))
    ep.runtime.check_flat(*leaves)
    return [leaves], None


def _value(p: Any) -> Any:
    """An InferParameter's value, whichever kind it holds (None: none)."""
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _wanted(ep: "Endpoint", request: Any, texts: Texts | None) -> list[Wanted]:
    """The outputs to return: the requested ones (``outputs.wanted`` checks each, its parameters as Python values),
    else all of the model's."""
    if not request.outputs:
        return [Wanted(n) for n in ep.output_names]
    return [wanted(ep, o.name, {k: _value(v) for k, v in o.parameters.items()}, True, texts) for o in request.outputs]


class _Servicer:
    """The RPCs, over the endpoints a ``GrpcServer`` serves."""

    def __init__(self, server: "GrpcServer"):
        self.server, self.p = server, server._p
        self.queued = threading.local()  # .flag: whether this thread's ModelInfer reached its batcher

    def authorize(self, context: Any) -> None:
        """UNAUTHENTICATED unless the call carries ``authorization: Bearer <token>`` metadata, where the server has
        a token."""
        token = self.server._token
        if token is None:
            return
        given = [v for k, v in context.invocation_metadata() if k == "authorization"]
        value = given[0] if len(given) == 1 and isinstance(given[0], str) else ""
        scheme, _, presented = value.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token):
            raise _Status("UNAUTHENTICATED", "this server needs 'authorization: Bearer <token>' metadata "
                                             f"({'the token given is not it' if given else 'none was given'}).")

    def _endpoint(self, name: str, version: str) -> "Endpoint":
        """The model a request names, or NOT_FOUND (naming the one model asked for, not every model served)."""
        if not name:
            raise _Status("INVALID_ARGUMENT", "the request names no model; set its model name.")
        ep = self.server.endpoints.get(name)
        if ep is None:
            raise _Status("NOT_FOUND", f"model {_quote(name)} is not served here.")
        if version and version != ep.version:
            raise _Status("NOT_FOUND", f"model {name!r} has version {ep.version!r} only, not {_quote(version)}.")
        return ep

    @_rpc
    def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        return self.p.pb.ServerLiveResponse(live=True)

    @_rpc
    def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.p.pb.ServerReadyResponse(ready=not self.server._stopping
                                             and all(ep.ready() for ep in self.server.endpoints.values()))

    @_rpc
    def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        """False, as Triton answers, for a model or a version not served: the question has an answer."""
        ep = self.server.endpoints.get(request.name)
        ready = ep is not None and request.version in ("", ep.version) and not self.server._stopping and ep.ready()
        return self.p.pb.ModelReadyResponse(ready=ready)

    @_rpc
    def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        from ..version import __version__

        return self.p.pb.ServerMetadataResponse(name="tripy_build", version=__version__, extensions=["statistics"])

    @_rpc
    def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        ep = self._endpoint(request.name, request.version)
        tensor = self.p.pb.ModelMetadataResponse.TensorMetadata
        if not ep.infer_served:  # a generate artifact: what /generate takes and gives, not its entries' internals
            inputs, outputs = ep.generate_tensors()
            return self.p.pb.ModelMetadataResponse(name=ep.name, versions=[ep.version], platform="tripy_build",
                                                   inputs=[tensor(**t) for t in inputs],
                                                   outputs=[tensor(**t) for t in outputs])
        return self.p.pb.ModelMetadataResponse(
            name=ep.name, versions=[ep.version], platform="tripy_build",
            inputs=[tensor(name=p, datatype=datatype(info.dtype), shape=metadata_shape(info)) for p, info in ep.args],
            outputs=[tensor(name=n, datatype=datatype(info.dtype), shape=metadata_shape(info))
                     for n, info in zip(ep.output_names, ep.outputs)])

    @_rpc
    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        ep = self._endpoint(request.model_name, request.model_version)
        if not ep.infer_served:
            raise _Status("UNIMPLEMENTED", ep.not_served())
        calls, texts = _decode(ep, request)
        asked = _wanted(ep, request, texts)
        try:
            futures = ep.batcher.submit_all(calls)
        except CallError as e:  # the server is stopping: the batcher takes no more requests
            raise _Status("UNAVAILABLE", str(e)) from None
        self.queued.flag = True  # counted by the batcher from here on, success or failure
        try:
            outs = [f.result() for f in futures]
        except CallError as e:  # the server stopped before the request ran
            raise _Status("UNAVAILABLE", str(e)) from None
        ep.last_inference_ms = int(time.time() * 1000)
        response = self.p.pb.ModelInferResponse(model_name=ep.name, model_version=ep.version, id=request.id)
        for w in asked:
            out = answer(ep, w, outs, texts)
            strings = out.dtype == object  # BYTES: classes or entities as strings
            response.outputs.add(name=w.name, datatype="BYTES" if strings else datatype(out.dtype), shape=out.shape)
            response.raw_output_contents.append(prefixed(out) if strings else out.tobytes())
        return response

    @_rpc
    def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Triton's statistics extension: one model's, or every model's where the request names none."""
        st = self.p.st
        eps = ([self._endpoint(request.name, request.version)] if request.name else
               list(self.server.endpoints.values()))

        def duration(d: dict[str, int]) -> Any:
            return st.StatisticDuration(count=d.get("count", 0), ns=d.get("ns", 0))

        stats = []
        for ep in eps:
            s = ep.statistics()
            i = s["inference_stats"]
            stats.append(st.ModelStatistics(
                name=s["name"], version=s["version"], last_inference=s["last_inference"],
                inference_count=s["inference_count"], execution_count=s["execution_count"],
                inference_stats=st.InferStatistics(success=duration(i["success"]), fail=duration(i["fail"]),
                                                   queue=duration(i["queue"]), compute_infer=duration(i["compute_infer"])),
                batch_stats=[st.InferBatchStatistics(batch_size=b["batch_size"], compute_infer=duration(b["compute_infer"]))
                             for b in s["batch_stats"]]))
        return st.ModelStatisticsResponse(model_stats=stats)


def check_free(host: str, port: int) -> None:
    """Refuse (``ConfigError``) an address that cannot be listened on for gRPC, before the server is made (as grpc
    binds: with SO_REUSEADDR, so that a port whose last connections are in TIME_WAIT is free)."""
    if not port:
        return
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host.strip("[]"), port))
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port} for gRPC: {e.strerror or e}; choose another port (0 picks "
                          "a free one) or host.") from None


def _bind_error(host: str, port: int) -> str:
    """Why an address cannot be listened on, as the OS says it (grpc's own error says only that it failed)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host.strip("[]"), port))
    except OSError as e:
        return e.strerror or str(e)
    return "grpc could not bind it"


class GrpcServer:
    """Endpoints served over gRPC (KServe v2's ``inference.GRPCInferenceService``, Triton's gRPC API).

    Args:
        endpoints: model name -> ``Endpoint`` (an HTTP ``Server``'s ``endpoints``, to serve both protocols with
            one batcher per model). The server does not own them: ``stop`` leaves them open, for their owner
            to close after it.
        host: the address to listen on (``0.0.0.0`` for every interface).
        port: the port; 0 picks a free one (see ``port``).
        max_workers: RPCs handled at once (more wait for a thread); an inference holds its thread while it
            waits for its batch.
        max_message_bytes: the largest request (and response) accepted, in bytes.
        metrics: the ``Metrics`` that count the requests refused before their batcher (an HTTP ``Server``'s
            ``metrics``, so that ``/metrics`` counts both protocols); default: a registry of its own (``metrics``).
        token_file: a file holding a bearer token that every RPC but ServerLive and ServerReady must carry as
            ``authorization: Bearer <token>`` metadata (UNAUTHENTICATED otherwise); the HTTP server's
            ``--token-file`` is the same file. Without it, anyone who reaches the port may call.

    Raises:
        ConfigError: grpcio is not installed (``pip install 'tripy_build[grpc]'``), the address cannot be
            listened on, the token file cannot be read, or an argument is out of range.

    Example::

        from tripy_build.serve.http import Server
        from tripy_build.serve.grpc import GrpcServer
        with Server(["artifacts/geglu/2bb85d9bc22e7905"], port=0).start() as http:
            with GrpcServer(http.endpoints, port=0) as rpc:  # started; stopped (drained) when the block ends,
                print(rpc.address)  # tritonclient.grpc.InferenceServerClient(rpc.address)
                ...
        # then the HTTP server closes the endpoints both served
    """

    def __init__(self, endpoints: dict[str, "Endpoint"], host: str = "127.0.0.1", port: int = 8001,
                 max_workers: int = 8, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 token_file: str | Path | None = None, metrics: Any = None):
        if not endpoints:
            raise ConfigError("GrpcServer: give at least one endpoint to serve.")
        if not (isinstance(max_workers, int) and max_workers >= 1):
            raise ConfigError(f"max_workers: must be a positive integer, got {max_workers!r}.")
        if not (isinstance(max_message_bytes, int) and 1 <= max_message_bytes < 1 << 31):
            raise ConfigError(f"max_message_bytes: must be an integer in 1..{(1 << 31) - 1} (protobuf's limit is 2 GiB), "
                              f"got {max_message_bytes!r}.")
        self._token = read_token(token_file) if token_file is not None else None
        self._p = _protocol()
        grpc = self._p.grpc
        self.endpoints = endpoints
        if metrics is None:
            from .metrics import Metrics

            metrics = Metrics(endpoints)
        self.metrics = metrics
        self.host = host
        self._stopping = False
        self._started = False
        self._lock = threading.Lock()
        self._pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tripy_build-grpc")
        self._server = grpc.server(self._pool, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # grpc listens with SO_REUSEPORT by default: a second server on a port in use would share it silently
            ("grpc.so_reuseport", 0),
        ])
        # Triton's service has more RPCs than are served here (streaming, repository, shared memory...): its own
        # base class answers those UNIMPLEMENTED.
        servicer = type("Servicer", (_Servicer, self._p.pb_grpc.GRPCInferenceServiceServicer), {})(self)
        self._p.pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self._server)
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError:  # grpc raises where it cannot bind (older versions returned 0)
            bound = 0
        if not bound:
            self._server.stop(None)
            self._pool.shutdown(wait=False)
            raise ConfigError(f"cannot listen on {address} for gRPC: {_bind_error(host, port)}; choose another port "
                              "(0 picks a free one) or host.")
        self.port: int = bound

    @property
    def address(self) -> str:
        """``host:port``, what gRPC clients are given (``tritonclient.grpc.InferenceServerClient(address)``)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def start(self) -> "GrpcServer":
        """Start answering (on grpc's threads; this returns at once). Starting a started server does nothing."""
        with self._lock:
            if self._stopping:
                raise ConfigError("this GrpcServer was stopped; make a new one to serve again.")
            if not self._started:
                self._server.start()
                self._started = True
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Stop: refuse new RPCs at once, let those in flight finish for up to ``grace`` seconds (then cancel
        them), and return once the server is down. The endpoints stay open. Stopping twice does nothing."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._server.stop(grace).wait()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` seconds pass); whether it stopped."""
        return not self._server.wait_for_termination(timeout)

    def __enter__(self) -> "GrpcServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
