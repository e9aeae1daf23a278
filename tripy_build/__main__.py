"""``python -m tripy_build`` and the ``tripy-build`` script.

An unchanged command is answered from the memo before Hydra is even imported; anything else runs
the Hydra app in ``cli``. The other commands (``verify``, ``bench``, ``inspect``/``show``, ``list``, ``gc``)
and ``--help`` are answered here, without Hydra. Ctrl-C ends any of them with one line and exit
status 130; a build it interrupts leaves nothing (artifacts are written to a temporary directory
that is removed, and renamed into place only when complete).
"""

import sys

COMMANDS = {
    "verify": ("tripy_build.cli.verify", "main"),
    "bench": ("tripy_build.cli.bench", "main"),
    "inspect": ("tripy_build.cli.show", "main"),
    "show": ("tripy_build.cli.show", "main"),
    "list": ("tripy_build.cli.listing", "main"),
    "gc": ("tripy_build.artifact.store", "main"),
    "serve": ("tripy_build.serve.http", "main"),
}


def _run() -> None:
    import importlib

    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in COMMANDS:
        module, function = COMMANDS[command]
        sys.exit(getattr(importlib.import_module(module), function)(sys.argv[2:]))
    if command == "build":
        del sys.argv[1]
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        from .cli.help import main as usage

        usage()
        return
    from .build.memo import answer

    if not answer(sys.argv[1:]):
        from .cli.app import command

        command()


def console() -> None:
    import os

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


if __name__ == "__main__":
    console()
