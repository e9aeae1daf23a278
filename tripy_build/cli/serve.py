"""``tripy-build serve PATH... [--host] [--port] [--batch-dim] [--max-batch] [--max-delay-ms]``.

SIGTERM stops the server with exit 0, Ctrl-C with 130; a bad path or option exits 2 with one line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Sequence

from ..errors import TripyBuildError
from ..serve.http import Server


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
