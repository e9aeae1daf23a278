"""Whether a precompiled executable in an artifact can run on this host, and if not, why.

An XLA executable is native code for one jaxlib and, on the CPU, one machine and set of CPU features (XLA's own
loader only logs a mismatch, then may die on an illegal instruction), on a GPU for one GPU model. Another jaxlib
or another GPU is a refusal (``refusal``: the loader raises, saying how to rebuild); a CPU without the features is
skipped with a warning, its shapes compiled from the portable program. An IREE module runs only on the IREE
runtime release that compiled it, on a CPU with the build host's features. Nothing here imports jax: the jax-free
runtime asks the same questions.
"""

from __future__ import annotations

from typing import Any

from ..host import host_features, host_isa, tested_jax
from ..jaxlib_api import TESTED
from .manifest import ExecutableEntry


class CompatibilityWarning(UserWarning):
    """A precompiled executable in an artifact cannot run on this host and was skipped."""


def refusal(entry: ExecutableEntry, client: Any = None) -> str | None:
    """Why an XLA executable must not be loaded here at all, or None: it was compiled by another jaxlib (XLA's
    executables load only in the jaxlib that compiled them; another may fail inside jaxlib or run wrong code), or,
    for a GPU, for another GPU model (``client``: the PJRT client that would run it, asked which GPU it has). The
    artifact's portable program still runs here, compiled for this machine (the loader's error says how)."""
    if not entry.is_xla:
        return None
    recorded, here = entry.depends_on, host_features()["jaxlib"]
    if recorded.get("jaxlib") and recorded["jaxlib"] != here:
        return (f"compiled by jaxlib {recorded['jaxlib']}, and this is jaxlib {here}: an XLA executable loads only in "
                "the jaxlib that compiled it")
    if entry.platform == "cuda" and recorded.get("gpu"):
        gpu = getattr(client.local_devices()[0], "device_kind", None) if client is not None else None
        if gpu != recorded["gpu"]:
            built = recorded.get("code") or f"compute capability {recorded.get('compute_capability')}"
            return f"compiled for the {recorded['gpu']} ({built}), and this machine's GPU is {gpu or 'not one'}"
    return None


def incompatibility(entry: ExecutableEntry, client: Any = None) -> str | None:
    """Why ``entry`` must not be loaded here, or None. ``client``: the PJRT client that would run an XLA CPU
    executable, asked which CPU features it compiles for."""
    if entry.is_iree:
        return _iree(entry.depends_on)
    if not entry.is_xla:
        return f"unknown executable format {entry.format!r}"
    return refusal(entry, client) or _xla(entry.depends_on, client if entry.platform == "cpu" else None)


def _xla(recorded: dict[str, Any], client: Any = None) -> str | None:
    """With the executable's own ``isa`` recorded and a PJRT ``client`` to ask, the features compared are
    LLVM's on both sides; otherwise the build host's ``/proc/cpuinfo`` flags against this host's."""
    host = host_features()
    if not tested_jax():
        return f"jaxlib {host['jaxlib']} is not a release this loader was tested with ({', '.join(TESTED)})"
    mismatch = _same_machine(recorded, ("machine", "system"))
    if mismatch:
        return mismatch
    here = host_isa(client) if client is not None and recorded.get("isa") is not None else None
    if here is not None:
        missing = missing_features(recorded["isa"], here["isa"])
        what = f"compiled for {recorded.get('target_cpu') or 'a CPU'} with features this host ({here['cpu']}) lacks"
    else:
        missing = missing_features(recorded.get("cpu_features", "").split(), host["cpu_features"].split())
        what = "built on a CPU with features this host lacks"
    return f"{what} ({missing})" if missing else None


def _iree(recorded: dict[str, Any]) -> str | None:
    """IREE's module format is versioned with the compiler, so the runtime must be the compiler's release;
    the module is compiled for the build host's CPU (``--iree-llvmcpu-target-cpu=host``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        runtime = version("iree-base-runtime")
    except PackageNotFoundError:
        return "an IREE module, and IREE is not installed here (pip install -e '.[iree]')"
    if recorded.get("iree-base-compiler") != runtime:
        return f"compiled by IREE {recorded.get('iree-base-compiler')}, this host has iree-base-runtime {runtime}"
    mismatch = _same_machine(recorded, ("machine", "system"))
    if mismatch:
        return mismatch
    missing = missing_features(recorded.get("cpu_features", "").split(), host_features()["cpu_features"].split())
    return f"compiled for a CPU with features this host lacks ({missing})" if missing else None


def _same_machine(recorded: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    here = host_features()
    for key in keys:
        if recorded.get(key) != here[key]:
            return f"built for {key} {recorded.get(key)!r}, this host has {here[key]!r}"
    return None


def missing_features(needed: Any, here: Any) -> str:
    """The features an executable needs that this host lacks, as text (``""`` when none), eight at most."""
    missing = sorted(set(needed) - set(here))
    return ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
