"""Reduced precision: weights and compute in bfloat16 or float16, the interface unchanged, the cost measured.

With ``precision="bfloat16"`` (or ``"float16"``) every floating array among the constants (the
weights) is cast before tracing, so the artifact stores it at half the size; floating inputs are cast
on entry to the program and floating outputs back to the dtype the float32 function returns, so
callers pass and get what they did before. ``"float32"`` changes nothing.

The error is measured against the float32 function on the self-test inputs, per output, as the
largest absolute difference and that difference relative to the output's scale (``max |y - y32| /
max |y32|``; element-wise relative error is meaningless where outputs cross zero). A build fails when
the relative error exceeds ``max_error``. Measured on the zoo (default sizes): bfloat16 0.19-0.88%,
float16 0.066-0.090%. A language model computes in bfloat16 from end to end (``models/_layers.matmul``; until
2026-11-28 a float32 rotary table lifted its layers to float32) and errs more, the more layers it has (random
weights): 4 layers of Qwen2.5-0.5B's shape 1.4% on a 2x64 prompt (PyTorch's own bfloat16, the same weights and
prompt: 1.3%), 1.65% over a generate build's self-test; all 24 layers 2.4% on a 2x64 prompt (PyTorch's 2.3%),
4.3% over the self-test. The default budgets are 8% and 0.5%.

On the CPU bfloat16 halves the weights' and the cache's bytes at about float32's speed (XLA's bfloat16
products go to YNNPACK; see ``models/_layers.matmul`` for the one-row case). Whatever the function's code lifts to
float32, its products stay in the reduced dtype (``reduced_dots``: a user's 4 MLP blocks of Qwen2.5-0.5B's width,
with a float32 norm scale, ran 5-6x faster for it). float16 has no such kernel on the
CPU: every product converts its operands to float32 (a 896 x 151936 product: 124 ms against 16 in float32).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import SpecError
from .reduced_dots import in_dtype

PRECISIONS = ("float32", "bfloat16", "float16")
DEFAULT_MAX_ERROR = {"float32": None, "bfloat16": 0.08, "float16": 0.005}


def check(precision: Any, max_error: Any = None) -> tuple[str | None, float | None]:
    """(the reduced dtype or None for float32, the error budget)."""
    if precision is None:
        return None, None
    if precision not in PRECISIONS:
        raise SpecError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}.")
    if max_error is not None and (isinstance(max_error, bool) or not isinstance(max_error, (int, float)) or max_error <= 0):
        raise SpecError(f"max_error must be a positive number (the error relative to the output's scale), got {max_error!r}.")
    budget = DEFAULT_MAX_ERROR[precision] if max_error is None else float(max_error)
    return (None if precision == "float32" else precision), budget


def _floating(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def cast_constant(value: Any, dtype: str, placed: Any = None) -> Any:
    """``value`` with every floating array in it cast to ``dtype``; ``placed``: a compile's ``trace.Placed``, so that
    its entries given the same weights hold their cast once."""
    def one(v: Any) -> Any:
        if not (_floating(v) and np.ndim(v)):
            return v
        make = lambda a: jnp.asarray(a, dtype)  # noqa: E731
        return make(v) if placed is None else placed.once(placed.cast.setdefault(dtype, {}), v, make)
    return jax.tree_util.tree_map(one, value)


def wrap(flat: Callable, reference: Callable, dtype: str, specs: Sequence[jax.ShapeDtypeStruct]) -> Callable:
    """``flat`` computing in ``dtype``: floating inputs cast on entry, its products in ``dtype`` whatever its code
    lifts to float32 (``reduced_dots``), outputs back to the dtypes the float32 ``reference`` returns for
    ``specs``. ``rewritten`` of the result: what its last trace rewrote (``reduced_dots.in_dtype``'s counts)."""
    out_dtypes = [o.dtype for o in jax.tree_util.tree_leaves(jax.eval_shape(reference, *specs))]
    computed = in_dtype(flat, dtype)

    def reduced(*args: Any) -> Any:
        out = computed(*[a.astype(dtype) if _floating(a) else a for a in args])
        reduced.rewritten = computed.counts
        leaves, tree = jax.tree_util.tree_flatten(out)
        return jax.tree_util.tree_unflatten(tree, [o.astype(d) for o, d in zip(leaves, out_dtypes)])

    reduced.__name__ = reduced.__qualname__ = flat.__name__
    reduced.rewritten = {}
    return reduced


def error(got: Sequence[Any], want: Sequence[Any]) -> tuple[float, float]:
    """(max absolute error, max error relative to each output's scale) over matching outputs."""
    worst_abs, worst_rel = 0.0, 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        diff = float(np.abs(g - w).max(initial=0.0))
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / max(float(np.abs(w).max(initial=0.0)), 1e-12))
    return worst_abs, worst_rel


def measure_precision(exe: Any, reference: Callable, dtype: str, budget: float | None,
                      rewritten: dict[str, int] | None = None) -> dict[str, Any]:
    """Compare ``exe`` (an ``Executable``) with the float32 ``reference`` on the self-test inputs; the error, as
    its metadata records it (``precision``, with ``rewritten``: the products ``reduced_dots`` rewrote); the budget
    enforced."""
    from ..artifact.selftest import from_files
    from .selftest import run_once

    worst_abs, worst_rel, names = 0.0, 0.0, []
    for case, _, _ in from_files(*exe.selftest_cases()):
        got = jax.tree_util.tree_leaves(exe.call_flat(*case.inputs))
        sizes = exe.dispatcher.route([np.shape(x) for x in case.inputs]).sizes
        want = jax.tree_util.tree_leaves(run_once(reference, *case.inputs, *[np.int32(n) for n in sizes]))
        a, r = error(got, want)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        names.append(case.name)
    measured = {"dtype": dtype, "max_abs_error": worst_abs, "max_rel_error": worst_rel, "max_error": budget,
                "measured_on": names, "rewritten": dict(rewritten or {})}
    if budget is not None and worst_rel > budget:
        raise SpecError(
            f"precision {dtype}: the outputs differ from float32 by up to {worst_rel:.3g} of their scale (max abs "
            f"{worst_abs:.3g}) on the self-test inputs ({', '.join(names)}), over the budget max_error={budget:g}. "
            "Raise the budget, or build in float16 or float32."
        )
    return measured
