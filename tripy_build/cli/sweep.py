"""A sweep (``-m``) from the driver's side: progress as jobs finish, the summary table, exit 1 on a failure.

Each job, in whatever process or node the launcher runs it, writes its result to a file in its output
directory (``write_result``); the driver watches the sweep directory for them (``SweepProgress``) and,
at the end, gathers them into one table, written as ``summary.json`` and ``summary.csv``
(``SweepSummary``, Hydra's callback, named in ``conf/config.yaml``). Files, not return values: a job on a
cluster node or in a killed worker has no other way back, and on Hydra 1.3.8 a failed job skips
``on_multirun_end``'s return values anyway.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..artifact.describe import human_size, table

log = logging.getLogger("tripy_build")


RESULT_FILE = "build_result.json"
SHARED_INIT = ".shared-init"  # in the sweep directory, removed after the sweep
_new_sweep_dir: list[Path] = []  # the sweep directory, where this process's sweep made it


def remove_new_sweep_dir() -> None:
    """Remove the directory a sweep refused for its config made (Hydra's sweeper writes ``multirun.yaml``
    before it composes the jobs' configs), and the empty folders above it up to the working directory."""
    for sweep_dir in _new_sweep_dir:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        cwd, parent = Path.cwd().resolve(), sweep_dir.resolve().parent
        while parent != cwd and cwd in parent.parents and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


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
    return "\n".join(table(headers, body, indent=""))
