"""What a cache-hit build costs: wall clock of whole ``python -m tripy_build`` processes.

For each model (GEGLU and the transformer block at their default dims, ``shapes=dynamic``), in a
fresh temporary artifacts dir and ``XDG_CACHE_HOME``:

- ``full build``          the first build of the config (trace, export, compile, self-test, write).
- ``cache hit``           the same command again: answered from the memo without composing configs.
- ``cache hit, no memo``  the same command with an empty ``XDG_CACHE_HOME`` each time (a new one per
                          run, so no memo exists): Hydra composes, the build key is recomputed, the
                          artifact's digests are checked. Shows what the memo saves.
- ``import tripy_build``  ``python -c "import tripy_build"``: the floor for any command of this package.

The repeated contenders run interleaved in rounds (the order rotates each round), so a shared
machine's drift hits them alike. Medians are reported, with the ratios ``cache hit / import`` (the
target: at most 1.2x) both as a ratio of medians and as the median of per-round (paired) ratios,
and ``full build / cache hit``. Each cache-hit run is checked to have said "cache hit" and not to have
traced or compiled.

    .venv/bin/python bench/cache_hit.py            # 10 rounds per model (about 2 minutes)
    .venv/bin/python bench/cache_hit.py --quick    # 3 rounds per model
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {"geglu": ["model=geglu", "shapes=dynamic"], "transformer": ["model=transformer", "shapes=dynamic"]}
TARGET = 1.2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds (3)")
    p.add_argument("--rounds", type=int, help="interleaved rounds per model (default 10, quick 3)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--no-memo-row", action="store_true", help="skip the 'cache hit, no memo' contender")
    p.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 10)
    return args


def timed(argv: list[str], cwd: Path, xdg: Path) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRIPY_BUILD_NO_MEMO"}
    env["XDG_CACHE_HOME"] = str(xdg)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return seconds, proc.stdout


def check_hit(label: str, out: str) -> None:
    if "cache hit" not in out or "trace+export" in out or "compile cpu" in out:
        sys.exit(f"{label}: expected a cache hit without tracing or compiling, got:\n{out[-3000:]}")


def bench_model(name: str, args: argparse.Namespace, root: Path) -> dict[str, object]:
    work, arts, xdg = root / name / "work", root / name / "arts", root / name / "xdg"
    for d in (work, arts, xdg):
        d.mkdir(parents=True)
    build = [args.python, "-m", "tripy_build", *MODELS[name], f"artifacts_dir={arts}"]
    bare = [args.python, "-c", "import tripy_build"]

    full, out = timed(build, work, xdg)
    if "trace+export" not in out:
        sys.exit(f"{name}: the first build did not build:\n{out[-3000:]}")

    contenders = {
        "cache hit": lambda: timed(build, work, xdg),
        "import tripy_build": lambda: timed(bare, work, xdg),
    }
    if not args.no_memo_row:
        fresh = iter(range(10**6))
        contenders["cache hit, no memo"] = lambda: timed(build, work, root / name / f"xdg-empty-{next(fresh)}")
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for i in range(len(names)):
            label = names[(r + i) % len(names)]
            seconds, out = contenders[label]()
            if label.startswith("cache hit"):
                check_hit(f"{name} {label}", out)
            times[label].append(seconds)
        print(f"  {name} round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names),
              flush=True)
    paired = [h / b for h, b in zip(times["cache hit"], times["import tripy_build"])]
    return {"full": full, "times": times, "paired": paired}


def main() -> None:
    args = parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    print(f"python {args.python}; {args.rounds} rounds per model; {os.cpu_count()} CPUs", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="tripy_build-bench-") as tmp:
        for m in models:
            results[m] = bench_model(m, args, Path(tmp))

    print()
    print(f"{'model':<12} {'contender':<20} {'median s':>9} {'min s':>7} {'max s':>7}  runs")
    for m, res in results.items():
        print(f"{m:<12} {'full build':<20} {res['full']:>9.3f} {res['full']:>7.3f} {res['full']:>7.3f}  1 (first build)")
        for label, ts in res["times"].items():
            print(f"{m:<12} {label:<20} {statistics.median(ts):>9.3f} {min(ts):>7.3f} {max(ts):>7.3f}  {len(ts)}")
    print()
    worst = 0.0
    for m, res in results.items():
        t = res["times"]
        hit, imp = statistics.median(t["cache hit"]), statistics.median(t["import tripy_build"])
        paired = statistics.median(res["paired"])
        worst = max(worst, hit / imp, paired)
        line = (f"{m}: cache hit / import = {hit / imp:.2f}x (paired per round: median {paired:.2f}x, "
                f"range {min(res['paired']):.2f}-{max(res['paired']):.2f}); full build / cache hit = {res['full'] / hit:.1f}x")
        if "cache hit, no memo" in t:
            line += f"; no memo / memo = {statistics.median(t['cache hit, no memo']) / hit:.2f}x"
        print(line)
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"target: cache hit at most {TARGET}x a bare import: {verdict} (worst ratio {worst:.2f}x)")


if __name__ == "__main__":
    main()
