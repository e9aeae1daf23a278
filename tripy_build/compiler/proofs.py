"""Padding declarations proven on the compiled executables, before a build or compile returns.

``rows`` says slices along a dim are independent; ``mask`` says the function masks everything at or
beyond the dim's true size; a mask input says it ignores every position where that input is 0. Each is
checked at every bucket boundary with large random values in the padding (the mask input's padding 0,
integer inputs within their declared value range), so that a model mixing rows or ignoring its mask
fails the build, naming the dim.
"""

from __future__ import annotations

import jax
import numpy as np

from ..artifact.selftest import DEFAULT_RTOL, RTOL, sample
from ..core.profiles import MaskInput, mask_inputs
from ..errors import SpecError
from ..runtime.executable import Executable


GARBAGE_SCALE = 8.0  # padding in the proof is filled with large random values, so any leak shows


def prove_padding(exe: Executable, seed: int = 0, budget: float | None = None) -> None:
    """Check every padding declaration on the compiled executables, at every bucket boundary.

    For a padded dim with buckets ``b0 < b1 < ...`` and every pair ``(b_i, b_i+1)``: random inputs of
    size ``b_i`` run exactly, and the same inputs filled up to ``b_i+1`` with large random values (not
    zeros, so that a model mixing rows or ignoring its mask shows it) run the larger bucket with the
    true size in ``DimSize``; the outputs, sliced back, must agree within the self-test tolerance.
    The other dims sit at their smallest bucket. Raises ``SpecError`` naming the dim. ``budget``: a
    reduced-precision build's error budget (``compiler/precision.py``); the comparison allows it where it is above
    the dtype's self-test tolerance (``_scale``).
    """
    rng = np.random.default_rng(seed)
    dispatcher = exe.dispatcher
    base = [d.buckets[0] if d.buckets else d.bounds[1] for d in exe.dims]
    for di, d in enumerate(exe.dims):
        if d.strategy != "padded":
            continue
        for small, large in zip(d.buckets, d.buckets[1:]):
            at_small = tuple(small if i == di else n for i, n in enumerate(base))
            at_large = tuple(large if i == di else n for i, n in enumerate(base))
            leaves = exe.flat_inputs
            ones = mask_inputs(exe.dims, [p for p, _ in leaves])
            inputs = [np.ones(s, info.dtype) if li in ones else sample(info, s, (seed, di, small, li))
                      for li, ((_, info), s) in enumerate(zip(leaves, dispatcher.leaf_shapes(at_small)))]
            mask = d.padding.input if isinstance(d.padding, MaskInput) else None
            filled = [x if x.shape == big else _fill(x, big, rng, info.values, zero=path == mask)
                      for x, big, (path, info) in zip(inputs, dispatcher.leaf_shapes(at_large), leaves)]
            true_sizes = dispatcher.route([x.shape for x in inputs]).sizes
            want = exe.run_profile(at_small, inputs, true_sizes)
            got = exe.run_profile(at_large, filled, true_sizes)
            exe.unload_profiles([at_small])  # a build's profiles are loaded only while it runs them
            for o, (w, g, axes) in enumerate(zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got),
                                                 dispatcher.out_axes)):
                g = np.asarray(g)[tuple(slice(0, at_small[a]) if a is not None else slice(None) for a in axes)]
                w = np.asarray(w)
                rtol = max(budget or 0.0, exe.tolerance or 0.0) or RTOL.get(w.dtype.name, DEFAULT_RTOL)
                err = np.abs(g.astype(np.float64) - w.astype(np.float64))
                bad = err > rtol * _scale(w, budget is not None or exe.tolerance is not None)
                if g.shape != w.shape or bad.any():
                    worst = float(err.max()) if g.shape == w.shape else float("inf")
                    declared = d.padding.to_json() if mask else d.padding
                    raise SpecError(
                        f"padding[{d.name!r}] = {declared!r} is not exact for {exe.__name__}: with {d.name}={small} "
                        f"padded to the bucket {large}, output {o} differs from the unpadded result by up to "
                        f"{worst:.3g} (tolerance {rtol:g}). "
                        + ("Slices along this dim are not independent; remove the declaration."
                           if d.padding == "rows" else
                           f"The model must ignore every position where {mask!r} is 0; fix the masking or remove "
                           "the declaration." if mask else
                           f"The model must mask every position at or beyond DimSize({d.name!r}); fix the "
                           "masking or remove the declaration.")
                    )


def _scale(w: np.ndarray, reduced: bool) -> np.ndarray | float:
    """What an output's error is measured against (times the tolerance): each element's ``1 + |w|``; for a
    reduced-precision build twice the output's own scale, ``2 max |w|``. There each of the two runs may be off the
    float32 result by the budget ``compiler/precision.py`` holds it to (a share of the output's scale), and two row
    counts take kernels that round differently: 4 layers of Qwen2.5-0.5B's shape in bfloat16, batch 1 against 2,
    differed by 2.0% of the logits' scale, each 1.4-1.8% off float32, whatever the padded row held. A leak of the
    proof's large fill values moves an output by its scale."""
    w = np.abs(w.astype(np.float64))
    return 2 * max(float(w.max(initial=0.0)), 1e-12) if reduced else 1.0 + w


def _fill(x: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator, values: tuple[int, int] | None = None,
          zero: bool = False) -> np.ndarray:
    """``x`` enlarged to ``shape``: the new positions 0 (``zero``: a mask input's padding), else random values far
    from zero (an integer input: anywhere in its declared ``values``, such as any token id)."""
    if zero:
        out = np.zeros(shape, x.dtype)
    elif x.dtype.kind == "f":
        out = (rng.standard_normal(shape) * GARBAGE_SCALE + GARBAGE_SCALE / 2).astype(x.dtype)
    elif x.dtype.kind == "b":
        out = rng.random(shape) < 0.5
    else:
        lo, hi = values if values is not None else (0, 4)
        out = rng.integers(lo, hi, shape).astype(x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out
