"""Where things are in an artifact directory: the file names, the safe paths, which files reproduce.

An artifact is a directory: ``manifest.json`` (``manifest.Manifest``), ``index.json`` (the digests of
the files that do not reproduce byte for byte, and build facts that vary), the exported programs,
``weights/*.npy`` (raw, or prepared: ``prepared_*.npy``), ``executables/*`` and ``selftest/*``. See docs/artifact.md.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ArtifactError

MANIFEST = "manifest.json"
INDEX = "index.json"
INDEX_KIND = "tripy_build.index"
MAX_JSON_BYTES = 16 * 1024 * 1024  # a manifest or index larger than this is refused unread
UNSTABLE_PREFIXES = ("executables/",)  # files whose bytes vary between builds: listed in the index
PROGRAM_FILE = "program.jaxexport"
PREP_FILE = "prep.jaxexport"


def dumps(data: Any) -> bytes:
    """Canonical JSON: sorted keys, fixed separators, so equal manifests are equal bytes."""
    return (json.dumps(data, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def disk_size(path: Path) -> int:
    """The bytes an artifact takes on disk, every file counted (what ``gc`` frees and ``list`` shows)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def entry_prefix(name: str) -> str:
    """Where the files of the entry ``name`` of a multi-entry artifact lie (the main entry's are at the top)."""
    return f"entries/{name}/"


def unstable_prefixes(manifest: Any) -> tuple[str, ...]:
    """``UNSTABLE_PREFIXES``, at the top and in every other entry's folder."""
    return (*UNSTABLE_PREFIXES, *(entry_prefix(name) + p for name, _ in manifest.entries for p in UNSTABLE_PREFIXES))


def reproducible_files(manifest: Any) -> list[str]:
    """The files a rebuild of this artifact reproduces byte for byte: the manifest and every file it
    lists (all but those under ``UNSTABLE_PREFIXES`` and the index of their digests)."""
    return [MANIFEST, *sorted(manifest.files)]


def is_artifact(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def safe_relpath(rel: Any) -> PurePosixPath:
    p = PurePosixPath(rel) if isinstance(rel, str) else None
    if p is None or p.is_absolute() or ".." in p.parts or not p.parts or "\\" in rel:
        raise ArtifactError(f"manifest lists an unsafe file path {rel!r}; refusing to read it.")
    return p


def no_links(root: Path, rel: PurePosixPath) -> Path:
    """``root / rel``, refused if it or a directory on the way is a symbolic link: an artifact is read only
    from regular files inside it, so a link cannot point a loader at a file the digests never covered."""
    path = root
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise ArtifactError(f"{path}: is a symbolic link; artifacts are read only from regular files inside "
                                "them, never through links. Copy the artifact with its files (cp -rL).")
    return path


def executable_file(i: int, iree: bool) -> str:
    """The file of the ``i``-th precompiled executable (an IREE module or XLA's)."""
    return f"executables/{i}.{'vmfb' if iree else 'xla'}"


def prep_executable_file(n: int) -> str:
    return f"executables/prep_{n}.xla"


def weight_file(i: int) -> str:
    return f"weights/{i}.npy"


def prepared_file(k: int) -> str:
    """Where the prep program's output ``k`` is stored, for a chunk saved prepared (``PrepChunkEntry.at_rest``)."""
    return f"weights/prepared_{k}.npy"
