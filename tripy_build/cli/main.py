"""``python -m tripy_build`` and the ``tripy-build`` script: one registry of subcommands.

An unchanged build command is answered from the memo before Hydra is even imported; any other build
runs the Hydra app (``app.py``). The other commands and ``--help`` are answered without Hydra. Ctrl-C
ends any of them with one line and exit status 130; a build it interrupts leaves nothing (artifacts are
written to a temporary directory that is removed, and renamed into place only when complete).
"""

from __future__ import annotations

import os
import sys

from .commands import COMMANDS

def _run() -> None:
    import importlib

    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in COMMANDS:
        module = importlib.import_module(f"{__package__}.{COMMANDS[command][0]}")
        sys.exit(module.main(sys.argv[2:]))
    if command == "build":
        del sys.argv[1]
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        from .help import main as usage

        usage()
        return
    from ..builder.memo import answer

    if not answer(sys.argv[1:]):
        from .app import command

        command()


def console() -> None:
    if sys.path[0] not in ("", os.getcwd()):
        # `python -m tripy_build` imports from the working directory first; the `tripy-build` script does too,
        # so that a config's model._target_ finds the user's package either way
        sys.path.insert(0, os.getcwd())
    try:
        _run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopped; nothing half-written was left (an unfinished artifact is removed).",
              file=sys.stderr, flush=True)
        sys.exit(130)
