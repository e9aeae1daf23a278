"""The machines a build's executables are for: ``target.cpu`` as a ceiling on XLA's instruction set, and the
device each platform is compiled on (``compile_plan``; ``target.gpu``'s GPUs are described in ``gpu``).

XLA reads ``--xla_cpu_max_isa`` from ``XLA_FLAGS`` once, when its CPU backend starts, so the setting
is applied to the environment before jax starts, or refused when the backend has started already.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ConfigError, SpecError
from ..runtime.xla import local_platform
from .gpu import HOST, compile_device, names as gpu_names, spec as gpu_spec


# ``target.cpu`` values: a ceiling on the instruction set XLA may use (``--xla_cpu_max_isa``).
CPU_TARGETS = {"x86_64": ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX"),
               "aarch64": ("NEON", "SVE", "SVE2")}


PORTABLE = {"x86_64": "AVX2", "aarch64": "NEON"}  # x86-64-v3: every x86 server CPU since 2013 has it


def max_isa(target: str) -> str | None:
    """The ``--xla_cpu_max_isa`` value for a ``target.cpu`` setting (None: compile for this host)."""
    if target == "host":
        return None
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    if target == "portable":
        return PORTABLE.get(machine)
    allowed = CPU_TARGETS.get(machine, ())
    if target.upper() not in allowed:
        raise ConfigError(f"target.cpu: {target!r} is not an instruction-set ceiling XLA knows on {machine}; use host, "
                          f"portable or one of {', '.join(allowed) or '(none on this machine)'}.")
    return target.upper()


def apply_cpu_target(target: str, backend_started: bool) -> None:
    """Put ``--xla_cpu_max_isa`` for ``target`` in ``XLA_FLAGS``: XLA reads it when its CPU backend starts."""
    isa = max_isa(target)
    if isa is None:
        return
    flag = f"--xla_cpu_max_isa={isa}"
    current = os.environ.get("XLA_FLAGS", "")
    if flag in current.split():
        return
    if backend_started or "--xla_cpu_max_isa" in current:
        raise ConfigError(
            f"target.cpu={target} compiles with {flag}, which XLA reads once, when its CPU backend starts, and this "
            f"process started it with XLA_FLAGS={current!r}. Build in a fresh process (a sweep: "
            "hydra/launcher=submitit_local runs each job in one), or start this one with XLA_FLAGS set."
        )
    os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()


@dataclass(frozen=True)
class CompilePlan:
    """Where each platform of a build is compiled: on a device of this machine, or for a described GPU."""

    devices: dict[str, Any]  # every build platform -> the jax device its executables are compiled for
    deviceless: dict[str, Any]  # the platforms compiled for a GPU that is not here -> its ``gpu.GpuSpec``
    run: str  # the platform whose executables this process runs: the padding proof, the precision measure, calls

    @property
    def twin(self) -> bool:
        """Whether no build platform runs here (a cuda build on a CPU machine): what runs is a twin program
        exported for this machine's CPU, whose executables are not saved."""
        return self.run not in self.devices


def compile_plan(platforms: Sequence[str], gpu_target: str = HOST) -> CompilePlan:
    """Which device each of ``platforms`` is compiled on: ``cuda`` on this machine's GPU where it has one and
    ``gpu_target`` is ``host`` or names that GPU, else for the GPU ``gpu_target`` describes (deviceless). What
    runs here is this machine's default platform where the build has it, else another the build has here,
    else the CPU (a twin)."""
    import jax

    here = local_platform()
    devices: dict[str, Any] = {}
    deviceless: dict[str, Any] = {}
    for p in platforms:
        if p != "cuda":
            devices[p] = jax.devices(p)[0]
            continue
        described = gpu_spec(gpu_target)
        local = jax.devices("cuda")[0] if here == "cuda" else None
        if described is None and local is None:
            raise SpecError(
                "backend includes cuda, and this machine has no NVIDIA GPU that jax can use: name the GPU to compile "
                f"for, e.g. target.gpu=h100 (one of {', '.join(gpu_names()[1:])}), or build on a machine with it.")
        if described is None or (local is not None and local.device_kind == described.name):
            devices[p] = local  # on the device itself: XLA autotunes
        else:
            devices[p], deviceless[p] = compile_device(described), described
    runnable = [p for p in platforms if p not in deviceless]
    run = here if here in runnable else (runnable[0] if runnable else "cpu")
    return CompilePlan(devices, deviceless, run)
