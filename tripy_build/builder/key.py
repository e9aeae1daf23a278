"""The build key: a sha256 over named parts, everything that can change what a build produces.

The parts (``key_parts``) are the resolved config, the model's source by content, the params' identity,
the toolchain (with tripy_build's own sources: ``package_digest``), the target and the compiler options;
an artifact records them, so a build can be told apart from another by part (``verify --rebuild``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from ..artifact.digest import ALGORITHM
from ..artifact.manifest import Manifest
from ..core.spec import NamedDimension
from ..errors import ArtifactError
from .request import BuildRequest

log = logging.getLogger(__name__)

KEY_LENGTH = 16  # hex digits of the build key used in directory names

# The code that can change what a build produces: these subpackages (recursively) and modules of
# tripy_build. Not the CLI, the server or the zoo (a model's own source is a key part of its own).
BUILD_CODE = ("core", "artifact", "runtime", "compiler", "builder", "host.py")


def package_digest() -> str:
    """sha256 over the sources of ``BUILD_CODE``: a code change without a version bump still rebuilds."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for part in BUILD_CODE:
        for path in sorted([root / part] if part.endswith(".py") else (root / part).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def key_parts(request: BuildRequest, sources: list[tuple[str, str, str]], params_identity: dict[str, Any],
              frameworks: dict[str, str] | None = None) -> dict[str, Any]:
    from ..compiler.optimization import compiler_options
    from ..host import host_features, toolchain

    host = host_features()
    return {
        "config": recorded_config(request),
        "model_code": {name: digest for name, _, digest in sources},
        "params": params_identity,
        "toolchain": dict(toolchain(), tripy_build_source=package_digest(), **(frameworks or {})),
        "target": {"platforms": request.platforms, "cpu": request.target_cpu, "machine": host["machine"],
                   "system": host["system"], **cpu_identity(request), **gpu_identity(request)},
        "compiler_options": ({p: compiler_options(request.optimization_level, p) for p in request.platforms}
                             if request.compiler == "xla" else {"iree": iree_options()}),
    }


def cpu_identity(request: BuildRequest) -> dict[str, Any]:
    """What a build's CPU executables depend on of the build host: its CPU's features for ``target.cpu=host``;
    nothing for a baseline, compiled for the same features on any host (so hosts share its cache entries)."""
    from ..host import host_features

    return {"cpu_features": host_features()["cpu_features"]} if request.target_cpu == "host" else {}


def gpu_identity(request: BuildRequest) -> dict[str, Any]:
    """What a build's CUDA executables depend on: the GPU (the one named, or this machine's) and jax's CUDA plugin."""
    if "cuda" not in request.platforms:
        return {}
    from ..compiler.gpu import HOST
    from ..host import plugin_version
    from ..runtime.xla import local_platform

    gpu = request.target_gpu
    if gpu == HOST and local_platform() == "cuda":
        import jax

        gpu = jax.devices("cuda")[0].device_kind
    return {"gpu": gpu, "cuda_plugin": plugin_version()}


_NOT_IN_KEY = ("derivable", "artifacts_dir", "force", "params_checkpoint", "params_checkpoint_key", "params_seed",
               "cache_max_bytes",
               "cache_max_age_days", "cache_remote", "shared_init_dir")  # locations; params go by identity


def recorded_config(request: BuildRequest) -> dict[str, Any]:
    """The resolved config as the build key and the manifest record it (output locations left out)."""
    config = {k: v for k, v in dataclasses.asdict(request).items() if k not in _NOT_IN_KEY}
    config["shapes"] = {k: list(v.bounds) if isinstance(v, NamedDimension) else v for k, v in request.shapes.items()}
    return config


def request_from_record(manifest: Manifest, artifact_path: Path, artifacts_dir: Path,
                        checkpoint: str | None = None) -> BuildRequest:
    """The build request an artifact was made from, to rebuild it elsewhere (``verify --rebuild``); its params
    from ``checkpoint`` if given, else from its seed or its own weights."""
    parts = manifest.key_parts
    identity = parts.get("params")
    if not isinstance(parts.get("config"), dict) or not isinstance(identity, dict):
        raise ArtifactError(
            f"{artifact_path}: records no build config (it was saved from the Python API, not built by "
            "`python -m tripy_build`), so it cannot be rebuilt.")
    config = manifest.build_config  # settings an older build did not record filled in (weights=raw: stored as given)
    config["shapes"] = {k: NamedDimension(k, *v) if isinstance(v, list) else v for k, v in config["shapes"].items()}
    checkpoint_key = None
    if checkpoint is None and identity.get("init") != "random":
        checkpoint, checkpoint_key = recorded_checkpoint(manifest, artifact_path)
    return BuildRequest(**config, params_seed=identity.get("seed", 0), params_checkpoint=checkpoint,
                        params_checkpoint_key=checkpoint_key, artifacts_dir=str(artifacts_dir), force=True)


def checkpoint_record(request: BuildRequest) -> dict[str, Any]:
    """Where a build's checkpoint was and what it held (each file's digest), for the artifact's index: a rebuild
    (``verify --rebuild``, ``tripy-build rebuild``) reads it from there while it is there and unchanged. Not in the
    manifest: two builds from the same checkpoint at two paths are the same bytes."""
    if request.params_checkpoint is None:
        return {}
    from ..artifact.digest import list_files

    root = Path(request.params_checkpoint).resolve()
    return {"checkpoint": {"path": str(root), "key": request.params_checkpoint_key,
                           "files": {rel: e[ALGORITHM] for rel, e in list_files(root).items()}}}


def recorded_checkpoint(manifest: Manifest, artifact_path: Path) -> tuple[str, str | None]:
    """The params a rebuild reads: the checkpoint the artifact was built from where it is still there with the
    recorded files, else the artifact's own weights (which ``weights=prepared`` does not hold raw: that build
    then says which checkpoint to give)."""
    from ..artifact.digest import list_files
    from ..artifact.read import read_index

    recorded = read_index(artifact_path, manifest, "checkpoint")
    path = recorded.get("path")
    if isinstance(path, str) and Path(path).is_dir() and isinstance(recorded.get("files"), dict):
        here = {rel: e[ALGORITHM] for rel, e in list_files(Path(path)).items()}
        if here == recorded["files"]:
            return path, recorded.get("key")
        changed = sorted(set(here.items()) ^ set(recorded["files"].items()))
        log.warning("the checkpoint this artifact was built from, %s, has changed since (%s): rebuilding from the "
                    "artifact's own weights", path, changed[0][0])
    return str(artifact_path), None


def iree_options() -> dict[str, Any]:
    from ..runtime import iree as iree_backend

    return {"flags": list(iree_backend.FLAGS), **iree_backend.versions()}


def build_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
