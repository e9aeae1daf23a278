"""``tripy-build rebuild PATH``: an artifact built again from the config it records, with this machine's toolchain.

What a loader refuses (executables compiled by another jaxlib, or for another GPU) is rebuilt here: the same
model, params, shapes and options, compiled by this jaxlib for this machine, written to the artifacts directory
under its new build key (a cache hit if it is there already). The new artifact's path is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..errors import TripyBuildError


def rebuild(path: str | Path, artifacts_dir: str | Path | None = None, checkpoint: str | None = None,
            gpu: str | None = None) -> Path:
    """Rebuild the artifact at ``path`` from its recorded config; the new artifact's path.

    Args:
        path: a built artifact (``python -m tripy_build``; one saved from the Python API records no config).
        artifacts_dir: where the new one goes; default: the folder its own model folder is in (``artifacts``).
        checkpoint: the params to build from; default: its seed, or the checkpoint it records it was built from
            while that is there unchanged, else its own weights (which ``weights=prepared`` does not hold raw).
        gpu: ``target.gpu`` for its cuda executables; default: ``host`` on a machine with a GPU (this GPU),
            else the recorded one.

    Returns:
        The rebuilt artifact's directory.
    """
    from ..artifact.read import read_manifest
    from ..builder.key import request_from_record
    from ..builder.pipeline import build
    from ..compiler.gpu import HOST
    from ..runtime.xla import local_platform

    root = Path(path).absolute()
    manifest = read_manifest(root)
    target = Path(artifacts_dir) if artifacts_dir is not None else root.parent.parent
    request = request_from_record(manifest, root, target, checkpoint)
    if gpu is None:
        gpu = HOST if local_platform() == "cuda" else request.target_gpu
    request = dataclasses.replace(request, force=False, target_gpu=gpu)
    return Path(build(request).path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build rebuild", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact directory")
    parser.add_argument("--artifacts-dir", help="where the rebuilt artifact goes (default: the one PATH is in)")
    parser.add_argument("--checkpoint", help="the params to rebuild from; default: the checkpoint the artifact "
                                             "records, while it is there unchanged")
    parser.add_argument("--gpu", help="target.gpu for cuda executables (default: host where this machine has a GPU, "
                                      "else the recorded one)")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        new = rebuild(args.path, args.artifacts_dir, args.checkpoint, args.gpu)
    except TripyBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
