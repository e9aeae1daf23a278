"""Model parameters: random init from a seed, orbax checkpoints, and hashing by value.

orbax writes file names and timestamps into a checkpoint, so two saves of the same params differ in
bytes; identity is therefore a digest of the values (tree paths, dtypes, shapes and bytes).
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
    """Restore a StandardCheckpointer checkpoint whose tree matches ``like`` (arrays or shape structs).

    ``what`` names the checkpoint in error messages, which raise ``error``.
    """
    import orbax.checkpoint as ocp

    path = Path(directory).absolute()
    if not path.exists():
        raise error(f"{what}: {str(path)!r} does not exist; pass a directory written by "
                    "orbax.checkpoint.StandardCheckpointer().save(path, params).")
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
