"""A compiled function's call signature and the checks every call goes through, without jax.

``Executable`` (jax arrays) and ``runtime.Runtime`` (numpy, no jax) share them: a call's arguments
are matched to the runtime parameters by position and keyword, flattened through each parameter's
structure, and every leaf is checked for type, rank, dtype (no silent casts), each dim against its
range, and named dims for one size across inputs. Errors name the input, the dim and the range, and say a
declaration as ``declared`` writes it (every dim's name and range), never as a Python repr: a server's clients
read them too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Any, Sequence

import numpy as np

from ..errors import CallError
from .spec import InputInfo, count_leaves, rebuild


@dataclass(frozen=True)
class Parameter:
    """A runtime parameter of the executable: its name, how it may be passed, its structure."""

    name: str
    kind: str  # an inspect.Parameter kind name
    template: Any

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "structure": self.template}


def array_types() -> tuple[type, ...]:
    """numpy arrays and scalars, and jax arrays if jax is loaded (this module never imports it)."""
    jax = sys.modules.get("jax")
    return (np.ndarray, np.generic, jax.Array) if jax is not None and hasattr(jax, "Array") else (np.ndarray, np.generic)


def bind_call(fname: str, visible: Sequence[Parameter], args: Sequence[Any], kwargs: dict[str, Any],
              spec: Callable[[str], Any]) -> dict[str, Any]:
    """Match a call's arguments to the visible parameters, the inputs left out that have a default filled;
    ``spec(name)``: what one expects (an ``InputInfo``, or a structure of them)."""
    names = [p.name for p in visible]
    positional = [p for p in visible if p.kind != "KEYWORD_ONLY"]
    if len(args) > len(positional):
        raise CallError(
            f"{fname}() takes {len(positional)} positional argument(s) "
            f"({', '.join(p.name for p in positional)}) but {len(args)} were given."
        )
    values: dict[str, Any] = {p.name: a for p, a in zip(positional, args)}
    for key, value in kwargs.items():
        if key not in names:
            raise CallError(
                f"{fname}() got an unexpected keyword argument {key!r}; its inputs are: "
                f"{', '.join(names)} (compile-time constants cannot be passed)."
            )
        if key in values:
            raise CallError(f"{fname}() got multiple values for input {key!r}.")
        values[key] = value
    filled = defaults({p.name: spec(p.name) for p in visible if p.name not in values}, visible, values, spec)
    missing = [n for n in names if n not in values and n not in filled]
    values.update(filled)
    if missing:
        raise CallError(
            f"{fname}() is missing input(s) {', '.join(repr(m) for m in missing)}; "
            f"expected: {', '.join(f'{n}: {_spec_text(spec(n))}' for n in missing)}."
        )
    return values


def defaults(left_out: dict[str, Any], visible: Sequence[Parameter], given: dict[str, Any],
             spec: Callable[[str], Any]) -> dict[str, Any]:
    """The inputs a call leaves out (``left_out``: name -> spec) that have a ``default`` (``InputInfo.default``),
    filled: each dim's size from a given input with the same named dim (or the dim's fixed size). One whose size
    nothing given says stays out (and is missing)."""
    wanted = {n: info for n, info in left_out.items() if isinstance(info, InputInfo) and info.default is not None}
    if not wanted:
        return {}
    sizes: dict[str, int] = {}
    for p in visible:
        value = given.get(p.name)
        info = spec(p.name) if value is not None else None
        if isinstance(info, InputInfo) and hasattr(value, "shape"):
            for i, name in info.dimension_names.items():
                if i < len(value.shape):
                    sizes.setdefault(name, int(value.shape[i]))
    out = {}
    for name, info in wanted.items():
        shape = [sizes.get(info.dimension_names.get(i)) if lo != hi else lo
                 for i, (lo, hi) in enumerate(zip(info.shape_bounds.min, info.shape_bounds.max))]
        if all(n is not None for n in shape):
            out[name] = np.full(shape, info.default, info.dtype)
    return out


def declared(info: InputInfo, dtype: str | None = None) -> str:
    """An input's declaration as a person (or a server's client) reads it, as ``inspect`` writes it
    (``artifact/describe.spec_text``): ``float32[batch=[1..16, opt 4], 4] in [0, 96)``, each dim fixed or its
    range and the size profiles are tuned for, named where it is a ``NamedDimension``, then the values' range
    where one is declared. ``dtype``: the type's name to show (a server's ``FP32``)."""
    dims = []
    for i, (lo, opt, hi) in enumerate(zip(*info.shape_bounds)):
        name = info.dimension_names.get(i)
        dims.append(str(lo) if lo == hi else f"{name + '=' if name else ''}[{lo}..{hi}, opt {opt}]")
    values = f" in [{info.values[0]}, {info.values[1]})" if info.values is not None else ""
    holds = f", every row holding {info.holds}" if info.holds is not None else ""
    return f"{dtype or info.dtype.name}[{', '.join(dims)}]{values}{holds}"


def _spec_text(spec: Any) -> str:
    return declared(spec) if isinstance(spec, InputInfo) else repr(spec)


def _shape(shape: Sequence[int]) -> str:
    return f"[{', '.join(str(int(n)) for n in shape)}]"


def check_leaf(value: Any, path: str, info: InputInfo) -> tuple[int, ...]:
    """The shape of one flat input, after checking it against its spec."""
    if not isinstance(value, array_types()):
        raise CallError(f"input '{path}' must be an array (numpy or jax) of {declared(info)}, got {type(value).__name__}.")
    shape = tuple(value.shape)
    if len(shape) != info.rank:
        raise CallError(f"input '{path}' has rank {len(shape)} (shape {_shape(shape)}) but expected rank {info.rank}: "
                        f"{declared(info)}.")
    if value.dtype != info.dtype:
        raise CallError(
            f"input '{path}' has dtype {np.dtype(value.dtype).name} but expected {info.dtype.name}; "
            f"convert it explicitly, e.g. x.astype('{info.dtype.name}') (no silent casts)."
        )
    for d, (size, lo, hi) in enumerate(zip(shape, info.shape_bounds.min, info.shape_bounds.max)):
        if not lo <= size <= hi:
            name = info.dimension_names.get(d)
            label = f" (NamedDimension {name!r})" if name else ""
            opt = info.shape_bounds.opt[d]
            expected = f"fixed at {lo}" if lo == hi else f"in range [{lo}, {hi}] (opt {opt})"
            raise CallError(
                f"input '{path}' dim {d}{label} is {size}, but it must be {expected}; "
                f"the input's shape is {_shape(shape)}, declared as {declared(info)}."
            )
    if info.values is not None or info.holds is not None:
        check_values(value, path, info)
    return shape


def narrowed(value: Any, path: str, info: InputInfo) -> Any:
    """An int64 numpy array given for an int32 input (what tokenizers return: ``return_tensors="np"``), as int32
    where every value fits, checked, never wrapped; anything else as it is (``check_leaf`` judges it)."""
    if not (isinstance(value, np.ndarray) and value.dtype == np.int64 and info.dtype == np.int32):
        return value
    if value.size:
        low, high = int(value.min()), int(value.max())
        limits = np.iinfo(np.int32)
        if low < limits.min or high > limits.max:
            bad = low if low < limits.min else high
            raise CallError(f"input '{path}' is int64 and holds {bad}, which int32 (its declared dtype, "
                            f"{declared(info)}) cannot hold; an int64 input is taken only where its values fit.")
    return value.astype(np.int32)


def check_values(value: Any, path: str, info: InputInfo) -> None:
    """Every element of an integer input within its declared ``[lo, hi)``, and every row holding its ``holds``."""
    if not value.size:
        return
    if info.holds is not None:
        missing = np.flatnonzero(~np.any(np.asarray(value) == info.holds, axis=-1))
        if missing.size:
            row = np.unravel_index(int(missing[0]), value.shape[:-1])
            raise CallError(
                f"input '{path}' row {list(map(int, row)) if len(row) > 1 else int(row[0])} holds no {info.holds}, "
                f"and every row must ({missing.size} do not); declared as {declared(info)}. The model reads each row "
                f"at that token: end every row with it, as the model's tokenizer ends every text.")
    if info.values is None:
        return
    lo, hi = info.values
    low, high = int(value.min()), int(value.max())
    if low < lo or high >= hi:
        bad = low if low < lo else high
        raise CallError(
            f"input '{path}' holds {bad}, but its values must lie in [{lo}, {hi}) (min {low}, max {high}); "
            f"declared as {declared(info)}. An index outside its table would be clamped silently."
        )


def value_checks(leaves: Sequence[tuple[str, InputInfo]]) -> Callable[[Sequence[Any]], None] | None:
    """What a call whose shapes were checked before still checks: the declared value ranges of its flat inputs
    (``leaves``, by position). None when no input declares one."""
    checked = [(i, path, info) for i, (path, info) in enumerate(leaves)
               if info.values is not None or info.holds is not None]
    if not checked:
        return None

    def check(args: Sequence[Any]) -> None:
        for i, path, info in checked:
            check_values(args[i], path, info)
    return check


def input_infos(leaves: Sequence[tuple[str, InputInfo]], parameters: Sequence[Parameter],
                visible: Sequence[Parameter] | None = None) -> dict[str, Any]:
    """Each visible parameter's spec: an ``InputInfo``, or its dicts, lists and tuples of them.

    ``leaves`` are every parameter's leaves in order (a template numbers its own leaves from 0).
    """
    shown = {p.name for p in (parameters if visible is None else visible)}
    out, start = {}, 0
    for p in parameters:
        n = count_leaves(p.template)
        if p.name in shown:
            out[p.name] = rebuild(p.template, [info for _, info in leaves[start:start + n]])
        start += n
    return out


def named_uses(leaves: Sequence[tuple[str, InputInfo]]) -> dict[str, list[tuple[int, int]]]:
    """Every NamedDimension's (flat input, axis) uses."""
    uses: dict[str, list[tuple[int, int]]] = {}
    for li, (_, info) in enumerate(leaves):
        for d, n in info.dimension_names.items():
            uses.setdefault(n, []).append((li, d))
    return uses


def check_leaves(values: Sequence[Any], leaves: Sequence[tuple[str, InputInfo]],
                 uses: dict[str, list[tuple[int, int]]]) -> tuple[tuple[int, ...], ...]:
    """Validate flat inputs against their specs; the tuple of their shapes. In a list of ``values``, an int64
    array for an int32 input is replaced by its int32 copy (``narrowed``), its values checked to fit."""
    if isinstance(values, list):
        values[:] = [narrowed(v, path, info) for v, (path, info) in zip(values, leaves)]
    shapes = tuple(check_leaf(v, path, info) for v, (path, info) in zip(values, leaves))
    for name, where in uses.items():
        if len({shapes[li][d] for li, d in where}) > 1:
            parts = ", ".join(f"input '{leaves[li][0]}' dim {d} is {shapes[li][d]}" for li, d in where)
            raise CallError(f"NamedDimension {name!r} must have one size in every input, but {parts}.")
    return shapes
