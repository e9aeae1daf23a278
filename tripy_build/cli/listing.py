"""``tripy-build list [ARTIFACTS_DIR]``: what was built, one line per artifact.

Artifact directories are named by build key, which says nothing to a reader; this reads each
manifest (without checking digests: ``verify`` does that) and shows the model, its inputs, the
options it was built with, its size, when it was written and its key. A directory whose manifest
cannot be read is listed as damaged, with the reason, rather than skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..artifact.describe import LIST_COLUMNS, list_row, table
from ..artifact.store import find
from ..errors import TripyBuildError, exit_status


def listing(root: str | Path) -> str:
    root = Path(root)
    if not root.is_dir():
        raise TripyBuildError(f"{str(root)!r} is not a directory; give the artifacts_dir a build wrote to "
                              "(default: artifacts).")
    rows = [list_row(p) for p in find(root)]
    if not rows:
        return f"no artifacts under {root}"
    lines = table(LIST_COLUMNS, [[r[h] for h in LIST_COLUMNS] for r in rows])
    return "\n".join(lines + [f"{len(rows)} artifact(s) under {root}; details: tripy-build show {root}/<model>/<key>"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build list", description=__doc__.splitlines()[0])
    parser.add_argument("artifacts_dir", nargs="?", default="artifacts", help="where builds wrote (default: artifacts)")
    args = parser.parse_args(argv)
    return exit_status(lambda: print(listing(args.artifacts_dir)))


if __name__ == "__main__":
    sys.exit(main())
