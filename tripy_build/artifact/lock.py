"""The lock a loader holds while it reads an artifact, so that ``gc`` never removes one being read.

Loaders hold a shared ``flock`` on the manifest; removal takes it exclusively, without waiting, or
leaves the artifact. Where the OS has no advisory locks (Windows) removal relies on its one rename.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from .layout import MANIFEST

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Held by a loader while it reads an artifact: gc will not remove it meanwhile. Marks it used."""
    manifest = Path(path) / MANIFEST
    try:
        fd = os.open(manifest, os.O_RDONLY)
    except OSError:
        yield  # no manifest: the reader reports that itself
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
        touch(manifest)
    finally:
        os.close(fd)  # releases the lock


def touch(manifest: Path) -> None:
    """Record a use: the access time only (mtime and bytes stay as built); best effort on read-only media."""
    with contextlib.suppress(OSError):
        os.utime(manifest, ns=(time.time_ns(), manifest.stat().st_mtime_ns))


@contextlib.contextmanager
def removing(path: Path) -> Iterator[bool]:
    """Held while an artifact is moved aside for removal: True if no loader holds it (the exclusive lock was
    free, taken without waiting), False if one does and the artifact must stay."""
    try:
        fd = os.open(Path(path) / MANIFEST, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
        yield True
    finally:
        os.close(fd)
