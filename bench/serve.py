"""Serving: ``tripy-build serve`` with dynamic batching, next to the same server one call per request,
and to ``jax.jit`` and eager JAX behind the same HTTP front end.

Every contender is a server process speaking KServe v2 (binary tensors) on loopback; a client process
runs N threads, each sending one-row requests back to back for ``--seconds`` (closed loop, keep-alive
connections). Reported per model and client count: requests per second, median and p99 latency, and
throughput as a ratio to ``jax.jit``.

- ``batched``    ``tripy-build serve ART``: requests gathered along ``batch`` with no wait (a batch is
                 what queued while the last call ran);
- ``batched-2ms`` ``--max-delay-ms 2``: a request also waits up to 2 ms for others to join it;
- ``unbatched``  ``tripy-build serve ART --batch-dim none`` (one call per request, one at a time);
- ``jax.jit``    the model's ``apply`` under ``jax.jit``, called in the handler thread per request
                 (what a hand-written server does; no shape checks, compiled per new shape);
- ``eager``      the same without ``jax.jit``.

Every contender's answer to one fixed request is checked against ``jax.jit``'s (max abs diff <= 1e-4 x
max |ref|). Server and client share this machine's cores, as they would share a host's.

    .venv/bin/python bench/serve.py                                # geglu and mlp, 1/8/32 clients
    .venv/bin/python bench/serve.py --models mlp --clients 16 --seconds 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import numpy as np

MODELS = {"geglu": ("GEGLU", {"dim_in": 512, "dim_out": 2048}),
          "mlp": ("MLP", {"dim_in": 512, "hidden": 2048, "dim_out": 512, "layers": 3})}
CONTENDERS = ("batched", "batched-2ms", "unbatched", "jax.jit", "eager")
WIDTH = 512
BATCH = (1, 8, 64)


def zoo_model(name: str):
    import tripy_build.models as zoo

    cls, kwargs = MODELS[name]
    return getattr(zoo, cls)(**kwargs)


def build(name: str, out: Path) -> None:
    """The artifact, and the same weights as an .npz for the jax servers."""
    import jax

    import tripy_build as tb

    model = zoo_model(name)
    params = model.init(jax.random.PRNGKey(0))

    def apply(params, x):
        return model.apply(params, x)
    apply.__name__ = name  # the served model's name
    exe = tb.compile(apply, args=[params, tb.InputInfo([tb.NamedDimension("batch", *BATCH), WIDTH], "float32")],
                     padding=model.padding)
    exe.save(out / name)
    leaves = jax.tree_util.tree_leaves(params)
    np.savez(out / f"{name}.npz", *[np.asarray(x) for x in leaves])


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


def jax_server(kind: str, name: str, out: Path) -> None:
    """``jax.jit`` or eager ``apply`` behind tripy_build's HTTP front end (``server._HTTPServer``)."""
    import jax

    import tripy_build as tb
    from tripy_build.serve import http as server

    model = zoo_model(name)
    template = model.init(jax.random.PRNGKey(0))
    with np.load(out / f"{name}.npz") as data:
        params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template),
                                              [data[f"arr_{i}"] for i in range(len(data.files))])
    params = jax.device_put(params)  # once, as a hand-written server would
    apply = jax.jit(model.apply) if kind == "jax.jit" else model.apply
    info = tb.InputInfo([tb.NamedDimension("batch", *BATCH), WIDTH], "float32")
    served = SimpleNamespace(__name__=name, flat_args=[("x", info)], output_infos=[info], dims=[],
                             call_flat=None, check_flat=lambda *leaves: None)  # no checks, as by hand
    ep = server.Endpoint(served, kind, batch_dim="none")
    ep.batcher.close()
    ep.batcher = _Direct(lambda x: apply(params, x))
    http = server._HTTPServer(("127.0.0.1", 0), server._Handler)
    http.endpoints = {name: ep}
    print(f"serving on http://127.0.0.1:{http.server_address[1]}", flush=True)
    http.serve_forever()


def body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    blob = x.tobytes()
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def answer(conn: http.client.HTTPConnection, path: str, payload: bytes, headers: dict[str, str]) -> np.ndarray:
    conn.request("POST", path, payload, headers)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {data[:300]!r}")
    split = int(r.headers["Inference-Header-Content-Length"])
    out = json.loads(data[:split])["outputs"][0]
    return np.frombuffer(data[split:], np.float32).reshape(out["shape"])


def client(url: str, name: str, clients: int, seconds: float) -> dict:
    """``clients`` threads sending one-row requests back to back; requests/s and latencies."""
    host, port = url.removeprefix("http://").split(":")
    path = f"/v2/models/{name}/infer"
    payloads = [body(np.random.default_rng(i).standard_normal((1, WIDTH), dtype=np.float32)) for i in range(64)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    deadline, errors = [0.0], []

    def run(i: int) -> None:
        try:
            conn = http.client.HTTPConnection(host, int(port))
            answer(conn, path, *payloads[i % 64])  # connect outside the timed window
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i} could not start: {e!r}")
            start.abort()
            return
        try:
            start.wait()
            k = i
            while time.perf_counter() < deadline[0]:
                t0 = time.perf_counter()
                answer(conn, path, *payloads[k % 64])
                latencies[i].append(time.perf_counter() - t0)
                k += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e!r}")
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    deadline[0] = time.perf_counter() + seconds
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} of {clients} clients failed; first: {errors[0]}")
    lat = np.concatenate([np.asarray(x) for x in latencies]) * 1e3
    return {"rps": len(lat) / wall, "p50_ms": float(np.median(lat)), "p99_ms": float(np.percentile(lat, 99))}


def reference_answer(url: str, name: str) -> list:
    host, port = url.removeprefix("http://").split(":")
    x = np.random.default_rng(99).standard_normal((3, WIDTH), dtype=np.float32)
    return answer(http.client.HTTPConnection(host, int(port)), f"/v2/models/{name}/infer", *body(x)).tolist()


def start_server(kind: str, name: str, out: Path) -> tuple[subprocess.Popen, str]:
    if kind in ("batched", "batched-2ms", "unbatched"):
        argv = [sys.executable, "-m", "tripy_build", "serve", str(out / name), "--port", "0"]
        argv += {"unbatched": ["--batch-dim", "none"], "batched-2ms": ["--max-delay-ms", "2"]}.get(kind, [])
    else:
        argv = [sys.executable, __file__, "--child-server", kind, name, str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("serving on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split()[2]
    raise RuntimeError(f"{kind} server for {name} did not start: exit {proc.wait()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="geglu,mlp")
    parser.add_argument("--clients", default="1,8,32", help="concurrent client threads, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed window per measurement")
    parser.add_argument("--child-server", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_server:
        jax_server(args.child_server[0], args.child_server[1], Path(args.child_server[2]))
        return
    counts = [int(c) for c in args.clients.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for name in args.models.split(","):
            build(name, out)
            ref = None
            for kind in ("jax.jit", *[c for c in CONTENDERS if c != "jax.jit"]):
                proc, url = start_server(kind, name, out)
                try:
                    got = np.asarray(reference_answer(url, name))
                    ref = got if ref is None else ref
                    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
                    assert err <= 1e-4, f"{kind} {name}: relative error {err:.2e} against jax.jit"
                    for n in counts:
                        client(url, name, n, min(1.0, args.seconds))  # warm: every batch size the load makes
                        r = client(url, name, n, args.seconds)
                        rows.append({"model": name, "server": kind, "clients": n, **r})
                        print(f"{name:6} {kind:10} {n:3} clients  {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.2f} ms"
                              f"  p99 {r['p99_ms']:7.2f} ms", flush=True)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    print("\nthroughput against jax.jit behind the same HTTP front end (higher is better):")
    print(f"{'model':6} {'clients':>7}  " + "  ".join(f"{c:>10}" for c in CONTENDERS))
    for name in args.models.split(","):
        for n in counts:
            by = {r["server"]: r for r in rows if r["model"] == name and r["clients"] == n}
            base = by["jax.jit"]["rps"]
            print(f"{name:6} {n:7}  " + "  ".join(f"{by[c]['rps'] / base:9.2f}x" for c in CONTENDERS))


if __name__ == "__main__":
    main()
