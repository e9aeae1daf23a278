"""``python -m tripy_build``: the Hydra command, a thin layer over ``build``.

A single run prints the artifact and exits non-zero with a one-line error on a bad config. In a
sweep (``-m``) each job records its result in its output directory instead of raising, so one
failed job neither hides the others nor skips the summary, which ``SweepSummary`` prints and writes
(JSON and CSV) in the sweep directory.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from . import config
from ..build import memo
from ..errors import ConfigError, TripyBuildError

VERSION_BASE = "1.3"
CONFIG_PATH = "pkg://tripy_build.conf"
RESULT_FILE = "build_result.json"
SHARED_INIT = ".shared-init"  # in the sweep directory, removed after the sweep

config.register()
log = logging.getLogger("tripy_build")


def _in_sweep(mode: Any, value: Any) -> Any:
    """``${tripy_build.in_sweep:${hydra.mode},VALUE}``: VALUE in a sweep's job, else nothing.

    A single build writes its artifact and nothing else (its log goes to the console and its config
    into the manifest), while a sweep's jobs keep Hydra's per-job config and log in the sweep directory
    beside their results (``conf/config.yaml`` uses it for ``hydra.output_subdir`` and the log file)."""
    if str(mode).endswith("MULTIRUN"):
        return value
    return os.devnull if str(value).endswith(".log") else None


if not OmegaConf.has_resolver("tripy_build.in_sweep"):
    OmegaConf.register_new_resolver("tripy_build.in_sweep", _in_sweep)


def _check_added_keys(cfg: DictConfig) -> None:
    """Hydra lets ``+key=value`` through a schema; refuse keys the schema does not have."""
    from .config_errors import DIM_DICTS, closest

    for override in HydraConfig.get().overrides.task:
        if override.startswith("+"):
            key = override.lstrip("+").split("=", 1)[0]
            if "@" in key or "/" in key or key in ("model", "shapes", "precision"):
                continue  # a config group choice, checked by Hydra itself
            if key.startswith(tuple(d + "." for d in DIM_DICTS)):
                continue  # a new dim in a dict keyed by dim names, checked against the model's dims
            where, _, name = key.rpartition(".")
            node = OmegaConf.select(cfg, where) if where else cfg
            siblings = [str(k) for k in node.keys() if k not in ("hydra", name)] if OmegaConf.is_dict(node) else []
            near = closest(name, siblings)
            raise ConfigError(
                f"{key}: no such key {f'in {where}' if where else 'at the top level'} (added with "
                f"'{override.split('=', 1)[0]}'; keys: {', '.join(siblings)})."
                + (f" Did you mean `{where + '.' if where else ''}{near}`?" if near else "")
                + " `python -m tripy_build --help` lists every key."
            )


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate and build one config; the result as a JSON-able dict."""
    from ..build.pipeline import build

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every step of a save at INFO
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    _check_added_keys(cfg)
    vb = config.validate(cfg)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:  # the sweep's jobs, in any process, share a model's init
        vb = dataclasses.replace(vb, shared_init_dir=str(Path(hc.sweep.dir) / SHARED_INIT))
    t0 = time.perf_counter()
    result = build(vb)
    if hc.mode != RunMode.MULTIRUN:
        memo.record(sys.argv[1:], result)
    record = {
        "status": "cache hit" if result.cache_hit else "built",
        "path": str(result.path), "key": result.key, "model": result.model,
        "build_seconds": round(time.perf_counter() - t0, 3), "size_bytes": result.size,
        "stages": {name: round(seconds, 3) for name, seconds in result.timings.items()},
        "summary": result.summary(),
    }
    if cfg.get("bench"):
        record.update(measure(result.path))
        record["summary"] += "\n" + record.pop("bench_report")
    return record


BENCH_STREAM = 50  # calls in the random-shape stream of a sweep's bench (the full bench: 200)


def measure(path: Path) -> dict[str, Any]:
    """``tripy-build bench`` on a fresh process: the columns a sweep's summary shows."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "tripy_build", "bench", str(path), "--json", "-",
                           "--stream", str(BENCH_STREAM), "--shapes", "2", "--cold-rounds", "1"],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise TripyBuildError(f"bench of {path} failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout)
    from .bench import report

    stream = result["stream"]
    return {
        "latency_ms": round(stream["median_ms"], 3), "p99_ms": round(stream["p99_ms"], 3), "stalls": stream["stalls"],
        "cold_start_ms": round(result["cold_start"]["tripy_build.runtime.load"]["seconds"] * 1e3, 1),
        "padding_overhead": round(result["padding_overhead_median"], 3), "bench_report": report(result),
    }


def command() -> None:
    """``python -m tripy_build [-m] KEY=VALUE ...``: Hydra's app, with an error in the config given (a misspelt
    key, an unknown option, a wrong type) on one line naming the key, what it accepts and the closest valid
    name, exit status 2, nothing written. ``HYDRA_FULL_ERROR=1`` shows Hydra's own traceback instead."""
    from .config_errors import explain

    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing, so that we can explain
    try:
        main()
    except Exception as e:
        error = explain(e, sys.argv[1:]) if full_error != "1" else None
        if error is None:
            raise
        _remove_new_sweep_dir()
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


_new_sweep_dir: list[Path] = []  # the sweep directory, where this process's sweep made it


def _remove_new_sweep_dir() -> None:
    """Remove the directory a sweep refused for its config made (Hydra's sweeper writes ``multirun.yaml``
    before it composes the jobs' configs), and the empty folders above it up to the working directory."""
    for sweep_dir in _new_sweep_dir:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        cwd, parent = Path.cwd().resolve(), sweep_dir.resolve().parent
        while parent != cwd and cwd in parent.parents and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


@hydra.main(version_base=VERSION_BASE, config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    overrides = list(hc.overrides.task)
    try:
        record = run(cfg)
        print(record["summary"], flush=True)
    except TripyBuildError as e:
        record = {"status": "failed", "error": f"{e}"}
        if not sweep:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
    except Exception as e:  # noqa: BLE001 - in a sweep one job's crash must not hide the rest
        if not sweep:
            raise
        record = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    if sweep:
        record.pop("summary", None)
        write_result(Path(hc.runtime.output_dir), {**record, "overrides": overrides, "job": hc.job.num,
                                                   "pid": os.getpid()})


def write_result(output_dir: Path, record: dict[str, Any]) -> None:
    """A sweep job's result file, which the progress watcher and the summary read (``record`` has its
    ``status``, ``overrides`` and ``job``). A launcher writes it for a job whose process died first."""
    (output_dir / RESULT_FILE).write_text(json.dumps(record, indent=1))
    if record["status"] == "failed":
        log.error("job %s failed: %s", record["job"], record["error"])


class SweepSummary(Callback):
    """After a sweep: one table of every job, printed and written as summary.json and summary.csv.

    With ``bench=true`` each job also measured its artifact: latency columns are added, and the
    jobs on the Pareto front of build time, size and median latency (no other job at least as good
    in all three and better in one) are marked in the ``pareto`` column.
    """

    COLUMNS = ("job", "overrides", "status", "build_seconds", "size_bytes", "path", "error")

    def __getstate__(self) -> dict[str, Any]:
        """Launchers that run jobs elsewhere (submitit) pickle the callbacks; the watcher stays here."""
        return {k: v for k, v in self.__dict__.items() if k != "_progress"}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not Path(config.hydra.sweep.dir).exists():
            _new_sweep_dir.append(Path(config.hydra.sweep.dir))
        for stale in result_files(Path(config.hydra.sweep.dir)):  # a sweep run again in its directory
            stale.unlink(missing_ok=True)
        self._progress = SweepProgress(Path(config.hydra.sweep.dir), expected_jobs(config))
        self._progress.start()

    BENCH_COLUMNS = ("latency_ms", "p99_ms", "stalls", "cold_start_ms", "padding_overhead", "pareto")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if getattr(self, "_progress", None) is not None:
            self._progress.stop()
        sweep_dir = Path(config.hydra.sweep.dir)
        shutil.rmtree(sweep_dir / SHARED_INIT, ignore_errors=True)
        records = sorted((json.loads(path.read_text()) for path in result_files(sweep_dir)),
                         key=lambda r: r.get("job") if isinstance(r.get("job"), int) else 0)
        rows = [{c: data.get(c, "") for c in (*self.COLUMNS, *self.BENCH_COLUMNS)} for data in records]
        for row in rows:
            row["overrides"] = " ".join(row["overrides"]) if isinstance(row["overrides"], list) else row["overrides"]
        benched = any(r["latency_ms"] != "" for r in rows)
        columns = (*self.COLUMNS, *self.BENCH_COLUMNS) if benched else self.COLUMNS
        if benched:
            mark_pareto(rows, ("build_seconds", "size_bytes", "latency_ms"))
        rows = [{c: r[c] for c in columns} for r in rows]
        (sweep_dir / "summary.json").write_text(json.dumps(rows, indent=1))
        with open(sweep_dir / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        print(format_table(rows), flush=True)
        failed = sum(r["status"] == "failed" for r in rows)
        expected = expected_jobs(config)
        missing = max(0, (expected or 0) - len(rows))
        print(f"{len(rows)} builds, {failed} failed"
              + (f", {missing} of the {expected} jobs wrote no result (killed before they could, or their output "
                 f"went elsewhere: each job's log is under {sweep_dir})" if missing else "")
              + f"; summary: {sweep_dir / 'summary.json'}", flush=True)
        if failed or missing:
            sys.exit(1)  # after the summary: a CI job running the sweep must fail


class SweepProgress(threading.Thread):
    """Progress of a sweep in the driver, whatever the launcher: it watches the jobs' result files appear
    (in this process, in local subprocesses, or on cluster nodes sharing the sweep directory) and prints
    done/total, each failure as it happens, the time elapsed and an estimate of the time left."""

    POLL_SECONDS = 0.5

    def __init__(self, sweep_dir: Path, total: int | None):
        super().__init__(name="tripy_build-sweep-progress", daemon=True)
        self.sweep_dir, self.total = sweep_dir, total
        self.seen: set[Path] = set()
        self.failed = 0
        self.started = time.perf_counter()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.POLL_SECONDS):
            self.poll()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.poll()

    def poll(self) -> None:
        for path in sorted(set(result_files(self.sweep_dir)) - self.seen):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written: next poll
            self.seen.add(path)
            done = len(self.seen)
            elapsed = time.perf_counter() - self.started
            failure = ""
            if data.get("status") == "failed":
                self.failed += 1
                failure = f"; job {data.get('job', path.parent.name)} failed: {str(data.get('error', '')).splitlines()[0][:120]}"
            total = f"/{self.total}" if self.total else ""
            left = (f", ~{elapsed / done * (self.total - done):.0f} s left"
                    if self.total and done < self.total else "")
            print(f"[sweep] {done}{total} done, {self.failed} failed, {elapsed:.0f} s elapsed{left}{failure}", flush=True)


def result_files(sweep_dir: Path) -> list[Path]:
    """The jobs' result files, at any depth: ``hydra.sweep.subdir`` may nest (``${hydra.job.override_dirname}``
    with a path in an override)."""
    return list(sweep_dir.rglob(RESULT_FILE))


def expected_jobs(config: DictConfig) -> int | None:
    """How many jobs the sweep runs, where the driver can tell: Hydra's basic sweeper over the command
    line's overrides (other sweepers choose their jobs as they go)."""
    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != "hydra._internal.core_plugins.basic_sweeper.BasicSweeper" or sweeper.get("params"):
        return None
    return sweep_size(list(config.hydra.overrides.task))


def sweep_size(overrides: list[str]) -> int | None:
    """How many jobs a basic sweep of these overrides runs (None where a sweep needs Hydra's config
    loader to expand, such as ``glob``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    total = 1
    try:
        for o in OverridesParser.create().parse_overrides(overrides):
            if o.is_sweep_override():
                total *= len(list(o.sweep_iterator()))
    except Exception:  # noqa: BLE001 - Hydra raises several kinds for sweeps it cannot expand here
        return None
    return total


def mark_pareto(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Set ``pareto`` to ``*`` on rows no other row beats: at least as good in every key, better in one."""
    scored = [r for r in rows if all(isinstance(r.get(k), (int, float)) for k in keys)]
    for r in rows:
        r["pareto"] = ""
    for r in scored:
        if not any(all(o[k] <= r[k] for k in keys) and any(o[k] < r[k] for k in keys) for o in scored if o is not r):
            r["pareto"] = "*"


def format_table(rows: list[dict[str, Any]]) -> str:
    from ..artifact.layout import human_size

    benched = "latency_ms" in (rows[0] if rows else {})
    headers = ("job", "overrides", "status", "time s", "size", *(("p50 ms", "p99 ms", "stalls", "pareto") if benched else ()),
               "path / error")
    body = [
        (str(r["job"]), r["overrides"], r["status"], f"{r['build_seconds']}" if r["build_seconds"] != "" else "-",
         human_size(r["size_bytes"]) if r["size_bytes"] != "" else "-",
         *((str(r["latency_ms"] or "-"), str(r["p99_ms"] or "-"), str(r["stalls"] if r["stalls"] != "" else "-"),
            r["pareto"]) if benched else ()),
         r["path"] if r["status"] != "failed" else str(r["error"]).splitlines()[0][:100])
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, body)])
