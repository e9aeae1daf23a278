"""From ``func`` plus compile arguments to a flat, pure function of the runtime inputs.

``InputInfo`` leaves (top level or inside dicts, lists and tuples) become runtime inputs and
``DimSize`` leaves the true sizes of named dims; every other argument is a compile-time constant
closed over by the flat function. Array leaves of constants are put on the device first: the
function sees jax arrays (so indexing and gathers work on them), and ``weights`` recognises them in
the traced program as weights that belong to that argument. The flat function takes the runtime
leaves and then the dim sizes positionally, in signature order, and returns what ``func`` returned.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..errors import SpecError, TraceError, describe_frame, user_frame
from ..core.spec import DimSize, InputInfo, leaf_kind, rebuild, structure_of


@dataclass
class Argument:
    """One parameter of the compiled function: runtime inputs, dim sizes, or a constant."""

    name: str
    kind: inspect._ParameterKind
    value: Any
    by_keyword: bool = False
    template: Any = None  # the structure of InputInfo or DimSize leaves; None for a constant
    leaves: list[tuple[str, InputInfo]] = field(default_factory=list)
    sizes: list[tuple[str, DimSize]] = field(default_factory=list)

    @property
    def runtime(self) -> bool:
        """A runtime input: part of the executable's signature."""
        return bool(self.leaves)

    @property
    def traced(self) -> bool:
        """Traced rather than closed over: a runtime input or a dim size."""
        return self.template is not None


@dataclass
class Placed:
    """What the entries of one compile made of the constants' arrays, by the ``id`` of the array given: its copy on
    the device, and its cast to a reduced precision; the same array given to several entries is held once (and
    their preps are then the same work on the same weights). Each array given is kept, so its id is not reused."""

    arrays: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # id -> (the array, on the device)
    cast: dict[str, dict[int, tuple[Any, Any]]] = field(default_factory=dict)  # dtype -> id -> (the array, its cast)

    def once(self, made: dict[int, tuple[Any, Any]], value: Any, make: Callable[[Any], Any]) -> Any:
        if id(value) not in made:
            made[id(value)] = (value, make(value))
        return made[id(value)][1]


def _on_device(value: Any, placed: Placed | None) -> Any:
    """``value`` with its numpy arrays on the device (each once for all of ``placed``'s entries)."""
    def put(v: Any) -> Any:
        if not isinstance(v, np.ndarray):
            return v
        return jax.device_put(v) if placed is None else placed.once(placed.arrays, v, jax.device_put)
    return jax.tree_util.tree_map(put, value)


def _make_argument(name: str, kind: inspect._ParameterKind, value: Any, by_keyword: bool = False,
                   placed: Placed | None = None) -> Argument:
    leaf = leaf_kind(value)
    if leaf is None:
        return Argument(name, kind, _on_device(value, placed), by_keyword)
    template, leaves = structure_of(value, name)
    if leaf is DimSize:
        return Argument(name, kind, value, by_keyword, template, sizes=leaves)
    return Argument(name, kind, value, by_keyword, template, leaves)


def bind_arguments(func: Callable, args: Sequence[Any], kwargs: dict[str, Any],
                   placed: Placed | None = None) -> list[Argument]:
    """Match compile arguments to ``func``'s parameters (``inspect.Signature.bind``), in signature order;
    variadic ones are frozen to what was given: ``*args`` as ``args0``, ``args1``..., ``**kwargs`` by name.
    ``placed``: the numpy arrays of constants placed on the device already, shared by a compile's entries."""
    kinds = inspect.Parameter
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        signature = inspect.Signature([kinds("args", kinds.VAR_POSITIONAL), kinds("kwargs", kinds.VAR_KEYWORD)])
    fname = getattr(func, "__name__", type(func).__name__)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise SpecError(
            f"{fname}{signature}: {e} (compile() was given {len(args)} argument(s) in args= and "
            f"{', '.join(map(repr, kwargs)) or 'none'} in kwargs=). Pass an InputInfo (a runtime input) or a value "
            "(a compile-time constant) for each parameter."
        ) from None
    result: list[Argument] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is kinds.VAR_POSITIONAL:
            result += [_make_argument(f"{name}{i}", kinds.POSITIONAL_OR_KEYWORD, v, placed=placed)
                       for i, v in enumerate(value)]
        elif kind is kinds.VAR_KEYWORD:
            result += [_make_argument(k, kinds.KEYWORD_ONLY, v, by_keyword=True, placed=placed) for k, v in value.items()]
        else:
            result.append(_make_argument(name, kind, value, by_keyword=name in kwargs, placed=placed))
    return result


def runtime_leaves(arguments: Sequence[Argument]) -> list[tuple[str, InputInfo]]:
    return [leaf for arg in arguments for leaf in arg.leaves]


def size_leaves(arguments: Sequence[Argument]) -> list[tuple[str, DimSize]]:
    return [leaf for arg in arguments for leaf in arg.sizes]


def weight_owners(arguments: Sequence[Argument]) -> dict[int, tuple[str, str]]:
    """``id`` of every array in a constant argument -> (argument name, its path, e.g. ``params['w']``)."""
    owners = {}
    for arg in arguments:
        if arg.traced:
            continue
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg.value)[0]:
            if isinstance(leaf, jax.Array):
                owners.setdefault(id(leaf), (arg.name, arg.name + jax.tree_util.keystr(path)))
    return owners


def _check_outputs(result: Any, fname: str) -> None:
    """The function returns arrays: one, or nested in dicts (string keys), lists and tuples, at least one."""
    def bad_leaves(x: Any, path: str) -> list[str]:
        if isinstance(x, (jax.Array, np.ndarray)):
            return []
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return [b for k in x for b in bad_leaves(x[k], f"{path}[{k!r}]")]
        if isinstance(x, (tuple, list)):
            return [b for i, v in enumerate(x) for b in bad_leaves(v, f"{path}[{i}]")]
        return [f"{path or 'the result'} is {type(x).__name__}"]

    bad = bad_leaves(result, "")
    if bad or not jax.tree_util.tree_leaves(result):
        detail = ", ".join(bad[:4]) if bad else "it is empty: no array in it"
        raise TraceError(
            f"{fname} must return one or more arrays (an array, or arrays in dicts with string keys, lists and "
            f"tuples), but it returned a {type(result).__name__} where {detail}: {result!r:.200}."
        )


def flat_function(func: Callable, arguments: Sequence[Argument]) -> Callable:
    """A function of the runtime leaves and then the dim sizes, with constants substituted back in."""
    fname = getattr(func, "__name__", type(func).__name__)
    n_leaves = sum(len(arg.leaves) for arg in arguments)

    def flat(*values):
        call_args, call_kwargs = [], {}
        leaves, sizes = iter(values[:n_leaves]), iter(values[n_leaves:])
        for arg in arguments:
            value = arg.value
            if arg.traced:
                source = leaves if arg.leaves else sizes
                value = rebuild(arg.template, [next(source) for _ in (arg.leaves or arg.sizes)])
            if arg.by_keyword:
                call_kwargs[arg.name] = value
            else:
                call_args.append(value)
        result = func(*call_args, **call_kwargs)
        _check_outputs(result, fname)
        return result

    flat.__name__ = fname
    flat.__qualname__ = fname
    return flat


_EVAL_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def translate_trace_error(err: BaseException, fname: str) -> TraceError | None:
    """Our error for a failure raised while tracing the user's function, or None to let it through."""
    where = describe_frame(user_frame(err.__traceback__))
    if isinstance(err, _EVAL_ERRORS):
        return TraceError(
            "Cannot evaluate a tensor while compiling: a traced input was converted to a Python or "
            f"numpy value (float(), int(), bool(), np.asarray(), or an `if` on a tensor) in {fname}.\n"
            f"Tensor was evaluated here:\n{where}\n"
            "Compiled functions run without Python; use jnp.where / jax.lax.cond instead of Python "
            "control flow on values, and jnp operations instead of numpy ones."
        )
    from jax.extend.core import InconclusiveDimensionOperation

    if isinstance(err, InconclusiveDimensionOperation):
        return TraceError(
            f"{fname} makes a Python decision on a dynamic dimension whose result depends on its "
            f"size, which is unknown while compiling:\n{where}\n{str(err).splitlines()[0]}\n"
            "Make that dim static (an int in the InputInfo) or avoid branching on it."
        )
    return None
