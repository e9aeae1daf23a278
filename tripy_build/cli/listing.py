"""``tripy-build list [ARTIFACTS_DIR] [KEY=VALUE ...] [--latest]``: what was built, one line per artifact.

Artifact directories are named by build key, which says nothing to a reader; this reads each
manifest (without checking digests: ``verify`` does that) and shows the model, its inputs, the
options it was built with (the checkpoint by its folder's name and its params' digest), its size,
when it was written and its key, fitted to the terminal's width (whole lines into a pipe). A directory whose manifest cannot
be read is listed as damaged, with the reason, rather than skipped. ``KEY=VALUE`` keeps the artifacts
built with that setting (``model=geglu shapes=dynamic target.cpu=portable``); ``--latest`` prints the
newest one's path alone, for scripts: ``ART=$(tripy-build list --latest model=geglu shapes=dynamic)``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from ..artifact.describe import LIST_COLUMNS, list_row, table
from ..artifact.read import read_manifest
from ..artifact.store import find
from ..errors import TripyBuildError, exit_status


def listing(root: str | Path, filters: dict[str, str] | None = None, width: int | None = None) -> str:
    found = matching(root, filters or {})
    if not found:
        return f"no artifacts under {root}" + (f" built with {_said(filters)}" if filters else "")
    rows = [list_row(p) for p in found]
    cells = [[r[h] for h in LIST_COLUMNS] for r in rows]
    lines = fit(cells, width or terminal_width()) if width or terminal_width() else table(LIST_COLUMNS, cells)
    return "\n".join(lines + [f"{len(rows)} artifact(s) under {root}; details: tripy-build show {root}/<model>/<key>"])


def matching(root: str | Path, filters: dict[str, str]) -> list[Path]:
    """The artifacts under ``root`` built with every ``KEY=VALUE`` of ``filters``, newest last."""
    root = Path(root)
    if not root.is_dir():
        raise TripyBuildError(f"{str(root)!r} is not a directory; give the artifacts_dir a build wrote to "
                              "(default: artifacts).")
    found = find(root)
    if not filters:
        return found
    out = []
    for path in found:
        try:
            settings = recorded_settings(read_manifest(path))
        except TripyBuildError:
            continue  # a damaged artifact matches nothing
        unknown = [k for k in filters if k not in settings]
        if unknown:
            raise TripyBuildError(f"list: {unknown[0]}=... is not a setting an artifact records; use model, shapes, "
                                  "task, backend, precision, target.cpu, target.gpu, weights, or a model.* key such as "
                                  "model.dim_in.")
        if all(settings[k] == v for k, v in filters.items()):
            out.append(path)
    return sorted(out, key=lambda p: (p / "manifest.json").stat().st_mtime)


def recorded_settings(manifest: Any) -> dict[str, str]:
    """The settings an artifact was built with, as command-line ``KEY=VALUE`` text: ``model``, ``shapes``, ...,
    and every ``model.*`` key."""
    config = manifest.build_config  # what the build recorded, with what it does not record filled in
    platforms = config.get("platforms") or list(manifest.platforms)
    settings = {"model": manifest.model or "", "shapes": str(config.get("shapes_name", "")),
                "task": "generate" if config.get("generate") else "infer",
                "backend": config["compiler"] if config["compiler"] != "xla" else
                (platforms[0] if len(platforms) == 1 else f"[{','.join(platforms)}]"),
                "precision": str(config["precision"]), "target.cpu": str(config["target_cpu"]),
                "target.gpu": str(config["target_gpu"]), "weights": str(config["weights"]),
                "optimization_level": str(manifest.optimization_level)}
    for k, v in (config.get("model") or {}).items():
        settings[f"model.{k}"] = str(v)
    return settings


def fit(cells: list[list[str]], width: int) -> list[str]:
    """``table``'s lines of ``cells`` no wider than ``width`` where that can be: the inputs column (the widest,
    and the first a reader skips) is cut short with an ellipsis, the others kept whole."""
    lines = table(LIST_COLUMNS, cells)
    over = max(len(line) for line in lines) - width
    column = LIST_COLUMNS.index("inputs")
    widest = max(len(r[column]) for r in cells)
    keep = max(12, widest - over)
    if over <= 0 or keep >= widest:
        return lines
    cut = [[c if i != column or len(c) <= keep else c[:keep - 1] + "…" for i, c in enumerate(r)] for r in cells]
    return table(LIST_COLUMNS, cut)


def terminal_width() -> int | None:
    """The terminal's columns (``COLUMNS`` where set); None where the output is not a terminal (a pipe, a file):
    whole lines there, as ``ls`` does."""
    import os

    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _said(filters: dict[str, str] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (filters or {}).items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build list", description=__doc__.splitlines()[0])
    parser.add_argument("args", nargs="*", metavar="[ARTIFACTS_DIR] [KEY=VALUE]",
                        help="where builds wrote (default: artifacts); KEY=VALUE: only artifacts built with it "
                             "(model=geglu shapes=dynamic)")
    parser.add_argument("--latest", action="store_true",
                        help="print only the newest matching artifact's path (ART=$(tripy-build list --latest ...))")
    args = parser.parse_args(argv)
    filters = dict(a.split("=", 1) for a in args.args if "=" in a)
    dirs = [a for a in args.args if "=" not in a]
    if len(dirs) > 1:
        parser.error(f"one artifacts directory, got {', '.join(dirs)}")
    root = dirs[0] if dirs else "artifacts"

    def latest() -> None:
        found = matching(root, filters)
        if not found:
            raise TripyBuildError(f"no artifact under {root}" + (f" built with {_said(filters)}" if filters else "")
                                  + "; `tripy-build list` shows what is there.")
        print(found[-1])
    return exit_status(latest if args.latest else lambda: print(listing(root, filters)))


if __name__ == "__main__":
    sys.exit(main())
