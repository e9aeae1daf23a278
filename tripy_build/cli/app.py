"""``python -m tripy_build [-m] KEY=VALUE ...``: the Hydra app, a thin layer over ``build``.

A single run prints the artifact and exits non-zero with a one-line error on a bad config. In a
sweep (``-m``) each job records its result in its output directory instead of raising, so one
failed job neither hides the others nor skips the summary (``sweep.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..builder import memo
from ..errors import ConfigError, TripyBuildError
from . import config
from .sweep import SHARED_INIT, remove_new_sweep_dir, write_result

VERSION_BASE = "1.3"
CONFIG_PATH = "pkg://tripy_build.conf"

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
    from .config_errors import DIM_DICTS, INPUT_DICTS, closest

    for override in HydraConfig.get().overrides.task:
        if override.startswith("+"):
            key = override.lstrip("+").split("=", 1)[0]
            if "@" in key or "/" in key or key in ("model", "shapes", "precision"):
                continue  # a config group choice, checked by Hydra itself
            if key.startswith(tuple(d + "." for d in DIM_DICTS)):
                continue  # a new dim in a dict keyed by dim names, checked against the model's dims
            if key in INPUT_DICTS or key.startswith(tuple(d + "." for d in INPUT_DICTS)):
                continue  # keyed by the model's input names, checked against its inputs by the build
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
    from ..builder.pipeline import build

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every step of a save at INFO
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    _check_added_keys(cfg)
    request = config.validate(cfg)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:  # the sweep's jobs, in any process, share a model's init
        request = dataclasses.replace(request, shared_init_dir=str(Path(hc.sweep.dir) / SHARED_INIT))
    t0 = time.perf_counter()
    result = build(request)
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
        remove_new_sweep_dir()
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


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
    except Exception as e:
        if not sweep:
            raise
        record = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    if sweep:
        record.pop("summary", None)
        write_result(Path(hc.runtime.output_dir), {**record, "overrides": overrides, "job": hc.job.num,
                                                   "pid": os.getpid()})


