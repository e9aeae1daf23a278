"""The model a config names: a zoo-style class, a Flax NNX, Flax Linen or Equinox module, or a function.

Whatever ``model._target_`` names, the build sees one protocol: ``init(key) -> params``, a pure
``apply(params, *inputs)``, ``inputs() -> {name: [dims]}``, ``input_dtypes()`` and ``padding``.
A class of the zoo's kind implements it itself; for the others an adapter does (``adapters.py``).
Here: which kind a target is, loading it, its inputs and padding with the config's dims resolved, and
what the build key hashes of it (its sources, its library's version).
"""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path
from typing import Any

from ..artifact.digest import digest_file
from ..core.spec import InputInfo, NamedDimension
from ..errors import ConfigError, raised_in_user_code
from .adapters import (SETTING_ERRORS, EquinoxModel, FunctionModel, LinenModel, NNXModel, _import, refused)

# Model config keys that are ours, not constructor arguments.
OWN_KEYS = ("_target_", "name", "padding")
# The keys a library model or a function also takes from the config.
LIBRARY_KEYS = ("inputs", "input_dtypes", "input_values", "vmap", "init", "call")
PROTOCOL = ("init", "apply", "inputs")


def framework_of(target: Any) -> str:
    """``nnx``, ``linen``, ``equinox``, ``function`` or ``protocol`` (a class with init/apply/inputs).

    Decided from the class's bases' modules, so that detecting a library never imports it.
    """
    if inspect.isclass(target):
        modules = [c.__module__ or "" for c in target.__mro__]
        if any(m.startswith("flax.nnx") for m in modules):
            return "nnx"
        if any(m.startswith("flax.linen") for m in modules):
            return "linen"
        if any(m == "equinox" or m.startswith("equinox.") for m in modules):
            return "equinox"
        return "protocol"
    return "function" if callable(target) else "protocol"


def instantiate(model_cfg: dict[str, Any], dims: dict[str, Any] | None = None) -> Any:
    """The model ``model_cfg`` describes, as an object with the zoo's protocol.

    Args:
        model_cfg: the ``model`` config: ``_target_``, ``name``, ``padding``, constructor arguments
            and, for library modules and functions, ``inputs`` / ``input_dtypes`` / ``vmap`` / ``init``.
        dims: ``shapes.dims`` resolved (a Linen module is initialised with inputs at their opt shapes).

    Returns:
        The model: the target's own instance for a zoo-style class, else an adapter.

    Example::

        model = instantiate({"_target_": "flax.nnx.Linear", "in_features": 64, "out_features": 10,
                      "inputs": {"x": ["batch", 64]}}, {"batch": NamedDimension("batch", 1, 8, 64)})
    """
    target_path = model_cfg["_target_"]
    target = _import(target_path, "model._target_")
    kind = framework_of(target)
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in model_cfg.items()
              if k not in OWN_KEYS + (LIBRARY_KEYS if kind != "protocol" else ())}
    if kind == "protocol":
        try:
            model = target(**kwargs)
        except SETTING_ERRORS as e:
            raise refused(target_path, kwargs, e) from None
        missing = [m for m in PROTOCOL if not callable(getattr(model, m, None))]
        if missing:
            raise ConfigError(
                f"model: {target_path} has no {missing[0]}() method. A model is a class with init(key), "
                "apply(params, *inputs) and inputs(); a Flax NNX, Flax Linen or Equinox module class; or a "
                "function apply(params, *inputs) with `init: module.init_function` in its config.")
        return model
    adapter = {"nnx": NNXModel, "linen": LinenModel, "equinox": EquinoxModel, "function": FunctionModel}[kind]
    return adapter(target, target_path, kwargs, model_cfg, dims or {})


def shapes_defining(dim: str) -> list[str]:
    """The package's shapes configs (``conf/shapes/*.yaml``) that give ``dim`` a range: ``image_text`` for CLIP's
    ``texts``."""
    from omegaconf import OmegaConf

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "conf" / "shapes").glob("*.yaml")):
        dims = OmegaConf.load(path).get("dims") or {}
        if dim in dims:
            found.append(path.stem)
    return found


def input_infos(model: Any, dims: dict[str, int | NamedDimension], dtype: str = "float32") -> dict[str, InputInfo]:
    """The model's declared inputs with every named dim resolved from ``shapes.dims``."""
    infos = {}
    dtypes = model.input_dtypes() if hasattr(model, "input_dtypes") else {}
    values = model.input_values() if hasattr(model, "input_values") else {}
    fills = model.input_defaults() if hasattr(model, "input_defaults") else {}
    holds = model.input_holds() if hasattr(model, "input_holds") else {}
    for name, shape in model.inputs().items():
        resolved = []
        for i, d in enumerate(shape):
            if isinstance(d, str):
                if d not in dims:
                    defined = [f"shapes={n}" for n in shapes_defining(d)]
                    raise ConfigError(
                        f"shapes.dims.{d}: the model's input {name!r} dim {i} is named {d!r}, but the shapes "
                        f"config does not define it; add shapes.dims.{d}=[min,opt,max] or ={'{size}'}"
                        + (f", or choose {' or '.join(defined)}, which {'do' if len(defined) > 1 else 'does'}." if defined
                           else ".")
                    )
                resolved.append(dims[d])
            else:
                resolved.append(d)
        infos[name] = InputInfo(resolved, dtypes.get(name, dtype), values.get(name), fills.get(name),
                                holds.get(name))
    return infos


def padding(model: Any, model_cfg: dict[str, Any], dims: dict[str, Any]) -> dict[str, str]:
    """The padding declaration for the model's dynamic dims: the config's ``model.padding`` (for a zoo
    model it starts as the class's), else the class's ``padding``; ``none`` means not padded."""
    configured = model_cfg.get("padding")
    declared = dict(getattr(model, "padding", None) or {}) if configured is None else dict(configured)
    used = {d for shape in model.inputs().values() for d in shape if isinstance(d, str)}
    unknown = sorted(set(declared) - used)
    declared = {d: k for d, k in declared.items() if k != "none"}
    if unknown:
        raise ConfigError(f"model.padding: {', '.join(map(repr, unknown))} is not a dim of this model's inputs "
                          f"(its dims: {', '.join(map(repr, sorted(used))) or 'none'}).")
    return {d: k for d, k in declared.items() if isinstance(dims.get(d), NamedDimension)}


def settings(model: Any) -> dict[str, Any]:
    """A zoo model's settings (its dataclass fields) as config values (tuples as lists)."""
    import dataclasses

    return {f.name: list(v) if isinstance(v := getattr(model, f.name), tuple) else v
            for f in dataclasses.fields(model)}


def pure_init(model: Any) -> bool:
    """Whether ``model.init`` only returns params, so that one call can serve several builds: the zoo's
    models and function models. Library adapters keep the module or graph their init constructs, and a
    user's own class may keep anything."""
    return isinstance(model, FunctionModel) or type(model).__module__.startswith("tripy_build.models.")


def framework_versions(model: Any) -> dict[str, str]:
    """The versions of the library the model is written with (part of the build key)."""
    from importlib.metadata import version

    name = {"nnx": "flax", "linen": "flax", "equinox": "equinox"}.get(getattr(model, "framework", ""))
    return {name: version(name)} if name else {}


def sources(model: Any) -> list[tuple[str, str, str]]:
    """(module, file, digest) of the model's module and every module it uses from its own folder.

    Following the module's globals (imported modules, functions and classes) catches helpers such
    as a shared layers file, without hashing third-party libraries, which the toolchain covers.
    A library module's own source (``flax.nnx.Linear``) is covered by the library's version instead.
    """
    origin = getattr(model, "source", type(model))
    first = inspect.getmodule(origin)
    found: dict[str, tuple[str, str]] = {}
    todo = [first]
    path0 = getattr(first, "__file__", None)
    root = Path(path0).resolve().parent if path0 else None
    init = getattr(model, "_init", None)
    if init is not None:
        todo.append(inspect.getmodule(init))
    while todo:
        module = todo.pop()
        path = getattr(module, "__file__", None)
        if module is None or module.__name__ in found or not path or not path.endswith(".py"):
            continue
        if root is None or root not in Path(path).resolve().parents:
            continue
        found[module.__name__] = (str(Path(path).resolve()), digest_file(Path(path)))
        for value in vars(module).values():
            used = value if isinstance(value, types.ModuleType) else sys.modules.get(getattr(value, "__module__", None) or "")
            if used is not None and used.__name__ not in found:
                todo.append(used)
    return [(name, path, digest) for name, (path, digest) in sorted(found.items())]


def run_init(init: Any) -> Any:
    """Run the model's init; an exception from its code becomes our error naming its line."""
    try:
        return init()
    except Exception as err:  # the model's own init failing is the user's to fix (re-raised, as ours)
        user = raised_in_user_code(err, "the model's init")
        if user is None:
            raise
        raise user from err
