"""The GPU check: the zoo built for ``backend=cuda`` on the card, both loaders, outputs against the CPU build's.

    scripts/gpu_check.sh                      on a machine with an NVIDIA GPU and jax's CUDA plugin
    scripts/gpu_check.sh --cpu                the same on the CPU (CI runs it, so that it cannot rot)
    python scripts/gpu_check.py --deviceless ART   also load an artifact built for this GPU on a machine without it

For each model (the GEGLU, the transformer block, a tiny BERT and a tiny GPT-2 with ``task=generate``, from Hugging
Face checkpoints where ``transformers`` is installed, else from a seed): a build for the platform under test and
one for the CPU from the same weights (each its own process: a process runs one jax platform; with ``--cpu``
the artifact's own CPU executables, as ``tripy_build.load`` runs them, are the CPU's outputs), then, per loader
(``tripy_build.load`` and the jax-free ``tripy_build.runtime``), a fresh process that loads the artifact, calls it
at the opt and max shapes (GPT-2: generates), and reports its cold start (spawn to first result) and steady
latency; then ``tripy-build serve``'s server on it (the loader ``--loader auto`` picks: ``tb.load`` for a GPU's
executables), one v2 request over HTTP. Every output is compared with the CPU build's, and with PyTorch's (on the
same device) where ``torch`` and ``transformers`` are there. One table at the end (also ``--out``/report.json);
the exit status is non-zero if any cell failed. Nothing is installed here: ``gpu_check.sh`` installs the project
without its dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = {
    "geglu": ["model=geglu", "model.dim_in=256", "model.dim_out=512", "shapes.dims.batch=[1,8,32]"],
    "transformer": ["model=transformer", "model.d_model=128", "model.heads=4", "model.d_ff=256",
                    "shapes.dims.batch=[1,2,8]", "shapes.dims.seq=[1,32,64]"],
    "bert": ["model=bert", "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,16,32]"],
    "gpt2": ["model=gpt2", "task=generate", "generate.max_length=48", "shapes.dims.batch=[1,1,2]",
             "shapes.dims.seq=[1,8,16]"],
}
# a tiny model of each Hugging Face architecture: zoo settings without a checkpoint, HF config with one
TINY = {
    "bert": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=64),
    "gpt2": dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0),
}
# --cpu: smaller ranges where the GPU's sizes would make CI's run long (each profile compiles for both platforms)
CPU_SIZES = {"transformer": ["shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,8,16]"],
             "bert": ["shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=pow2:8"],
             "gpt2": ["shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,4,4]", "shapes.buckets.seq=[1,4]"]}
PROMPTS = [[5, 17, 33, 2], [9, 4]]
NEW_TOKENS = 12


def run(cmd: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})


def platform_env(platform: str) -> dict[str, str]:
    return {"JAX_PLATFORMS": "cpu" if platform == "cpu" else "cuda,cpu"}


def checkpoint(name: str, root: Path) -> list[str]:
    """A tiny Hugging Face checkpoint of ``name`` (save_pretrained) and the overrides that build from it; the zoo's
    own tiny settings (random init from a seed) where transformers is not installed."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import torch
        import transformers
    except ImportError:
        keys = {"bert": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                         "max_position_embeddings"], "gpt2": ["vocab_size", "n_embd", "n_layer", "n_head", "n_positions"]}
        return [f"model.{k}={TINY[name][k]}" for k in keys[name]]
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    if name == "bert":
        model = transformers.BertModel(transformers.BertConfig(**TINY["bert"]))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY["gpt2"]))
    path = root / f"hf-{name}"
    model.eval().save_pretrained(path)
    return [f"params.checkpoint={path}"]


def build(name: str, overrides: list[str], platform: str, arts: Path, gpu: str) -> tuple[Path | None, float, str]:
    """Build in a fresh process: (artifact, seconds, error). ``platform`` "cpu+cuda": both, on a CPU machine (what
    ``--cpu`` checks: the CPU executables of a two-platform artifact, its GPU's compiled without one)."""
    backend = {"cuda": ["backend=cuda", f"target.gpu={gpu}"], "cpu": ["backend=cpu"],
               "cpu+cuda": ["backend=[cpu,cuda]", f"target.gpu={gpu}"]}[platform]
    t0 = time.perf_counter()
    r = run([sys.executable, "-m", "tripy_build", *overrides, *backend, f"artifacts_dir={arts}"], platform_env(platform))
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        return None, seconds, (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    path = next(line.split("artifact: ", 1)[1].split()[0] for line in r.stdout.splitlines() if line.startswith("artifact: "))
    return Path(path), seconds, ""


WORKER = r'''
import json, sys, time
t_spawn = float(sys.argv[5])
import numpy as np
art, loader, out, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if loader == "runtime":
    from tripy_build import runtime
    exe = runtime.load(art, warmup="none")
else:
    import tripy_build as tb
    exe = tb.load(art, warmup="none")
def flat(outs):
    if isinstance(outs, dict):
        return [np.asarray(v) for v in outs.values()]
    if isinstance(outs, (list, tuple)):
        return [np.asarray(v) for v in outs]
    return [np.asarray(outs)]
report, results = {}, {}
if mode == "generate":
    prompts = json.loads(sys.argv[6])
    n = int(sys.argv[7])
    ids = exe.generate(prompts, n)
    report["cold_s"] = time.time() - t_spawn
    results["ids"] = np.asarray(ids)
    for label, batch in (("opt", prompts[:1]), ("max", prompts)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter(); exe.generate(batch, n, eos_token_id=[]); times.append(time.perf_counter() - t0)
        report[f"{label}_ms"] = 1e3 * min(times) / n  # per generated token
else:
    from tripy_build.artifact.selftest import sample
    infos = exe.flat_args
    cases = {}
    for label in ("opt", "max"):
        cases[label] = [sample(info, getattr(info.shape_bounds, label), (7, i)) for i, (_, info) in enumerate(infos)]
    first = flat(exe.call_flat(*cases["opt"]))
    report["cold_s"] = time.time() - t_spawn
    for label, xs in cases.items():
        outs = flat(exe.call_flat(*xs))
        for i, o in enumerate(outs):
            results[f"{label}{i}"] = o
        for i, x in enumerate(xs):
            results[f"{label}_in{i}"] = x
        times = []
        for _ in range(20):
            t0 = time.perf_counter(); flat(exe.call_flat(*xs)); times.append(time.perf_counter() - t0)
        report[f"{label}_ms"] = 1e3 * float(np.median(times))
np.savez(out, **results)
print("REPORT " + json.dumps(report))
'''


SERVE_WORKER = r'''
import json, sys, time, urllib.request
import numpy as np
from tripy_build.artifact.selftest import sample
from tripy_build.serve.codec import DATATYPES, datatype
from tripy_build.serve.http import Server
art, out, t_spawn = sys.argv[1], sys.argv[2], float(sys.argv[3])
with Server([art], port=0).start() as srv:
    (name, ep), = srv.endpoints.items()
    xs = [sample(info, info.shape_bounds.opt, (7, i)) for i, (_, info) in enumerate(ep.args)]
    body = {"inputs": [{"name": p, "shape": list(x.shape), "datatype": datatype(x.dtype), "data": x.ravel().tolist()}
                       for (p, _), x in zip(ep.args, xs)]}
    req = urllib.request.Request(f"{srv.url}/v2/models/{name}/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(req, timeout=300).read())
    first = time.time() - t_spawn
    times = []
    for _ in range(20):
        t0 = time.perf_counter(); urllib.request.urlopen(req, timeout=300).read(); times.append(time.perf_counter() - t0)
# each output as its datatype says (JSON's shortest float32 digits read back as float32 are the value sent)
np.savez(out, **{f"opt{i}": np.asarray(o["data"], DATATYPES[o["datatype"]]).reshape(o["shape"])
                 for i, o in enumerate(answer["outputs"])})
print("REPORT " + json.dumps({"loader": ep.loader, "cold_s": first, "opt_ms": 1e3 * float(np.median(times))}))
'''


def serve(artifact: Path, platform: str, out: Path) -> tuple[dict, str]:
    """``tripy-build serve``'s server on the artifact, in a fresh process, with the loader it picks (``--loader
    auto``: tb.load for a GPU's executables): one v2 request at the opt shape, then 20 timed; ({loader, cold_s,
    opt_ms}, error), the answer's outputs in ``out``."""
    r = run([sys.executable, "-c", SERVE_WORKER, str(artifact), str(out), repr(time.time())], platform_env(platform))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    if r.returncode != 0 or not lines:
        return {}, (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    return json.loads(lines[-1][7:]), ""


def measure(artifact: Path, loader: str, platform: str, out: Path, generate: bool) -> tuple[dict, str]:
    """Load and call in a fresh process: ({cold_s, opt_ms, max_ms}, error); the outputs in ``out``."""
    args = [sys.executable, "-c", WORKER, str(artifact), loader, str(out), "generate" if generate else "call",
            repr(time.time())]
    if generate:
        args += [json.dumps(PROMPTS), str(NEW_TOKENS)]
    r = run(args, platform_env(platform))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    if r.returncode != 0 or not lines:
        return {}, (r.stderr.strip().splitlines() or ["?"])[-1][:400]
    return json.loads(lines[-1][7:]), ""


def max_error(got: Path, want: Path, prefix: str = "") -> float:
    """The largest error of ``got``'s outputs against ``want``'s (relative to each output's scale; GPT-2's: the
    tokens that differ), over those whose names start with ``prefix``."""
    a, b = np.load(got), np.load(want)
    worst = 0.0
    for k in b.files:
        if "_in" in k or not k.startswith(prefix):
            continue
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        if k == "ids":
            worst = max(worst, float((x != y).sum()))  # tokens that differ
            continue
        worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return worst


def torch_error(name: str, got: Path, overrides: list[str], platform: str) -> str:
    """The largest error against PyTorch on the same device (relative to the output's scale), or "-"."""
    ckpt = next((o.split("=", 1)[1] for o in overrides if o.startswith("params.checkpoint=")), None)
    if ckpt is None:
        return "-"
    import torch
    import transformers

    device = "cuda" if platform == "cuda" and torch.cuda.is_available() else "cpu"
    data = np.load(got)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel.from_pretrained(ckpt).eval().to(device)
        differ = 0
        for row, prompt in zip(data["ids"], PROMPTS):
            with torch.no_grad():
                ids = model.generate(torch.tensor([prompt], device=device), max_new_tokens=NEW_TOKENS, do_sample=False,
                                     pad_token_id=0)[0, len(prompt):].cpu().numpy()
            differ += int((ids != row[:len(ids)]).sum())
        return f"{differ} tokens differ"
    model = transformers.BertModel.from_pretrained(ckpt).eval().to(device)
    worst = 0.0
    for label in ("opt", "max"):
        ids, mask, types = (torch.tensor(data[f"{label}_in{i}"].astype(np.int64), device=device) for i in range(3))
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state.cpu().numpy()
        g = data[f"{label}0"]
        worst = max(worst, float(np.abs(g - want).max() / np.abs(want).max()))
    return f"{worst:.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="check on the CPU (no GPU needed; the CI's run): the models "
                                                           "built for [cpu,cuda] with the H100's executables compiled "
                                                           "without it, their CPU executables run")
    parser.add_argument("--gpu", default="host", help="target.gpu of the GPU builds (default: this machine's)")
    parser.add_argument("--deviceless", type=Path, help="an artifact built for this GPU on a machine without it")
    parser.add_argument("--models", default=",".join(MODELS), help="which models (default: all)")
    parser.add_argument("--out", type=Path, help="keep the artifacts and report.json here (default: a temporary folder)")
    args = parser.parse_args(argv)
    platform = "cpu" if args.cpu else "cuda"
    root = args.out or Path(tempfile.mkdtemp(prefix="tripy_build-gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows, failed, report = [], 0, []
    header = ["model", "loader", "build s", "cold start s", "steady ms opt", "steady ms max", "error vs CPU build",
              "error vs PyTorch", "note"]
    for name in args.models.split(","):
        overrides = MODELS[name] + (CPU_SIZES.get(name, []) if args.cpu else []) + \
            (checkpoint(name, root) if name in TINY else [])
        if args.cpu:
            # the CPU build to compare with is the artifact's own CPU executables, the ones this machine runs: tb.load's
            # outputs of it are the reference (a CPU-only build from the same weights compiles the same code again)
            built, seconds, error = build(name, overrides, "cpu+cuda", root / "cpu+cuda", "h100")
            reference, ref_error = built, ""
        else:
            built, seconds, error = build(name, overrides, platform, root / platform, args.gpu)
            reference, _, ref_error = build(name, overrides, "cpu", root / "cpu", "host")
        if built is None or reference is None:
            rows.append([name, "-", f"{seconds:.1f}", "-", "-", "-", "-", "-", f"build failed: {error or ref_error}"])
            failed += 1
            continue
        generate = name == "gpt2"
        want = root / f"{name}-cpu.npz"
        ref_times, ref_error = measure(reference, "tb", "cpu", want, generate)
        for loader in ("tb", "runtime"):
            got = want if args.cpu and loader == "tb" else root / f"{name}-{platform}-{loader}.npz"
            times, error = (ref_times, ref_error) if got == want else measure(built, loader, platform, got, generate)
            if error or ref_error:
                rows.append([name, loader, f"{seconds:.1f}", "-", "-", "-", "-", "-", error or f"CPU reference: {ref_error}"])
                failed += 1
                continue
            err = max_error(got, want)
            vs_torch = torch_error(name, got, overrides, platform) if name in TINY else "-"
            unit = " (per token)" if generate else ""
            rows.append([name, loader, f"{seconds:.1f}", f"{times['cold_s']:.2f}", f"{times['opt_ms']:.2f}{unit}",
                         f"{times['max_ms']:.2f}{unit}", f"{err:.0f} tokens differ" if generate else f"{err:.1e}",
                         vs_torch, ""])
            report.append({"model": name, "loader": loader, "platform": platform, "build_s": seconds, **times,
                           "error_vs_cpu": err, "error_vs_torch": vs_torch})
        if not generate and not ref_error:
            got = root / f"{name}-{platform}-serve.npz"
            served, error = serve(built, platform, got)
            err = max_error(got, want, "opt") if not error else None
            rows.append([name, f"serve ({served.get('loader', '?')})", "-", f"{served['cold_s']:.2f}" if served else "-",
                         f"{served['opt_ms']:.2f}" if served else "-", "-", f"{err:.1e}" if err is not None else "-", "-",
                         error or "one v2 request over HTTP, then 20 timed (the first is the cold start)"])
            failed += bool(error)
            if not error:
                report.append({"model": name, "loader": "serve", "platform": platform, "serve_loader": served["loader"],
                               "cold_s": served["cold_s"], "opt_ms": served["opt_ms"], "error_vs_cpu": err})
    if args.deviceless is not None:
        for loader in ("tb", "runtime"):
            got = root / f"deviceless-{loader}.npz"
            times, error = measure(args.deviceless, loader, platform, got, False)
            rows.append([f"deviceless {args.deviceless.name}", loader, "-", f"{times.get('cold_s', 0):.2f}" if times else "-",
                         f"{times['opt_ms']:.2f}" if times else "-", f"{times['max_ms']:.2f}" if times else "-", "-", "-",
                         error or "loaded and ran (its first-load self-test passed)"])
            failed += bool(error)
    if args.cpu:
        # what a CPU machine can check of a GPU build: it compiles without the GPU, and this machine refuses it
        built, seconds, error = build("geglu", MODELS["geglu"], "cuda", root / "deviceless", "h100")
        refused = run([sys.executable, "-c", f"import tripy_build as tb; tb.load({str(built)!r})"], {}) if built else None
        ok = refused is not None and refused.returncode != 0 and "built for cuda only" in refused.stderr
        why = error or (refused.stderr[-200:] if refused else "")
        rows.append(["geglu for h100 (deviceless)", "tb", f"{seconds:.1f}", "-", "-", "-", "-", "-",
                     "built, and refused on this CPU" if ok else f"FAILED: {why}"])
        failed += not ok
    from tripy_build.artifact.describe import table

    print("\n".join(table(header, rows, indent="")))
    print(f"\n{platform}: {len(rows)} rows, {failed} failed, {time.perf_counter() - started:.0f} s; artifacts in {root}")
    (root / "report.json").write_text(json.dumps(report, indent=1))
    if args.out is None and not failed:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
