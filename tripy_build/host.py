"""What a compiled CPU executable depends on, read off this host without importing jax.

An XLA CPU executable is native code for one jaxlib, machine and set of CPU features; XLA's own
loader only logs a feature mismatch and may then die on an illegal instruction. ``host_features``
records what a build depended on, ``incompatibility`` says why this host must not load it.

The CPU features an executable needs are the ones LLVM compiled it for, which its bytes name (the
target triple, the CPU and ``+feature`` list): a build with ``--xla_cpu_max_isa=AVX2`` needs far
fewer than the build host has. This host's features are read the same way, in LLVM's names on any
operating system, from a tiny program compiled by the PJRT client (``host_isa``).
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from typing import Any

FORMAT = "pjrt-executable-v1"
TESTED_JAX_SERIES = ("0.10.",)


@lru_cache(maxsize=None)
def version(dist: str) -> str:
    """``jax.__version__`` or ``jaxlib.__version__`` without importing jax (``import jax`` takes ~0.5 s).

    Both packages keep their release version as a literal in ``<package>/version.py``; read it as text
    (``importlib.metadata`` costs ~30 ms of imports, a tenth of the runtime's whole start).
    """
    import importlib.util

    spec = importlib.util.find_spec(dist)
    if spec is not None and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                match = re.search(r"^_release_version: str = '([^']+)'", f.read(), re.M)
            if match:
                return match.group(1)
        except OSError:
            pass
    from importlib.metadata import version as dist_version

    return dist_version(dist)


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity where the OS has one; else every core)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def hostname() -> str:
    """This machine's name as temporary files carry it, so that builders sharing a folder never collide
    and each judges only its own host's temporaries by pid (``TRIPY_BUILD_HOSTNAME`` overrides it, for
    containers that share a name)."""
    import socket

    name = os.environ.get("TRIPY_BUILD_HOSTNAME") or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9.]", "_", name) or "host"


@lru_cache(maxsize=None)
def host_features() -> dict[str, Any]:
    """What an XLA CPU executable built here depends on: jaxlib, the machine and its CPU flags."""
    flags: list[str] = []
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("flags", "Features") and not flags:
                    flags = sorted(set(value.split()))
                elif key in ("model name", "CPU part") and not model:
                    model = value.strip()
    except OSError:
        pass
    return {
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_model": model,
        "cpu_features": " ".join(flags),
    }


def tested_jax() -> bool:
    """Whether this jax is a version whose executable wrapper ``load`` rebuilds was tested."""
    return version("jax").startswith(TESTED_JAX_SERIES)


# LLVM x86 "features" that only tune code generation; a CPU without them runs the code fine.
_TUNING = ("prefer-", "fast-", "slow-", "false-deps-", "idivl-", "idivq-", "lea-", "macrofusion", "branchfusion",
           "pad-short-functions", "sbb-dep-breaking", "allow-light-256-bit", "tuning-", "use-", "avoid-", "disable-",
           "branch-hint", "64bit-mode", "fast", "harden-", "retpoline", "lvi-", "seses", "soft-float")
_ISA = re.compile(rb"(\+64bit[+\-a-z0-9,._]*)")
_CPU = re.compile(rb"([a-z0-9_]+-[a-z0-9_]+-[a-z0-9_]+(?:-[a-z0-9_]+)?)[\x00-\x1f]{1,4}([a-z][a-z0-9._-]{2,40})[\x00-\x1f]")
PROBE = """module @tripy_build_probe {
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}"""


def target_of(blob: bytes) -> dict[str, Any] | None:
    """The CPU an XLA CPU executable was compiled for: ``{"cpu": ..., "isa": [features]}``, or None."""
    match = _ISA.search(blob)
    if match is None:
        return None
    features = [f[1:] for f in match.group(1).decode().split(",") if f.startswith("+")]
    cpu = _CPU.search(blob[:match.start()])
    return {"cpu": cpu.group(2).decode() if cpu else None,
            "isa": sorted(f for f in features if not f.startswith(_TUNING))}


_HOST_ISA: list[Any] = []


def host_isa(client: Any) -> dict[str, Any] | None:
    """This host's CPU in LLVM's terms, as XLA compiles for it (with this process's ``XLA_FLAGS``)."""
    if not _HOST_ISA:
        try:
            device = client.local_devices()[0]
            from jaxlib import _jax

            exe = client.compile_and_load(PROBE, _jax.DeviceList((device,)))
            _HOST_ISA.append(target_of(bytes(client.serialize_executable(exe))))
        except Exception:  # noqa: BLE001 - an API change: fall back to the /proc/cpuinfo flags
            _HOST_ISA.append(None)
    return _HOST_ISA[0]


def incompatibility(recorded: dict[str, Any], client: Any = None) -> str | None:
    """Why an executable built with ``recorded`` dependencies must not be loaded here, or None.

    With the executable's own ``isa`` recorded and a PJRT ``client`` to ask, the features compared
    are LLVM's on both sides; otherwise the build host's ``/proc/cpuinfo`` flags against this host's.
    """
    host = host_features()
    if not tested_jax():
        return f"jax {host['jax']} is not a version this loader was tested with ({', '.join(TESTED_JAX_SERIES)}x)"
    for key in ("jaxlib", "machine", "system"):
        if recorded.get(key) != host[key]:
            return f"built for {key} {recorded.get(key)!r}, this host has {host[key]!r}"
    here = host_isa(client) if client is not None and recorded.get("isa") is not None else None
    if here is not None:
        missing = sorted(set(recorded["isa"]) - set(here["isa"]))
        what = f"compiled for {recorded.get('target_cpu') or 'a CPU'} with features this host ({here['cpu']}) lacks"
    else:
        missing = sorted(set(recorded.get("cpu_features", "").split()) - set(host["cpu_features"].split()))
        what = "built on a CPU with features this host lacks"
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        return f"{what} ({shown})"
    return None


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
        from .errors import ConfigError

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
        from .errors import ConfigError

        raise ConfigError(
            f"target.cpu={target} compiles with {flag}, which XLA reads once, when its CPU backend starts, and this "
            f"process started it with XLA_FLAGS={current!r}. Build in a fresh process (a sweep: "
            "hydra/launcher=submitit_local runs each job in one), or start this one with XLA_FLAGS set."
        )
    os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()
