"""Executables compiled at run time, remembered across processes.

A shape that no profile covers is compiled from the artifact's exported program on first use. The
result is stored in a size-bounded directory managed by jax's own ``LRUCache`` (least recently used
entries are evicted, access is serialized with a file lock), so the next process that needs the same
shape deserializes it in milliseconds instead of compiling.

The key is a sha256 over named parts: the exported program's digest, the concrete input shapes and
dtypes, the platform, the compile options, jaxlib and ``XLA_FLAGS``, and the host's CPU. Keying on
the program's digest rather than on a fingerprint of the lowered module (what jax's global
persistent cache does) skips lowering on a hit, which alone costs 20-250 ms per shape here, and
leaves the process-wide jax configuration alone.

Settings: ``TRIPY_BUILD_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tripy_build/executables``; ``off``
disables the cache) and ``TRIPY_BUILD_CACHE_MAX_BYTES`` (default 2 GiB).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..host import cache_home

log = logging.getLogger(__name__)

ENV_DIR = "TRIPY_BUILD_CACHE_DIR"
ENV_MAX_BYTES = "TRIPY_BUILD_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
MAGIC = b"TBX1"


def default_dir() -> Path | None:
    configured = os.environ.get(ENV_DIR)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "none", "0") else Path(configured)
    return cache_home() / "executables"


def default_max_bytes() -> int:
    try:
        return int(os.environ.get(ENV_MAX_BYTES, DEFAULT_MAX_BYTES))
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", ENV_MAX_BYTES, os.environ[ENV_MAX_BYTES], DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES


def key(**parts: Any) -> str:
    """sha256 over the named parts (JSON, sorted keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class CompileCache:
    """A directory of serialized executables with their metadata, bounded in size."""

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None):
        from .. import jaxlib_api

        self.path = Path(path)
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self._store = jaxlib_api.lru_cache(str(self.path), self.max_bytes)

    def get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The executable's bytes and metadata, or None (also for an entry that does not check out)."""
        try:
            data = self._store.get(key)
        except Exception as e:  # noqa: BLE001 - a broken cache must never break a call
            log.warning("compile cache %s unreadable (%s); compiling instead", self.path, e)
            return None
        if data is None:
            return None
        try:
            if data[:4] != MAGIC:
                raise ValueError("bad magic")
            n = int.from_bytes(data[4:8], "little")
            header = json.loads(data[8:8 + n])
            blob = data[8 + n:]
            if hashlib.sha256(blob).hexdigest() != header["sha256"]:
                raise ValueError("digest mismatch")
            return blob, header["meta"]
        except (ValueError, KeyError, TypeError) as e:
            log.warning("compile cache entry %s is damaged (%s); compiling instead", key[:16], e)
            return None

    def put(self, key: str, blob: bytes, meta: dict[str, Any]) -> None:
        header = json.dumps({"sha256": hashlib.sha256(blob).hexdigest(), "meta": meta}).encode()
        try:
            self._store.put(key, MAGIC + len(header).to_bytes(4, "little") + header + blob)
        except Exception as e:  # noqa: BLE001
            log.warning("could not store in compile cache %s (%s)", self.path, e)


_shared: dict[tuple[str, int], CompileCache] = {}


def shared() -> CompileCache | None:
    """The process's cache for the default settings, or None when disabled."""
    path = default_dir()
    if path is None:
        return None
    slot = (str(path.absolute()), default_max_bytes())
    if slot not in _shared:
        try:
            _shared[slot] = CompileCache(path)
        except Exception as e:  # noqa: BLE001 - e.g. an unwritable directory: run without the cache
            log.warning("compile cache disabled: cannot use %s (%s)", path, e)
            return None
    return _shared[slot]
