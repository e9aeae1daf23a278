"""Cold start: wall time from spawning a fresh Python process to the first result of a model.

For GEGLU, MLP and TransformerBlock at their default dims (``shapes=dynamic``: batch [1, 8, 64],
seq [1, 64, 256]), each contender runs in a fresh ``python`` process:

- ``a artifact opt``    ``tb.load(path)``, then one call at the opt shape, which runs the artifact's
                        precompiled executable (nothing is traced or compiled).
- ``b artifact other``  the same artifact called at another in-range shape (batch 36, seq 160): the
                        exported program is compiled on first use.
- ``c jit from source`` import the model class, ``np.load`` its params from an .npz written up front,
                        ``jax.jit(partial(model.apply, params))(x)`` at the opt shape (traced, lowered
                        and compiled in the call; the params are closed over as constants, as the
                        artifact folds them in with ``params.mode=constant``).
- ``d import tripy_build`` / ``d import jax``  bare ``python -c "import ..."`` for reference; their
                        'to result' is spawn to the import being done (a stamp printed right after it),
                        their 'to exit' spawn to the process's exit.

Setup, once per model and not timed: ``python -m tripy_build model=<m> shapes=dynamic
artifacts_dir=<tmp>`` builds the artifact; a helper process re-creates the build's params
(``model.init(PRNGKey(seed))``, checked against the manifest's params digest), writes them to the
.npz and computes reference outputs at both shapes, which every timed run's output is checked against.

Each child stamps CLOCK_MONOTONIC (shared by all processes) at its first line, after its imports,
after loading and when the first result is ready (``jax.block_until_ready``) and prints them as JSON;
the parent stamps the spawn and the exit. The split per run:

- ``startup``     spawn to the child's first line (interpreter start, ``site``);
- ``import``      ``import tripy_build`` (a, b) or ``import jax`` + the model's module (c), and making
                  the input array (well under a millisecond);
- ``load``        ``tb.load`` (a, b) or ``np.load`` of the params + building the param tree (c);
- ``first call``  the call through ``block_until_ready``; for b and c this includes tracing,
                  lowering and XLA compilation, shown separately from jax's own monitoring events;
- ``to result``   spawn to first result (= the sum of the above): **the cold-start time**;
- ``to exit``     spawn to the parent seeing the child exit (adds interpreter/XLA teardown).

Inside ``load`` the artifact children also time (by wrapping the functions, negligible overhead)
reading + digest-checking the files, deserializing the exported program, initialising the XLA CPU
backend and deserializing the precompiled executable.

Contenders run interleaved in rounds, the order rotating each round, so a shared machine's drift
hits them alike; one untimed warm-up round first fills the OS page cache and ``__pycache__``.
Children get a temporary ``XDG_CACHE_HOME`` and no jax persistent compilation cache. Medians are
reported, and the ratios c/a, b/a and a/(d import jax), as a ratio of medians and as the median of
per-round (paired) ratios.

    .venv/bin/python bench/cold_start.py            # 7 rounds (about 2 minutes on 2 cores)
    .venv/bin/python bench/cold_start.py --quick    # 3 rounds
    .venv/bin/python bench/cold_start.py --pin      # each child pinned to one CPU before importing jax
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# registry name -> (module, class); default dims are the dataclass defaults, which the Hydra configs
# repeat (the params digest check in the setup would catch a difference).
MODELS = {
    "geglu": ("tripy_build.models.geglu", "GEGLU"),
    "mlp": ("tripy_build.models.mlp", "MLP"),
    "transformer": ("tripy_build.models.transformer", "TransformerBlock"),
}
A, B, C = "a artifact opt", "b artifact other", "c jit from source"
D_TB, D_JAX = "d import tripy_build", "d import jax"
PER_MODEL = (A, B, C)
REFERENCE = (D_TB, D_JAX)


def clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# --- the children --------------------------------------------------------------------------------
# Run as ``python -c CHILD '<json>'``. Nothing before the first stamp but the interpreter's own start.
CHILD = r'''
import time
_clock = lambda: time.clock_gettime(time.CLOCK_MONOTONIC)
t_start = _clock()
import json, os, sys
cfg = json.loads(sys.argv[1])
if cfg["pin"] is not None:
    os.sched_setaffinity(0, {cfg["pin"]})   # before jax is imported: XLA sizes its thread pools at start

stamps, detail = {"start": t_start}, {}

import numpy as np
if cfg["mode"] == "artifact":
    import tripy_build as tb
    import jax
else:
    import importlib
    from functools import partial
    import jax
    model_cls = getattr(importlib.import_module(cfg["module"]), cfg["cls"])
x = np.random.default_rng(0).standard_normal(cfg["shape"], dtype=np.float32)
stamps["imported"] = _clock()

# --- instrumentation (after the import stamp; wrappers cost well under a microsecond per call)
def _timed(owner, attr, label):
    inner = getattr(owner, attr)
    def wrapper(*a, **k):
        t = _clock()
        try:
            return inner(*a, **k)
        finally:
            detail[label] = detail.get(label, 0.0) + _clock() - t
    setattr(owner, attr, wrapper)
from jax._src import xla_bridge
_timed(xla_bridge, "backends", "backend init")   # the first call creates the CPU client
def _on_event(event, secs, **kwargs):
    name = {"/jax/core/compile/jaxpr_trace_duration": "trace",
            "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
            "/jax/core/compile/backend_compile_duration": "xla compile"}.get(event)
    if name:
        detail[name] = detail.get(name, 0.0) + secs
jax.monitoring.register_event_duration_secs_listener(_on_event)

if cfg["mode"] == "artifact":
    from tripy_build import artifact, xla_executable
    _timed(artifact, "read_manifest", "read+verify files")
    _timed(artifact, "read", "read+verify files")
    _timed(jax.export, "deserialize", "deserialize program")
    _timed(xla_executable, "load", "deserialize executable")
    exe = tb.load(cfg["artifact"])
    stamps["loaded"] = _clock()
    detail_load = dict(detail)
    precompiled = [list(map(list, s)) for s in exe.precompiled_shapes]
    y = exe(x)
    jax.block_until_ready(y)
else:
    model = model_cls()
    with np.load(cfg["npz"]) as z:
        flat = {k: z[k] for k in z.files}
    params = {}
    for key, value in flat.items():   # "layers/[0]/weight" -> params["layers"][0]["weight"]
        node, parts = params, key.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    def _lists(node):
        if not isinstance(node, dict):
            return node
        node = {k: _lists(v) for k, v in node.items()}
        if node and all(k.startswith("[") for k in node):
            return [node[f"[{i}]"] for i in range(len(node))]
        return node
    params = _lists(params)
    stamps["loaded"] = _clock()
    detail_load = dict(detail)
    precompiled = None
    y = jax.jit(partial(model.apply, params))(x)
    jax.block_until_ready(y)
stamps["result"] = _clock()
out = np.asarray(y).astype(np.float64)
print(json.dumps({"stamps": stamps, "load_detail": detail_load,
                  "call_detail": {k: v - detail_load.get(k, 0.0) for k, v in detail.items()
                                  if v - detail_load.get(k, 0.0) > 0},
                  "precompiled": precompiled, "out_shape": list(out.shape),
                  "abs_sum": float(np.abs(out).sum()), "head": out.ravel()[:4].tolist()}))
'''

# Run once per model as ``python -c SETUP '<json>'``: params as the build made them, an .npz of them
# and reference outputs at both shapes.
SETUP = r'''
import importlib, json, sys
import numpy as np
import jax
from tripy_build import params as params_io
cfg = json.loads(sys.argv[1])
manifest = json.load(open(cfg["manifest"]))
model = getattr(importlib.import_module(cfg["module"]), cfg["cls"])()
meta = manifest["metadata"]["params"]
params = jax.device_get(jax.jit(model.init)(jax.random.PRNGKey(int(meta.get("seed", 0)))))
if params_io.digest(params) != meta["sha256"]:
    sys.exit(f"params of {cfg['cls']}() at seed {meta.get('seed')} differ from the artifact's (digest mismatch)")
flat = {}
for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    parts = [str(p.key) if hasattr(p, "key") else f"[{p.idx}]" for p in path]
    flat["/".join(parts)] = np.asarray(leaf)
np.savez(cfg["npz"], **flat)
refs = {}
for name, shape in cfg["shapes"].items():
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    out = np.asarray(jax.jit(model.apply)(params, x)).astype(np.float64)
    refs[name] = {"out_shape": list(out.shape), "abs_sum": float(np.abs(out).sum()), "head": out.ravel()[:4].tolist()}
print(json.dumps(refs))
'''


# --- the parent ----------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds (3)")
    p.add_argument("--rounds", type=int, help="timed interleaved rounds (default 7, quick 3)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--pin", nargs="?", type=int, const=-1, default=None, metavar="CPU",
                   help="pin each child to one CPU (default: the last allowed one) before it imports jax")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up round")
    p.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    p.add_argument("--json", help="also write every run's measurements to this file")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 7)
    if args.pin == -1:
        args.pin = sorted(os.sched_getaffinity(0))[-1]
    return args


def child_env(xdg: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")) and k != "TRIPY_BUILD_NO_MEMO"}
    env["XDG_CACHE_HOME"] = str(xdg)
    env.pop("PYTHONPATH", None)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path, what: str) -> tuple[float, float, str]:
    """(spawn time, exit time, stdout); exits with the child's output if it fails."""
    t0 = clock()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t1 = clock()
    if proc.returncode != 0:
        sys.exit(f"{what}: exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return t0, t1, proc.stdout


def other_shape(spec: dict) -> list[int]:
    """An in-range shape that differs from opt in every dynamic dim: halfway from opt to max."""
    return [o if lo == hi else ((o + hi) // 2 if (o + hi) // 2 != o else lo)
            for lo, o, hi in zip(spec["min"], spec["opt"], spec["max"])]


def setup_model(name: str, args, tmp: Path, env: dict[str, str]) -> dict:
    module, cls = MODELS[name]
    arts, work = tmp / "artifacts", tmp / "work"
    t0, t1, _ = run([args.python, "-m", "tripy_build", f"model={name}", "shapes=dynamic", f"artifacts_dir={arts}"],
                    env, work, f"build {name}")
    found = sorted((arts / name).glob("*/manifest.json"))
    if len(found) != 1:
        sys.exit(f"build {name}: expected one artifact under {arts / name}, found {len(found)}")
    manifest = json.loads(found[0].read_text())
    specs = manifest["input_specs"]
    if len(specs) != 1:
        sys.exit(f"{name}: this benchmark feeds one input, the artifact has {len(specs)}")
    opt, other = list(specs[0]["opt"]), other_shape(specs[0])
    pre = [[list(s) for s in e["input_shapes"]] for e in manifest["executables"]]
    if [opt] not in pre or [other] in pre:
        sys.exit(f"{name}: expected exactly the opt shape {opt} precompiled, the artifact has {pre}")
    npz = tmp / f"{name}_params.npz"
    cfg = {"manifest": str(found[0]), "module": module, "cls": cls, "npz": str(npz),
           "shapes": {"opt": opt, "other": other}}
    _, _, out = run([args.python, "-c", SETUP, json.dumps(cfg)], env, work, f"setup {name}")
    refs = json.loads(out.strip().splitlines()[-1])
    base = {"pin": args.pin, "module": module, "cls": cls}
    return {
        "build_s": t1 - t0, "artifact": str(found[0].parent), "opt": opt, "other": other,
        "children": {
            A: (dict(base, mode="artifact", artifact=str(found[0].parent), shape=opt), refs["opt"]),
            B: (dict(base, mode="artifact", artifact=str(found[0].parent), shape=other), refs["other"]),
            C: (dict(base, mode="jit", npz=str(npz), shape=opt), refs["opt"]),
        },
    }


def check_output(what: str, res: dict, ref: dict) -> None:
    ok = res["out_shape"] == ref["out_shape"] and abs(res["abs_sum"] - ref["abs_sum"]) <= 1e-3 * max(1.0, ref["abs_sum"])
    ok = ok and all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(res["head"], ref["head"]))
    if not ok:
        sys.exit(f"{what}: output differs from the reference: {res} vs {ref}")


def timed_child(what: str, cfg: dict, ref: dict | None, args, env, cwd: Path) -> dict:
    if cfg["mode"] == "bare":
        # `python -c "import X"`, then a stamp (``time`` is already loaded by then, so it costs nothing):
        # the interpreter's teardown after importing jax takes a few hundred ms, so 'to exit' alone
        # would flatter anything compared with it.
        pin = f"import os; os.sched_setaffinity(0, {{{cfg['pin']}}}); " if cfg["pin"] is not None else ""
        code = f"{pin}import {cfg['module']}; import time; print(time.clock_gettime(time.CLOCK_MONOTONIC))"
        argv = [args.python, "-c", code]
    else:
        argv = [args.python, "-c", CHILD, json.dumps(cfg)]
    t_spawn, t_exit, out = run(argv, env, cwd, what)
    if cfg["mode"] == "bare":
        return {"to result": float(out.split()[-1]) - t_spawn, "to exit": t_exit - t_spawn}
    res = json.loads(out.strip().splitlines()[-1])
    check_output(what, res, ref)
    if cfg["mode"] == "artifact":
        precompiled = [s[0] for s in res["precompiled"]]
        if (cfg["shape"] in precompiled) != what.endswith(A):
            sys.exit(f"{what}: shape {cfg['shape']} has a precompiled executable: {cfg['shape'] in precompiled}, "
                     "which this contender does not expect")
        if what.endswith(A) and any(k in res["call_detail"] for k in ("trace", "lower", "xla compile")):
            sys.exit(f"{what}: the precompiled shape traced or compiled on its first call: {res['call_detail']}")
    s = res["stamps"]
    if s["start"] < t_spawn:
        sys.exit(f"{what}: the child's clock is before the spawn; CLOCK_MONOTONIC is not shared here")
    row = {"startup": s["start"] - t_spawn, "import": s["imported"] - s["start"], "load": s["loaded"] - s["imported"],
           "first call": s["result"] - s["loaded"], "to result": s["result"] - t_spawn, "to exit": t_exit - t_spawn}
    row.update({f"load: {k}": v for k, v in res["load_detail"].items()})
    row.update({f"call: {k}": v for k, v in res["call_detail"].items()})
    return row


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    args = parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    print(f"python {args.python}; {args.rounds} rounds{'' if args.no_warmup else ' (+1 warm-up)'}; "
          f"{os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} allowed; "
          f"children {'pinned to CPU ' + str(args.pin) if args.pin is not None else 'not pinned'}", flush=True)

    with tempfile.TemporaryDirectory(prefix="tripy_build-cold-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "work").mkdir()
        env = child_env(tmp / "xdg")
        setups = {}
        for m in models:
            setups[m] = setup_model(m, args, tmp, env)
            st = setups[m]
            print(f"  built {m} in {st['build_s']:.1f} s: opt shape {st['opt']}, other shape {st['other']}", flush=True)

        jobs = [(m, c) for m in models for c in PER_MODEL] + [(None, d) for d in REFERENCE]
        bare = {D_TB: {"mode": "bare", "module": "tripy_build", "pin": args.pin},
                D_JAX: {"mode": "bare", "module": "jax", "pin": args.pin}}
        rows: dict[tuple, list[dict]] = {j: [] for j in jobs}
        first = 0 if args.no_warmup else -1
        for r in range(first, args.rounds):
            k = r % len(jobs)
            for m, c in jobs[k:] + jobs[:k]:
                what = f"{m or '-'}: {c}"
                if m is None:
                    row = timed_child(what, bare[c], None, args, env, tmp / "work")
                else:
                    cfg, ref = setups[m]["children"][c]
                    row = timed_child(what, cfg, ref, args, env, tmp / "work")
                if r >= 0:
                    rows[(m, c)].append(row)
            label = "warm-up" if r < 0 else f"round {r + 1}/{args.rounds}"
            if r >= 0:
                short = {D_TB: "import tripy_build", D_JAX: "import jax"}
                print(f"  {label}: " + ", ".join(f"{m + ' ' + c.split()[0] if m else short[c]} {rows[(m, c)][-1]['to result']:.2f}"
                                                 for m, c in jobs), flush=True)
            else:
                print(f"  {label} done", flush=True)

    if args.json:
        Path(args.json).write_text(json.dumps({f"{m}|{c}": v for (m, c), v in rows.items()}, indent=1))
    report(models, setups, rows)


def report(models, setups, rows) -> None:
    cols = ["startup", "import", "load", "first call", "to result", "to exit"]
    print()
    print("Medians in ms; 'to result' (spawn -> first result ready) is the cold-start time.")
    print(f"{'model':<12} {'contender':<21}" + "".join(f"{c:>11}" for c in cols) + "   min-max to result")
    for m in models + [None]:
        for c in (PER_MODEL if m else REFERENCE):
            rs = rows[(m, c)]
            cells = "".join(f"{median([r[k] for r in rs if k in r]) * 1e3:>11.0f}" if k in rs[0] else f"{'':>11}"
                            for k in cols)
            tr = [r["to result"] for r in rs]
            print(f"{m or '-':<12} {c:<21}{cells}   {min(tr) * 1e3:.0f}-{max(tr) * 1e3:.0f}")
    print()
    print("Inside 'load' and 'first call' (medians in ms; jax's trace/lower/compile events, wrapped loader steps):")
    for m in models:
        for c in PER_MODEL:
            rs = rows[(m, c)]
            keys = sorted({k for r in rs for k in r if ":" in k})
            parts = ", ".join(f"{k} {median([r.get(k, 0.0) for r in rs]) * 1e3:.0f}" for k in keys)
            print(f"  {m:<12} {c:<21} {parts}")
    print()
    jax_rs = rows[(None, D_JAX)]
    for m in models:
        med = {c: median([r["to result"] for r in rows[(m, c)]]) for c in PER_MODEL}
        med_jax = median([r["to result"] for r in jax_rs])

        def paired(num, den):
            return median([x["to result"] / y["to result"] for x, y in zip(num, den)])

        a, b, c = (rows[(m, x)] for x in PER_MODEL)
        print(f"{m}: c/a = {med[C] / med[A]:.2f}x (paired {paired(c, a):.2f}x), "
              f"b/a = {med[B] / med[A]:.2f}x (paired {paired(b, a):.2f}x), "
              f"a/(import jax) = {med[A] / med_jax:.2f}x (paired {paired(a, jax_rs):.2f}x)")
    print("(all 'to result': spawn -> first result ready; for 'import jax', spawn -> `import jax` done.)")


if __name__ == "__main__":
    main()
