"""The invocation memo: an unchanged build command answers from the build cache without Hydra.

Composing the configs costs more than everything else in a cache hit. After a single (non-sweep)
build, the memo records under a fingerprint of the command line, working directory, config files,
tripy_build's sources, toolchain, relevant environment and host which artifact the command produced,
and which input files (model sources, params checkpoint) went into it. The same command later
rechecks those files and the artifact's digests and prints the cache hit. Whatever the memo cannot
vouch for (sweeps, ``force=true``, ``bench=true``, ``hydra.searchpath``, configs reading the environment) takes the
full path, which recomputes the build key from scratch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from ..artifact.digest import digest_file
from ..artifact.layout import is_artifact
from ..artifact.read import verify_files
from ..errors import ArtifactError
from ..host import cache_home

ENV_PREFIXES = ("XLA_", "JAX_", "TF_", "TRIPY_BUILD_", "HYDRA_", "PYTHONPATH")


def memo_dir() -> Path:
    return cache_home() / "memo"


def _config_dirs(argv: Sequence[str]) -> list[Path] | None:
    """Config directories the command reads, or None if it is not a plain single build."""
    dirs = [Path(__file__).resolve().parents[1] / "conf"]  # the packaged configs
    args = iter(argv)
    for arg in args:
        if arg in ("--config-dir", "-cd"):
            dirs.append(Path(next(args, "")))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
        elif arg.startswith("-") or "=" not in arg:
            return None  # -m, --cfg, --help, ...: not a plain build
        elif arg.lstrip("+~").split("=", 1)[0] in ("force", "bench", "hydra.searchpath"):
            return None
    return dirs


def fingerprint(argv: Sequence[str]) -> str | None:
    if os.environ.get("TRIPY_BUILD_NO_MEMO"):
        return None
    dirs = _config_dirs(argv)
    if dirs is None:
        return None
    import jax
    import jaxlib

    from .key import package_digest
    from ..host import host_features

    configs = {}
    for d in dirs:
        for path in sorted(d.rglob("*.yaml")) if d.is_dir() else []:
            text = path.read_bytes()
            if b"oc.env" in text:
                return None
            configs[str(path.resolve())] = hashlib.sha256(text).hexdigest()
    record = {
        "argv": list(argv), "cwd": os.getcwd(), "configs": configs, "package": package_digest(),
        "python": sys.version, "sys_path": sys.path, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "host": host_features(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def lookup(argv: Sequence[str]) -> Any:
    """The ``BuildResult`` of a cache hit this memo can vouch for, or None."""
    fp = fingerprint(argv)
    if fp is None:
        return None
    try:
        memo = json.loads((memo_dir() / f"{fp}.json").read_text())
        path = Path(memo["path"])
        for source, digest in memo["sources"].items():
            if digest_file(Path(source)) != digest:
                return None
        manifest = verify_files(path)
    except (OSError, ValueError, KeyError, TypeError, ArtifactError):
        return None
    if manifest.build_key != memo["key"]:
        return None
    from .report import result_from_manifest

    return result_from_manifest(path, memo["key"], memo["model"], True, {}, manifest, memo["sources"])


def record(argv: Sequence[str], result: Any) -> None:
    """Remember which artifact ``argv`` built (best effort: a memo that cannot be written is skipped)."""
    fp = fingerprint(argv)
    if fp is None:
        return
    data = {"path": str(result.path), "key": result.key, "model": result.model, "sources": result.sources}
    try:
        d = memo_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{fp}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, d / f"{fp}.json")
    except OSError:
        pass


def answer(argv: Sequence[str]) -> bool:
    """Print the cache hit for an unchanged command; False if the full path must run."""
    result = lookup(argv)
    if result is None:
        return False
    print(f"cache hit: {result.path} (build key {result.key[:16]}, unchanged command)", file=sys.stderr)
    print(result.summary(), flush=True)
    return True


def prune() -> int:
    """Drop memo entries whose artifact no longer exists; how many."""
    dropped = 0
    for entry in memo_dir().glob("*.json") if memo_dir().is_dir() else []:
        try:
            target = Path(json.loads(entry.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            target = None
        if target is None or not is_artifact(target):
            with contextlib.suppress(OSError):
                entry.unlink()
                dropped += 1
    return dropped
