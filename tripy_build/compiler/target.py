"""``target.cpu``: the CPU a build's executables are for, as a ceiling on XLA's instruction set.

XLA reads ``--xla_cpu_max_isa`` from ``XLA_FLAGS`` once, when its CPU backend starts, so the setting
is applied to the environment before jax starts, or refused when the backend has started already.
"""

from __future__ import annotations

import os
import platform

from ..errors import ConfigError


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
