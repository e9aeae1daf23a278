"""Weights: the arrays a function closes over, lifted out of the program, stored once, prepared once.

XLA folds constants into every executable it compiles, so an artifact with one executable per shape
profile would carry the weights once per profile. Instead the traced function is split in two:

- ``prep(*weights) -> prepared``: the work that depends on the weights alone (a transpose before a
  matmul, a reshape into heads, a cast), run once when the weights are loaded or bound;
- ``main(*prepared, *inputs) -> outputs``: everything else, compiled once per profile, taking the
  prepared weights as arguments.

Doing the weight-only work ahead is what XLA's constant folding did for free: with raw weights as
arguments, ``x @ W.T`` at batch 8 ran 1.4-2.2x slower than with folded constants on this CPU, and
with prepared weights it runs as fast. An equation is moved to ``prep`` only if every input is a
weight (or derived from one), its outputs have static shapes (never a dim of a dynamic input), it has
no side effects and it does not make its data larger; the split is abandoned if the prepared weights
would outgrow the raw ones by ``MAX_PREPARED_GROWTH``.

``prep`` is also cut into chunks (``PrepChunk``): groups of prepared arrays that share no weight,
about ``PREP_CHUNK_BYTES`` each. A loader runs them one after another and drops each chunk's raw
weights once it has run, so the raw weights and the prepared ones are never both held in full: for
BERT-base, whose prep transposes and fuses nearly every matrix, one prep call held 1.8x the weights.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..runtime.program import PrepChunk, Source, Weight, resolve
from jax.extend import core
from jax.extend.core.primitives import jit_p
from jax._src import source_info_util

# Anonymous constants (not from a constant argument) smaller than this stay folded into the program.
INLINE_MAX_BYTES = 1024
# A weight-only equation may grow its data this much over all its inputs together and still be prepared
# ahead: a concatenate (a fused QKV matrix) or a transpose is no growth, a broadcast of a bias row is small,
# a broadcast of a matrix to a batch or an outer product is refused.
MAX_EQN_GROWTH = 1.0
SMALL_EQN_BYTES = 64 * 1024
MAX_PREPARED_GROWTH = 1.5
# A prep chunk's raw and prepared bytes together, about (one group of arrays sharing a weight may exceed it).
PREP_CHUNK_BYTES = 64 * 1024 * 1024


@dataclass
class Split:
    """A traced function split into weights, a prep function and a main function."""

    weights: list[Weight]
    prep: Callable | None  # (*weight values) -> list of prepared arrays; None if nothing to prepare
    prep_avals: list[Any]  # shapes/dtypes of prep's outputs
    sources: list[Source]  # one per leading argument of main
    main: Callable  # (*leading, *inputs) -> outputs, with the function's own output tree
    out_tree: Any
    chunks: list[PrepChunk] = dataclasses.field(default_factory=list)  # prep in pieces that share no weight
    chunk_fn: Callable[[PrepChunk], Callable] | None = None  # a chunk's function: (*its weights) -> its outputs

    def prepare(self, weights: Sequence[Any], run_prep: Callable | None = None) -> list[Any]:
        """The leading arguments of ``main`` for these weight values (``run_prep`` runs ``prep``)."""
        prepared = (run_prep or self.prep)(*weights) if self.prep is not None else []
        return resolve(self.sources, weights, prepared)


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _is_static(aval: Any) -> bool:
    """A plain array of known shape (a PRNG key's extended dtype is neither sized nor prepared)."""
    dtype = getattr(aval, "dtype", None)
    if dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return False
    return all(isinstance(d, (int, np.integer)) for d in getattr(aval, "shape", ()))


def _eval(eqns: Sequence[Any], env: dict[Any, Any], inline: bool = False) -> None:
    """Evaluate equations into ``env`` (``core.eval_jaxpr``'s loop, over a subset of a jaxpr).

    With ``inline``, nested ``jit`` calls are evaluated equation by equation instead of bound whole.
    """
    def read(v: Any) -> Any:
        return v.val if isinstance(v, core.Literal) else env[v]

    for eqn in eqns:
        args = [read(v) for v in eqn.invars]
        if inline and eqn.primitive is jit_p:
            inner = eqn.params["jaxpr"]
            sub = dict(zip(inner.jaxpr.constvars, inner.consts))
            sub.update(zip(inner.jaxpr.invars, args))
            _eval(inner.jaxpr.eqns, sub, inline)
            ans = [v.val if isinstance(v, core.Literal) else sub[v] for v in inner.jaxpr.outvars]
        else:
            bind_params = eqn.primitive.get_bind_params(eqn.params)
            name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
            with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
                ans = eqn.primitive.bind(*args, **bind_params)
            ans = ans if eqn.primitive.multiple_results else [ans]
        env.update(zip(eqn.outvars, ans))


def trace(flat_fn: Callable, specs: Sequence[jax.ShapeDtypeStruct]) -> tuple[core.ClosedJaxpr, Any]:
    """The jaxpr of ``flat_fn`` with nested ``jit`` calls inlined, so weight-only work inside them shows.

    (``jax.disable_jit`` would inline them too, but it also runs ``lax.scan`` and loops in Python.)
    """
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)

    def inlined(*args: Any) -> list[Any]:
        env = dict(zip(closed.jaxpr.constvars, closed.consts))
        env.update(zip(closed.jaxpr.invars, args))
        _eval(closed.jaxpr.eqns, env, inline=True)
        return [v.val if isinstance(v, core.Literal) else env[v] for v in closed.jaxpr.outvars]

    return jax.make_jaxpr(inlined)(*specs), jax.tree_util.tree_structure(out_shape)


def split(closed: core.ClosedJaxpr, out_tree: Any, owners: dict[int, tuple[str, str]]) -> Split:
    """Split a traced function; ``owners`` maps ``id(array)`` of constant-argument leaves to (argument, path).

    Constants that belong to a constant argument are always weights (so ``bind`` can replace them);
    other constants become weights when they are at least ``INLINE_MAX_BYTES``, else stay folded.
    """
    jaxpr = closed.jaxpr
    weights: list[Weight] = []
    weight_of_var: dict[Any, int] = {}
    inline: dict[Any, Any] = {}
    used = _used_vars(jaxpr)
    for i, (var, value) in enumerate(zip(jaxpr.constvars, closed.consts)):
        if var not in used:
            continue
        owner = owners.get(id(value))
        if owner is None and _nbytes(var.aval) < INLINE_MAX_BYTES:
            inline[var] = value
            continue
        argument, path = owner if owner is not None else (None, f"const[{i}]")
        weight_of_var[var] = len(weights)
        weights.append(Weight(path, argument, value))

    known = set(weight_of_var)
    prep_eqns, main_eqns = [], []
    constants: set[Any] = set()  # outputs of small equations of no input (a scale vector): made wherever read
    # weight-only work done more than once (a tied embedding table transposed for the inputs and for the logits):
    # each repeat's outputs -> the first's, so that it is prepared, and held on the device, once
    same: dict[Any, Any] = {}
    first: dict[Any, Any] = {}
    for eqn in jaxpr.eqns:
        if same and any(v in same for v in eqn.invars if not isinstance(v, core.Literal)):
            eqn = eqn.replace(invars=[v if isinstance(v, core.Literal) else same.get(v, v) for v in eqn.invars])
        ins = [v for v in eqn.invars if not isinstance(v, core.Literal)]
        static = not eqn.effects and all(_is_static(v.aval) for v in eqn.outvars)
        out_bytes = sum(_nbytes(v.aval) for v in eqn.outvars) if static else 0
        if not ins and static and out_bytes <= SMALL_EQN_BYTES:
            # ``w * jnp.concatenate([jnp.full(d, s), jnp.ones(2 * d)])`` is weight-only work: the vector is
            # made in prep too, so the product is prepared once instead of on every call
            prep_eqns.append(eqn)
            main_eqns.append(eqn)
            known.update(eqn.outvars)
            constants.update(eqn.outvars)
            continue
        foldable = bool(ins) and all(v in known for v in ins) and static and \
            out_bytes <= max(MAX_EQN_GROWTH * sum(_nbytes(v.aval) for v in ins), SMALL_EQN_BYTES)
        if foldable and all(v in constants for v in ins):
            prep_eqns.append(eqn)  # still made of constants only: made wherever read, as above
            main_eqns.append(eqn)
            known.update(eqn.outvars)
            constants.update(eqn.outvars)
            continue
        key = _work(eqn) if foldable else None
        if key is not None and key in first:
            same.update(zip(eqn.outvars, first[key].outvars))
            continue
        if key is not None:
            first[key] = eqn
        (prep_eqns if foldable else main_eqns).append(eqn)
        if foldable:
            known.update(eqn.outvars)
    outvars = [v if isinstance(v, core.Literal) else same.get(v, v) for v in jaxpr.outvars]

    needed = _vars_read(main_eqns) | {v for v in outvars if not isinstance(v, core.Literal)}
    computed = [v for eqn in prep_eqns for v in eqn.outvars if v in needed and v not in constants]
    if constants:  # main keeps the constant equations it reads (directly, or through another constant)
        read = _vars_read([e for e in main_eqns if not set(e.outvars) <= constants]) | set(outvars)
        kept = []
        for eqn in reversed(main_eqns):
            if not set(eqn.outvars) <= constants or read & set(eqn.outvars):
                kept.append(eqn)
                read |= _vars_read([eqn])
        main_eqns = kept[::-1]
    weight_bytes = sum(w.nbytes for w in weights)
    if sum(_nbytes(v.aval) for v in computed) > MAX_PREPARED_GROWTH * max(weight_bytes, 1):
        prep_eqns, main_eqns, computed = [], list(jaxpr.eqns), []
    leading = [v for v in weight_of_var if v in (_vars_read(main_eqns) | set(outvars))] + computed
    sources = [Source("weight", weight_of_var[v]) if v in weight_of_var else Source("prep", computed.index(v))
               for v in leading]
    weight_vars = list(weight_of_var)

    def prep(*values: Any) -> list[Any]:
        env = dict(inline)
        env.update(zip(weight_vars, values))
        _eval(prep_eqns, env)
        return [env[v] for v in computed]

    def chunk_fn(chunk: PrepChunk) -> Callable:
        wanted = [computed[k] for k in chunk.outputs]
        eqns = _needed(prep_eqns, wanted)

        def run(*values: Any) -> list[Any]:
            env = dict(inline)
            env.update(zip([weight_vars[i] for i in chunk.weights], values))
            _eval(eqns, env)
            return [env[v] for v in wanted]
        return run

    def main(*args: Any) -> Any:
        env = dict(inline)
        env.update(zip(leading, args[:len(leading)]))
        env.update(zip(jaxpr.invars, args[len(leading):]))
        _eval(main_eqns, env)
        outs = [v.val if isinstance(v, core.Literal) else env[v] for v in outvars]
        return jax.tree_util.tree_unflatten(out_tree, outs)

    chunks = _chunks(prep_eqns, computed, weight_vars, constants) if computed else []
    return Split(weights, prep if computed else None, [v.aval for v in computed], sources, main, out_tree, chunks,
                 chunk_fn if computed else None)


def _needed(eqns: Sequence[Any], wanted: Sequence[Any]) -> list[Any]:
    """The equations of ``eqns`` that ``wanted`` depends on, in order."""
    need = set(wanted)
    kept = []
    for eqn in reversed(eqns):
        if any(v in need for v in eqn.outvars):
            kept.append(eqn)
            need.update(v for v in eqn.invars if not isinstance(v, core.Literal))
    return kept[::-1]


def _chunks(prep_eqns: Sequence[Any], computed: Sequence[Any], weight_vars: Sequence[Any],
            constants: set[Any] = frozenset()) -> list[PrepChunk]:
    """``computed`` cut into chunks that share no weight (nor any work), about ``PREP_CHUNK_BYTES`` each.

    Prepared arrays made from a common weight, or through a common intermediate, are grouped (a
    union-find over the prep equations; a small constant each chunk makes for itself joins nothing);
    groups are packed in order of their first prepared array.
    """
    parent: dict[Any, Any] = {}

    def find(v: Any) -> Any:
        while parent.setdefault(v, v) is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for eqn in prep_eqns:
        vs = [v for v in (*eqn.invars, *eqn.outvars) if not isinstance(v, core.Literal) and v not in constants]
        for v in vs[1:]:
            parent[find(v)] = find(vs[0])
    groups: dict[Any, list[int]] = {}
    for k, v in enumerate(computed):
        groups.setdefault(find(v), []).append(k)
    index = {v: i for i, v in enumerate(weight_vars)}
    chunks: list[PrepChunk] = []
    weights: list[int] = []
    outputs: list[int] = []
    size = 0
    for root, ks in groups.items():
        members = [i for v, i in index.items() if find(v) is root]
        n = sum(_nbytes(computed[k].aval) for k in ks) + sum(_nbytes(weight_vars[i].aval) for i in members)
        if outputs and size + n > PREP_CHUNK_BYTES:
            chunks.append(PrepChunk(tuple(sorted(weights)), tuple(outputs)))
            weights, outputs, size = [], [], 0
        weights += members
        outputs += ks
        size += n
    chunks.append(PrepChunk(tuple(sorted(weights)), tuple(outputs)))
    return chunks


def _work(eqn: Any) -> Any:
    """What an equation computes, as a key equal for two that compute the same (primitive, inputs, parameters);
    None where a parameter is more than plain values (a jaxpr, a function: its text could hide what differs, such
    as the constants a jaxpr closes over), so that such equations are never merged."""
    if not all(_plain(v) for v in eqn.params.values()):
        return None
    params = tuple(sorted((k, repr(v)) for k, v in eqn.params.items()))
    return (eqn.primitive, tuple(("literal", repr(v.val)) if isinstance(v, core.Literal) else v for v in eqn.invars),
            params)


def _plain(value: Any) -> bool:
    """Whether a parameter is numbers, text, dtypes or enums (a transpose's permutation, a cast's dtype), in tuples."""
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, np.dtype, enum.Enum))


def _vars_read(eqns: Sequence[Any]) -> set[Any]:
    return {v for eqn in eqns for v in eqn.invars if not isinstance(v, core.Literal)}


def _used_vars(jaxpr: core.Jaxpr) -> set[Any]:
    return _vars_read(jaxpr.eqns) | {v for v in jaxpr.outvars if not isinstance(v, core.Literal)}
