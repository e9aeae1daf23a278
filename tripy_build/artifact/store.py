"""The artifacts under a directory: finding them, and removing the least recently used within a budget.

"Used" is the manifest's access time, which both loaders and a cache hit set explicitly
(``lock.touch``: the artifact's bytes and mtimes stay as built), so it holds on filesystems mounted
``noatime``. An artifact a process is loading right now is never removed (``lock.removing``); one that
is removed is first moved aside (one rename, so no reader sees half of it), then deleted. Temporaries of
killed builds are removed on the way (``write.remove_stale_temporaries``).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError
from .describe import human_size
from .layout import MANIFEST, disk_size, is_artifact
from .lock import removing
from .write import remove_stale_temporaries, temporary_prefix

@dataclass
class Collected:
    removed: list[tuple[Path, int]] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)
    kept_bytes: int = 0
    memo_entries: int = 0  # memo entries dropped with them (the caller prunes the memo: build.memo)
    dry_run: bool = False  # ``removed`` lists what would be removed

    def summary(self) -> str:
        freed = sum(n for _, n in self.removed)
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"{verb} {len(self.removed)} artifact(s), {human_size(freed)}; "
                 f"{'would keep' if self.dry_run else 'kept'} {human_size(self.kept_bytes)}"]
        lines += [f"  {verb} {p} ({human_size(n)})" for p, n in self.removed]
        lines += [f"  in use, kept: {p}" for p in self.in_use]
        if self.memo_entries:
            entries = "entry" if self.memo_entries == 1 else "entries"
            lines.append(f"  dropped {self.memo_entries} memo {entries} of removed artifacts")
        return "\n".join(lines)



def parse_size(text: str, key: str = "cache.max_bytes") -> int:
    """A budget as people write it, ``500MB``, ``2G``, ``1.5GiB`` or bytes -> bytes (units of 1024, as
    ``describe.human_size`` writes them); ``key`` names the setting in errors."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ConfigError(f"{key}: {text!r} is not a size; e.g. 500MB, 2G or 1073741824.")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))

def collect(root: str | os.PathLike, max_bytes: int | None = None, max_age_days: float | None = None,
            keep: Sequence[Path] = (), dry_run: bool = False) -> Collected:
    """Remove artifacts under ``root`` older than ``max_age_days`` (since last use), then least recently
    used ones until the rest fit in ``max_bytes``; never ``keep`` or one being loaded."""
    root = Path(root)
    done = Collected(dry_run=dry_run)
    if not root.is_dir():
        return done
    for model_dir in [root, *(p for p in root.iterdir() if p.is_dir())]:
        remove_stale_temporaries(model_dir)
    kept = {Path(k).resolve() for k in keep}
    found = [(p, (p / MANIFEST).stat().st_atime, disk_size(p)) for p in find(root)]
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
    return done


def _remove(path: Path) -> bool:
    """Delete an artifact unless a loader holds it; False if it is in use."""
    with removing(path) as free:
        if not free:
            return False
        aside = path.parent / (temporary_prefix(path) + "gc")
        os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
    return True


DEPTH = 3  # artifacts_dir/<model>/<key>/manifest.json, or a saved artifact one or two levels down


def find(root: Path) -> list[Path]:
    """Artifact directories under ``root`` (itself included), sorted by model then date."""
    found = [root] if is_artifact(root) else []
    for depth in range(1, DEPTH):
        found += [p.parent for p in root.glob("/".join(["*"] * depth) + "/" + MANIFEST)
                  if not p.parent.name.startswith(".")]  # temporary directories of builds in progress
    return sorted(set(found), key=lambda p: (p.parent.name, p.stat().st_mtime))
