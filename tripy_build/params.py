"""Model parameters: random init from a seed, orbax checkpoints, and hashing by value.

orbax writes file names and timestamps into a checkpoint, so two saves of the same params differ in
bytes; identity is therefore a digest of the values (tree paths, dtypes, shapes and bytes). A built
artifact can serve as a checkpoint too: its weights are the params it was built with.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .errors import ConfigError, TripyBuildError


def digest(params: Any) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        arr = np.asarray(leaf)
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def abstract(params: Any) -> Any:
    def spec(a: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) if hasattr(a, "dtype") else jax.ShapeDtypeStruct(
            np.shape(a), np.asarray(a).dtype)

    return jax.tree_util.tree_map(spec, params)


def save(directory: str | os.PathLike, params: Any) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(Path(directory).absolute(), jax.tree_util.tree_map(np.asarray, params))
        ckpt.wait_until_finished()


def restore(directory: str | os.PathLike, like: Any, what: str = "params.checkpoint",
            error: type[TripyBuildError] = ConfigError) -> Any:
    """Restore params whose tree matches ``like`` (arrays or shape structs): every leaf's shape and dtype.

    ``directory`` is an orbax ``StandardCheckpointer`` checkpoint or a tripy_build artifact (its
    weights). ``what`` names the checkpoint in error messages, which raise ``error``.
    """
    path = Path(directory).absolute()
    if not path.exists():
        raise error(f"{what}: {str(path)!r} does not exist; pass a directory written by "
                    "orbax.checkpoint.StandardCheckpointer().save(path, params), or a built artifact.")
    restored = _from_artifact(path, like, what, error) if (path / "manifest.json").is_file() else \
        _from_orbax(path, like, what, error)
    for (key, want), got in zip(jax.tree_util.tree_flatten_with_path(abstract(like))[0],
                                jax.tree_util.tree_leaves(restored)):
        if (tuple(want.shape), np.dtype(want.dtype)) != (tuple(np.shape(got)), np.asarray(got).dtype):
            raise error(f"{what}: params{jax.tree_util.keystr(key)} in {str(path)!r} has shape {tuple(np.shape(got))} "
                        f"and dtype {np.asarray(got).dtype}, but the model needs {tuple(want.shape)} and "
                        f"{np.dtype(want.dtype)}; the checkpoint is for a different model or config.")
    return restored


def _from_artifact(path: Path, like: Any, what: str, error: type[TripyBuildError]) -> Any:
    from . import artifact
    from .serialization import from_npy

    try:
        manifest = artifact.read_manifest(path)
        entries = {w["path"]: w for w in manifest.get("weights", []) if w.get("argument") == "params"}
        _, files = artifact.read(path, [e["file"] for e in entries.values()], [], manifest)
    except TripyBuildError as e:
        raise error(f"{what}: {e}") from None
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = []
    for key, _ in paths:
        name = "params" + jax.tree_util.keystr(key)
        if name not in entries:
            raise error(f"{what}: the artifact {str(path)!r} stores no weight {name}; it was built from a "
                        "different model.")
        leaves.append(from_npy(files[entries[name]["file"]], str(path / entries[name]["file"]), entries[name]["dtype"]))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _from_orbax(path: Path, like: Any, what: str, error: type[TripyBuildError]) -> Any:
    import orbax.checkpoint as ocp

    target = abstract(like)
    try:
        with ocp.StandardCheckpointer() as ckpt:
            restored = ckpt.restore(path, target)
    except Exception as e:  # noqa: BLE001 - orbax raises many types for a mismatched tree
        raise error(
            f"{what}: cannot restore {str(path)!r} as this model's parameters "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). The checkpoint must hold "
            "the tree that model.init returns: same keys, shapes and dtypes."
        ) from None
    return jax.tree_util.tree_map(np.asarray, restored)
