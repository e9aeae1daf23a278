"""``tripy-build gc [ARTIFACTS_DIR]``: keep the build cache and the memo within a size or age budget.

Artifacts are removed least recently used first. "Used" is the manifest's access time, which both
loaders and a cache hit set explicitly (the artifact's bytes and mtimes stay as built), so it holds on
filesystems mounted ``noatime``. An artifact a process is loading right now is never removed: loaders
hold a shared ``flock`` on its manifest while they read it, and gc takes the artifact only if it gets the
exclusive lock without waiting; it then moves the directory aside (one rename, so no reader sees half of
it) and deletes it. Memo entries whose artifact is gone are dropped, and temporaries of killed builds
are removed.

The same budget applies after every build when the config sets ``cache.max_bytes`` or
``cache.max_age_days`` (the artifact just built is always kept).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from . import layout as artifact
from ..errors import ConfigError, exit_status

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; gc then relies on the rename alone
    fcntl = None


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Held by a loader while it reads an artifact: gc will not remove it meanwhile. Marks it used."""
    manifest = Path(path) / artifact.MANIFEST
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


def parse_size(text: str) -> int:
    """``500MB``, ``2G``, ``1.5GiB`` or bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ConfigError(f"cache.max_bytes: {text!r} is not a size; e.g. 500MB, 2G or 1073741824.")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass
class Collected:
    removed: list[tuple[Path, int]] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)
    kept_bytes: int = 0
    memo_entries: int = 0
    dry_run: bool = False  # ``removed`` lists what would be removed

    def summary(self) -> str:
        freed = sum(n for _, n in self.removed)
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"{verb} {len(self.removed)} artifact(s), {artifact.human_size(freed)}; "
                 f"{'would keep' if self.dry_run else 'kept'} {artifact.human_size(self.kept_bytes)}"]
        lines += [f"  {verb} {p} ({artifact.human_size(n)})" for p, n in self.removed]
        lines += [f"  in use, kept: {p}" for p in self.in_use]
        if self.memo_entries:
            lines.append(f"  dropped {self.memo_entries} memo entr{'y' if self.memo_entries == 1 else 'ies'} of removed artifacts")
        return "\n".join(lines)


def collect(root: str | os.PathLike, max_bytes: int | None = None, max_age_days: float | None = None,
            keep: Sequence[Path] = (), dry_run: bool = False) -> Collected:
    """Remove artifacts under ``root`` older than ``max_age_days`` (since last use), then least recently
    used ones until the rest fit in ``max_bytes``; never ``keep`` or one being loaded."""
    from ..cli.listing import find

    root = Path(root)
    done = Collected(dry_run=dry_run)
    if not root.is_dir():
        return done
    for model_dir in [root, *(p for p in root.iterdir() if p.is_dir())]:
        artifact.remove_stale_temporaries(model_dir)
    kept = {Path(k).resolve() for k in keep}
    found = [(p, (p / artifact.MANIFEST).stat().st_atime, artifact.disk_size(p)) for p in find(root)]
    found.sort(key=lambda e: e[1])
    total = sum(n for _, _, n in found)
    now = time.time()
    for path, used, size in found:
        old = max_age_days is not None and now - used > max_age_days * 86400
        over = max_bytes is not None and total > max_bytes
        if not (old or over) or path.resolve() in kept:
            continue
        if dry_run or _remove(path):
            done.removed.append((path, size))
            total -= size
        else:
            done.in_use.append(path)
    done.kept_bytes = total
    if not dry_run:
        done.memo_entries = prune_memo()
    return done


def _remove(path: Path) -> bool:
    """Delete an artifact unless a loader holds it; False if it is in use."""
    manifest = path / artifact.MANIFEST
    try:
        fd = os.open(manifest, os.O_RDONLY)
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
        aside = path.parent / (artifact.temporary_prefix(path) + "gc")
        os.rename(path, aside)
    finally:
        os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)
    return True


def prune_memo() -> int:
    """Drop memo entries whose artifact no longer exists; how many."""
    import json

    from ..build.memo import memo_dir

    dropped = 0
    for entry in memo_dir().glob("*.json") if memo_dir().is_dir() else []:
        try:
            target = Path(json.loads(entry.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            target = None
        if target is None or not artifact.is_artifact(target):
            with contextlib.suppress(OSError):
                entry.unlink()
                dropped += 1
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build gc", description=__doc__.splitlines()[0])
    parser.add_argument("artifacts_dir", nargs="?", default="artifacts")
    parser.add_argument("--max-bytes", help="keep at most this much (500MB, 2G, ...), least recently used removed first")
    parser.add_argument("--max-age-days", type=float, help="remove artifacts not used for this many days")
    parser.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    args = parser.parse_args(argv)
    if args.max_bytes is None and args.max_age_days is None:
        parser.error("give --max-bytes and/or --max-age-days")
    def run() -> None:
        result = collect(args.artifacts_dir, parse_size(args.max_bytes) if args.max_bytes else None,
                         args.max_age_days, dry_run=args.dry_run)
        print(result.summary())
    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
