"""``tripy-build gc [ARTIFACTS_DIR]``: keep the build cache and the memo within a size or age budget.

Artifacts are removed least recently used first, never one a process is loading
(``artifact/store.py``); memo entries whose artifact is gone are dropped (``builder/memo.py``). The same
budget applies after every build when the config sets ``cache.max_bytes`` or ``cache.max_age_days``.
"""

from __future__ import annotations

import argparse

from ..artifact.store import parse_size
from ..artifact.store import collect
from ..builder.memo import prune
from ..errors import exit_status


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
        result = collect(args.artifacts_dir, parse_size(args.max_bytes, "--max-bytes") if args.max_bytes else None,
                         args.max_age_days, dry_run=args.dry_run)
        if not args.dry_run:
            result.memo_entries = prune()
        print(result.summary())
    return exit_status(run)
