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

from ..errors import ConfigError, TripyBuildError


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
            error: type[TripyBuildError] = ConfigError, key: str | None = None) -> Any:
    """Restore params whose tree matches ``like`` (arrays or shape structs): every leaf's shape and dtype.

    ``directory`` is an orbax ``StandardCheckpointer`` checkpoint or a tripy_build artifact (its
    weights). ``key`` selects the sub-tree that holds the params in a checkpoint that saved more (a
    dotted path: ``model`` for ``{"model": ..., "optimizer": ...}``, ``0`` for ``nnx.state((model,
    optimizer))``). ``what`` names the checkpoint in error messages, which raise ``error``.
    """
    path = Path(directory).absolute()
    if not path.exists():
        raise error(f"{what}: {str(path)!r} does not exist; pass a directory written by Hugging Face's "
                    "save_pretrained (config.json + model.safetensors), by "
                    "orbax.checkpoint.StandardCheckpointer().save(path, params), or a built artifact.")
    if (path / "manifest.json").is_file():
        if key:
            raise error(f"params.checkpoint_key={key}: {str(path)!r} is a built artifact, whose weights are the "
                        "model's params alone; checkpoint_key selects a sub-tree of an orbax checkpoint. Remove it.")
        restored = _from_artifact(path, like, what, error)
    else:
        restored = _from_orbax(path, like, what, error, tuple(key.split(".")) if key else ())
    for (key, want), got in zip(jax.tree_util.tree_flatten_with_path(abstract(like))[0],
                                jax.tree_util.tree_leaves(restored)):
        if (tuple(want.shape), np.dtype(want.dtype)) != (tuple(np.shape(got)), np.asarray(got).dtype):
            raise error(f"{what}: params{jax.tree_util.keystr(key)} in {str(path)!r} has shape {tuple(np.shape(got))} "
                        f"and dtype {np.asarray(got).dtype}, but the model needs {tuple(want.shape)} and "
                        f"{np.dtype(want.dtype)}; the checkpoint is for a different model or config.")
    return restored


def _from_artifact(path: Path, like: Any, what: str, error: type[TripyBuildError]) -> Any:
    from ..artifact.read import read_files, read_manifest
    from ..artifact.npy import from_npy

    try:
        manifest = read_manifest(path)
        entries = {w.path: w for w in manifest.weights if w.argument == "params"}
        _, files = read_files(path, [e.file for e in entries.values() if e.stored], [], manifest)
    except TripyBuildError as e:
        raise error(f"{what}: {e}") from None
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = []
    for key, _ in paths:
        name = "params" + jax.tree_util.keystr(key)
        if name not in entries:
            raise error(f"{what}: the artifact {str(path)!r} stores no weight {name}; it was built from a "
                        "different model.")
        if not entries[name].stored:
            raise error(f"{what}: the artifact {str(path)!r} holds {name} only as the prep program makes it (saved "
                        "with weights=prepared, the default), not its raw value. Use the checkpoint it was built "
                        "from (verify --rebuild --checkpoint DIR), or build it with weights=raw.")
        leaves.append(from_npy(files[entries[name].file], str(path / entries[name].file), entries[name].dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def leaf_name(path: Any) -> tuple[str, ...]:
    """A tree path as plain names: ``nnx.State``'s ``['l1']['kernel'].value`` and an orbax checkpoint's
    ``['l1']['kernel']['value']`` (or a list index and its string) name the same leaf."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def _from_orbax(path: Path, like: Any, what: str, error: type[TripyBuildError], prefix: tuple[str, ...] = ()) -> Any:
    """Check the checkpoint's recorded tree against the model's, leaf by leaf, before reading any array,
    then read only the model's leaves (under ``prefix``, the path of ``params.checkpoint_key``).

    Leaves the model does not have (an NNX model's RNG streams, optimizer state saved alongside) are
    neither read nor kept; every leaf it has must be there with its exact shape and dtype (orbax would
    otherwise cast a dtype on restore).
    """
    import orbax.checkpoint as ocp

    def cannot(e: Exception) -> TripyBuildError:
        return error(f"{what}: cannot read {str(path)!r} as an orbax checkpoint ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}); write it with "
                     "orbax.checkpoint.StandardCheckpointer().save(path, params).")

    with ocp.StandardCheckpointer() as ckpt:
        try:
            meta = ckpt.metadata(path)
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a directory it cannot read
            raise cannot(e) from None
        tree = getattr(meta, "item_metadata", meta)
        stored = {leaf_name(p): m for p, m in jax.tree_util.tree_flatten_with_path(tree)[0]}
        wanted, treedef = jax.tree_util.tree_flatten_with_path(abstract(like))
        for key, want in wanted:
            name = "params" + jax.tree_util.keystr(key)
            got = stored.get(prefix + leaf_name(key))
            if got is None:
                held = ", ".join("/".join(n) for n in list(stored)[:6]) + (", ..." if len(stored) > 6 else "")
                under = _common_prefix(stored, {leaf_name(k) for k, _ in wanted})
                fix = (f"the model's leaves are under {'.'.join(under)!r} (saved with other state, such as the "
                       f"optimizer's): set params.checkpoint_key={'.'.join(under)}" if under else
                       f"under params.checkpoint_key={'.'.join(prefix)} it has no such leaf" if prefix else
                       "it is for a different model")
                raise error(f"{what}: {str(path)!r} has no leaf {name}"
                            + (f" under {'.'.join(prefix)!r}" if prefix else "")
                            + f", which the model needs (the checkpoint holds: {held or 'nothing'}); {fix}.")
            found = _recorded(got)
            if found != (tuple(want.shape), np.dtype(want.dtype)):
                raise error(f"{what}: {name} in {str(path)!r} has shape {found[0]} and dtype {found[1].name}, but "
                            f"the model needs shape {tuple(want.shape)} and dtype {np.dtype(want.dtype).name}; the "
                            "checkpoint is for a different model or config.")
    item = _subtree(tree, {prefix + leaf_name(k) for k, _ in wanted})
    try:
        if item is None:
            with ocp.StandardCheckpointer() as ckpt:
                restored = ckpt.restore(path)
        else:
            with ocp.PyTreeCheckpointer() as ckpt:
                restored = ckpt.restore(path, args=ocp.args.PyTreeRestore(
                    item=item, restore_args=jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item),
                    partial_restore=True))
    except Exception as e:  # noqa: BLE001
        raise cannot(e) from None
    values = {leaf_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(restored)[0]}
    return jax.tree_util.tree_unflatten(treedef, [np.asarray(values[prefix + leaf_name(k)]) for k, _ in wanted])


def _common_prefix(stored: dict[tuple[str, ...], Any], names: set[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The path under which a checkpoint holds every one of the model's leaves ``names`` (one or two levels
    deep: ``model``, ``0``, ``state.params``), or None."""
    for depth in (1, 2):
        prefixes = {n[:depth] for n in stored if len(n) > depth and n[depth:] in names}
        for p in sorted(prefixes):
            if all(p + n in stored for n in names):
                return p
    return None


def _subtree(tree: Any, names: set[tuple[str, ...]]) -> dict[str, Any] | None:
    """The checkpoint's recorded ``tree`` cut to the leaves named ``names``, as shape structs (what orbax's
    partial restore reads), or None where a path to one passes a list: those restore whole."""
    item: dict[str, Any] = {}
    for path, meta in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if leaf_name(path) not in names:
            continue
        if not all(isinstance(k, jax.tree_util.DictKey) for k in path):
            return None
        node = item
        for k in path[:-1]:
            node = node.setdefault(k.key, {})
        node[path[-1].key] = jax.ShapeDtypeStruct(*_recorded(meta))
    return item


def _recorded(meta: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype orbax recorded for a leaf."""
    return tuple(getattr(meta, "shape", ()) or ()), np.dtype(getattr(meta, "dtype", None) or "float32")


def is_pretrained(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a Hugging Face ``save_pretrained`` directory (``config.json`` and safetensors)."""
    from ..models import hf

    path = Path(directory)
    return (path / hf.CONFIG).is_file() and ((path / hf.WEIGHTS).is_file() or (path / hf.INDEX).is_file())


def load_pretrained(model_cfg: dict[str, Any], directory: str | os.PathLike) -> tuple[Any, Any]:
    """``(model, params)`` from a Hugging Face ``save_pretrained`` directory, for the zoo model ``model_cfg`` names
    when it has a Hugging Face architecture (``models/hf.py``): its settings from ``config.json``, its tensors
    streamed from safetensors. A setting the build config gives (one that differs from the model's default)
    must agree with the checkpoint's."""
    import dataclasses

    from ..models import MODELS, hf
    from .adapters import _import

    cls = _import(model_cfg["_target_"], "model._target_")
    if cls is hf.Pretrained:  # model=hf: the zoo model config.json names
        try:
            cls = MODELS[hf.model_name(directory)]
        except hf.CheckpointError as e:
            raise ConfigError(f"params.checkpoint: {e}") from None
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        set_here = [k for k, v in model_cfg.items() if k not in ("_target_", "name", "padding") and k not in fields
                    and v != hf.Pretrained.SETTINGS.get(k)]
        if set_here:
            raise ConfigError(f"model.{set_here[0]}={model_cfg[set_here[0]]}: {str(directory)!r} is a {cls.name} "
                              f"checkpoint, which has no setting {set_here[0]!r}; remove it.")
        model_cfg = {k: v for k, v in model_cfg.items() if k in fields or k == "padding"}
    if cls not in MODELS.values() or getattr(cls, "name", None) not in hf.NAMES:
        raise ConfigError(
            f"params.checkpoint: {str(directory)!r} is a Hugging Face save_pretrained directory, but model "
            f"{model_cfg.get('name') or model_cfg['_target_']} has no Hugging Face architecture; models that read one: "
            f"{', '.join(sorted(hf.NAMES))}.")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    given = {k: v for k, v in model_cfg.items() if k in defaults and hf.normalized(v) != hf.normalized(defaults[k])}
    try:
        return hf.load_pretrained(cls, directory, given)
    except hf.CheckpointError as e:
        raise ConfigError(f"params.checkpoint: {e}") from None
