"""``tripy-build serve PATH... [--host] [--port] [--grpc-port] [--batch-dim] [--max-batch] [--max-delay-ms]
[--wait-ready] [--expose-entries] [limits] [access]``.

The port opens at once and the models' profiles warm up in the background: ``/v2/health/ready`` answers 400
until they have, and a line ``ready: ...`` is printed then. With ``--wait-ready`` the ports open only once every
model is warmed: ``serving on URL`` and ``ready: ...`` are printed together, and the port's first answer is ready.
SIGTERM drains (stop accepting, finish the requests in flight, at most ``--drain-timeout``) and exits 0,
Ctrl-C exits 130 the same way (both also while ``--wait-ready`` waits); a bad path or option exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Sequence

from ..errors import TripyBuildError
from ..serve.endpoint import LOADER_NAMES, LOADERS
from ..serve.limits import Limits


def _size(text: str) -> int:
    """``256M``, ``1G``, ``65536``: a byte count."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1:].upper() in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 65536, 64K, 16M, 1G)") from None


# ``Limits``' fields as options: --max-body-bytes and so on, each with its default.
LIMIT_HELP = {
    "max_body_bytes": "largest request with binary tensor data",
    "max_json_bytes": "largest all-JSON request; JSON costs ~5x its size once parsed",
    "max_buffered_bytes": "request bodies held at once over all connections",
    "max_header_bytes": "request line and headers",
    "max_connections": "open connections; past it a new one takes the place of the one idle the longest (closed), "
                       "and gets 503 only where none is idle",
    "read_timeout": "seconds for a request to arrive, head and body",
    "idle_timeout": "seconds a connection may wait with no request",
    "drain_timeout": "seconds a stopping server waits for requests in flight",
}


def _count(text: str) -> int | None:
    """``--max-connections``: a count, or ``auto`` (None: set by the file limit and the memory)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of connections (e.g. 10000, or auto)") from None


def _auto_connections() -> str:
    """The connection bound a server started now would set itself (``Limits.resolved``), for ``--help``."""
    try:
        return str(Limits().resolved().max_connections)
    except TripyBuildError:
        return "none: the file limit leaves no room"


def _shown(n: int) -> str:
    """65536 -> ``64K``, 16777216 -> ``16M``: a byte count as ``_size`` reads it."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def main(argv: Sequence[str] | None = None) -> int:
    defaults = Limits()
    parser = argparse.ArgumentParser(
        prog="tripy-build serve", description="Serve built artifacts over HTTP (KServe v2 protocol), with "
        "dynamic batching along a rows-padded dim.")
    parser.add_argument("artifacts", nargs="+", help="artifact directories (artifacts/MODEL/KEY)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--grpc-port", type=int, default=None, help="also serve KServe v2 over gRPC on this port "
                        "(0 picks a free one; needs pip install 'tripy_build[grpc]')")
    parser.add_argument("--batch-dim", default="auto", help="dim to gather requests along: a rows-padded dim's "
                        "name, 'auto' (the one such dim in every input and output) or 'none'")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="most rows in one call (default: the largest precompiled size of the dim)")
    parser.add_argument("--max-delay-ms", type=float, default=0.0,
                        help="longest a request waits for others to join its batch (default 0: a batch is what "
                        "queued while the last call ran)")
    parser.add_argument("--wait-ready", action="store_true",
                        help="open the ports only once every model's profiles are warmed, then print 'serving on URL' "
                        "and 'ready: ...': a script that polls the port (or waits for that line) never sees the server "
                        "not ready. Without it the port opens at once and the profiles warm up in the background, "
                        "GET /v2/health/ready answering 400 until they have (its 'ready: ...' line comes then)")
    parser.add_argument("--expose-entries", action="store_true",
                        help="an artifact built with task=generate is served by POST /v2/models/NAME/generate and "
                        "generate_stream; with this its first entry (prefill: the cache and positions among its inputs) "
                        "is also served on /infer (and gRPC's ModelInfer) and described in the model's metadata, for "
                        "debugging. Without it those refuse, naming /generate")
    parser.add_argument("--loader", default="auto", choices=LOADERS,
                        help="what runs each artifact: 'runtime' (tripy_build.runtime: no jax, the fastest start, CPU "
                        "executables only), 'jax' (tripy_build.load: every platform jax drives, an NVIDIA GPU included) "
                        "or 'auto' (default: jax for an artifact with a CUDA program on a host with a GPU, or without a "
                        "CPU program; else runtime)")
    limits = parser.add_argument_group("limits")
    for field, what in LIMIT_HELP.items():
        default, size = getattr(defaults, field), field.endswith("_bytes")
        if field == "max_connections":
            auto = _auto_connections()
            limits.add_argument("--max-connections", type=_count, default=None, help=f"{what} (default {auto} here: "
                                "as many as the file limit (RLIMIT_NOFILE, raised to its hard limit) and the memory "
                                "allow; 'auto' says so too)")
            continue
        limits.add_argument("--" + field.replace("_", "-"), type=_size if size else type(default), default=default,
                            help=f"{what} (default {_shown(default) if size else f'{default:g}'})")
    access = parser.add_argument_group("access")
    access.add_argument("--token-file", default=None,
                        help="file holding a bearer token every request but /v2/health/* must carry")
    access.add_argument("--allowed-hosts", default=None, help="comma-separated Host names answered, '*' for any "
                        "(default: localhost, 127.0.0.1 and ::1 on a loopback address, any otherwise)")
    access.add_argument("--allowed-origins", default="", help="comma-separated web origins (https://app.example) "
                        "whose requests are answered (default none: a browser's cross-origin request is refused)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        from ..serve.http import Server

        server = Server(args.artifacts, args.host, args.port, args.batch_dim, args.max_batch, args.max_delay_ms,
                        limits=Limits(**{f: getattr(args, f) for f in LIMIT_HELP}),
                        allowed_hosts=args.allowed_hosts.split(",") if args.allowed_hosts is not None else None,
                        allowed_origins=args.allowed_origins.split(","), token_file=args.token_file,
                        grpc_port=args.grpc_port, wait_ready=args.wait_ready, expose_entries=args.expose_entries,
                        loader=args.loader)
    except TripyBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for ep in server.endpoints.values():
        print(f"{ep.name} ({ep.path}, run by {LOADER_NAMES[ep.loader]}): {ep.routes(server.url)}", flush=True)

    def serving() -> None:
        if server.grpc is not None:
            print(f"gRPC (KServe v2, inference.GRPCInferenceService) on {server.grpc.address}", flush=True)
        if args.wait_ready:
            print(f"serving on {server.url} (Ctrl-C stops; SIGTERM drains); every model is ready", flush=True)
        else:
            print(f"serving on {server.url} (Ctrl-C stops; SIGTERM drains); the profiles warm up in the background, "
                  f"GET /v2/health/ready answers 200 once they have", flush=True)

    def announce() -> None:
        if args.wait_ready:
            server.serving.wait()
            serving()
        if server.wait_ready():
            print(f"ready: every model's profiles warmed, {time.monotonic() - started:.1f} s after starting", flush=True)

    if args.wait_ready:
        print("warming every model's profiles up; the ports open once they are (--wait-ready)", flush=True)
    else:
        serving()
    threading.Thread(target=announce, name="tripy_build-ready", daemon=True).start()
    try:
        stopped_by = server.serve_forever()
    except TripyBuildError as e:  # with --wait-ready, the ports are taken once the models are warmed
        print(f"error: {e}", file=sys.stderr)
        return 2
    if stopped_by == "SIGINT":
        print("\ninterrupted: stopped serving.", file=sys.stderr, flush=True)
        return 130
    print("stopped serving.", flush=True)
    return 0
