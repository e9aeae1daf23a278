"""Input specifications: ``InputInfo`` and ``NamedDimension``.

A shape is a sequence of dims, each an int (static), a ``(min, opt, max)`` triple (dynamic and
independent of every other dim) or a ``NamedDimension`` (dynamic, equal wherever the name appears).
Everything is validated when the object is built, so a bad spec never reaches tracing.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import CallError, SpecError


def _check_size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(f"{what} must be an integer, got {value!r} ({type(value).__name__}).")
    if value < 1:
        raise SpecError(f"{what} must be at least 1, got {value}.")
    return int(value)


def _check_bounds(bounds: Sequence[Any], what: str) -> tuple[int, int, int]:
    lo, opt, hi = (_check_size(v, f"{what}: {k}") for k, v in zip(("min", "opt", "max"), bounds))
    if lo > opt or opt > hi:
        raise SpecError(
            f"{what}: bounds must satisfy min <= opt <= max, got (min={lo}, opt={opt}, max={hi}). "
            "Reorder them, e.g. (1, 8, 64)."
        )
    return lo, opt, hi


class NamedDimension:
    """A dynamic dimension that several inputs share; its sizes must be equal at run time."""

    __slots__ = ("name", "min", "opt", "max")

    def __init__(self, name: str, min: int, opt: int, max: int):  # noqa: A002 (matches Tripy's API)
        if not isinstance(name, str) or not name:
            raise SpecError(f"NamedDimension name must be a non-empty string, got {name!r}.")
        self.name = name
        self.min, self.opt, self.max = _check_bounds((min, opt, max), f"NamedDimension {name!r}")

    @property
    def bounds(self) -> tuple[int, int, int]:
        return (self.min, self.opt, self.max)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedDimension) and (self.name, self.bounds) == (other.name, other.bounds)

    def __hash__(self) -> int:
        return hash((self.name, self.bounds))

    def __repr__(self) -> str:
        return f"NamedDimension({self.name!r}, {self.min}, {self.opt}, {self.max})"


class ShapeBounds(NamedTuple):
    """Per-dimension minimum, optimum and maximum sizes of one tensor."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def to_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a string, numpy or jax dtype (``jnp.float32``, ``"bfloat16"``...)."""
    try:
        import ml_dtypes  # jax's dependency; lets numpy parse "bfloat16" and the fp8 names

        if isinstance(dtype, str) and hasattr(ml_dtypes, dtype):
            return np.dtype(getattr(ml_dtypes, dtype))
    except ImportError:  # pragma: no cover - jax always installs ml_dtypes
        pass
    result = None
    if dtype is not None:  # np.dtype(None) would silently mean float64
        for candidate in (dtype, getattr(dtype, "dtype", None)):
            try:
                result = np.dtype(candidate) if candidate is not None else None
            except TypeError:
                continue
            break
    if result is None or result.kind not in "biufcV":
        raise SpecError(
            f"dtype {dtype!r} is not a tensor dtype; expected a name such as 'float32', 'bfloat16', "
            "'int32', 'bool', or a numpy/jax dtype."
        )
    return result


class InputInfo:
    """Shape and dtype of one runtime input, and for an integer input optionally the range of its values.

    ``shape`` entries: an int, a ``(min, opt, max)`` triple, or a ``NamedDimension``. ``values``: ``(lo, hi)``,
    every element must lie in ``[lo, hi)`` (token ids in ``[0, vocab)``): a call is checked against it,
    because an out-of-range index into a table is clamped silently by XLA's gather. ``default``: the value that
    fills the input where a call leaves it out (Hugging Face's ``token_type_ids`` are zeros, its
    ``attention_mask`` ones); its shape then comes from the named dims the other inputs give. None: required.
    ``holds``: a value every row (the last axis) must hold at least once, checked on every call: a model that
    reads each row at that token (BART's classifier at its last end-of-sequence id), which without it would read
    another position without a word.
    """

    __slots__ = ("shape_bounds", "dtype", "dimension_names", "values", "default", "holds")

    def __init__(self, shape: Sequence[Any], dtype: Any, values: Sequence[int] | None = None,
                 default: int | float | None = None, holds: int | None = None):
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise SpecError(
                f"InputInfo shape must be a sequence of dims, got {shape!r}; e.g. ((1, 8, 64), 512)."
            )
        mins, opts, maxs, names = [], [], [], {}
        for i, dim in enumerate(shape):
            what = f"InputInfo shape dim {i}"
            if isinstance(dim, NamedDimension):
                lo, opt, hi = dim.bounds
                names[i] = dim.name
            elif isinstance(dim, Sequence) and not isinstance(dim, (str, bytes)):
                if len(dim) != 3:
                    raise SpecError(
                        f"{what}: a dynamic dim is a (min, opt, max) triple, got {tuple(dim)!r} "
                        f"with {len(dim)} entries."
                    )
                lo, opt, hi = _check_bounds(dim, what)
            else:
                lo = opt = hi = _check_size(dim, what)
            mins.append(lo)
            opts.append(opt)
            maxs.append(hi)
        self.shape_bounds = ShapeBounds(tuple(mins), tuple(opts), tuple(maxs))
        self.dtype = to_dtype(dtype)
        self.dimension_names: dict[int, str] = names
        self.values = _check_values(values, self.dtype)
        if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float)) or (
                self.values is not None and not self.values[0] <= default < self.values[1])):
            raise SpecError(f"InputInfo default={default!r}: the value a left-out input is filled with must be a "
                            f"number{' within its values ' + str(list(self.values)) if self.values else ''}.")
        self.default = default
        if holds is not None and (self.dtype.kind not in "iu" or not self.rank or isinstance(holds, bool)
                                  or not isinstance(holds, (int, np.integer)) or default is not None
                                  or (self.values is not None and not self.values[0] <= holds < self.values[1])):
            raise SpecError(f"InputInfo holds={holds!r}: the value every row must hold is an integer of an integer "
                            "input of rank 1 or more, within its values, and such an input has no default.")
        self.holds = int(holds) if holds is not None else None
        collect_named_dims([("this InputInfo", self)])

    @property
    def rank(self) -> int:
        return len(self.shape_bounds.min)

    def dims(self) -> list[Any]:
        """The shape as it was given: ints, triples and ``NamedDimension`` objects."""
        out: list[Any] = []
        for i, (lo, opt, hi) in enumerate(zip(*self.shape_bounds)):
            if i in self.dimension_names:
                out.append(NamedDimension(self.dimension_names[i], lo, opt, hi))
            elif lo == hi:
                out.append(lo)
            else:
                out.append((lo, opt, hi))
        return out

    def to_json(self) -> dict[str, Any]:
        out = {
            "dtype": self.dtype.name,
            "min": list(self.shape_bounds.min),
            "opt": list(self.shape_bounds.opt),
            "max": list(self.shape_bounds.max),
            "dim_names": [self.dimension_names.get(i) for i in range(self.rank)],
        }
        if self.values is not None:
            out["values"] = list(self.values)
        if self.default is not None:
            out["default"] = self.default
        if self.holds is not None:
            out["holds"] = self.holds
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "InputInfo":
        try:
            names = data["dim_names"]
            dims = [
                NamedDimension(names[i], lo, opt, hi) if names[i] is not None else (lo, opt, hi)
                for i, (lo, opt, hi) in enumerate(zip(data["min"], data["opt"], data["max"]))
            ]
            return cls(dims, data["dtype"], data.get("values"), data.get("default"), data.get("holds"))
        except (KeyError, IndexError, TypeError) as e:
            raise SpecError(f"malformed tensor spec {dict(data)!r}: {e!r}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputInfo) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.shape_bounds, self.dtype, tuple(sorted(self.dimension_names.items())), self.values,
                     self.default, self.holds))

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) if not isinstance(d, tuple) else str(d) for d in self.dims())
        values = f", values=[{self.values[0]}, {self.values[1]})" if self.values is not None else ""
        default = f", default={self.default}" if self.default is not None else ""
        holds = f", holds={self.holds}" if self.holds is not None else ""
        return (f"InputInfo(shape=({dims}{',' if self.rank == 1 else ''}), dtype={self.dtype.name}{values}{default}"
                f"{holds})")


def _check_values(values: Any, dtype: np.dtype) -> tuple[int, int] | None:
    """``values`` as ``(lo, hi)``: two integers, ``lo < hi``, for an integer dtype."""
    if values is None:
        return None
    if dtype.kind not in "iu":
        raise SpecError(f"InputInfo values={values!r}: a range of values is for integer inputs (ids, indices); "
                        f"this one is {dtype.name}.")
    if (not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or len(values) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
            or not values[0] < values[1]):
        raise SpecError(f"InputInfo values={values!r}: must be (lo, hi), two integers with lo < hi: every element "
                        "lies in [lo, hi), e.g. (0, vocab_size).")
    info = np.iinfo(dtype)
    if values[0] < info.min or values[1] - 1 > info.max:
        raise SpecError(f"InputInfo values={tuple(values)!r}: outside what {dtype.name} holds "
                        f"([{info.min}, {info.max}]).")
    return int(values[0]), int(values[1])


def undeclared_values(infos: Sequence[tuple[str, "InputInfo"]]) -> list[str]:
    """The integer inputs of ``infos`` whose values are not declared (``InputInfo.values``): ids a call is not
    checked against, where one past a table gives NaN or another row without a word."""
    return [name for name, info in infos if info.dtype.kind in "iu" and info.values is None]


def collect_named_dims(infos: Sequence[tuple[str, InputInfo]]) -> dict[str, NamedDimension]:
    """Every named dim across inputs; a name bound to two different ranges is an error."""
    seen: dict[str, tuple[NamedDimension, str]] = {}
    for input_name, info in infos:
        for dim_index, name in info.dimension_names.items():
            nd = NamedDimension(name, *(b[dim_index] for b in info.shape_bounds))
            where = f"input '{input_name}' dim {dim_index}"
            if name in seen and seen[name][0] != nd:
                first, first_where = seen[name]
                raise SpecError(
                    f"NamedDimension {name!r} is bound to two different ranges: {first.bounds} at "
                    f"{first_where} and {nd.bounds} at {where}. Use one NamedDimension object for both, "
                    "or give them different names."
                )
            seen.setdefault(name, (nd, where))
    return {name: nd for name, (nd, _) in seen.items()}


# --- Structure of a runtime argument --------------------------------------------------------------
# A runtime argument is an InputInfo or a dict/list/tuple whose every leaf is one. Its structure is
# kept as a small JSON template so that a loaded artifact can check and flatten calls without the
# model's Python code: {"leaf": i}, {"dict": [[key, child], ...]} (keys sorted), {"list": [...]},
# {"tuple": [...]}.


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"


class DimSize:
    """The true size of a named dimension, passed to the function as a runtime ``int32`` scalar.

    A function that masks (attention over a padded sequence, pooling over a padded image) needs the
    size its input had before padding. Pass ``DimSize("seq")`` (or ``DimSize(seq_dim)``) where the
    function expects that length; it is not part of the compiled executable's signature: every call
    fills it from the shapes of the inputs, before any padding.
    """

    __slots__ = ("name",)

    def __init__(self, dim: "str | NamedDimension"):
        name = dim.name if isinstance(dim, NamedDimension) else dim
        if not isinstance(name, str) or not name:
            raise SpecError(f"DimSize takes a NamedDimension or its name, got {dim!r}.")
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DimSize) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("DimSize", self.name))

    def __repr__(self) -> str:
        return f"DimSize({self.name!r})"


RUNTIME_LEAVES = (InputInfo, DimSize)


def leaf_kind(value: Any) -> type | None:
    """``InputInfo`` or ``DimSize`` if ``value`` (or a leaf in its dicts, lists and tuples) is one."""
    if isinstance(value, RUNTIME_LEAVES):
        return type(value)
    children = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((k for k in map(leaf_kind, children) if k is not None), None)


def structure_of(value: Any, path: str) -> tuple[Any, list[tuple[str, Any]]]:
    """The template of a runtime argument and its (path, leaf) pairs in flattening order.

    The leaves are all ``InputInfo`` (a runtime input) or all ``DimSize`` (filled in by the runtime).
    """
    leaves: list[tuple[str, Any]] = []
    kind = leaf_kind(value)

    def walk(v: Any, p: str) -> Any:
        if isinstance(v, RUNTIME_LEAVES):
            if not isinstance(v, kind):
                raise SpecError(
                    f"argument '{p}' is a {type(v).__name__} in a container of {kind.__name__}s; pass "
                    "runtime inputs (InputInfo) and dim sizes (DimSize) as separate arguments."
                )
            leaves.append((p, v))
            return {"leaf": len(leaves) - 1}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise SpecError(f"argument '{p}': runtime dicts need string keys, got {list(v)!r}.")
            return {"dict": [[k, walk(v[k], _child_path(p, k))] for k in sorted(v)]}
        if type(v) in (list, tuple):
            return {type(v).__name__: [walk(c, _child_path(p, i)) for i, c in enumerate(v)]}
        raise SpecError(
            f"argument '{p}' is {type(v).__name__} inside a container of runtime inputs. A container is "
            "either all runtime inputs (every leaf an InputInfo, in dicts, lists and tuples) or all "
            "constants: pass the constants as a separate argument or close over them."
        )

    return walk(value, path), leaves


def count_leaves(template: Any) -> int:
    if "leaf" in template:
        return 1
    if "dict" in template:
        return sum(count_leaves(c) for _, c in template["dict"])
    return sum(count_leaves(c) for c in template.get("list", template.get("tuple", [])))


def rebuild(template: Any, leaves: Sequence[Any]) -> Any:
    """The inverse of flattening: put ``leaves`` back into the template's containers."""
    if "leaf" in template:
        return leaves[template["leaf"]]
    if "dict" in template:
        return {k: rebuild(c, leaves) for k, c in template["dict"]}
    kind = "list" if "list" in template else "tuple"
    children = [rebuild(c, leaves) for c in template[kind]]
    return children if kind == "list" else tuple(children)


def describe_structure(template: Any) -> str:
    if "leaf" in template:
        return "array"
    if "dict" in template:
        return "dict with keys " + ", ".join(repr(k) for k, _ in template["dict"])
    kind = "list" if "list" in template else "tuple"
    return f"{kind} of {len(template[kind])}"


def flatten_like(template: Any, value: Any, path: str, out: list[Any]) -> None:
    """Append ``value``'s leaves to ``out`` in template order; a mismatch names the path."""
    if "leaf" in template:
        out.append(value)
        return
    if "dict" in template:
        keys = [k for k, _ in template["dict"]]
        if not isinstance(value, dict) or sorted(value) != keys:
            got = (f"dict with keys {', '.join(repr(k) for k in sorted(value, key=str))}"
                   if isinstance(value, dict) else type(value).__name__)
            raise CallError(f"input '{path}' must be a {describe_structure(template)}, got {got}.")
        for k, child in template["dict"]:
            flatten_like(child, value[k], _child_path(path, k), out)
        return
    kind = "list" if "list" in template else "tuple"
    children = template[kind]
    if not isinstance(value, (list, tuple)) or len(value) != len(children):
        got = f"{type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
        raise CallError(f"input '{path}' must be a {kind} of {len(children)}, got {got}.")
    for i, (child, v) in enumerate(zip(children, value)):
        flatten_like(child, v, _child_path(path, i), out)


def output_names(template: Any, n: int) -> list[str]:
    """Names for ``n`` flat outputs: their paths in the dict a function returns (``last_hidden_state``,
    ``heads[0]``), or ``output0``, ``output1``... when it returns anything else (``template``: as
    ``structure_template`` makes it, or None)."""
    if not template or "dict" not in template:
        return [f"output{i}" for i in range(n)]
    names = [f"output{i}" for i in range(n)]

    def walk(t: Any, path: str) -> None:
        if "leaf" in t:
            names[t["leaf"]] = path
        elif "dict" in t:
            for k, c in t["dict"]:
                walk(c, _child_path(path, k) if path else str(k))
        else:
            for i, c in enumerate(t.get("list", t.get("tuple", []))):
                walk(c, _child_path(path, i))
    walk(template, "")
    return names


def structure_template(tree: Any) -> Any:
    """A JSON template (``spec.rebuild``'s format) of a pytree whose leaves are their flat indices, or None."""
    if isinstance(tree, int):
        return {"leaf": tree}
    if isinstance(tree, dict) and all(isinstance(k, str) for k in tree):
        children = [[k, structure_template(tree[k])] for k in sorted(tree)]
        return None if any(c is None for _, c in children) else {"dict": children}
    if type(tree) in (list, tuple):
        children = [structure_template(c) for c in tree]
        return None if any(c is None for c in children) else {type(tree).__name__: children}
    return None
