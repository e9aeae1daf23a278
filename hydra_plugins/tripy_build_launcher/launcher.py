"""Runs a sweep's jobs on a pool of worker processes that outlive a job.

A fresh process per job (submitit_local) pays for importing jax, Hydra and tripy_build every time
(~1.5 s here) and starts every job at once; on a 2-core machine that was slower than one job after
another. Here ``workers`` processes (default: one per core) take jobs from a queue, so the imports are
paid once per worker. Reuse is safe because the only process-wide setting a build makes is the XLA CPU
target (``target.cpu``, applied before jax starts): a sweep where any job sets it to other than
``host`` runs every job in a fresh process instead, and the build refuses a target it cannot apply,
so a reused worker can never build with another job's settings.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
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
    def __init__(self, workers: int = 0, fresh_process_per_job: bool = False) -> None:
        self.workers = workers
        self.fresh = fresh_process_per_job
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        target_set = any(o.lstrip("+").startswith("target.cpu=") and o.split("=", 1)[1] != "host"
                         for overrides in job_overrides for o in overrides)
        fresh = self.fresh or target_set or str(self.config.get("target", {}).get("cpu", "host")) != "host"
        workers = min(len(job_overrides), self.workers or os.cpu_count() or 1)
        log.info(f"Launching {len(job_overrides)} jobs on {workers} worker process(es)"
                 + (", a fresh one per job (a job sets target.cpu)" if fresh and not self.fresh else ""))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                 max_tasks_per_child=1 if fresh else None) as pool:
            if not fresh:  # the workers import jax and tripy_build while the jobs' configs are composed
                for _ in range(workers):
                    pool.submit(_warm)
            futures = []
            for i, overrides in enumerate(job_overrides):
                idx = initial_job_idx + i
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                with open_dict(cfg):
                    cfg.hydra.job.id = idx
                    cfg.hydra.job.num = idx
                log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                futures.append(pool.submit(_run, OmegaConf.to_container(cfg, resolve=False)))
            return [f.result() for f in futures]


def _warm() -> None:
    import jax

    _task()
    jax.devices()
