"""``tripy-build list [ARTIFACTS_DIR]``: what was built, one line per artifact.

Artifact directories are named by build key, which says nothing to a reader; this reads each
manifest (without checking digests: ``verify`` does that) and shows the model, its inputs, the
options it was built with, its size, when it was written and its key. A directory whose manifest
cannot be read is listed as damaged, with the reason, rather than skipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..artifact import layout as artifact
from ..errors import TripyBuildError, exit_status
from .show import _table

DEPTH = 3  # artifacts_dir/<model>/<key>/manifest.json, or a saved artifact one or two levels down


def find(root: Path) -> list[Path]:
    """Artifact directories under ``root`` (itself included), sorted by model then date."""
    found = [root] if artifact.is_artifact(root) else []
    for depth in range(1, DEPTH):
        found += [p.parent for p in root.glob("/".join(["*"] * depth) + "/" + artifact.MANIFEST)
                  if not p.parent.name.startswith(".")]  # temporary directories of builds in progress
    return sorted(set(found), key=lambda p: (p.parent.name, p.stat().st_mtime))


def describe(path: Path) -> dict[str, Any]:
    """One row: model, inputs, options, profiles, size, date and key (or why the manifest is unreadable)."""
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    try:
        m = artifact.read_manifest(path)
        artifact.read_index(path, m)  # a damaged index makes the row say so
    except TripyBuildError as e:
        return {"model": path.parent.name, "inputs": "-", "options": f"damaged: {str(e).splitlines()[0][:80]}",
                "profiles": "-", "size": "-", "date": date, "key": path.name}
    meta = m.get("metadata") or {}
    config = (meta.get("build_key_parts") or {}).get("config") or {}
    compiler = (m.get("compiler") or {}).get("name", "xla")
    options = [compiler if compiler != "xla" else "+".join(m.get("platforms", [])),
               f"O{m.get('optimization_level')}", config.get("precision", "float32")]
    if config.get("target_cpu", "host") != "host":
        options.append(f"cpu={config['target_cpu']}")
    if (meta.get("build_key_parts") or {}).get("params", {}).get("init") == "checkpoint":
        options.append("checkpoint")
    return {
        "model": meta.get("model") or m.get("function", "?"),
        "inputs": "; ".join(f"{s['path']} {artifact.spec_text(s)}" for s in m.get("input_specs", [])),
        "options": " ".join(options), "profiles": str(len(m.get("executables", []))), "size": artifact.human_size(artifact.disk_size(path)),
        "date": date, "key": str(meta.get("build_key", path.name))[:16],
    }


def listing(root: str | Path) -> str:
    root = Path(root)
    if not root.is_dir():
        raise TripyBuildError(f"{str(root)!r} is not a directory; give the artifacts_dir a build wrote to "
                              "(default: artifacts).")
    rows = [describe(p) for p in find(root)]
    if not rows:
        return f"no artifacts under {root}"
    headers = ["model", "inputs", "options", "profiles", "size", "date", "key"]
    lines = _table(headers, [[r[h] for h in headers] for r in rows])
    return "\n".join(lines + [f"{len(rows)} artifact(s) under {root}; details: tripy-build show {root}/<model>/<key>"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build list", description=__doc__.splitlines()[0])
    parser.add_argument("artifacts_dir", nargs="?", default="artifacts", help="where builds wrote (default: artifacts)")
    args = parser.parse_args(argv)
    return exit_status(lambda: print(listing(args.artifacts_dir)))


if __name__ == "__main__":
    sys.exit(main())
