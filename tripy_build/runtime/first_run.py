"""The self-test at an artifact's first load on a GPU its executables were compiled for without.

A deviceless build (``backend=cuda target.gpu=h100`` on a machine with no GPU) runs nothing on that GPU: its
padding proof and reference outputs ran on the build machine's CPU. So the first time such an artifact is loaded
on its GPU, either loader (``tripy_build.load``, ``tripy_build.runtime.load``) runs its self-test there (every case
of every entry, through the executables just loaded) before returning it, and refuses it if any case fails. A
pass is remembered per artifact, GPU and jaxlib in ``host.cache_home()/first_run/``, so later loads (by either
loader) skip it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .. import host
from ..artifact import selftest
from ..artifact.manifest import Manifest
from ..artifact.read import read_files
from ..errors import ArtifactError

log = logging.getLogger(__name__)


def never_run_here(manifest: Manifest, platform: str) -> bool:
    """Whether the executables this machine would run were compiled without their device (never run at build)."""
    return any(e.platform == platform and e.depends_on.get("deviceless")
               for _, m in manifest.all_entries() for e in m.executables)


def _marker(root: Path, manifest: Manifest, device: str) -> Path:
    import blake3

    files = json.dumps({rel: e.to_json() for rel, e in sorted(manifest.files.items())}, sort_keys=True)
    key = blake3.blake3("\0".join([files, device, host.version("jaxlib")]).encode()).hexdigest()[:32]
    return host.cache_home() / "first_run" / f"{key}.ok"


def selftest_once(root: Path, manifest: Manifest, executables: dict[str, Any], device: str) -> None:
    """Run every entry's self-test through ``executables`` (entry name -> ``Executable``; "" for a single function)
    unless it passed on this ``device`` (its name) before; ``ArtifactError`` naming the first case that fails.
    ``executables``: either loader's (``call_flat`` returns the flat outputs); nothing here imports jax."""
    marker = _marker(root, manifest, device)
    if marker.exists():
        return
    for name, m in manifest.all_entries():
        files = read_files(root, selftest.file_names(m.selftest))[1]
        exe = executables[name]
        for case, rtol, atol in selftest.from_files(list(m.selftest), files):
            ok, err = selftest.check(exe.call_flat, case, rtol, atol)
            if not ok:
                where = f"entry {name!r}, " if name else ""
                raise ArtifactError(
                    f"{root}: its self-test fails at its first load on this {device} ({where}case {case.name!r}: max abs "
                    f"error {err:.3g}, tolerance rtol {rtol:g}, atol {atol:g}): the executables compiled for it without "
                    f"the GPU compute something else here. Rebuild the artifact on this machine (tripy-build rebuild "
                    f"{root}).")
    log.info("%s: self-test passed at its first load on this %s", root, device)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(device + "\n")
    except OSError as e:  # an unwritable cache only means the next load tests again
        log.warning("could not remember the passed self-test in %s (%s)", marker, e)
