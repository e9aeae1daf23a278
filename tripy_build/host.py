"""Facts about this machine, read without importing jax: versions, CPU features, cores, its name and
cache folder. A leaf every layer may use (like ``errors``).

An XLA CPU executable is native code for one jaxlib, machine and set of CPU features: ``host_features``
records what a build depended on, and ``artifact.compat`` judges a host against it.

The CPU features an executable needs are the ones LLVM compiled it for, which its bytes name (the
target triple, the CPU and ``+feature`` list): a ``target.cpu=portable`` build needs x86-64-v3's, far
fewer than the build host has. This host's features are read the same way, in LLVM's names on any
operating system, from a tiny program compiled by the PJRT client (``host_isa``), once per jaxlib
build, CPU and ``XLA_FLAGS``: the answer is cached.
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from pathlib import Path
from typing import Any


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


def plugin_version() -> str | None:
    """The installed jax CUDA plugin's distribution and version (13's, else 12's: ``jax-cuda13-plugin 0.12.0.1``),
    or None."""
    from importlib.metadata import PackageNotFoundError

    for dist in ("jax_cuda13_plugin", "jax_cuda12_plugin"):
        try:
            return f"{dist.replace('_', '-')} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU its driver exposes (its device nodes), without asking CUDA."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def quiet_without_gpu() -> None:
    """On a machine with no NVIDIA GPU, let jax's CUDA plugin register without its CUDA version check.

    The check loads the CUDA libraries and counts the devices; with no GPU (or no libraries: the plugin
    alone, installed for deviceless builds) it fails, jax logs the traceback on every start and leaves the
    plugin out, so nothing could compile for a GPU. With no GPU there is nothing to check. It must run
    before jax starts its backends (``import tripy_build`` calls it); a value the user set is kept.
    """
    if not gpu_present():
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def cache_home() -> Path:
    """Where tripy_build keeps what it caches on this machine (the command memo, run-time compiles):
    ``$XDG_CACHE_HOME/tripy_build``, by default ``~/.cache/tripy_build``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tripy_build"


def return_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere). XLA's
    executables and buffers are freed into that heap, which keeps them: letting go of 14 loaded BERT-base
    profiles left the resident set at 1021 MB, and trimming then took it to 631."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: libc's where it has one
    except (OSError, AttributeError):
        return
    trim(0)


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
    model = ""
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
    # Only where /proc/cpuinfo names no model: on Linux platform.processor() runs `uname -p` in a
    # subprocess (3-7 ms of every runtime load) and most often answers "" or the machine.
    model = model or platform.processor()
    return {
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_model": model,
        "cpu_features": " ".join(flags),
    }


def tested_jax() -> bool:
    """Whether this jaxlib is of a series whose internals ``jaxlib_api`` calls were tested on."""
    from .jaxlib_api import TESTED_SERIES

    return version("jaxlib").startswith(TESTED_SERIES)


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
    """This host's CPU in LLVM's terms, as XLA compiles for it (with this process's ``XLA_FLAGS``).

    Learning it compiles a probe program (~30 ms, a sixth of the runtime's cold start), so the answer
    is kept per host in ``cache_home()/host_isa/``, under a key of everything it depends on: jaxlib's
    build (its version and its library's size and mtime), the CPU (model and flags) and ``XLA_FLAGS``.
    A cache entry that cannot be read or parsed is probed again and rewritten.
    """
    if not _HOST_ISA:
        cached = _isa_cache_path()
        answer = _read_isa(cached) if cached is not None else None
        if answer is None:
            answer = _probe_isa(client)
            if answer is not None and cached is not None:
                _write_isa(cached, answer)
        _HOST_ISA.append(answer)
    return _HOST_ISA[0]


def _probe_isa(client: Any) -> dict[str, Any] | None:
    from .jaxlib_api import compile_probe

    try:
        return target_of(compile_probe(client, PROBE))
    except Exception:  # noqa: BLE001 - an API change: fall back to the /proc/cpuinfo flags
        return None


def _isa_cache_path() -> Path | None:
    """Where the probe's answer for this jaxlib build, CPU and ``XLA_FLAGS`` is kept (None: no jaxlib)."""
    import importlib.util

    import blake3  # not hashlib: the runtime's load imports nothing else that needs it (3-4 ms)

    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.origin:
        return None
    parts = [version("jaxlib"), platform.machine(), os.environ.get("XLA_FLAGS", "")]
    for name in ("libjax_common.so", "_jax.so"):
        try:
            st = os.stat(os.path.join(os.path.dirname(spec.origin), name))
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    features = host_features()
    parts += [features["cpu_model"], features["cpu_features"]]
    key = blake3.blake3("\0".join(parts).encode()).hexdigest()[:32]
    return cache_home() / "host_isa" / f"{key}.json"


def _read_isa(path: Path) -> dict[str, Any] | None:
    import json

    try:
        answer = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(answer, dict) and isinstance(answer.get("isa"), list)
          and all(isinstance(f, str) for f in answer["isa"]) and isinstance(answer.get("cpu"), (str, type(None))))
    return {"cpu": answer["cpu"], "isa": list(answer["isa"])} if ok else None


def _write_isa(path: Path, answer: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file); a cache folder that cannot be written is no error."""
    import contextlib
    import json
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".isa-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(answer, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def toolchain() -> dict[str, Any]:
    """The versions a build depends on (part of the build key and the manifest)."""
    from .version import __version__

    return {
        "python": platform.python_version(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "tripy_build": __version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
