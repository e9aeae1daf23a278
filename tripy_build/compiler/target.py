"""The machines a build's executables are for: ``target.cpu``'s CPUs, and the device each platform is compiled on
(``compile_plan``; ``target.gpu``'s GPUs are described in ``gpu``).

``target.cpu=host`` compiles for this machine's CPU, every feature it has. Any other value names a baseline: an
LLVM CPU and the exact feature list its code may use (x86-64's psABI levels; ``portable`` is x86-64-v3 on x86
and NEON on arm64), compiled for on a compile-only device (``jaxlib_api.cpu_compile_device``), so what is
recorded and what a loader checks is the baseline's list whatever CPU built it. XLA's ``--xla_cpu_max_isa``
is no substitute: it only takes the host's features above a level away, which leaves an AMD host's own
(``sse4a``, ``clzero``) and those of its level (``sha``, ``vaes``) in the code an Intel server would refuse.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from typing import Any, Sequence

from .. import jaxlib_api
from ..errors import ConfigError, SpecError
from ..runtime.xla import local_platform
from .gpu import HOST, compile_device, names as gpu_names, spec as gpu_spec


_X86_V2 = "64bit cmov cx8 fxsr mmx sse sse2 cx16 crc32 popcnt sahf sse3 ssse3 sse4.1 sse4.2"
_X86_V3 = f"{_X86_V2} avx avx2 bmi bmi2 f16c fma lzcnt movbe xsave"
_X86_V4 = f"{_X86_V3} avx512f avx512bw avx512cd avx512dq avx512vl"
# ``target.cpu`` names -> (LLVM's CPU, the features its code may use), per machine: x86-64's levels as the
# x86-64 psABI defines them (v3: every x86 server CPU since 2013, Intel Haswell and AMD Zen 1 on).
CPU_BASELINES = {
    "x86_64": {"x86-64-v2": ("x86-64-v2", _X86_V2), "x86-64-v3": ("x86-64-v3", _X86_V3),
               "x86-64-v4": ("x86-64-v4", _X86_V4)},
    "aarch64": {"armv8-a": ("generic", "fp-armv8 neon")},
}
PORTABLE = {"x86_64": "x86-64-v3", "aarch64": "armv8-a"}


def machine() -> str:
    return platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")


def cpu_names() -> list[str]:
    """The ``target.cpu`` values this machine can build for."""
    return ["host", "portable", *CPU_BASELINES.get(machine(), {})]


def cpu_baseline(target: str) -> tuple[str, list[str]] | None:
    """The LLVM CPU and features ``target.cpu=target`` compiles for (None: this host's CPU)."""
    if target == "host":
        return None
    here = machine()
    name = PORTABLE.get(here) if target == "portable" else target
    if name not in CPU_BASELINES.get(here, {}):
        raise ConfigError(f"target.cpu: {target!r} is not a CPU baseline for {here}; use one of "
                          f"{', '.join(cpu_names())}.")
    cpu, features = CPU_BASELINES[here][name]
    return cpu, sorted(features.split())


@functools.lru_cache(maxsize=None)
def cpu_device(target: str) -> Any:
    """The compile-only device ``target.cpu=target`` compiles on (None for ``host``: this CPU's device)."""
    baseline = cpu_baseline(target)
    if baseline is None:
        return None
    cpu, features = baseline
    return jaxlib_api.cpu_compile_device(cpu, ",".join(f"+{f}" for f in features))


@dataclass(frozen=True)
class CompilePlan:
    """Where each platform of a build is compiled: on a device of this machine, or for a described GPU."""

    devices: dict[str, Any]  # every build platform -> the jax device its executables are compiled for
    deviceless: dict[str, Any]  # the platforms compiled for a GPU that is not here -> its ``gpu.GpuSpec``
    run: str  # the platform whose executables this process runs: the padding proof, the precision measure, calls
    cpu: str = "host"  # ``target.cpu``: where not ``host``, the CPU executables are compiled on a compile-only device

    @property
    def twin(self) -> bool:
        """Whether no build platform runs here (a cuda build on a CPU machine): what runs is a twin program
        exported for this machine's CPU, whose executables are not saved."""
        return self.run not in self.devices


def compile_plan(platforms: Sequence[str], gpu_target: str = HOST, cpu_target: str = "host") -> CompilePlan:
    """Which device each of ``platforms`` is compiled on: ``cuda`` on this machine's GPU where it has one and
    ``gpu_target`` is ``host`` or names that GPU, else for the GPU ``gpu_target`` describes (deviceless); ``cpu``
    on this machine's CPU, or for the baseline ``cpu_target`` names (its executables run here once loaded from
    their bytes). What runs here is this machine's default platform where the build has it, else another the
    build has here, else the CPU (a twin)."""
    import jax

    here = local_platform()
    devices: dict[str, Any] = {}
    deviceless: dict[str, Any] = {}
    for p in platforms:
        if p != "cuda":
            devices[p] = (p == "cpu" and cpu_device(cpu_target)) or jax.devices(p)[0]
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
    return CompilePlan(devices, deviceless, run, cpu_target)
