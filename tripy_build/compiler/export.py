"""Symbolic shapes and ``jax.export``: the portable program at the heart of every artifact.

Each unnamed dynamic dim gets its own symbol (``<input>_d<i>``); each ``NamedDimension`` one shared
symbol, so the compiler may use the equality. The declared min/max become symbolic constraints.

The function is traced once; ``weights`` splits the trace into the weights, a ``prep`` program (the
work on the weights alone) and ``main``, and both programs are exported: ``main`` takes the prepared
weights, then the runtime inputs, then the ``DimSize`` values.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import jax

from ..runtime.program import Program
from . import weights as weights_lib
from ..errors import TraceError, raised_in_user_code
from ..core.spec import DimSize, InputInfo, NamedDimension, collect_named_dims
from .trace import translate_trace_error


@dataclass(frozen=True)
class Symbol:
    """One dimension variable of the exported program, and where it appears."""

    name: str
    bounds: tuple[int, int, int]
    named: str | None  # the NamedDimension's name, or None for an independent dim
    uses: tuple[tuple[str, int], ...]  # (input path, dim index)

    def describe(self) -> str:
        where = ", ".join(f"input '{p}' dim {d}" for p, d in self.uses)
        lo, _, hi = self.bounds
        if self.named:
            return f"NamedDimension {self.named!r} [{lo}, {hi}] ({where})"
        return f"{where} [{lo}, {hi}]"


def _identifier(text: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", text)
    if not base or base[0].isdigit() or base[0] == "_":
        base = "d" + base
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def make_symbols(leaves: Sequence[tuple[str, InputInfo]]) -> tuple[list[list[Any]], list[Symbol]]:
    """Per leaf, its dims as ints or symbol names; and the symbols with their bounds."""
    named = collect_named_dims(leaves)
    taken: set[str] = set()
    named_symbols = {n: _identifier(n, taken) for n in named}
    uses: dict[str, list[tuple[str, int]]] = {}
    bounds: dict[str, tuple[int, int, int]] = {}
    owners: dict[str, str | None] = {}
    dims_per_leaf = []
    for path, info in leaves:
        dims: list[Any] = []
        for i, (lo, opt, hi) in enumerate(zip(*info.shape_bounds)):
            if i in info.dimension_names:
                sym = named_symbols[info.dimension_names[i]]
                owners[sym] = info.dimension_names[i]
            elif lo == hi:
                dims.append(lo)
                continue
            else:
                sym = _identifier(f"{path}_d{i}", taken)
                owners[sym] = None
            bounds[sym] = (lo, opt, hi)
            uses.setdefault(sym, []).append((path, i))
            dims.append(sym)
        dims_per_leaf.append(dims)
    symbols = [Symbol(s, bounds[s], owners[s], tuple(uses[s])) for s in bounds]
    return dims_per_leaf, symbols


def symbolic_specs(leaves: Sequence[tuple[str, InputInfo]]) -> tuple[list[jax.ShapeDtypeStruct], list[Symbol]]:
    dims_per_leaf, symbols = make_symbols(leaves)
    constraints = []
    for s in symbols:
        lo, _, hi = s.bounds
        if lo > 1:
            constraints.append(f"{s.name} >= {lo}")
        constraints.append(f"{s.name} <= {hi}")
    scope = jax.export.SymbolicScope(constraints)
    specs = []
    for (_, info), dims in zip(leaves, dims_per_leaf):
        text = ", ".join(str(d) for d in dims)
        shape = jax.export.symbolic_shape(text, scope=scope) if dims else ()
        specs.append(jax.ShapeDtypeStruct(shape, info.dtype))
    return specs, symbols


@contextmanager
def deterministic_locations() -> Iterator[None]:
    """Keep source paths and line numbers out of the program so rebuilds are byte-identical."""
    old = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        yield
    finally:
        jax.config.update("jax_traceback_in_locations_limit", old)


def _independent_dims_error(err: Exception, symbols: Sequence[Symbol], fname: str) -> TraceError | None:
    text = str(err)
    mentioned = [s for s in symbols if re.search(rf"\b{re.escape(s.name)}\b", text)]
    independent = [s for s in mentioned if s.named is None]
    if not independent:
        return None
    inputs = sorted({p for s in independent for p, _ in s.uses})
    listing = "\n".join(f"  - {s.describe()}" for s in mentioned)
    return TraceError(
        f"{fname} combines dynamic dims that were declared independent, so their sizes cannot be "
        f"proven equal (inputs {', '.join(repr(i) for i in inputs)}):\n{listing}\n"
        "If these dims are always equal at run time, declare them with one "
        "NamedDimension(name, min, opt, max) shared by those inputs.\n"
        f"JAX said: {text.splitlines()[0]}"
    )


def _translated(err: Exception, symbols: Sequence[Symbol], fname: str) -> Exception | None:
    if isinstance(err, TraceError):
        return None
    return translate_trace_error(err, fname) or _independent_dims_error(err, symbols, fname)


def export(flat_fn: Callable, leaves: Sequence[tuple[str, InputInfo]], sizes: Sequence[tuple[str, DimSize]],
           owners: dict[int, tuple[str, str]], platforms: Sequence[str], prep_name: str | None = None) -> Program:
    """Trace ``flat_fn(*leaves, *sizes)`` once, split off its weights and export ``main`` and ``prep``
    (named ``prep_name``, default ``<function>_prep``: the entries of one build name theirs alike, so that
    entries doing the same weight-only work have the same prep program, stored and run once)."""
    specs, symbols = symbolic_specs(leaves)
    named = {s.named for s in symbols if s.named}
    for path, size in sizes:
        if size.name not in named:
            raise TraceError(
                f"argument '{path}' is {size!r}, but no input has a NamedDimension {size.name!r}; "
                f"named dims: {', '.join(map(repr, sorted(named))) or 'none'}."
            )
    size_specs = [jax.ShapeDtypeStruct((), "int32") for _ in sizes]
    fname = getattr(flat_fn, "__name__", "function")
    try:
        with deterministic_locations():
            closed, out_tree = weights_lib.trace(flat_fn, [*specs, *size_specs])
    except Exception as err:
        translated = _translated(err, symbols, fname)
        if translated is None:
            user = raised_in_user_code(err, f"{fname}, while tracing,")
            if user is None:
                raise
            raise user from err  # the original stays attached as the cause
        raise translated.with_traceback(None) from None
    split = weights_lib.split(closed, out_tree, owners)
    split.main.__name__ = split.main.__qualname__ = fname
    weight_specs = [jax.ShapeDtypeStruct(w.value.shape, w.value.dtype) for w in split.weights]
    leading = [weight_specs[s.index] if s.kind == "weight" else
               jax.ShapeDtypeStruct(split.prep_avals[s.index].shape, split.prep_avals[s.index].dtype)
               for s in split.sources]
    prep, chunks = None, []
    with deterministic_locations():
        if split.prep is not None:
            prep_name = prep_name or f"{fname}_prep"
            split.prep.__name__ = split.prep.__qualname__ = prep_name
            prep = jax.export.export(jax.jit(split.prep), platforms=tuple(platforms))(*weight_specs)
            for n, chunk in enumerate(split.chunks):
                fn = split.chunk_fn(chunk)
                fn.__name__ = fn.__qualname__ = f"{prep_name}{n}"
                chunks.append((chunk, jax.export.export(jax.jit(fn), platforms=tuple(platforms))(
                    *[weight_specs[i] for i in chunk.weights])))
        try:
            main = jax.export.export(jax.jit(split.main), platforms=tuple(platforms))(*leading, *specs, *size_specs)
        except Exception as err:
            translated = _translated(err, symbols, fname)
            if translated is None:
                raise
            raise translated.with_traceback(None) from None
    return Program(main, prep, split.weights, split.sources, symbols, chunks)


def output_infos(program: Program, leaves: Sequence[tuple[str, InputInfo]], n_sizes: int) -> list[InputInfo]:
    """Output specs with every range resolved, by shape inference at the min, opt and max shapes."""
    exported, symbols = program.main, program.symbols
    leading = program.leading_avals()
    size_specs = [jax.ShapeDtypeStruct((), "int32")] * n_sizes
    shapes = []
    for k in range(3):
        concrete = [jax.ShapeDtypeStruct(info.shape_bounds[k], info.dtype) for _, info in leaves]
        out = jax.eval_shape(exported.call, *leading, *concrete, *size_specs)
        shapes.append([o.shape for o in jax.tree_util.tree_leaves(out)])
    named = {s.name: s.named for s in symbols if s.named}
    infos = []
    for i, aval in enumerate(exported.out_avals):
        dims = []
        for d, sym in enumerate(aval.shape):
            lo, opt, hi = (shapes[k][i][d] for k in range(3))
            lo, hi = min(lo, opt, hi), max(lo, opt, hi)  # shape functions need not be monotone
            if isinstance(sym, int) or lo == hi:
                dims.append(lo)
            elif str(sym) in named:
                dims.append(NamedDimension(named[str(sym)], lo, opt, hi))
            else:
                dims.append((lo, opt, hi))
        infos.append(InputInfo(dims, aval.dtype))
    return infos
