"""The settings of ``hydra/launcher=tripy_local`` (``hydra.launcher.<field>=...``)."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class TripyLocalLauncherConf:
    _target_: str = "hydra_plugins.tripy_build_launcher.launcher.TripyLocalLauncher"
    # how many jobs run at once; 0: one per CPU core (more only adds contention: a build compiles on
    # every core already). Lower it where builds need much memory: each worker holds one build
    workers: int = 0
    # a fresh process for every job instead of reusing workers (forked from a server that has the
    # imports done): each job's memory returned to the OS when it ends, at ~1 ms a job
    fresh_process_per_job: bool = False
    # each worker on a core of its own (Linux; when workers <= cores): XLA sizes its thread pools to the
    # cores a process may use, and unpinned builds ran pools as wide as the machine on the same cores
    pin_cores: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="tripy_local", node=TripyLocalLauncherConf,
                             provider="tripy_build")
