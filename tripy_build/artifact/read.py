"""Reading an artifact: its manifest parsed into a ``Manifest``, and every file a reader uses checked.

The manifest's kind and schema version are checked before anything else, and every file's size and
digest before its bytes are used; nothing is unpickled and nothing is read through a link.
``read_contents`` is what both loaders start from: the manifest and the checked bytes of every file
they deserialize, read while holding the reader's lock (``lock.reading``); the weights are read and
checked one by one as the loader places them (``Contents.take_weight``).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..core.spec import count_leaves, rebuild
from ..errors import ArtifactError
from . import crosscheck
from .compat import CompatibilityWarning, incompatibility, refusal
from .digest import digest_bytes, digest_file, file_names, recorded
from .layout import INDEX, INDEX_KIND, MANIFEST, MAX_JSON_BYTES, no_links, reproducible_files, safe_relpath
from .lock import reading
from .manifest import KIND, READABLE_VERSIONS, ExecutableEntry, Manifest, WeightEntry
from .npy import from_npy

READ_AHEAD_BYTES = 32 << 20
"""Weights read and checked before a loader takes them (``Contents.take_weights``). Measured on BERT-base
(418 MB) with tripy_build.runtime: none ahead, load 840-890 ms and a peak 1.30-1.33x the weights over the
process's own RSS; 32 MiB, 680-700 ms and 1.28-1.36x; 64 MiB, 700-730 ms and 1.38-1.43x."""


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


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The artifact's ``Manifest``: its kind and schema version checked, every field parsed."""
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(
            f"{str(root)!r} is not a tripy_build artifact: {MANIFEST} is missing. "
            "Pass the directory that Executable.save() or the build command wrote."
        )
    manifest = _parse_json(mpath, "manifest")
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{mpath}: not a tripy_build manifest (kind is {kind!r}).")
    version = manifest.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ArtifactError(
            f"{mpath}: schema_version {version!r} is not supported; this tripy_build reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Rebuild the artifact or use a matching tripy_build."
        )
    if not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"{mpath}: no 'files' table; the artifact is damaged.")
    return Manifest.from_json(manifest, str(mpath))


ALIGNED_MIN_BYTES = 64 << 10
"""An ``.npy`` file at least this large is read into memory of its own, page-aligned (``read_file``)."""


def read_file(fpath: Path) -> bytes | memoryview:
    """A file's bytes; an ``.npy`` file of ``ALIGNED_MIN_BYTES`` or more as a read-only view of anonymous memory.

    ``.npy`` puts an array's data at a multiple of 64 bytes into the file, so in page-aligned memory the
    array is 64-byte aligned, and XLA's CPU client then uses it as the device buffer where it would
    otherwise copy it on its worker threads: the weights are held once, and placing them copies
    nothing (runtime loader, peak RSS over the process's: BERT-base 1.24x the weights -> 1.10x, load
    325 -> 245 ms; GPT-2 small with ``tb.load`` 1.36-1.40x -> 1.16x). The memory is ``mmap``'s default
    anonymous mapping, a shared one, which the kernel backs with huge pages only where ``shmem_enabled`` says
    so (by default never), rather than numpy's: numpy asks for huge pages on large arrays, and zeroing those
    on first touch took BERT's load to 410-700 ms here.
    """
    size = fpath.stat().st_size
    if not fpath.name.endswith(".npy") or size < ALIGNED_MIN_BYTES:
        return fpath.read_bytes()
    view = memoryview(mmap.mmap(-1, size))
    n = 0
    with open(fpath, "rb", buffering=0) as f:  # one read(2) returns at most 0x7ffff000 bytes on Linux: a >2 GiB
        while n < size and (got := f.readinto(view[n:])):  # weight (Llama-3-8B's embeddings) takes several
            n += got
    return view[:n].toreadonly()


def check_digests(root: Path, listed: dict[str, Any], where: str,
                  names: Sequence[str]) -> dict[str, bytes | memoryview]:
    """Each listed file's size and digest against its entry in ``where``; the bytes of those in ``names``."""
    contents: dict[str, bytes | memoryview] = {}
    for rel, entry in listed.items():
        fpath = no_links(root, safe_relpath(rel))
        if not isinstance(entry, dict):
            raise ArtifactError(f"{root / where}: malformed entry for {rel!r}; the artifact is damaged.")
        if not fpath.is_file():
            raise ArtifactError(f"{fpath}: listed in {where} but missing; the artifact is incomplete.")
        data = read_file(fpath) if rel in names else None
        size = len(data) if data is not None else fpath.stat().st_size
        if size != entry.get("size"):
            raise ArtifactError(f"{fpath}: size {size} does not match {where} ({entry.get('size')}); "
                                "the artifact is damaged or was modified.")
        algorithm, expected = recorded(entry)
        digest = digest_bytes(data, algorithm) if data is not None else digest_file(fpath, algorithm)
        if digest != expected:
            raise ArtifactError(f"{fpath}: {algorithm} {digest[:16]}... does not match {where} "
                                f"({str(expected)[:16]}...); the artifact is damaged or was modified.")
        if data is not None:
            contents[rel] = data
    return contents


def read_index(root: Path, manifest: Manifest, table: str = "files") -> dict[str, Any]:
    """The sidecar index's file table (or another ``table`` in it, such as ``compile_seconds``).

    Every path in its file table must lie under a prefix the manifest names.
    """
    spec = manifest.index
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
            raise ArtifactError(f"{ipath}: lists {rel!r}, outside the prefixes the manifest delegates to it "
                                f"({', '.join(covers)}).")
    extra = index.get(table, {})
    return extra if isinstance(extra, dict) else {}


def file_tables(root: Path, manifest: Manifest) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the manifest and its sidecar index vouch for: each file's size and digest, every path checked."""
    listed = {rel: e.to_json() for rel, e in manifest.files.items()}
    index = read_index(root, manifest)
    for rel in [*listed, *index]:
        safe_relpath(rel)
    return listed, index


def read_files(path: str | os.PathLike, names: Sequence[str], prefixes: Sequence[str] | None = None,
               manifest: Manifest | None = None,
               tables: tuple[dict[str, Any], dict[str, Any]] | None = None) -> tuple[Manifest, dict[str, bytes | memoryview]]:
    """The manifest and the bytes of ``names``, after checking digests.

    Every listed file is checked, or with ``prefixes`` given only ``names`` and the files under those
    prefixes: a loader checks what it deserializes, ``verify`` checks everything. A ``manifest``
    already read by ``read_manifest`` is not read again, nor its ``file_tables`` when given.
    """
    root = Path(path)
    manifest = manifest if manifest is not None else read_manifest(root)
    listed, index = tables if tables is not None else file_tables(root, manifest)

    def wanted(table: dict[str, Any]) -> dict[str, Any]:
        if prefixes is None:
            return table
        picked = {k: v for k, v in table.items() if k.startswith(tuple(prefixes))} if prefixes else {}
        picked.update({k: table[k] for k in names if k in table})
        return picked

    contents = check_digests(root, wanted(listed), MANIFEST, names)
    contents.update(check_digests(root, wanted(index), INDEX, names))
    for rel in names:
        if rel not in contents:
            raise ArtifactError(f"{root / MANIFEST}: does not list {rel!r}, which this artifact needs.")
    return manifest, contents


def verify_files(path: str | os.PathLike) -> Manifest:
    """The manifest, after checking every listed file's size and digest."""
    return read_files(path, [])[0]


def unlisted_files(path: str | os.PathLike) -> list[str]:
    """Files in the artifact that neither the manifest nor the index vouches for."""
    root = Path(path)
    manifest = read_manifest(root)
    known = set(manifest.files) | set(read_index(root, manifest))
    return [rel for rel in file_names(root) if rel not in known]


def reproducible_tree(root: Path) -> dict[str, bytes]:
    """The reproducible files of every artifact under ``root``, by path relative to it: what two builds
    of the same configs must agree on byte for byte."""
    return {str((m.parent / rel).relative_to(root)): (m.parent / rel).read_bytes()
            for m in sorted(Path(root).rglob(MANIFEST)) for rel in reproducible_files(read_manifest(m.parent))}


@dataclass
class Contents:
    """An artifact as a loader needs it: the manifest, and the checked bytes of every file it deserializes."""

    path: str
    manifest: Manifest
    files: dict[str, bytes | memoryview] = field(default_factory=dict)
    entry: str = ""  # the entry ``manifest`` is, in a multi-entry artifact (``for_entry``)
    tables: tuple[dict[str, Any], dict[str, Any]] | None = None  # file_tables, read once for every take_weight

    @property
    def bound_files(self) -> dict[str, list[str]]:
        """Each bound input's ``.npy`` leaves, by parameter name."""
        counts = {p.name: count_leaves(p.template) for p in self.manifest.parameters}
        return {name: [f"{rel}/{i}.npy" for i in range(counts[name])] for name, rel in self.manifest.bound_inputs.items()}

    def for_entry(self, name: str) -> "Contents":
        """The same artifact seen as its entry ``name`` (its record as ``manifest``; the files shared)."""
        if name == self.manifest.entry:
            return self
        view = Contents(self.path, self.manifest.entry_manifest(name), entry=name)
        view.files, view.tables = self.files, self.tables
        return view

    def where(self, rel: str = MANIFEST) -> str:
        return os.path.join(self.path, rel)

    def array(self, rel: str, dtype: Any = None) -> np.ndarray:
        return from_npy(self.files[rel], self.where(rel), dtype)

    def take_weight(self, entry: WeightEntry) -> np.ndarray:
        """A weight, read from its file when a loader needs it and checked against its digest then.

        Not read with the rest by ``read_contents``: a loader places the weights on the device one prep
        chunk at a time, so only those still needed are in memory (a model's weights are held once).
        """
        if not entry.stored:
            raise ArtifactError(
                f"{self.where()}: the weight {entry.path} is not in this artifact: it was saved with "
                "weights='prepared' (the default), which stores only what the prep program makes of it. Read it "
                "from the checkpoint the artifact was built from, or build again with weights=raw "
                "(Executable.save(path, weights='raw')) to keep the raw weights.")
        try:
            with reading(self.path):
                data = read_files(self.path, [entry.file], [], self.manifest, self.tables)[1][entry.file]
        except ArtifactError as e:
            raise ArtifactError(f"{e} (reading the weight {entry.path})") from None
        return from_npy(data, self.where(entry.file), entry.dtype)

    def take_weights(self, entries: Sequence[WeightEntry]) -> Iterator[np.ndarray]:
        """``take_weight`` of each of ``entries``, in order, read and checked ahead (``read_ahead``)."""
        return read_ahead([functools.partial(self.take_weight, e) for e in entries], [e.nbytes for e in entries])

    def bound_values(self) -> dict[str, Any]:
        values, start, files = {}, 0, self.bound_files
        for p in self.manifest.parameters:
            n = count_leaves(p.template)
            if p.name in files:
                infos = [info for _, info in self.manifest.leaves[start:start + n]]
                values[p.name] = rebuild(p.template, [self.array(f, info.dtype) for f, info in zip(files[p.name], infos)])
            start += n
        return values

    def usable(self, entry: ExecutableEntry, client: Any = None) -> bool:
        """Whether a precompiled executable can run here (``client``: the PJRT client that would run it, asked which
        CPU features it compiles for and which GPU it has); warns with the reason when it cannot, and raises where it
        must not be loaded at all (``compat.refusal``: another jaxlib, another GPU)."""
        import warnings

        refused = refusal(entry, client)
        if refused is not None:
            raise ArtifactError(f"{self.where(entry.file)}: {refused}. Rebuild the artifact here (tripy-build rebuild "
                                f"{self.path}), or load it with trust_executables=False to compile its portable "
                                "program for this machine.")
        reason = incompatibility(entry, client)
        if reason is not None:
            warnings.warn(f"{self.where(entry.file)}: skipped ({reason}); the exported program will be "
                          "compiled for these shapes on first use instead.", CompatibilityWarning, stacklevel=4)
        return reason is None

    def check_platform(self, platform: str, runs: str | None = None) -> None:
        """Refuse an artifact whose program was not exported for ``platform`` (the one the loader runs here);
        ``runs``: why that is the platform, where it is not simply this host's."""
        platforms = self.manifest.platforms
        if platform not in platforms:
            gpus = sorted({e.depends_on["gpu"] for e in self.manifest.executables if e.depends_on.get("gpu")})
            raise ArtifactError(
                f"{self.where()}: built for {', '.join(platforms)} only{' (' + ', '.join(gpus) + ')' if gpus else ''}, "
                f"and {runs or f'this host runs {platform}'}: its program cannot run here. Load it where it can, or "
                f"build it for both: backend=[{','.join([*platforms, platform])}] (executables for each)."
            )


def read_ahead(reads: Sequence[Callable[[], Any]], sizes: Sequence[int]) -> Iterator[Any]:
    """``read()`` of each of ``reads``, in order, run ahead on two threads: at most ``READ_AHEAD_BYTES`` (by
    ``sizes``) beyond the one the caller has. Reading and hashing release the GIL, so they run on the cores
    the caller's device work leaves free, and on both while it waits. Close the iterator (or exhaust it)
    to end the threads; an error is raised where its read comes in order.

    Two plain threads rather than ``concurrent.futures``, whose import (with ``logging``) is ~4 ms of
    the runtime's cold start."""
    n = len(reads)
    cond = threading.Condition()
    done: dict[int, tuple[bool, Any]] = {}
    started = ahead = wanted = 0  # reads begun; their bytes not yet taken; the index the caller waits for
    closing = False

    def work() -> None:
        nonlocal started, ahead
        while True:
            with cond:
                while not closing and started < n and not (
                        started == wanted or ahead + sizes[started] <= READ_AHEAD_BYTES):
                    cond.wait()
                if closing or started >= n:
                    return
                i, started, ahead = started, started + 1, ahead + sizes[started]
            try:
                out = (True, reads[i]())
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread, in order
                out = (False, e)
            with cond:
                done[i] = out
                cond.notify_all()

    threads = [threading.Thread(target=work, name="tripy_build-read", daemon=True) for _ in range(min(2, n))]
    for t in threads:
        t.start()
    try:
        for i in range(n):
            with cond:
                while i not in done:
                    cond.wait()
                ok, value = done.pop(i)
                ahead, wanted = ahead - sizes[i], i + 1
                cond.notify_all()
            if not ok:
                raise value
            yield value
    finally:
        with cond:
            closing = True
            cond.notify_all()
        for t in threads:
            t.join()  # a read under way holds the reader's lock: let it finish


def read_contents(path: str | os.PathLike, executables: bool = True, manifest: Manifest | None = None) -> Contents:
    """Parse an artifact's manifest (unless ``manifest`` is it, already read) and read every file a loader
    needs, each checked against its digest.

    With ``executables=False`` the precompiled executables are not read at all (``trust_executables``)."""
    with reading(path):
        top = manifest if manifest is not None else read_manifest(path)
        contents = Contents(str(path), top)
        wanted: list[str] = []
        for name, m in top.all_entries():
            where = os.path.join(str(path), MANIFEST) + (f" (entry {name!r})" if name else "")
            names = {p.name for p in m.parameters}
            for bound in m.bound_inputs:
                if bound not in names:
                    raise ArtifactError(f"{where}: bound input {bound!r} is not an input of {m.function}.")
            crosscheck.consistent(where, m.leaves, m.dims, m.executables, len(m.sources))
            crosscheck.prep_chunks(where, m)
            prep = m.prep
            wanted += [m.program.file, *([prep.file] if prep else []),
                       *(e.file for e in [*m.executables, *(c.executable for c in (prep.chunks if prep else ()))]
                         if executables),
                       *(f for fs in contents.for_entry(name).bound_files.values() for f in fs)]
        contents.tables = file_tables(Path(path), top)
        contents.files = read_files(path, list(dict.fromkeys(wanted)), [], top, contents.tables)[1]
        return contents


