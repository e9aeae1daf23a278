"""A profile's first use: random in-range calls right after ``load`` returns, both loaders.

For each model (a zoo model built as ``python -m tripy_build model=<name>`` builds it) and loader
(``tripy_build.runtime.load`` and ``tripy_build.load``, each with its default warm-up), a fresh process
loads the artifact and at once makes ``--calls`` calls at random in-range shapes (seeded, the same
shapes for both loaders). After the stream it measures each shape's steady latency (the fastest of a
few more calls) and reports:

- stalls       calls slower than 2x their shape's steady latency + 10 ms;
- worst        the worst call / steady ratio, and that call's excess over steady in ms;
- 1st/profile  for each precompiled profile, its first call in the stream against 2x steady + 1 ms
               (how many profiles exceed it, of how many the stream reached);
- load ms      importing the loader and ``load`` (jax's import is most of ``tb.load``'s ~400 ms).

Each configuration runs twice: pinned to one core (where a warm-up thread competes with the calls for
the only core) and on every core the machine has (``--no-pinned``: only the latter). Each is a single
stream in a single child, not a median, so run it twice to see the noise (two runs of the transformer
on one core: 6 and 15 stalls), or ``--repeats N``: N fresh children each, interleaved, then a row of
each number's median.

    .venv/bin/python bench/first_use.py                         # geglu + transformer, both loaders, pinned and not
    .venv/bin/python bench/first_use.py --models geglu --calls 100 --no-pinned
    .venv/bin/python bench/first_use.py --models bert --no-pinned --loaders runtime   # real BERT-base: ~12 min a run

``bert`` is BERT-base at its real size (random weights are enough for timing; built in ~1 min, 440 MB),
called with batch 1-8 and seq 1-512 (every position real), its steady latency per shape from the
stream's own call and one more (a call takes 0.02-3 s). 2 / 3 stalls of 200 with the runtime / tb.load
on the 2-core Intel VM (11 with the runtime before the two-pass warm-up), all in the first five calls.

``bert-tiny`` is Hugging Face's ``BertModel`` at 2 layers of hidden 32 from its ``save_pretrained``
checkpoint (made here; needs torch and transformers), batch [1, 2, 8] x seq [1, 16, 64]: 28 profiles of
~270 KB, over ``warmup.QUIET_ABOVE_BYTES``. ``--models bert-tiny,transformer --calls 150 --no-pinned
--repeats 3``, medians, all cores of the 2-core VM (shared, so noisy), before and after ``load`` prepared
such a model's profiles itself (``warmup.prepare_at_load``; before: the range over 5-7 runs):

    model        loader     load ms before -> after   late calls of 150 before -> after   worst late call before
    bert-tiny    runtime          81-120 -> 667                 12-13 -> 0                 +37-52 ms (x410-550)
    bert-tiny    tb.load         396-481 -> 1006                13-14 -> 0                 +30-52 ms (x160-280)
    transformer  runtime           78-121 -> 72                   0-2 -> 0                 (background both times)
    transformer  tb.load          416-646 -> 416                  0-4 -> 0

Prepared at load (a rule on bytes alone), the transformer block (63 profiles of ~100 KB, 6.2 MB) had
taken 2.1-2.5 s to load, for no fewer late calls (1-7): it keeps the background warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tripy_build.cli.bench import STALL_FACTOR, STALL_MARGIN_S
from tripy_build.runtime.warmup import FIRST_CALL_FACTOR, FIRST_CALL_MARGIN_S

CHILD = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
if cfg["loader"] == "runtime":
    from tripy_build import runtime
    f = runtime.load(cfg["art"])
    call = lambda kw: f(**kw)
else:
    import jax
    import tripy_build as tb
    f = tb.load(cfg["art"])
    call = lambda kw: jax.block_until_ready(f(**kw))
load_s = time.perf_counter() - t0
rng = np.random.default_rng(0)
dims, tail, vocab = cfg["dims"], cfg["tail"], cfg.get("vocab")
shapes = [tuple(int(rng.integers(lo, hi + 1)) for lo, hi in dims) + tuple(tail) for _ in range(cfg["calls"])]

def inputs(s):
    r = np.random.default_rng(1)
    if vocab:  # a text model's Hugging Face inputs, every position real
        return {"input_ids": r.integers(0, vocab, s).astype(np.int32), "attention_mask": np.ones(s, np.int32),
                "token_type_ids": np.zeros(s, np.int32)}
    return {"x": r.standard_normal(s, dtype=np.float32)}

xs = {s: inputs(s) for s in set(shapes)}
times = []
for s in shapes:
    t = time.perf_counter()
    call(xs[s])
    times.append(time.perf_counter() - t)
steady = {}
for s in set(shapes):
    best = min(t for z, t in zip(shapes, times) if z == s)  # a stream call faster than the reruns was no stall
    for _ in range(cfg["reruns"]):
        t = time.perf_counter()
        call(xs[s])
        best = min(best, time.perf_counter() - t)
    steady[s] = best
route = lambda s: f.dispatcher.route([x.shape for x in xs[s].values()]).target  # the profile it runs
print(json.dumps({"load_s": load_s, "calls": [[list(s), t, steady[s], list(route(s))] for s, t in zip(shapes, times)]}))
"""

# reruns: calls per shape after the stream for its steady latency (BERT-base: 0.02-3 s a call)
MODELS = {"geglu": {"dims": [[1, 64]], "tail": [512], "reruns": 3},
          "transformer": {"dims": [[1, 64], [1, 256]], "tail": [256], "reruns": 3},
          "bert": {"dims": [[1, 8], [1, 512]], "tail": [], "vocab": 30522, "reruns": 1},
          "bert-tiny": {"dims": [[1, 8], [1, 64]], "tail": [], "vocab": 99, "reruns": 3}}

# bert-tiny: Hugging Face's BertModel at 2 layers of hidden 32 (tests/build/test_pretrained.py's), from its
# save_pretrained checkpoint, batch [1, 2, 8] x seq [1, 16, 64]: 4 x 7 = 28 profiles of ~260 KB each
TINY_BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=64)


def build(model: str, root: Path, python: str) -> str:
    out = root / "artifacts"
    extra = []
    if model == "bert-tiny":
        import torch
        import transformers

        torch.manual_seed(0)
        transformers.BertModel(transformers.BertConfig(**TINY_BERT)).eval().save_pretrained(root / "hf-bert-tiny")
        extra = [f"params.checkpoint={root / 'hf-bert-tiny'}", "shapes.dims.batch=[1,2,8]", "shapes.dims.seq=[1,16,64]"]
    name = model.split("-")[0]
    subprocess.run([python, "-m", "tripy_build", f"model={name}", f"artifacts_dir={out}", *extra], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "TRIPY_BUILD_NO_MEMO": "1"})
    return str(max((out / name).iterdir(), key=lambda p: p.stat().st_mtime))


def run(python: str, cfg: dict, pin: bool) -> dict:
    cmd = [python, "-c", CHILD, json.dumps(cfg)]
    if pin:
        cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"child failed: {cfg}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(result: dict) -> dict:
    calls = result["calls"]
    stalls = [c for c in calls if c[1] > STALL_FACTOR * c[2] + STALL_MARGIN_S]
    worst = max(calls, key=lambda c: c[1] / c[2])
    first: dict[tuple, list] = {}
    for c in calls:
        first.setdefault(tuple(c[3]), c)
    over = [c for c in first.values() if c[1] > FIRST_CALL_FACTOR * c[2] + FIRST_CALL_MARGIN_S]
    return {"load_ms": result["load_s"] * 1e3, "stalls": len(stalls), "calls": len(calls),
            "worst_ratio": worst[1] / worst[2], "worst_excess_ms": (worst[1] - worst[2]) * 1e3,
            "first_over": len(over), "profiles_reached": len(first),
            "first_over_ms": sorted(round((c[1] - 2 * c[2]) * 1e3, 1) for c in over)}


def line(model: str, loader: str, pin: bool, s: dict, what: str = "") -> str:
    return (f"{model:12} {('tripy_build.runtime' if loader == 'runtime' else 'tb.load'):20} "
            f"{'1 core' if pin else 'all cores':9} load {s['load_ms']:6.0f} ms  stalls {s['stalls']:g}/{s['calls']}  "
            f"worst x{s['worst_ratio']:.1f} (+{s['worst_excess_ms']:.1f} ms)  1st call > 2x steady + 1 ms: "
            f"{s['first_over']:g}/{s['profiles_reached']:g} profiles " + (what or str(s["first_over_ms"][:6])))


def median(summaries: list[dict]) -> dict:
    """Each number's median over runs (each taken apart: the worst call's ratio and excess from different runs)."""
    import numpy as np

    keys = ("load_ms", "stalls", "worst_ratio", "worst_excess_ms", "first_over", "profiles_reached")
    return {**summaries[0], **{k: float(np.median([s[k] for s in summaries])) for k in keys}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--loaders", default="runtime,load")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--no-pinned", action="store_true", help="only the unpinned runs")
    p.add_argument("--workdir", help="build here (kept) instead of a temporary directory")
    p.add_argument("--artifact", action="append", default=[], metavar="MODEL=PATH",
                   help="use this built artifact for MODEL instead of building it (bert: bench/real_models.py "
                        "leaves one in its --workdir, under bert/tb-artifacts/bert/)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each configuration (fresh processes, interleaved); a median row follows (default 1)")
    p.add_argument("--json", help="also write the summaries to this file")
    args = p.parse_args(argv)
    python = sys.executable
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        given = dict(a.split("=", 1) for a in args.artifact)
        for model in args.models.split(","):
            art = given.get(model) or build(model, root, python)
            configs = [(pin, loader) for pin in ([False] if args.no_pinned else [True, False])
                       for loader in args.loaders.split(",")]
            runs: dict[tuple, list[dict]] = {c: [] for c in configs}
            for _ in range(args.repeats):
                for pin, loader in configs:
                    cfg = {"art": art, "loader": loader, "calls": args.calls, **MODELS[model]}
                    s = summarize(run(python, cfg, pin))
                    runs[(pin, loader)].append(s)
                    rows.append({"model": model, "loader": loader, "pinned": pin, **s})
                    print(line(model, loader, pin, s), flush=True)
            if args.repeats > 1:
                for (pin, loader), ss in runs.items():
                    print(line(model, loader, pin, median(ss), f"median of {len(ss)}"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
