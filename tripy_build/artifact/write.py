"""Writing an artifact atomically, and clearing what killed writers left.

The artifact is assembled in a temporary sibling directory, fsynced and renamed into place, so a
reader sees a complete artifact or none; a replace swaps the old one aside first. Temporaries carry
their writer's pid and host, so that a later writer removes only those whose writer is gone.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from ..errors import ArtifactError
from ..host import hostname
from .digest import ALGORITHM, digest_bytes
from .layout import INDEX, INDEX_KIND, MANIFEST, dumps, is_artifact, unstable_prefixes
from .manifest import FileEntry, Manifest
from .npy import NpyFile


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temporary_prefix(target: Path, kind: str = "tmp") -> str:
    """``.<name>.<kind>-<pid>@<host>-``: how a temporary next to ``target`` is named, so that
    ``remove_stale_temporaries`` can tell whose it is (``kind``: ``tmp`` being written, ``old`` moved aside)."""
    return f".{target.name}.{kind}-{os.getpid()}@{hostname()}-"


FOREIGN_STALE_SECONDS = 6 * 3600  # another host's temporary this old is abandoned (its pid cannot be checked)


def remove_stale_temporaries(parent: Path) -> None:
    """Delete half-written artifacts left by builds that were killed (their process is gone), and put back
    an artifact a killed replace had moved aside but not yet replaced.

    Temporaries are named ``.<name>.tmp-<pid>@<host>-<random>`` (``.old-`` for a replace's): this host's
    are judged by whether their process lives, another host's (a shared folder) only by age.
    """
    import shutil
    import time

    here = hostname()
    for entry in [*parent.glob(".*.tmp-*-*"), *parent.glob(".*.old-*-*")]:
        kind = ".tmp-" if ".tmp-" in entry.name else ".old-"
        name, rest = entry.name[1:].rsplit(kind, 1)
        owner = rest.rsplit("-", 1)[0]
        pid, _, host = owner.partition("@")
        if not pid.isdigit():
            continue
        if (host or here) == here:
            if int(pid) == os.getpid() or _pid_alive(int(pid)):
                continue
        else:
            try:
                if time.time() - entry.stat().st_mtime < FOREIGN_STALE_SECONDS:
                    continue
            except OSError:
                continue
        previous = entry / "artifact"
        if kind == ".old-" and is_artifact(previous) and not (parent / name).exists():
            os.rename(previous, parent / name)  # killed between the two renames of a replace: put it back
        shutil.rmtree(entry, ignore_errors=True)


def write(path: str | os.PathLike, manifest: Manifest, files: dict[str, bytes | NpyFile], replace: bool = True,
          index_extra: dict[str, Any] | None = None) -> Path:
    """Write an artifact atomically: ``files`` by relative path (bytes, or an array's ``NpyFile``, made as it is
    written), then the index and the manifest.

    Files under ``UNSTABLE_PREFIXES`` (in every entry's folder too; XLA executables: not byte-reproducible) are listed in the
    sidecar ``index.json``, with ``index_extra`` (build facts that vary, such as compile times), so that
    ``manifest.json`` stays byte-identical across rebuilds. An existing artifact at ``path`` is
    replaced, or with ``replace=False`` kept (a concurrent build of the same content got there first);
    any other existing non-empty directory is refused.
    """
    import shutil
    import tempfile

    target = Path(path).absolute()
    if target.exists() and not (target.is_dir() and (is_artifact(target) or not any(target.iterdir()))):
        raise ArtifactError(
            f"cannot save to {str(target)!r}: it exists and is not a tripy_build artifact. "
            "Choose a new directory or remove it."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target.parent)
        tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(target), dir=target.parent))
    except OSError as e:
        raise ArtifactError(f"cannot write an artifact under {str(target.parent)!r}: {e.strerror or e}. Choose a "
                            "writable directory (artifacts_dir=... or save(path)).") from None
    try:
        everything = {}
        for rel, data in files.items():
            dest = tmp / PurePosixPath(rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            parts = data.parts() if isinstance(data, NpyFile) else [data]
            write_file(dest, parts)
            # digested from the bytes in hand: reading the files back would hash the same bytes from the page cache
            digest = data.digest(parts) if isinstance(data, NpyFile) else digest_bytes(data)
            everything[rel] = {"size": sum(len(p) for p in parts), ALGORITHM: digest}
            del parts
        everything = dict(sorted(everything.items()))
        covers = unstable_prefixes(manifest)
        unstable = {k: v for k, v in everything.items() if k.startswith(covers)}
        stable = {k: v for k, v in everything.items() if k not in unstable}
        write_file(tmp / INDEX, [dumps({**(index_extra or {}), "kind": INDEX_KIND, "files": unstable})])
        full = dataclasses.replace(manifest, files={k: FileEntry.from_json(v) for k, v in stable.items()},
                                   index={"file": INDEX, "covers": list(covers)})
        write_file(tmp / MANIFEST, [dumps(full.to_json())])
        _fsync_tree(tmp)
        os.chmod(tmp, 0o755)
        if replace:
            _replace_dir(tmp, target)
        else:
            try:
                os.rename(tmp, target)
            except OSError:
                if not is_artifact(target):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(target.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArtifactError(f"writing the artifact {str(target)!r} failed: {e.strerror or e}"
                            f"{f' ({e.filename})' if e.filename else ''}. Nothing was written; an artifact already "
                            "there is untouched.") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def write_file(path: Path, parts: Sequence[bytes | memoryview]) -> None:
    """One file of an artifact, from its parts in order (every file ``write`` makes goes through here)."""
    with open(path, "wb") as f:
        for part in parts:
            f.write(part)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an old artifact there is swapped out first and then deleted.

    Another process may be replacing the same target at the same moment: whichever of its renames
    comes between ours, we try again, so both end with a complete artifact at ``target``.
    """
    import shutil
    import tempfile

    for _ in range(100):
        try:
            os.rename(new, target)
            return
        except OSError:
            if not target.exists():
                continue  # moved aside by another writer between our rename and this check
        old = Path(tempfile.mkdtemp(prefix=temporary_prefix(target, "old"), dir=target.parent))
        try:
            os.rename(target, old / "artifact")
        except FileNotFoundError:
            shutil.rmtree(old, ignore_errors=True)
            continue  # another writer moved it first
        try:
            os.rename(new, target)
        except OSError:
            shutil.rmtree(old, ignore_errors=True)
            continue  # another writer's artifact landed in between: swap again
        shutil.rmtree(old, ignore_errors=True)
        return
    raise OSError(errno.EBUSY, f"{target}: replaced by other writers 100 times while this one tried", str(target))
