"""Runs a sweep's jobs on a pool of worker processes, one per core, that outlive a job.

Where the time went with other launchers, on 2 cores: a fresh process per job (submitit_local) pays
~1 s of imports (jax, Hydra, tripy_build) every time and starts every job at once; the default
launcher builds one job after another, and a build keeps only ~1.2 cores busy on average.

- **Workers are reused** and forked from a server that imported everything once (started while the
  sweeper checks the jobs' configs), so starting one costs ~1 ms. Reuse is safe because a build sets
  nothing process-wide: even its CPU target (``target.cpu``) is a compile-only device of its own, not
  ``XLA_FLAGS``.
- **Each job's config is composed once**: the composition the sweeper made to check it is kept for
  the launch.
- **Each worker runs on a core of its own** (``pin_cores``, where the OS lets a process choose:
  Linux). XLA sizes its thread pools to the cores a process may use; unpinned, two builds each ran
  pools as wide as the machine on the same cores. The 16-job sweep of bench/sweep_launchers.py, run
  in one process, used 54 s of CPU time free to use both cores and 42 s pinned to one (45 s and
  42 s of wall time), for the same bytes.
- **The largest jobs start first** (``estimated_work``), so that no worker is left alone with a long
  job at the end while the others idle; among equally large jobs a worker takes **one of a model it
  has built** (``next_job``), whose init it keeps. The summary lists the jobs in the sweep's order.
- **A worker that dies fails only its job** (killed for memory, a crash in native code): the job is
  reported failed with how its process ended, a new worker takes the core, and the sweep goes on.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


def _task() -> TaskFunction:
    from tripy_build.cli import app as cli

    return cli.main.__wrapped__  # the function under @hydra.main


def _run(plain: dict[str, Any], resolved: dict[str, Any]) -> JobReturn:
    """One job in a worker: Hydra's own ``run_job`` on the job's composed config.

    The config travels as plain containers: its schema classes (and so the driver's config loader) are
    made at run time and do not pickle, and ``run_job`` needs only the callbacks, made here from the
    config as Hydra makes them. The build validates the config against the schema again, as always.
    ``resolved`` is the driver's resolver cache (``OmegaConf.get_cache``): ``${now:...}`` in Hydra's
    default ``hydra.sweep.dir`` resolves to the driver's time, not to each worker's, so every job
    writes under the one sweep directory the driver watches (Hydra's own launchers copy the cache the
    same way, in ``load_sweep_config``).
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
    OmegaConf.set_cache(config, resolved)
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
        from tripy_build.host import usable_cores

        cores = usable_cores()
        count = min(len(job_overrides), self.workers or len(cores))
        pin = self.pin_cores and hasattr(os, "sched_setaffinity") and 1 < len(cores) and count <= len(cores)
        log.info(f"Launching {len(job_overrides)} jobs on {count} worker process(es)"
                 + (", each on a core of its own" if pin else "")
                 + (", a fresh one per job" if self.fresh else ""))
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
        jobs = [_Job(OmegaConf.to_container(cfg, resolve=False), OmegaConf.get_cache(cfg), estimated_work(cfg),
                     model_key(cfg)) for cfg in configs]
        workers = [_Worker(cores[n] if pin else None, self.fresh) for n in range(count)]
        try:
            return run_jobs(jobs, workers, lambda i, why: _died(configs[i], why))
        finally:
            for worker in workers:
                worker.pool.shutdown(cancel_futures=True)
            _stop_forkserver()


class _Job(NamedTuple):  # not a dataclass: Hydra's plugin scan runs this module outside sys.modules
    plain: dict[str, Any]  # the composed config as plain containers (what pickles to a worker)
    resolved: dict[str, Any]  # its resolver cache: ${now:...} as the driver resolved it
    work: float  # estimated_work
    model: str  # model_key


class _Worker:
    """A worker process, on ``core`` unless None, and the models it has built (whose init it keeps).

    Each worker is a pool of one process, so that one that dies (killed for memory, a crash in native
    code) fails only the job it ran; it is replaced, on the same core."""

    def __init__(self, core: int | None, fresh: bool) -> None:
        self.core, self.fresh = core, fresh
        self.models: set[str] = set()
        self.pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=_context(), max_tasks_per_child=1 if self.fresh else None,
                                   initializer=_start_worker, initargs=(self.core,))

    def replace(self) -> str:
        """Start a new process after this one died; how it ended (its exit code)."""
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=True)
        self.pool, self.models = self._start(), set()
        code = next((p.exitcode for p in processes if p.exitcode is not None), None)
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name} (signal {-code})" + (
                ", as the out-of-memory killer does" if code == -signal.SIGKILL else "")
        return f"exit code {code}" if code is not None else "no exit code"


def run_jobs(jobs: Sequence[_Job], workers: Sequence[_Worker], died: Callable[[int, str], JobReturn]) -> list[JobReturn]:
    """Run every job on the workers, each next job chosen by ``next_job`` when a worker is free; the
    results in the jobs' order. A job whose worker died gets ``died(index, how)``."""
    pending = sorted(range(len(jobs)), key=lambda i: -jobs[i].work)
    busy: dict[Future, tuple[_Worker, int]] = {}
    results: list[Any] = [None] * len(jobs)
    while pending or busy:
        held = {id(w) for w, _ in busy.values()}
        for worker in workers:
            if pending and id(worker) not in held:
                others = set().union(*(o.models for o in workers if o is not worker))
                i = next_job(pending, jobs, worker.models, others)
                pending.remove(i)
                if not worker.fresh:
                    worker.models.add(jobs[i].model)
                busy[worker.pool.submit(_run, jobs[i].plain, jobs[i].resolved)] = (worker, i)
        done, _ = wait(busy, return_when=FIRST_COMPLETED)
        for future in done:
            worker, i = busy.pop(future)
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                results[i] = died(i, worker.replace())
    return results


def next_job(pending: Sequence[int], jobs: Sequence[_Job], mine: set[str], others: set[str]) -> int:
    """The job a free worker takes next: the largest pending (``pending`` is largest first), and among
    the equally large, one of a model this worker has built, else one of a model no other worker has.

    A worker keeps the inits it made (``tripy_build.builder.init_cache``), and the others read them from
    the sweep's shared init directory (~50 ms instead of 0.4-0.9 s for a zoo model); workers that start
    on different models do not make the same init at once. In the 16-job sweep of
    bench/sweep_launchers.py (two models) the two workers made four inits before, one per model now.
    """
    largest = [i for i in pending if jobs[i].work == jobs[pending[0]].work]
    for prefer in (lambda i: jobs[i].model in mine, lambda i: jobs[i].model not in others):
        chosen = next((i for i in largest if prefer(i)), None)
        if chosen is not None:
            return chosen
    return largest[0]


def model_key(cfg: DictConfig) -> str:
    """What a job's model init depends on in its config: the model and its params settings."""
    try:
        return json.dumps([OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                           for k in ("model", "params")], sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - scheduling only: the job itself reports a bad config
        return ""


def _died(cfg: DictConfig, how: str) -> JobReturn:
    """A failed result for a job whose worker process died before it could write one (its file too, for
    the progress and the summary): the sweep goes on, and ends with a non-zero exit as for any failure."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus

    from tripy_build.cli.sweep import write_result

    HydraConfig.instance().set_config(cfg)  # the sweep's subdir may interpolate the job's hydra keys
    output_dir = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir"))) / str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
    output_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(cfg.hydra.overrides.task)
    write_result(output_dir, {"status": "failed", "overrides": overrides, "job": cfg.hydra.job.num, "pid": None,
                              "error": f"the worker process building it died: {how}; the other jobs went on"})
    return JobReturn(overrides=overrides, cfg=cfg, hydra_cfg=cfg, working_dir=str(output_dir),
                     task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED)


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
    from tripy_build.core.profiles import DEFAULT_BUCKETS, resolve_buckets

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


# What the fork server imports: what a build imports, short of starting jax's backend (~0.16 s per
# worker more, imported on its first build otherwise). jax loads its LAPACK kernels from scipy.linalg
# when its CPU backend starts.
PRELOAD = [__name__, "tripy_build.cli.app", "tripy_build.compiler.pipeline", "tripy_build.runtime.save",
           "scipy.linalg"]


def _context() -> multiprocessing.context.BaseContext:
    """Workers forked from a server that has imported Hydra, jax and tripy_build once (where the OS has
    fork: 1 ms per worker instead of ~1 s of imports each). The server never starts jax's backend: each
    worker starts its own."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _stop_forkserver() -> None:
    """Stop and reap the fork server once the sweep is done rather than at exit, so that it and its
    workers are this process's children in its CPU accounting (``getrusage``), as spawned workers are."""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def _start_worker(core: int | None) -> None:
    """A worker's start: freeze what the fork server imported (the collector then skips those ~10^5
    objects in every full collection: ~0.1 s per build here), and pin it to ``core`` unless None."""
    gc.freeze()
    if core is not None:
        os.sched_setaffinity(0, {core})
