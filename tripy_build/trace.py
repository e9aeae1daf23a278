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

from .errors import SpecError, TraceError, describe_frame, user_frame
from .spec import DimSize, InputInfo, leaf_kind, rebuild, structure_of


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


def _on_device(value: Any) -> Any:
    return jax.tree_util.tree_map(lambda v: jax.device_put(v) if isinstance(v, np.ndarray) else v, value)


def _make_argument(name: str, kind: inspect._ParameterKind, value: Any, by_keyword: bool = False) -> Argument:
    leaf = leaf_kind(value)
    if leaf is None:
        return Argument(name, kind, _on_device(value), by_keyword)
    template, leaves = structure_of(value, name)
    if leaf is DimSize:
        return Argument(name, kind, value, by_keyword, template, sizes=leaves)
    return Argument(name, kind, value, by_keyword, template, leaves)


def bind_arguments(func: Callable, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Argument]:
    """Match compile arguments to ``func``'s parameters; variadic ones are frozen to what was given."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    P = inspect.Parameter
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    var_pos = next((p for p in params if p.kind == P.VAR_POSITIONAL), None)
    var_kw = next((p for p in params if p.kind == P.VAR_KEYWORD), None)
    named = {p.name: p for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    fname = getattr(func, "__name__", type(func).__name__)

    if len(args) > len(positional) and var_pos is None:
        raise SpecError(
            f"{fname}() takes {len(positional)} positional argument(s) "
            f"({', '.join(p.name for p in positional)}) but compile() was given {len(args)} in args=."
        )
    result: list[Argument] = []
    given: set[str] = set()
    for i, value in enumerate(args):
        if i < len(positional):
            p = positional[i]
            result.append(_make_argument(p.name, p.kind, value))
            given.add(p.name)
        else:
            result.append(_make_argument(f"{var_pos.name}{i - len(positional)}", P.POSITIONAL_OR_KEYWORD, value))
    extra = []
    for key, value in kwargs.items():
        if key in given:
            raise SpecError(f"{fname}() got argument '{key}' both in args= and kwargs=.")
        if key not in named and var_kw is None:
            raise SpecError(
                f"{fname}() has no parameter '{key}' (kwargs=); its parameters are: "
                f"{', '.join(p.name for p in params)}."
            )
        extra.append((key, value))
    order = {p.name: i for i, p in enumerate(params)}
    extra.sort(key=lambda kv: order.get(kv[0], len(order)))
    for key, value in extra:
        kind = named[key].kind if key in named else P.KEYWORD_ONLY
        result.append(_make_argument(key, kind, value, by_keyword=True))
        given.add(key)
    missing = [
        p.name for p in params
        if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)
        and p.default is P.empty and p.name not in given
    ]
    if missing:
        raise SpecError(
            f"{fname}() parameter(s) {', '.join(repr(m) for m in missing)} got no value: pass an InputInfo "
            "(runtime input) or a value (compile-time constant) for each in args= or kwargs=."
        )
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
    def is_array(x: Any) -> bool:
        return isinstance(x, (jax.Array, np.ndarray))

    if is_array(result):
        return
    if isinstance(result, (tuple, list)) and result and all(is_array(r) for r in result):
        return
    if isinstance(result, (tuple, list)):
        bad = [f"[{i}] is {type(r).__name__}" for i, r in enumerate(result) if not is_array(r)]
        detail = "it is empty" if not result else "element " + ", ".join(bad[:4])
        raise TraceError(
            f"{fname} must return one or more arrays (an array, or a tuple/list of arrays), "
            f"but it returned a {type(result).__name__} where {detail}."
        )
    raise TraceError(
        f"{fname} must return one or more arrays (an array, or a tuple/list of arrays), "
        f"but it returned {type(result).__name__}: {result!r:.200}."
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
    from jax._src.export.shape_poly import InconclusiveDimensionOperation

    if isinstance(err, InconclusiveDimensionOperation):
        return TraceError(
            f"{fname} makes a Python decision on a dynamic dimension whose result depends on its "
            f"size, which is unknown while compiling:\n{where}\n{str(err).splitlines()[0]}\n"
            "Make that dim static (an int in the InputInfo) or avoid branching on it."
        )
    return None
