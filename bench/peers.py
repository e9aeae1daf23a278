"""Peers: tripy_build next to jax.jit, ONNX Runtime (jax2onnx), IREE and torch AOTInductor.

The same three zoo models with identical weights (``model.init(PRNGKey(0))``, written once to an
.npz that every peer's build reads):

- ``geglu``        ``GEGLU(512, 2048)``, x[batch, 512], batch 1..64;
- ``mlp``          ``MLP(dim_in=512, hidden=2048, dim_out=512, layers=3)``, x[batch, 512], batch 1..64;
- ``transformer``  ``TransformerBlock(256, 4, 1024)`` (unmasked), x[batch, seq, 256], batch 1..64, seq 1..256.

Shapes: small = batch 1 (transformer 1 x 16), large = batch 64 (transformer 8 x 256), new = batch 37
(transformer 3 x 37). The cold start's first result is at the small shape, which is tripy_build's
``opt`` (so its precompiled executable serves it).

Peers (each a class below with ``build`` / ``imports`` / ``load``; a missing one is skipped):

- ``tripy_build``  ``tb.compile(model.apply, args=[params, tb.InputInfo(...)], padding=model.padding)``
  (with ``DimSize`` lengths for masked dims, as the build command does), ``exe.save``, ``tb.load``.
- ``tripy_build.runtime``  the same artifact loaded by ``tripy_build.runtime.load``: no ``import jax``.
- ``jax.jit``      from source: import the model, ``np.load`` the weights, ``jax.jit`` (its cold start
                   traces and compiles). No build; its "artifact" is the weights' .npz.
- ``onnxruntime``  ``jax2onnx.to_onnx`` with symbolic dims, run by an ``InferenceSession`` (CPU provider).
- ``iree``         ``jax.export`` -> ``exported.mlir_module()`` -> ``iree-compile`` (llvm-cpu, ``IREE_FLAGS``),
                   run by the ``local-sync`` driver. Dynamic dims where IREE accepts them, else one static
                   module per shape used, marked "(static)".
- ``torch-aoti``   the same math as an ``nn.Module`` (Linear weights [out, in], exact erf GELU),
                   ``torch.export`` with dynamic ``Dim``s, ``aoti_compile_and_package`` (fresh TorchInductor
                   cache per model), loaded with ``aoti_load_package`` (which imports ``torch._inductor``
                   and probes the CPU's vector ISA with compiled test programs in subprocesses).

All in fresh processes with one intra-op thread each (``THREAD_ENV``, ORT ``intra_op_num_threads=1``,
``torch.set_num_threads(1)``, IREE's ``local-sync``), pinned to one CPU before any import (``--no-pin``);
or, with ``--threads default``, every peer with its own default threads on every core, unpinned (what a
user gets without tuning; batch 1 is where thread pools cost most). tripy_build's modules are compiled
to ``.pyc`` first, as ``pip install`` does (an editable install compiles them on each import otherwise).

- build s     a child per (model, peer): weights in memory -> artifact on disk (imports not counted);
- size MB     every file of the artifact;
- cold ms     the parent's wall time from spawn to the child's line saying the first result (small
              shape) is a host array; the child also reports its split from CLOCK_MONOTONIC stamps;
- new 1st ms  the same child's next call, at the new shape, unused before in that process (jax.jit
              compiles here; tripy_build runs a bucket the background warm-up may not have reached);
- small/large then, once tripy_build's background warm-up is done (``wait_warmed``: timing beside it
              inflated the transformer's large shape from 26 to 43 ms), the child warms both shapes up
              and times single calls for ``--steady`` s per shape (median per child, then the median
              over rounds); last, a second call at the new shape for reference.

Contenders run interleaved, the order rotating each round, after an untimed warm-up round; medians
over rounds, each also as a ratio to tripy_build's. Every peer's outputs at all three shapes are
checked against ``jax.jit(model.apply)`` (max abs diff <= 1e-4 x max |ref|).

    .venv/bin/pip install -e '.[peers]'
    .venv/bin/python bench/peers.py                      # 5 rounds, about 10 minutes on 2 cores
    .venv/bin/python bench/peers.py --quick --models geglu,mlp --json /tmp/peers.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
MODELS = {
    "geglu": {"cls": "GEGLU", "kwargs": {"dim_in": 512, "dim_out": 2048},
              "dims": [("batch", 1, 64), 512], "small": [1, 512], "large": [64, 512], "new": [37, 512]},
    "mlp": {"cls": "MLP", "kwargs": {"dim_in": 512, "hidden": 2048, "dim_out": 512, "layers": 3},
            "dims": [("batch", 1, 64), 512], "small": [1, 512], "large": [64, 512], "new": [37, 512]},
    "transformer": {"cls": "TransformerBlock", "kwargs": {"d_model": 256, "heads": 4, "d_ff": 1024},
                    "dims": [("batch", 1, 64), ("seq", 1, 256), 256],
                    "small": [1, 16, 256], "large": [8, 256, 256], "new": [3, 37, 256]},
}
SHAPES = ("small", "large", "new")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
IREE_FLAGS = ["--iree-llvmcpu-target-cpu=host", "--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"]
RTOL = 1e-4


def one_thread() -> bool:
    """Whether this child runs with one intra-op thread (``--threads 1``, the default) or the peers' own."""
    return os.environ.get("PEERS_THREADS", "1") == "1"


def clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# --- shared helpers (children) -------------------------------------------------------------------
def zoo_model(name: str):
    import tripy_build.models as zoo
    return getattr(zoo, MODELS[name]["cls"])(**MODELS[name]["kwargs"])


def inputs(name: str) -> dict:
    import numpy as np
    return {s: np.random.default_rng(i).standard_normal(MODELS[name][s], dtype=np.float32)
            for i, s in enumerate(SHAPES)}


def flatten(tree, prefix="") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}{key}/").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in flatten(sub, f"{prefix}[{i}]/").items()}
    return {prefix[:-1]: tree}


def load_params(npz: str | Path) -> dict:
    """The nested dict/list param tree from an .npz written by ``flatten`` (list items as ``[i]``)."""
    import numpy as np
    tree: dict = {}
    with np.load(npz) as data:
        for key in data.files:
            node, parts = tree, key.split("/")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = data[key]

    def lists(node):
        if not isinstance(node, dict):
            return node
        node = {k: lists(v) for k, v in node.items()}
        if node and all(k.startswith("[") for k in node):
            return [node[f"[{i}]"] for i in range(len(node))]
        return node
    return lists(tree)


def art_dir(key: str) -> str:
    return "art-" + key.replace(".", "-")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# --- the peers: build(model name, params, artifact dir) -> meta; imports(); load(name, dir, meta) --
class TripyBuild:
    key, label, modules = "tripy_build", "tripy_build", ("tripy_build",)

    def build(self, name, params, art):
        """As ``python -m tripy_build`` builds a zoo model: its padding declaration, DimSize lengths, pow2 buckets."""
        import tripy_build as tb
        spec, model = MODELS[name], zoo_model(name)
        shape = [d if isinstance(d, int) else tb.NamedDimension(d[0], d[1], opt, d[2])
                 for d, opt in zip(spec["dims"], spec["small"])]
        masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}
        exe = tb.compile(model.apply, args=[params, tb.InputInfo(shape, "float32")],
                         kwargs={"lengths": masks} if masks else None, padding=model.padding)
        t = clock()
        exe.save(art / "artifact")
        return {"save_s": clock() - t, "profiles": len(exe.profiles)}

    def imports(self):
        import tripy_build  # noqa: F401

    def load(self, name, art, meta):
        import numpy as np
        import tripy_build as tb
        self.loaded = tb.load(art / "artifact")
        return lambda x: np.asarray(self.loaded(x))

    def settle(self):
        """Wait for the background warm-up of every profile, so that steady latency is not timed beside it
        (the transformer block's 63 profiles: large shape 43 -> 26 ms)."""
        self.loaded.wait_warmed()


class TripyRuntime(TripyBuild):
    """The same artifact, loaded by ``tripy_build.runtime`` (jaxlib's PJRT client, never ``import jax``)."""

    key, label, modules = "tripy_build.runtime", "tripy_build.runtime (no jax)", ("tripy_build",)

    def imports(self):
        from tripy_build import runtime  # noqa: F401

    def load(self, name, art, meta):
        from tripy_build import runtime
        self.loaded = runtime.load(art / "artifact")
        return self.loaded


class JaxJit:
    key, label, modules = "jax.jit", "jax.jit (from source)", ("jax",)

    def build(self, name, params, art):
        import shutil
        shutil.copy(art.parent / "params.npz", art / "params.npz")
        return {"no_build": True}

    def imports(self):
        import jax  # noqa: F401
        import tripy_build.models  # noqa: F401  (the model's source; no tripy_build internals)

    def load(self, name, art, meta):
        from functools import partial
        import jax
        import numpy as np
        fn = jax.jit(partial(zoo_model(name).apply, load_params(art / "params.npz")))
        return lambda x: np.asarray(fn(x))


class OnnxRuntime:
    key, label, modules = "onnxruntime", "onnxruntime (jax2onnx)", ("jax2onnx", "onnxruntime")

    def build(self, name, params, art):
        from functools import partial
        import jax2onnx
        dims = [d if isinstance(d, int) else d[0] for d in MODELS[name]["dims"]]
        jax2onnx.to_onnx(partial(zoo_model(name).apply, params), [tuple(dims)], model_name=name,
                         return_mode="file", output_path=str(art / "model.onnx"))
        return {}

    def imports(self):
        import onnxruntime  # noqa: F401

    def load(self, name, art, meta):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        if one_thread():
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(art / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {inp: x})[0]


class Iree:
    key, label, modules = "iree", "iree llvm-cpu", ("iree.compiler", "iree.runtime")

    def _compile(self, name, params, shape):
        from functools import partial
        import jax
        import numpy as np
        from iree import compiler
        if any(isinstance(d, str) for d in shape):
            lo_hi = {d[0]: d for d in MODELS[name]["dims"] if not isinstance(d, int)}
            used = [d for d in shape if isinstance(d, str)]
            shape = jax.export.symbolic_shape(", ".join(map(str, shape)), constraints=[
                c for d in used for c in (f"{d} >= {lo_hi[d][1]}", f"{d} <= {lo_hi[d][2]}")])
        exported = jax.export.export(jax.jit(partial(zoo_model(name).apply, params)), platforms=["cpu"])(
            jax.ShapeDtypeStruct(tuple(shape), np.float32))
        return compiler.compile_str(exported.mlir_module(), target_backends=["llvm-cpu"],
                                    input_type="stablehlo", extra_args=IREE_FLAGS)

    def build(self, name, params, art):
        dyn = [d if isinstance(d, int) else d[0] for d in MODELS[name]["dims"]]
        t = clock()
        try:
            (art / "dynamic.vmfb").write_bytes(self._compile(name, params, dyn))
            return {"files": {"*": "dynamic.vmfb"}}
        except Exception as e:  # noqa: BLE001 - iree.compiler.CompilerToolError: dynamic shapes it cannot lower
            errors = [ln.strip() for ln in str(e).splitlines() if "error:" in ln] or [str(e).splitlines()[0]]
            reason = errors[0].split("error:", 1)[-1].split(": %")[0].strip()[:200]
        rejected_s, files = clock() - t, {}
        for s in ("small", "large"):
            shape = MODELS[name][s]
            files[json.dumps(shape)] = f"static_{'x'.join(map(str, shape))}.vmfb"
            (art / files[json.dumps(shape)]).write_bytes(self._compile(name, params, shape))
        return {"files": files, "static": True, "dynamic_rejected": reason, "excluded_s": rejected_s}

    def imports(self):
        import iree.runtime  # noqa: F401

    def load(self, name, art, meta):
        import numpy as np
        import iree.runtime as rt
        config = rt.Config("local-sync")
        fns = {}
        for shape, file in meta["files"].items():
            ctx = rt.SystemContext(config=config)
            module = rt.VmModule.mmap(config.vm_instance, str(art / file))
            ctx.add_vm_module(module)
            fns[shape] = ctx.modules[module.name]["main"]
        if "*" in fns:
            return lambda x: np.asarray(fns["*"](x))
        return lambda x: np.asarray(fns[json.dumps(list(x.shape))](x))


class TorchAoti:
    key, label, modules = "torch-aoti", "torch AOTInductor", ("torch",)

    def build(self, name, params, art):
        import torch
        from torch.export import Dim
        module = torch_module(name, params)
        dims = MODELS[name]["dims"]
        example = torch.zeros([d if isinstance(d, int) else 2 for d in dims])  # 2: export specializes 0/1
        dynamic = {i: Dim(d[0], min=d[1], max=d[2]) for i, d in enumerate(dims) if not isinstance(d, int)}
        with torch.no_grad():
            ep = torch.export.export(module, (example,), dynamic_shapes={"x": dynamic})
            torch._inductor.aoti_compile_and_package(ep, package_path=str(art / "model.pt2"))
        return {}

    def imports(self):
        import torch
        import torch._inductor
        if one_thread():
            torch.set_num_threads(1)

    def load(self, name, art, meta):
        import torch
        runner = torch._inductor.aoti_load_package(str(art / "model.pt2"))
        return lambda x: runner(torch.from_numpy(x)).numpy()


def torch_module(name: str, params: dict):
    """The zoo model's math in torch, with the zoo's weights (Linear weights are [out, in] in both)."""
    import math
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own convention
    from torch import nn

    def filled(module, weight, bias):
        module.weight.data.copy_(torch.from_numpy(weight))
        module.bias.data.copy_(torch.from_numpy(bias))
        return module

    def linear(p):
        return filled(nn.Linear(p["weight"].shape[1], p["weight"].shape[0]), p["weight"], p["bias"])

    def layer_norm(p):
        return filled(nn.LayerNorm(p["scale"].shape[0], eps=1e-5), p["scale"], p["bias"])

    class GEGLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = linear(params["proj"])

        def forward(self, x):
            y, gate = self.proj(x).chunk(2, dim=-1)
            return y * F.gelu(gate)  # exact (erf)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(linear(p) for p in params["layers"])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x) if i == len(self.layers) - 1 else torch.relu(layer(x))
            return x

    class Block(nn.Module):
        def __init__(self, heads):
            super().__init__()
            self.heads, a, f = heads, params["attn"], params["ffn"]
            self.ln1, self.ln2 = layer_norm(params["ln1"]), layer_norm(params["ln2"])
            self.q, self.k, self.v, self.out = (linear(a[n]) for n in ("q", "k", "v", "out"))
            self.up, self.down = linear(f["up"]), linear(f["down"])

        def forward(self, x):
            b, s, d = x.shape
            dh = d // self.heads
            y = self.ln1(x)
            q, k, v = (m(y).view(b, s, self.heads, dh).transpose(1, 2) for m in (self.q, self.k, self.v))
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
            h = x + self.out((probs @ v).transpose(1, 2).reshape(b, s, d))
            return h + self.down(F.gelu(self.up(self.ln2(h))))

    make = {"geglu": GEGLU, "mlp": MLP, "transformer": lambda: Block(MODELS[name]["kwargs"]["heads"])}
    return make[name]().eval()


PEERS = [TripyBuild(), TripyRuntime(), JaxJit(), OnnxRuntime(), Iree(), TorchAoti()]
BY_KEY = {p.key: p for p in PEERS}


# --- the children: python -c CHILD '<json>' -------------------------------------------------------
CHILD = ("import time; t0 = time.clock_gettime(time.CLOCK_MONOTONIC); import json, os, sys; "
         "cfg = json.loads(sys.argv[1]); cfg['pin'] is None or os.sched_setaffinity(0, {cfg['pin']}); "
         "sys.path.insert(0, cfg['bench']); import peers; peers.child(cfg, t0)")


def child(cfg: dict, t0: float) -> None:
    {"setup": child_setup, "build": child_build, "run": child_run}[cfg["mode"]](cfg, t0)


def child_setup(cfg, t0):
    """Weights (written once for every peer) and jax.jit reference outputs at every shape."""
    import jax
    import numpy as np
    name, work = cfg["model"], Path(cfg["work"])
    model = zoo_model(name)
    params = jax.device_get(jax.jit(model.init)(jax.random.PRNGKey(0)))
    np.savez(work / "params.npz", **{k: np.asarray(v) for k, v in flatten(params).items()})
    for s, x in inputs(name).items():
        np.save(work / f"ref_{s}.npy", np.asarray(jax.jit(model.apply)(params, x)))
    print(json.dumps({}))


def child_build(cfg, t0):
    peer, name, art = BY_KEY[cfg["peer"]], cfg["model"], Path(cfg["art"])
    params = load_params(art.parent / "params.npz")
    t = clock()
    meta = peer.build(name, params, art) or {}
    meta["build_s"] = clock() - t - meta.get("excluded_s", 0.0)
    (art / "meta.json").write_text(json.dumps(meta))
    print(json.dumps(meta))


def child_run(cfg, t0):
    """Cold start at the small shape, the new shape's first call, then steady latency at small and large."""
    import numpy as np
    peer, name, art = BY_KEY[cfg["peer"]], cfg["model"], Path(cfg["art"])
    meta = json.loads((art / "meta.json").read_text())
    xs = inputs(name)
    stamps = {"start": t0}
    peer.imports()
    stamps["imported"] = clock()
    fn = peer.load(name, art, meta)
    stamps["loaded"] = clock()
    outs = {"small": fn(xs["small"])}
    stamps["result"] = clock()
    print("first result", flush=True)

    new = None
    if not meta.get("static"):  # right after load, as a server's second request would
        t = clock()
        outs["new"] = fn(xs["new"])
        new = {"first": clock() - t}
    stamps["settling"] = clock()
    getattr(peer, "settle", lambda: None)()
    stamps["settled"] = clock()
    steady = {}
    for s in ("small", "large"):
        for _ in range(3):
            outs[s] = fn(xs[s])
    for s in ("small", "large"):
        times, end = [], clock() + cfg["steady_s"]
        while len(times) < 5 or (clock() < end and len(times) < 5000):
            t = clock()
            fn(xs[s])
            times.append(clock() - t)
        steady[s] = float(np.median(times))
    if new is not None:
        t = clock()
        fn(xs["new"])
        new["second"] = clock() - t
    if cfg["save"]:
        for s, y in outs.items():
            np.save(Path(cfg["save"]) / f"{s}.npy", np.asarray(y))
    print(json.dumps({"stamps": stamps, "steady": steady, "new": new}), flush=True)


# --- the parent ----------------------------------------------------------------------------------
def parse_args(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, no warm-up, short loops")
    p.add_argument("--rounds", type=int, help="timed interleaved rounds (default 5, quick 2)")
    p.add_argument("--steady", type=float, help="seconds of timed calls per shape per run (default 0.5)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--peers", default=",".join(BY_KEY), help=f"comma-separated, from {', '.join(BY_KEY)}")
    p.add_argument("--no-pin", action="store_true", help="do not pin the children to one CPU")
    p.add_argument("--threads", choices=["1", "default"], default="1",
                   help="1: one intra-op thread per peer, pinned (default); default: each peer's own threads, unpinned")
    p.add_argument("--workdir", help="build here (kept) instead of a temporary directory")
    p.add_argument("--json", help="also write every measurement to this file")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.steady = args.steady or (0.1 if args.quick else 0.5)
    args.pin = None if args.no_pin or args.threads == "default" else sorted(os.sched_getaffinity(0))[-1]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for what, chosen, known in (("model", args.models, MODELS), ("peer", args.peers, BY_KEY)):
        bad = [c for c in chosen if c not in known]
        if bad:
            p.error(f"unknown {what}(s) {', '.join(bad)}; choose from {', '.join(known)}")
    if "tripy_build" not in args.peers:
        p.error("the peer tripy_build is the reference of every ratio; keep it in --peers")
    return args


def environment(args) -> dict:
    import importlib.metadata as md
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    env = {"python": platform.python_version(), "machine": f"{platform.machine()}, {cpu}, "
           f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} allowed)"}
    for dist in ("tripy_build", "jax", "jaxlib", "numpy", "jax2onnx", "onnx", "onnxruntime",
                 "iree-base-compiler", "iree-base-runtime", "torch"):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = "not installed"
    env["threads"] = (f"1 intra-op thread everywhere: {' '.join(f'{k}={v}' for k, v in THREAD_ENV.items())}; "
                      "ORT intra/inter_op_num_threads=1; torch.set_num_threads(1); IREE local-sync"
                      if args.threads == "1" else "each peer's default threads (IREE local-sync)")
    env["pinning"] = f"children pinned to CPU {args.pin}" if args.pin is not None else "children not pinned"
    return env


def child_env(work: Path, threads: str = "1") -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "TORCHINDUCTOR"))}
    env.pop("PYTHONPATH", None)
    if threads == "1":
        env.update(THREAD_ENV)
    else:
        for k in THREAD_ENV:
            env.pop(k, None)
    env.update(PEERS_THREADS=threads, XDG_CACHE_HOME=str(work / "xdg"), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-run"))
    return env


def spawn(cfg: dict, env: dict, log: Path):
    """Run a child: (seconds from spawn to its 'first result' line or None, its last JSON line with the
    spawn's CLOCK_MONOTONIC stamp added, seconds from spawn to exit)."""
    import subprocess
    argv = [sys.executable, "-c", CHILD, json.dumps(cfg)]
    with open(log, "w") as err:
        t0 = clock()
        proc = subprocess.Popen(argv, env=env, cwd=cfg["work"], stdout=subprocess.PIPE, stderr=err, text=True)
        first, last = None, None
        for line in proc.stdout:
            if line.startswith("first result") and first is None:
                first = clock() - t0
            elif line.strip():
                last = line
        rc = proc.wait()
    if rc != 0 or last is None:
        tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
        raise RuntimeError(f"exit {rc}: {tail[0][:300]}")
    return first, dict(json.loads(last), spawn=t0), clock() - t0


def median(xs):
    import statistics
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def build_all(args, peers, root: Path, env: dict, base: dict, failed: list) -> dict:
    """Weights and references per model, then one build child per (model, peer): {model: {peer: entry}}."""
    import shutil
    results = {}
    for m in args.models:
        work, results[m] = root / m, {}
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        spawn(dict(base, mode="setup", model=m, work=str(work)), env, work / "setup.log")
        for peer in peers:
            art = work / art_dir(peer.key)
            art.mkdir()
            cfg = dict(base, mode="build", model=m, peer=peer.key, work=str(work), art=str(art))
            try:  # a fresh TorchInductor cache per model: the build compiles from scratch
                _, meta, wall = spawn(cfg, dict(env, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-build")),
                                      work / f"{peer.key}.build.log")
            except RuntimeError as e:
                print(f"  {m}: {peer.key} build failed ({e}); skipped")
                failed.append(f"{m}/{peer.key} build")
                continue
            meta.update(size=dir_size(art) - (art / "meta.json").stat().st_size, build_wall_s=wall)
            results[m][peer.key] = {"meta": meta, "runs": []}
            note = f"; dynamic shapes rejected ({meta['dynamic_rejected']}): static" if meta.get("static") else ""
            print(f"  {m}: built {peer.key} in {meta['build_s']:.1f} s ({wall:.1f} s process), "
                  f"{meta['size'] / 1e6:.1f} MB{note}", flush=True)
    return results


def run_rounds(args, results: dict, root: Path, env: dict, base: dict, failed: list) -> None:
    """Every (model, peer) once per round in a fresh child, the order rotating; outputs checked once."""
    import numpy as np
    jobs = [(m, k) for m in results for k in results[m]]
    first_round = 0 if args.quick else -1  # round -1: untimed warm-up (page cache, __pycache__, ISA probes)
    for r in range(first_round, args.rounds):
        k = r % len(jobs) if jobs else 0
        for m, key in jobs[k:] + jobs[:k]:
            if key not in results[m]:
                continue
            work, save = root / m, None
            if r == first_round:
                save = work / f"{key}.out"
                save.mkdir(exist_ok=True)
            cfg = dict(base, mode="run", model=m, peer=key, work=str(work), art=str(work / art_dir(key)),
                       steady_s=args.steady, save=str(save) if save else None)
            try:
                first, res, wall = spawn(cfg, env, work / f"{key}.run.log")
            except RuntimeError as e:
                print(f"  {m}: {key} failed to run ({e}); dropped")
                failed.append(f"{m}/{key} run")
                del results[m][key]
                continue
            if r >= 0:
                results[m][key]["runs"].append(dict(res, cold=first, exit=wall))
            if save:
                results[m][key]["max_abs_diff"], results[m][key]["ok"] = compare(work, save, np)
        print(f"  {'warm-up round' if r < 0 else f'round {r + 1}/{args.rounds}'} done", flush=True)


def main(argv=None) -> int:
    import importlib.util
    import tempfile
    args = parse_args(argv)
    env_info = environment(args)
    for k, v in env_info.items():
        print(f"{k + ':':<20} {v}")
    print(f"{'rounds:':<20} {args.rounds}{'' if args.quick else ' (+1 untimed warm-up)'}, "
          f"{args.steady} s of timed calls per shape per run", flush=True)

    def available(peer) -> bool:
        try:
            return all(importlib.util.find_spec(m) is not None for m in peer.modules)
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            return False
    peers = [BY_KEY[k] for k in args.peers if available(BY_KEY[k])]
    for key in args.peers:
        if BY_KEY[key] not in peers:
            print(f"skipped {key}: {', '.join(BY_KEY[key].modules)} not importable (pip install -e '.[peers]')")

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="tripy_build-peers-")
    root = Path(args.workdir or tmp.name).resolve()
    import compileall
    import tripy_build
    compileall.compile_dir(Path(tripy_build.__file__).parent, quiet=1)
    env, base, failed = child_env(root, args.threads), {"bench": str(BENCH), "pin": args.pin}, []
    try:
        results = build_all(args, peers, root, env, base, failed)
        run_rounds(args, results, root, env, base, failed)
    finally:
        if tmp is not None:
            tmp.cleanup()

    summary = summarize(results)
    report(args.models, summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env_info, "args": vars(args), "models": MODELS,
                                               "results": results, "summary": summary}, indent=1, default=str))
    for m, k in [(model, k) for model in summary for k, s in summary[model].items() if not s["ok"]]:
        failed.append(f"{m}/{k} output differs from jax.jit(model.apply) by more than {RTOL} x max |ref|")
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


def compare(work: Path, save: Path, np) -> tuple[float, bool]:
    diff, ok = 0.0, True
    for out in sorted(save.glob("*.npy")):
        ref, y = np.load(work / f"ref_{out.name}"), np.load(out)
        d = float(np.max(np.abs(y.astype(np.float64) - ref))) if y.shape == ref.shape else float("inf")
        diff = max(diff, d)
        ok = ok and d <= RTOL * max(1.0, float(np.max(np.abs(ref))))
    return diff, ok


def summarize(results: dict) -> dict:
    out = {}
    for m, peers in results.items():
        out[m] = {}
        for key, r in peers.items():
            runs, meta = r["runs"], r["meta"]
            st = [dict(x["stamps"], spawn=x["spawn"], exit=x["spawn"] + x["exit"]) for x in runs]
            steps = ("spawn", "start", "imported", "loaded", "result")
            out[m][key] = {
                "label": BY_KEY[key].label + (" (static)" if meta.get("static") else ""),
                "static": bool(meta.get("static")),
                "build": None if meta.get("no_build") else meta["build_s"], "size": meta["size"],
                "cold": median([x["cold"] for x in runs]),
                "small": median([x["steady"]["small"] for x in runs]),
                "large": median([x["steady"]["large"] for x in runs]),
                "new": median([x["new"]["first"] for x in runs if x["new"]]),
                "new 2nd": median([x["new"]["second"] for x in runs if x["new"]]),
                "split": {k: median([s[b] - s[a] for s in st]) for k, a, b in zip(
                    ("startup", "import", "load", "first call"), steps, steps[1:])},
                "to exit": median([x["exit"] for x in runs]), "save_s": meta.get("save_s"),
                "warm-up": median([s["settled"] - s["settling"] for s in st]) if all("settled" in s for s in st) else None,
                "max_abs_diff": r.get("max_abs_diff"), "ok": r.get("ok", False), "rounds": len(runs),
            }
    return out


def num(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def report(models: list[str], summary: dict) -> None:
    cols = [("build s", "build", 1), ("size MB", "size", 1e-6), ("cold ms", "cold", 1e3),
            ("small ms", "small", 1e3), ("large ms", "large", 1e3), ("new 1st ms", "new", 1e3)]
    print()
    print("Medians over rounds; (x) = ratio to tripy_build's. cold: spawn -> first result (small shape).")
    print("small/large: steady per-call latency; new 1st: first call at a shape new to the process.")
    print("Shapes: " + "; ".join(f"{m} small {MODELS[m]['small']}, large {MODELS[m]['large']}, "
                                 f"new {MODELS[m]['new']}" for m in models))
    header = f"{'model':<12}{'peer':<30}" + "".join(f"{c:>17}" for c, _, _ in cols) + f"{'max|diff|':>11}"
    print(header)
    print("-" * len(header))
    for m in models:
        rows = summary.get(m, {})
        ref = rows.get("tripy_build", {})
        for r in rows.values():
            cells = []
            for _, k, scale in cols:
                v = r[k]
                if v is None:
                    cells.append("n/a (static)" if k == "new" and r["static"] else "-")
                    continue
                ratio = f" ({v / ref[k]:.2f})" if ref.get(k) else ""
                cells.append(num(v * scale) + ratio)
            diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}" + ("" if r["ok"] else " !")
            print(f"{m:<12}{r['label']:<30}" + "".join(f"{c:>17}" for c in cells) + f"{diff:>11}")
    print()
    print("Cold start split (medians, ms): spawn -> child's first line, imports, load, first call; spawn -> exit;")
    print("how long the child then waited for tripy_build's background warm-up (steady latency is timed after it:")
    print("wait_warmed); and the new shape's second call (steady at that shape):")
    for m in models:
        for r in summary.get(m, {}).values():
            sp = dict(r["split"], **{"to exit": r["to exit"], "warm-up wait": r.get("warm-up")})
            parts = ", ".join(f"{k} {num(v * 1e3)}" for k, v in sp.items() if v is not None)
            second = f", new 2nd {num(r['new 2nd'] * 1e3)}" if r["new 2nd"] is not None else ""
            print(f"  {m:<12}{r['label']:<30}{parts}{second}")
    for m in models:
        r = summary.get(m, {}).get("tripy_build")
        if r and r.get("save_s") is not None:
            print(f"  {m}: tripy_build's build = tb.compile {r['build'] - r['save_s']:.2f} s + exe.save "
                  f"{r['save_s']:.2f} s (save runs the eager self-test at min/opt/max)")


if __name__ == "__main__":
    sys.exit(main())
