"""The products of a reduced-precision build, computed in its dtype, whatever the function's own code does.

``precision="bfloat16"`` casts the weights and the inputs; the function's code decides the rest, and two things
in ordinary code undo the saving without a word (measured on the zoo, fixed there in ``models/_layers``, and here
for every function a build is given: a user's own model, a Flax or Equinox module):

- **A lifted product.** A float32 constant anywhere upstream (a rotary table, a scale vector, a mask made with
  ``jnp.float32``) promotes the activations to float32, and every product after it converts its bfloat16 weight
  matrix to float32 on every call. Such a product (one operand in bfloat16, or a bfloat16 value converted to
  float32, the other in float32) is computed from the bfloat16 value itself and the other operand rounded to
  bfloat16, accumulated and returned in float32 as the function had it: the rest of the function is unchanged.
- **A one-row product on the CPU.** XLA's CPU backend gives a bfloat16 product of one row (a batch-1 call, a
  decode step) to no library and converts the whole matrix to float32 on every call; with one row of zeros more
  it takes YNNPACK's bfloat16 kernel (``models/_layers.matmul``: Qwen2.5-0.5B's LM head 130 ms -> 12 ms). A
  product without batch dims whose rows may number one (a static 1, or a symbolic dim not provably >= 2) gets
  that row on the CPU (``lax.platform_dependent``; other platforms unchanged).

The function is traced, then its jaxpr evaluated again with those products replaced, into a jaxpr of its own that
the function then runs; one with none is returned as it is (the zoo's, which avoid both). The evaluation inlines the
calls it makes (``jit``, custom derivatives, remat) and rewrites the bodies of ``scan``, ``while`` and ``cond``.
The error of the result is measured against float32 as every reduced build's is (``compiler/precision.py``).
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, InconclusiveDimensionOperation, Literal, jaxpr_as_fun
from jax.extend.core import primitives as prims

_INLINED = {prims.jit_p: "jaxpr", prims.closed_call_p: "call_jaxpr", prims.custom_jvp_call_p: "call_jaxpr",
            prims.custom_vjp_call_p: "call_jaxpr", prims.remat_p: "jaxpr"}


def in_dtype(fn: Callable, dtype: str) -> Callable:
    """``fn`` with its lifted products computed in ``dtype`` and, in bfloat16, its one-row products padded on the
    CPU; ``fn`` itself where it has none. ``counts`` of the returned function: what the last trace replaced."""
    def rewritten(*args: Any) -> Any:
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        leaves = jax.tree_util.tree_leaves(args)
        found: collections.Counter = collections.Counter()
        new = jax.make_jaxpr(lambda *a: _Rewrite(dtype, found).run(closed, a))(*leaves)
        rewritten.counts = dict(found)
        if not found:
            return fn(*args)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), jaxpr_as_fun(new)(*leaves))

    rewritten.counts = {}
    rewritten.__name__ = rewritten.__qualname__ = getattr(fn, "__name__", "rewritten")
    return rewritten


def _may_be_one(dim: Any) -> bool:
    try:
        return not bool(dim >= 2)
    except InconclusiveDimensionOperation:  # a symbolic dim whose bounds cannot say
        return True


def _runs_on_cpu(platforms: Any, branch: int) -> bool:
    """Whether branch ``branch`` of a ``cond`` may run on the CPU (``branches_platforms``: ``platform_dependent``'s
    branches by platform, None for its default; absent for an ordinary ``cond``)."""
    if platforms is None:
        return True
    if platforms[branch] is None:
        return not any(names and "cpu" in names for names in platforms)
    return "cpu" in platforms[branch]


class _Rewrite:
    def __init__(self, dtype: str, found: collections.Counter, cpu: bool = True) -> None:
        self.dtype = jnp.dtype(dtype)
        self.found = found
        self.cpu = cpu  # whether the code rewritten may run on the CPU (a platform_dependent branch for another may not)
        self.lifted: dict[int, tuple[Any, Any]] = {}  # id(a float32 value) -> (it, the reduced value it was converted from)

    def run(self, closed: ClosedJaxpr, args: Any) -> list[Any]:
        return self.eval(closed.jaxpr, closed.consts, args)

    def eval(self, jaxpr: Any, consts: Any, args: Any) -> list[Any]:
        env: dict[Any, Any] = {}
        read = lambda v: v.val if isinstance(v, Literal) else env[v]  # noqa: E731
        for var, value in zip(jaxpr.constvars, consts):
            env[var] = value
        for var, value in zip(jaxpr.invars, args):
            env[var] = value
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            outs = self.eqn(eqn, invals)
            for var, value in zip(eqn.outvars, outs):
                env[var] = value
        return [read(v) for v in jaxpr.outvars]

    def eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        prim = eqn.primitive
        if prim in _INLINED:
            sub = eqn.params[_INLINED[prim]]
            if isinstance(sub, ClosedJaxpr):
                return self.eval(sub.jaxpr, sub.consts, invals)
            return self.eval(sub, (), invals)
        if prim is prims.dot_general_p:
            return [self.dot(eqn, *invals)]
        params = {k: self.body(v, self.cpu) for k, v in eqn.params.items() if k != "branches"}
        if "branches" in eqn.params:
            platforms = eqn.params.get("branches_platforms")
            params["branches"] = tuple(self.body(b, self.cpu and _runs_on_cpu(platforms, i))
                                       for i, b in enumerate(eqn.params["branches"]))
        out = prim.bind(*invals, **prim.get_bind_params(params))
        outs = list(out) if prim.multiple_results else [out]
        if prim.name == "convert_element_type" and invals[0].dtype == self.dtype and outs[0].dtype == jnp.float32:
            self.lifted[id(outs[0])] = (outs[0], invals[0])
        return outs

    def body(self, value: Any, cpu: bool) -> Any:
        """A ``scan``/``while``/``cond`` body (a closed jaxpr) with its products rewritten; any other parameter as
        it is."""
        if not isinstance(value, ClosedJaxpr):
            return value
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in value.jaxpr.invars]
        inner = _Rewrite(self.dtype.name, self.found, cpu)
        before = sum(self.found.values())
        new = jax.make_jaxpr(lambda *a: inner.eval(value.jaxpr, value.consts, a))(*avals)
        return new if sum(self.found.values()) > before else value

    def dot(self, eqn: Any, lhs: Any, rhs: Any) -> Any:
        params = dict(eqn.params)
        out_dtype = eqn.outvars[0].aval.dtype
        operands = []
        for x in (lhs, rhs):
            source = self.lifted.get(id(x))
            operands.append(source[1] if source is not None and source[0] is x else x)
        if any(a is not b for a, b in zip(operands, (lhs, rhs))) or {x.dtype for x in operands} == {
                self.dtype, jnp.dtype(jnp.float32)}:
            self.found["lifted"] += 1
            operands = [x.astype(self.dtype) if x.dtype == jnp.float32 else x for x in operands]
            params["preferred_element_type"] = out_dtype
        lhs, rhs = operands
        (contract, _), (batch, _) = params["dimension_numbers"]
        free = [i for i in range(lhs.ndim) if i not in contract and i not in batch]
        if (self.cpu and self.dtype == jnp.bfloat16 and lhs.dtype == rhs.dtype == jnp.bfloat16 and not batch and free
                and all(_may_be_one(lhs.shape[i]) for i in free)):
            self.found["one row"] += 1
            axis = free[-1]

            def padded(lhs: Any, rhs: Any) -> Any:
                zeros = jnp.zeros((*lhs.shape[:axis], 1, *lhs.shape[axis + 1:]), lhs.dtype)
                y = prims.dot_general_p.bind(jnp.concatenate([lhs, zeros], axis=axis), rhs, **params)
                return jax.lax.slice_in_dim(y, 0, lhs.shape[axis], axis=free.index(axis))

            def plain(lhs: Any, rhs: Any) -> Any:
                return prims.dot_general_p.bind(lhs, rhs, **params)
            return jax.lax.platform_dependent(lhs, rhs, cpu=padded, default=plain)
        return prims.dot_general_p.bind(lhs, rhs, **params)
