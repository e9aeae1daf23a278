"""Self-test cases made at build: seeded inputs at the min, opt and max shapes, with reference outputs.

Their format in an artifact, and the comparison ``verify`` makes, are ``artifact/selftest.py``'s. The
reference is the function traced from its Python source by ``jax.jit`` at each case's concrete
shapes: independent of everything an artifact adds (the symbolic export, the weight split and prep
program, the profiles, padding). Eager, op-by-op JAX would be independent too but costs 3-4x more
(each op compiles for each shape: 2-6 s per shape for the transformer block here).

An executable that pads gets one more case, ``padded``, at shapes just above a bucket, so that the
padding path is checked wherever the artifact is verified.

Every artifact carries them so that ``verify`` can check, on any host, that the executables it
loads compute what the model computed when it was built, without the model's code.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..artifact.selftest import CASES, Case, sample
from ..core.spec import InputInfo


def make(flat_fn: Callable, leaves: Sequence[tuple[str, InputInfo]], fixed: dict[int, Any] | None = None,
         seed: int = 0, extra: dict[int, tuple[int, ...]] | None = None, ones: frozenset[int] = frozenset()) -> list[Case]:
    """Run ``flat_fn`` (traced from its source with ``jax.jit``) on seeded inputs.

    Leaves in ``fixed`` (bound inputs such as weights) take those values and are not stored in the case.
    ``extra`` gives the shape of every leaf for one more case, ``padded``. Leaves in ``ones`` (attention
    masks: every real position attended) are all ones.
    """
    fixed = fixed or {}
    shapes = {which: {li: getattr(info.shape_bounds, which) for li, (_, info) in enumerate(leaves)} for which in CASES}
    if extra:
        shapes["padded"] = extra
    cases = []
    for ci, (which, case_shapes) in enumerate(shapes.items()):
        sampled = {li: np.ones(case_shapes[li], info.dtype) if li in ones else sample(info, case_shapes[li], (seed, ci, li))
                   for li, (_, info) in enumerate(leaves) if li not in fixed}
        full = [fixed[li] if li in fixed else sampled[li] for li in range(len(leaves))]
        args = [jax.numpy.asarray(x) for x in full]
        outputs = jax.tree_util.tree_leaves(run_once(flat_fn, *args))
        cases.append(Case(which, list(sampled.values()), [np.asarray(o) for o in outputs],
                          seeds=[None if li in ones else (seed, ci, li) for li in sampled],
                          values=[leaves[li][1].values for li in sampled]))
    return cases


ONCE_OPTIONS = {"xla_backend_optimization_level": 0}


def run_once(fn: Callable, *args: Any) -> Any:
    """``jax.jit(fn)(*args)`` for code that runs once: LLVM at -O0 compiles in ~60% of the time, and the arrays
    ``fn`` closes over (a model's weights) are passed in as arguments rather than folded into the program as
    constants, which for BERT-base (418 MB of weights) made the compile take minutes and gigabytes.

    The backend level changes how fast the code runs, not what it computes (no fast-math, no
    reassociation), and a reference compiled differently from the profiles is a better check.
    """
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    consts = list(closed.consts)

    def with_weights(weights: Sequence[Any], *xs: Any) -> Any:
        return jax.core.eval_jaxpr(closed.jaxpr, weights, *xs)

    outs = jax.jit(with_weights).lower(consts, *args).compile(compiler_options=ONCE_OPTIONS)(consts, *args)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outs)
