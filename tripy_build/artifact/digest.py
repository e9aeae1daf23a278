"""Sizes and digests of an artifact's files: what the manifest vouches for and readers check.

Files are recorded by BLAKE3 (``ALGORITHM``): checking every byte a loader uses is most of loading a
real model, and BLAKE3 hashes 5.2 GB/s on one core here against sha256's 1.0 (hashlib). BERT-base's
runtime load, 418 MB of weights: 540-550 ms with sha256, 350-360 with BLAKE3, 280-290 unchecked.
Artifacts before schema 5 record sha256, which readers still check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import blake3

from .layout import INDEX, MANIFEST

ALGORITHM = "blake3"
"""The digest new artifacts record each file by (the key beside ``size`` in its entry)."""


def _sha256(data: bytes | memoryview = b"") -> Any:
    import hashlib  # only artifacts from before schema 5 need it: 3 ms of the runtime's import otherwise

    return hashlib.sha256(data)


_HASHES: dict[str, Callable[..., Any]] = {"blake3": blake3.blake3, "sha256": _sha256}
ALGORITHMS = tuple(_HASHES)
"""Every digest a reader checks: ``ALGORITHM`` first, then those older artifacts recorded."""

_CHUNK = 1 << 20


def digest_bytes(data: bytes | memoryview, algorithm: str = ALGORITHM) -> str:
    return _HASHES[algorithm](data).hexdigest()


def digest_parts(parts: Sequence[bytes | memoryview], algorithm: str = ALGORITHM) -> str:
    """The digest of the parts' bytes one after another (a file written in parts: ``npy.NpyFile``)."""
    h = _HASHES[algorithm](b"")
    for part in parts:
        h.update(part)
    return h.hexdigest()


def digest_file(path: Path, algorithm: str = ALGORITHM) -> str:
    h = _HASHES[algorithm](b"")
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def recorded(entry: Mapping[str, Any]) -> tuple[str, Any]:
    """The digest a files-table entry records: ``(algorithm, hex)``; ``(ALGORITHM, None)`` when it has none
    (a damaged entry: no file's digest matches None)."""
    for algorithm in ALGORITHMS:
        if algorithm in entry:
            return algorithm, entry[algorithm]
    return ALGORITHM, None


def file_names(root: Path, prefixes: Sequence[str] | None = None) -> list[str]:
    """The files under ``root`` by relative POSIX path, sorted: all but manifest and index, or those under
    ``prefixes``."""
    names = (p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file())
    return [rel for rel in names
            if rel not in (MANIFEST, INDEX) and (prefixes is None or rel.startswith(tuple(prefixes)))]


def list_files(root: Path, prefixes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Size and digest of ``file_names(root, prefixes)``."""
    return {rel: {"size": (root / rel).stat().st_size, ALGORITHM: digest_file(root / rel)}
            for rel in file_names(root, prefixes)}
