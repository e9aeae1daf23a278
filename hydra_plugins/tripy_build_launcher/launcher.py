"""Runs a sweep's jobs on a pool of worker processes, one per core, that outlive a job.

Where the time went with other launchers, on 2 cores: a fresh process per job (submitit_local) pays
~1 s of imports (jax, Hydra, tripy_build) every time and starts every job at once; the default
launcher builds one job after another, and a build keeps only ~1.2 cores busy on average.

- **Workers are reused** and forked from a server that imported everything once (started while the
  sweeper checks the jobs' configs), so starting one costs ~1 ms. Reuse is safe because the only
  process-wide setting a build makes is the XLA CPU target (``target.cpu``, applied before jax
  starts): a sweep where any job sets it to other than ``host`` runs every job in a fresh process
  instead (still forked, so still cheap), and the build refuses a target it cannot apply, so a
  reused worker never builds with another job's settings.
- **Each job's config is composed once**: the composition the sweeper made to check it is kept for
  the launch.
- **Each worker runs on a core of its own** (``pin_cores``, where the OS lets a process choose:
  Linux). XLA sizes its thread pools to the cores a process may use; unpinned, two builds each ran
  pools as wide as the machine on the same cores. The 16-job sweep of bench/sweep_launchers.py, run
  in one process, used 54 s of CPU time free to use both cores and 42 s pinned to one (45 s and
  42 s of wall time), for the same bytes. A worker claims a core by holding an exclusive ``flock``
  on that core's file, so a worker that replaces another takes the core its predecessor left, and a
  killed worker's core is freed by the OS.
- **The largest jobs start first** (``estimated_work``), so that no worker is left alone with a long
  job at the end while the others idle. The summary lists the jobs in the sweep's order.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


def _task() -> TaskFunction:
    from tripy_build import cli

    return cli.main.__wrapped__  # the function under @hydra.main


def _run(plain: dict[str, Any]) -> JobReturn:
    """One job in a worker: Hydra's own ``run_job`` on the job's composed config.

    The config travels as plain containers: its schema classes (and so the driver's config loader) are
    made at run time and do not pickle, and ``run_job`` needs only the callbacks, made here from the
    config as Hydra makes them. The build validates the config against the schema again, as always.
    """
    from hydra._internal.callbacks import Callbacks

    from hydra.conf import HydraConf

    setup_globals()
    hydra_node = OmegaConf.structured(HydraConf)
    OmegaConf.set_struct(hydra_node, False)  # the composed node carries keys the schema lacks (hydra.env)
    hydra_node.merge_with(plain.pop("hydra"))
    config = OmegaConf.create(plain)
    with open_dict(config):
        config.hydra = hydra_node  # typed again: HydraConfig checks it
    hydra_context = HydraContext(config_loader=None, callbacks=Callbacks(config))  # type: ignore[arg-type]
    ret = run_job(hydra_context=hydra_context, task_function=_task(), config=config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    ret.return_value  # noqa: B018 - raises here if the job raised, so the driver gets the error
    return ret


class TripyLocalLauncher(Launcher):
    def __init__(self, workers: int = 0, fresh_process_per_job: bool = False, pin_cores: bool = True) -> None:
        self.workers = workers
        self.fresh = fresh_process_per_job
        self.pin_cores = pin_cores
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self._composed: dict[tuple[str, ...], DictConfig] = {}

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        _keep_compositions(hydra_context.config_loader, self._composed)
        if _context().get_start_method() == "forkserver":  # it imports while the sweeper checks the jobs' configs
            multiprocessing.forkserver.ensure_running()

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        target_set = any(o.lstrip("+").startswith("target.cpu=") and o.split("=", 1)[1] != "host"
                         for overrides in job_overrides for o in overrides)
        fresh = self.fresh or target_set or str(self.config.get("target", {}).get("cpu", "host")) != "host"
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        workers = min(len(job_overrides), self.workers or len(cores) or os.cpu_count() or 1)
        pin = self.pin_cores and hasattr(os, "sched_setaffinity") and 1 < len(cores) and workers <= len(cores)
        log.info(f"Launching {len(job_overrides)} jobs on {workers} worker process(es)"
                 + (", each on a core of its own" if pin else "")
                 + (", a fresh one per job (a job sets target.cpu)" if fresh and not self.fresh else ""))
        configs = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            cfg = self._composed.pop(tuple(overrides), None)
            if cfg is None:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = idx
                cfg.hydra.job.num = idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            configs.append(cfg)
        order = sorted(range(len(configs)), key=lambda i: -estimated_work(configs[i]))
        claims = tempfile.TemporaryDirectory(prefix="tripy-build-cores-")
        with claims, ProcessPoolExecutor(workers, mp_context=_context(), max_tasks_per_child=1 if fresh else None,
                                         initializer=_start_worker, initargs=(claims.name if pin else None, cores)) as pool:
            futures = {i: pool.submit(_run, OmegaConf.to_container(configs[i], resolve=False)) for i in order}
            results = [futures[i].result() for i in range(len(configs))]
        _stop_forkserver()
        return results


def _keep_compositions(loader: Any, composed: dict[tuple[str, ...], DictConfig]) -> None:
    """Keep what ``loader.load_sweep_config`` composes, for ``launch`` to take instead of composing again.

    Hydra's sweeper composes every job's config once to check it (``validate_batch_is_legal``) and a
    launcher composes it again: ~0.1 s per job here, in the driver, on a core the builds need.
    """
    compose = loader.load_sweep_config

    def load_sweep_config(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        composed[tuple(sweep_overrides)] = cfg = compose(master_config, sweep_overrides)
        return cfg

    loader.load_sweep_config = load_sweep_config


def estimated_work(cfg: DictConfig) -> float:
    """A job's work relative to the sweep's others, read from its config, to start the largest first.

    With the largest last, one worker finishes it alone while the others idle (measured: 4.5 s of a
    24 s sweep on one of two cores). The estimate is the number of shape profiles the ``shapes`` config
    allows (the product of its ranged dims' bucket counts, capped at ``max_profiles``: the dims a model
    uses are not known before it is traced), doubled for a reduced precision, whose float32 reference
    is compiled too. It orders the jobs and nothing else; a config it cannot read counts as 1, and the
    job reports what is wrong with it.
    """
    from tripy_build.profiles import DEFAULT_BUCKETS, resolve_buckets

    try:
        shapes = cfg.shapes
        count = 1
        for name, dim in shapes.dims.items():
            if OmegaConf.is_list(dim) and len(dim) == 3:
                policy = shapes.get("buckets", {}).get(name, DEFAULT_BUCKETS)
                policy = OmegaConf.to_object(policy) if OmegaConf.is_config(policy) else policy
                count *= max(1, len(resolve_buckets(policy, tuple(dim), name)))
        count = min(count, int(shapes.get("max_profiles") or count))
        dtype = cfg.precision.dtype
        return count * (2 if getattr(dtype, "value", dtype) != "float32" else 1)
    except Exception:  # noqa: BLE001 - ordering only: the job itself reports a bad config
        return 1


def _context() -> multiprocessing.context.BaseContext:
    """Workers forked from a server that has imported Hydra, jax and tripy_build once (where the OS has
    fork: 1 ms per worker instead of ~1 s of imports each). The server never starts jax's backend, so
    each worker starts its own, after its job's XLA settings (``target.cpu``) are applied."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "tripy_build.cli"])
    return context


def _stop_forkserver() -> None:
    """Stop and reap the fork server once the sweep is done rather than at exit, so that it and its
    workers are this process's children in its CPU accounting (``getrusage``), as spawned workers are."""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


_claimed: list[int] = []  # the descriptor holding this worker's core claim, open for the worker's life


def _start_worker(claims: str | None, cores: list[int]) -> None:
    """A worker's start: freeze what the fork server imported (the collector then skips those ~10^5
    objects in every full collection: ~0.1 s per build here), and claim a core unless ``claims`` is None."""
    gc.freeze()
    if claims is not None:
        claim_core(claims, cores)


def claim_core(claims: str, cores: list[int], wait_s: float = 30) -> int | None:
    """Pin this worker to a core no other worker holds, waiting up to ``wait_s`` for a predecessor to
    exit; the core, or None when it runs unpinned."""
    import fcntl  # POSIX only, as pinning is

    deadline = time.monotonic() + wait_s
    while True:
        for core in cores:
            fd = os.open(os.path.join(claims, str(core)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            _claimed.append(fd)
            os.sched_setaffinity(0, {core})
            return core
        if time.monotonic() > deadline:  # every core held past the deadline: run unpinned rather than wait
            log.warning("tripy_local: no free core to pin a worker to; it runs on all cores")
            return None
        time.sleep(0.05)
