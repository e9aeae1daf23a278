"""Sizes and sha256 digests of an artifact's files: what the manifest vouches for and readers check."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

from .layout import INDEX, MANIFEST


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(root: Path, prefixes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Size and sha256 of the files under ``root`` (all but manifest and index, or those under ``prefixes``)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in (MANIFEST, INDEX) or (prefixes is not None and not rel.startswith(tuple(prefixes))):
            continue
        out[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out
