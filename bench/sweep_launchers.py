"""A 16-job sweep with each launcher, side by side: wall time, speed-up over the default, CPU time, and
where a job's time goes (process start and imports vs building).

    python bench/sweep_launchers.py [--launchers basic,tripy_local,submitit_local,slurm,ray] [--rounds 3]

The sweep: model=geglu,mlp shapes=static,dynamic optimization_level=0,3 precision=float32,bfloat16.
Every run starts from an empty artifacts folder (no cache hits) and the memo off. The launchers run in
interleaved rounds (basic, tripy_local, ..., basic, tripy_local, ...) and each reports its median, as
these cores are shared and a single run swings by 10%. Every run's reproducible files are compared
with the first launcher's: a launcher that builds different bytes fails the benchmark.

``slurm`` runs on a one-node cluster on localhost (scripts/local-slurm.sh; started here and stopped
after, unless SLURM_CONF names a running one), one core per job; ``ray`` starts a local Ray cluster
(hydra/launcher=ray_local). Either is left out, with the reason, where it is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tripy_build import host
from tripy_build.artifact.read import reproducible_tree
from tripy_build.cli.sweep import result_files

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["model=geglu,mlp", "shapes=static,dynamic", "optimization_level=0,3", "precision=float32,bfloat16"]
LAUNCHERS = {
    "basic": ["hydra/launcher=basic"],
    "tripy_local": ["hydra/launcher=tripy_local"],
    "submitit_local": ["hydra/launcher=submitit_local"],
    "slurm": ["hydra/launcher=slurm_cpu", "hydra.launcher.cpus_per_task=1"],
    "ray": ["hydra/launcher=ray_local"],
}


def run(launcher: str, tmp: Path, env: dict[str, str]) -> tuple[float, float | None, list[dict], dict[str, bytes],
                                                                 dict[str, float]]:
    """(wall s, CPU s of the driver and its children or None where jobs run elsewhere, summary rows, files,
    the jobs' build stages summed)."""
    arts, sweep = tmp / f"{launcher}-arts", tmp / f"{launcher}-sweep"
    shutil.rmtree(arts, ignore_errors=True)
    shutil.rmtree(sweep, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "-m", *SWEEP, f"artifacts_dir={arts}",
                           f"hydra.sweep.dir={sweep}", *LAUNCHERS[launcher]],
                          capture_output=True, text=True, env={**env, "TRIPY_BUILD_NO_MEMO": "1"}, cwd=tmp)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{launcher} failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    files = reproducible_tree(arts)
    stages: dict[str, float] = {}
    for result in result_files(sweep):
        for stage, seconds in json.loads(result.read_text()).get("stages", {}).items():
            stage = "measure reduced-precision error" if stage.startswith("measure ") else stage
            stages[stage] = stages.get(stage, 0.0) + seconds
    local = launcher in ("basic", "tripy_local", "submitit_local")
    return wall, cpu if local else None, json.loads((sweep / "summary.json").read_text()), files, stages


def import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tripy_build.cli, jax; jax.devices()"], check=True, capture_output=True)
    return time.perf_counter() - t0


def start_slurm(tmp: Path) -> tuple[dict[str, str], Path | None] | str:
    """The environment that reaches a Slurm cluster and the state dir to stop after, or why there is none."""
    if os.environ.get("SLURM_CONF"):
        return {}, None
    if not all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "sinfo")):
        return "Slurm is not installed (scripts/local-slurm.sh install, as root)"
    state = tmp / "slurm"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "local-slurm.sh"), "start", str(state)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return f"a local Slurm cluster did not start: {proc.stderr.strip()[-300:]}"
    return {"SLURM_CONF": proc.stdout.strip().splitlines()[-1].split("=", 1)[1]}, state


def available(launcher: str) -> str | None:
    """Why ``launcher`` cannot run here, or None."""
    module = {"submitit_local": "hydra_plugins.hydra_submitit_launcher", "slurm": "hydra_plugins.hydra_submitit_launcher",
              "ray": "hydra_plugins.hydra_ray_launcher"}.get(launcher)
    if module is None:
        return None if launcher in LAUNCHERS else f"unknown launcher (one of {', '.join(LAUNCHERS)})"
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install -e '.[{'ray' if launcher == 'ray' else 'submitit'}]')"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launchers", default="basic,tripy_local,submitit_local,slurm,ray")
    p.add_argument("--rounds", type=int, default=3, help="interleaved runs per launcher; the median is reported")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sweep-launchers-"))
    launchers, env, slurm_state = [], dict(os.environ), None
    for name in args.launchers.split(","):
        why = available(name)
        if why is None and name == "slurm":
            started = start_slurm(tmp)
            if isinstance(started, str):
                why = started
            else:
                env.update(started[0])
                slurm_state = started[1]
        if why:
            print(f"{name:16} left out: {why}")
        else:
            launchers.append(name)
    print(f"{len(host.usable_cores())} cores; a fresh process's start and imports (tripy_build.cli, jax, its CPU backend): "
          f"{import_seconds():.2f} s; {args.rounds} interleaved round(s), medians")
    walls: dict[str, list[float]] = {n: [] for n in launchers}
    cpus: dict[str, list[float]] = {n: [] for n in launchers}
    builds: dict[str, list[float]] = {n: [] for n in launchers}
    stages: dict[str, dict[str, float]] = {}
    reference: dict[str, bytes] | None = None
    try:
        for _ in range(args.rounds):
            for name in launchers:
                wall, cpu, rows, files, stages[name] = run(name, tmp, env)
                reference = reference or files
                if files != reference:
                    differ = sorted(k for k in set(files) | set(reference) if files.get(k) != reference.get(k))
                    raise SystemExit(f"{name} built different bytes from {launchers[0]}: {differ[:5]}")
                walls[name].append(wall)
                cpus[name].append(cpu if cpu is not None else float("nan"))
                builds[name].append(sum(r["build_seconds"] for r in rows if isinstance(r["build_seconds"], (int, float))))
    finally:
        if slurm_state is not None:
            subprocess.run(["bash", str(REPO / "scripts" / "local-slurm.sh"), "stop", str(slurm_state)],
                           capture_output=True, timeout=60)
    base = statistics.median(walls[launchers[0]])
    print(f"{'launcher':16} {'wall s':>7} {'speed-up':>9} {'CPU s':>7} {'jobs build s':>13}  runs (wall s)")
    for name in launchers:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        cpu_text = f"{cpu:7.1f}" if cpu == cpu else f"{'-':>7}"  # NaN: jobs ran outside this process tree
        print(f"{name:16} {wall:7.1f} {base / wall:8.2f}x {cpu_text} {statistics.median(builds[name]):13.1f}  "
              + " ".join(f"{w:.1f}" for w in walls[name]))
    print(f"(speed-up against {launchers[0]}; CPU s: the driver and its children; jobs build s: the sum of "
          "the jobs' own build time, without process start and imports; the same reproducible bytes from every run)")
    print("\nwhere the jobs' build time goes (the last round, summed over the jobs, s):")
    names = list(dict.fromkeys(k for name in launchers for k in stages[name]))
    print(f"{'launcher':16} " + " ".join(f"{n[:14]:>14}" for n in names))
    for name in launchers:
        print(f"{name:16} " + " ".join(f"{stages[name].get(n, 0.0):14.1f}" for n in names))
    print("outside the builds, per job: a fresh process's start and imports (submitit_local, slurm, ray: every job; "
          "tripy_local: forked from a preloaded server, ~1 ms); basic and tripy_local compose each config in the "
          "driver (~0.1 s).")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
