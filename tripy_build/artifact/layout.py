"""The artifact format on disk: a directory with ``manifest.json`` and the files it lists.

Writing is atomic: the artifact is assembled in a temporary sibling directory, fsynced and renamed
into place, so a reader sees a complete artifact or none. Reading checks the schema version and every
file's size and sha256 before anything is deserialized, and never unpickles. See docs/artifact.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from ..errors import ArtifactError
from ..host import hostname

SCHEMA_VERSION = 3
MANIFEST = "manifest.json"
MAX_JSON_BYTES = 16 * 1024 * 1024  # a manifest or index larger than this is refused unread
INDEX = "index.json"
KIND = "tripy_build.artifact"
INDEX_KIND = "tripy_build.index"
UNSTABLE_PREFIXES = ("executables/",)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dumps(data: Any) -> bytes:
    """Canonical JSON: sorted keys, fixed separators, so equal manifests are equal bytes."""
    return (json.dumps(data, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def list_files(root: Path, prefixes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Size and sha256 of the files under ``root`` (all but manifest and index, or those under ``prefixes``)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in (MANIFEST, INDEX) or (prefixes is not None and not rel.startswith(tuple(prefixes))):
            continue
        out[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def disk_size(path: Path) -> int:
    """The bytes an artifact takes on disk, every file counted (what ``gc`` frees and ``list`` shows)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def human_size(n: float) -> str:
    """``9.0 MB``: a byte count as every command shows it, in units of 1024 (as ``gc --max-bytes 2G`` reads it)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def spec_text(spec: dict[str, Any]) -> str:
    """``float32[batch=[1..64, opt 8], 512]``: a manifest tensor spec in one line."""
    dims = []
    for lo, opt, hi, name in zip(spec["min"], spec["opt"], spec["max"], spec["dim_names"]):
        dims.append(str(lo) if lo == hi else f"{name + '=' if name else ''}[{lo}..{hi}, opt {opt}]")
    return f"{spec['dtype']}[{', '.join(dims)}]"


def reproducible_files(manifest: dict[str, Any]) -> list[str]:
    """The files a rebuild of this artifact reproduces byte for byte: the manifest and every file it
    lists (all but those under ``UNSTABLE_PREFIXES`` and the index of their digests)."""
    return [MANIFEST, *sorted(manifest.get("files", {}))]


def reproducible_tree(root: Path) -> dict[str, bytes]:
    """The reproducible files of every artifact under ``root``, by path relative to it: what two builds
    of the same configs must agree on byte for byte."""
    return {str((m.parent / rel).relative_to(root)): (m.parent / rel).read_bytes()
            for m in sorted(Path(root).rglob(MANIFEST)) for rel in reproducible_files(read_manifest(m.parent))}


def is_artifact(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


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


def write(path: str | os.PathLike, manifest: dict[str, Any], files: dict[str, bytes], replace: bool = True,
          index_extra: dict[str, Any] | None = None) -> Path:
    """Write an artifact atomically: ``files`` by relative path, then the index and the manifest.

    Files under ``UNSTABLE_PREFIXES`` (XLA executables: not byte-reproducible) are listed in the
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
        for rel, data in files.items():
            dest = tmp / PurePosixPath(rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        everything = list_files(tmp)
        unstable = {k: v for k, v in everything.items() if k.startswith(UNSTABLE_PREFIXES)}
        stable = {k: v for k, v in everything.items() if k not in unstable}
        (tmp / INDEX).write_bytes(dumps({**(index_extra or {}), "kind": INDEX_KIND, "files": unstable}))
        full = dict(manifest, schema_version=SCHEMA_VERSION, kind=KIND, files=stable,
                    index={"file": INDEX, "covers": list(UNSTABLE_PREFIXES)})
        (tmp / MANIFEST).write_bytes(dumps(full))
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


def _parse_json(path: Path, what: str) -> Any:
    """A manifest or index, bounded: at most ``MAX_JSON_BYTES`` and no deeper than Python can parse."""
    no_links(path.parent, PurePosixPath(path.name))
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ArtifactError(f"{path}: {size} bytes, over the {MAX_JSON_BYTES} a {what} may have (a real one is "
                            "kilobytes); refusing to parse it.")
    try:
        return json.loads(path.read_bytes())
    except RecursionError:
        raise ArtifactError(f"{path}: nested too deeply to be a {what}; the artifact is damaged.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e}); the artifact is damaged.") from None


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(
            f"{str(root)!r} is not a tripy_build artifact: {MANIFEST} is missing. "
            "Pass the directory that Executable.save() or the build command wrote."
        )
    manifest = _parse_json(mpath, "manifest")
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ArtifactError(f"{mpath}: not a tripy_build manifest (kind is {manifest.get('kind') if isinstance(manifest, dict) else None!r}).")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"{mpath}: schema_version {version!r} is not supported; this tripy_build reads version "
            f"{SCHEMA_VERSION}. Rebuild the artifact or use a matching tripy_build."
        )
    return manifest


def _check_entries(root: Path, listed: dict[str, Any], where: str, names: Sequence[str]) -> dict[str, bytes]:
    contents: dict[str, bytes] = {}
    for rel, entry in listed.items():
        fpath = no_links(root, safe_relpath(rel))
        if not isinstance(entry, dict):
            raise ArtifactError(f"{root / where}: malformed entry for {rel!r}; the artifact is damaged.")
        if not fpath.is_file():
            raise ArtifactError(f"{fpath}: listed in {where} but missing; the artifact is incomplete.")
        data = fpath.read_bytes() if rel in names else None
        size = len(data) if data is not None else fpath.stat().st_size
        if size != entry.get("size"):
            raise ArtifactError(f"{fpath}: size {size} does not match {where} ({entry.get('size')}); "
                                "the artifact is damaged or was modified.")
        digest = sha256_bytes(data) if data is not None else sha256_file(fpath)
        if digest != entry.get("sha256"):
            raise ArtifactError(f"{fpath}: sha256 {digest[:16]}... does not match {where} "
                                f"({str(entry.get('sha256'))[:16]}...); the artifact is damaged or was modified.")
        if data is not None:
            contents[rel] = data
    return contents


def read_index(root: Path, manifest: dict[str, Any], table: str = "files") -> dict[str, Any]:
    """The sidecar index's file table (or another ``table`` in it, such as ``compile_seconds``).

    Every path in its file table must lie under a prefix the manifest names.
    """
    spec = manifest.get("index")
    if not isinstance(spec, dict) or spec.get("file") != INDEX:
        raise ArtifactError(f"{root / MANIFEST}: no 'index' entry; the artifact is damaged.")
    ipath = root / INDEX
    try:
        index = _parse_json(ipath, "index")
    except FileNotFoundError:
        raise ArtifactError(f"{ipath}: missing; the artifact is incomplete.") from None
    if not isinstance(index, dict) or index.get("kind") != INDEX_KIND or not isinstance(index.get("files"), dict):
        raise ArtifactError(f"{ipath}: not a tripy_build index; the artifact is damaged.")
    covers = tuple(spec.get("covers") or ())
    for rel in index["files"]:
        if not isinstance(rel, str) or not rel.startswith(covers):
            raise ArtifactError(f"{ipath}: lists {rel!r}, outside the prefixes the manifest delegates to it ({', '.join(covers)}).")
    extra = index.get(table, {})
    return extra if isinstance(extra, dict) else {}


def read(path: str | os.PathLike, names: Sequence[str], prefixes: Sequence[str] | None = None,
         manifest: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and the bytes of ``names``, after checking digests.

    Every listed file is checked, or with ``prefixes`` given only ``names`` and the files under those
    prefixes: a loader checks what it deserializes, ``verify`` checks everything. A ``manifest``
    already read by ``read_manifest`` is not read again.
    """
    root = Path(path)
    manifest = manifest if manifest is not None else read_manifest(root)
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise ArtifactError(f"{root / MANIFEST}: no 'files' table; the artifact is damaged.")
    index = read_index(root, manifest)
    for rel in [*listed, *index]:
        safe_relpath(rel)

    def wanted(table: dict[str, Any]) -> dict[str, Any]:
        if prefixes is None:
            return table
        return {k: v for k, v in table.items() if k in names or k.startswith(tuple(prefixes))}

    contents = _check_entries(root, wanted(listed), MANIFEST, names)
    contents.update(_check_entries(root, wanted(index), INDEX, names))
    for rel in names:
        if rel not in contents:
            raise ArtifactError(f"{root / MANIFEST}: does not list {rel!r}, which this artifact needs.")
    return manifest, contents


def verify_files(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest, after checking every listed file's size and digest."""
    return read(path, [])[0]


def unlisted_files(path: str | os.PathLike) -> list[str]:
    """Files in the artifact that neither the manifest nor the index vouches for."""
    root = Path(path)
    manifest = read_manifest(root)
    known = set(manifest.get("files", {})) | set(read_index(root, manifest))
    return [rel for rel in list_files(root) if rel not in known]
