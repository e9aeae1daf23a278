"""What a compiled CPU executable depends on, read off this host without importing jax.

An XLA CPU executable is native code for one jaxlib, machine and set of CPU features; XLA's own
loader only logs a feature mismatch and may then die on an illegal instruction. ``host_features``
records what a build depended on, ``incompatibility`` says why this host must not load it.
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


def incompatibility(recorded: dict[str, Any]) -> str | None:
    """Why an executable built with ``recorded`` dependencies must not be loaded here, or None."""
    host = host_features()
    if not tested_jax():
        return f"jax {host['jax']} is not a version this loader was tested with ({', '.join(TESTED_JAX_SERIES)}x)"
    for key in ("jaxlib", "machine", "system"):
        if recorded.get(key) != host[key]:
            return f"built for {key} {recorded.get(key)!r}, this host has {host[key]!r}"
    missing = sorted(set(recorded.get("cpu_features", "").split()) - set(host["cpu_features"].split()))
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        return f"built on a CPU with features this host lacks ({shown})"
    return None


