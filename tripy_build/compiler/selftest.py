"""Self-test cases made at build: seeded inputs at the min, opt and max shapes, with reference outputs.

Their format in an artifact, and the comparison ``verify`` makes, are ``artifact/selftest.py``'s. The
reference is the function traced from its Python source by ``jax.jit`` at each case's concrete
shapes: independent of everything an artifact adds (the symbolic export, the weight split and prep
program, the profiles, padding). Eager, op-by-op JAX would be independent too but costs 3-4x more
(each op compiles for each shape: 2-6 s per shape for the transformer block here).

Along a dim declared ``rows`` the reference runs one row at a time, each row's outputs folded into what
the self-test keeps of them (``OutputSketch``) as they come: running BERT-base at its max shape (16, 512)
took 1.2 GB of XLA's working memory on top of the weights, and GPT-2's logits there are 1.6 GB, so a
build held several times the weights for this one case (GPT-2: a 10 GB peak). The declaration is proven
on the compiled profiles before (``compiler/proofs.py``), and a wrong one would fail the self-test
itself, which runs the artifact's profile on the whole batch against these rows.

An executable that pads gets one more case, ``padded``, at shapes just above a bucket, so that the
padding path is checked wherever the artifact is verified.

Every artifact carries them so that ``verify`` can check, on any host, that the executables it
loads compute what the model computed when it was built, without the model's code.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from ..artifact.selftest import CASES, Case, OutputSketch, sample
from ..core.spec import InputInfo
from ..host import usable_cores


def make(flat_fn: Callable, leaves: Sequence[tuple[str, InputInfo]], fixed: dict[int, Any] | None = None,
         seed: int = 0, extra: dict[int, tuple[int, ...]] | None = None, ones: frozenset[int] = frozenset(),
         rows: tuple[Mapping[int, int], Sequence[int]] | None = None) -> list[Case]:
    """Run ``flat_fn`` (traced from its source with ``jax.jit``) on seeded inputs.

    Leaves in ``fixed`` (bound inputs such as weights) take those values and are not stored in the case.
    ``extra`` gives the shape of every leaf for one more case, ``padded``. Leaves in ``ones`` (attention
    masks: every real position attended) are all ones. ``rows``: the axis of a dim declared ``rows`` in
    each leaf that has it (by leaf index) and in each output; the reference then runs a row at a time.
    """
    fixed = fixed or {}
    shapes = {which: {li: getattr(info.shape_bounds, which) for li, (_, info) in enumerate(leaves)} for which in CASES}
    if extra:
        shapes["padded"] = extra
    drawn = []
    for ci, (which, case_shapes) in enumerate(shapes.items()):
        sampled = {li: np.ones(case_shapes[li], info.dtype) if li in ones else sample(info, case_shapes[li], (seed, ci, li))
                   for li, (_, info) in enumerate(leaves) if li not in fixed}
        drawn.append((which, ci, sampled, [fixed[li] if li in fixed else sampled[li] for li in range(len(leaves))]))
    options = ROWS_OPTIONS if rows else ONCE_OPTIONS
    runs = compile_each(flat_fn, [first_batch(full, rows) for *_, full in drawn], options)
    return [Case(which, list(sampled.values()), reference_outputs(run, full, rows),
                 seeds=[None if li in ones else (seed, ci, li) for li in sampled],
                 values=[leaves[li][1].values for li in sampled], holds=[leaves[li][1].holds for li in sampled])
            for run, (which, ci, sampled, full) in zip(runs, drawn)]


def batches(full: Sequence[Any], rows: tuple[Mapping[int, int], Sequence[int]] | None) -> tuple[int, int]:
    """How many rows the reference runs along ``rows`` (1 without), and how many at a time.

    Where each row of every input along ``rows`` is a single element (BERT's ``min`` case, (1, 1)), two rows run
    at a time, a last one beside a copy of itself: at one such row every matrix product is a matrix-vector one,
    for which XLA copies each weight matrix transposed on every run (BERT-base: 245 MB of scratch at (1, 1),
    81 MB at (2, 1); (1, 1) was the peak of its build). Not two everywhere: two rows of GPT-2's logits at
    (16, 512) are 206 MB.
    """
    in_axes = rows[0] if rows else {}
    n = next((np.shape(full[li])[a] for li, a in in_axes.items()), 1)
    step = 2 if in_axes and all(np.size(full[li]) == np.shape(full[li])[a] for li, a in in_axes.items()) else 1
    return n, step


def first_batch(full: Sequence[Any], rows: tuple[Mapping[int, int], Sequence[int]] | None) -> list[Any]:
    """The abstract values (shape, dtype) of the arguments each run of the reference takes."""
    in_axes = rows[0] if rows else {}
    _, step = batches(full, rows)
    return [jax.ShapeDtypeStruct(tuple(step if a == in_axes.get(li) else k for a, k in enumerate(v.shape)), v.dtype,
                                 weak_type=v.weak_type) for li, v in enumerate(map(jax.typeof, full))]


def reference_outputs(run: Callable[..., list[Any]], full: Sequence[Any],
                      rows: tuple[Mapping[int, int], Sequence[int]] | None) -> list[Any]:
    """``run(*full)``'s flat outputs as the self-test keeps them (``OutputSketch.result``), computed a row at a
    time along ``rows`` (``make``; ``batches``) when it is given; ``run`` is compiled for ``first_batch``."""
    in_axes, out_axes = rows if rows else ({}, None)
    n, step = batches(full, rows)
    whole = [None if li in in_axes else jax.numpy.asarray(x) for li, x in enumerate(full)]  # placed once
    sketches: list[OutputSketch] = []
    for start in range(0, n, step):
        kept = min(step, n - start)
        taken = [min(start + k, n - 1) for k in range(step)]  # the last row again where fewer are left
        args = [jax.numpy.asarray(np.take(x, taken, axis=in_axes[li])) if li in in_axes else whole[li]
                for li, x in enumerate(full)]
        outs = [np.asarray(o) for o in run(*args)]
        axes = out_axes or [None] * len(outs)
        outs = [o if axis is None else o[(slice(None),) * axis + (slice(0, kept),)] for o, axis in zip(outs, axes)]
        sketches = sketches or [OutputSketch([n if a == axis else k for a, k in enumerate(o.shape)], o.dtype, axis)
                                for o, axis in zip(outs, axes)]
        for sketch, o in zip(sketches, outs):
            sketch.add(o, start)
        del outs
    return [s.result() for s in sketches]


def compile_each(fn: Callable, specs: Sequence[Sequence[Any]], options: dict[str, Any]) -> list[Callable[..., list[Any]]]:
    """``lower_once(fn, *args, options=options)`` compiled, for each ``args`` of ``specs`` (abstract values): traced in
    turn, each compiled in a thread pool as soon as it is traced (XLA releases the GIL: the next one traces
    meanwhile), as the profiles are (``compiler/pipeline.py``)."""
    workers = max(1, min(len(specs), len(usable_cores())))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tripy_build-reference") as pool:
        compiling = [pool.submit(lower_once(fn, *args, options=options)[0]) for args in specs]
        return [c.result() for c in compiling]


ONCE_OPTIONS = {"xla_backend_optimization_level": 0}

ROWS_OPTIONS: dict[str, Any] = {}
"""A reference run row by row is compiled as XLA's default does: at -O0, XLA's own code for a one-row matrix
product ran the default GEGLU's 64 rows in 1.6 s (19 ms a row) against 0.27 s for all its cases run whole."""


def lower_once(fn: Callable, *args: Any, options: dict[str, Any] = ONCE_OPTIONS
               ) -> tuple[Callable[[], Callable[..., list[Any]]], Any]:
    """``fn`` traced and lowered by ``jax.jit`` for code that runs a few times at ``args``' shapes (arrays or
    abstract values), and the tree of its outputs. Calling the first compiles it: a callable on arguments of
    those shapes that returns the flat outputs. LLVM at -O0 compiles in ~60% of the time, and the arrays ``fn``
    closes over (a model's weights) are passed in as arguments rather than folded into the program as
    constants, which for BERT-base (418 MB of weights) made the compile take minutes and gigabytes.

    The backend level changes how fast the code runs, not what it computes (no fast-math, no
    reassociation), and a reference compiled differently from the profiles is a better check.
    """
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    consts = list(closed.consts)

    def with_weights(weights: Sequence[Any], *xs: Any) -> Any:
        return jax.core.eval_jaxpr(closed.jaxpr, weights, *xs)

    lowered = jax.jit(with_weights).lower(consts, *args)

    def compile_() -> Callable[..., list[Any]]:
        compiled = lowered.compile(compiler_options=options or None)
        return lambda *xs: compiled(consts, *xs)

    return compile_, jax.tree_util.tree_structure(shapes)


def run_once(fn: Callable, *args: Any) -> Any:
    """``jax.jit(fn)(*args)`` for code that runs once (``lower_once``), its outputs in ``fn``'s structure."""
    compile_, tree = lower_once(fn, *args)
    return jax.tree_util.tree_unflatten(tree, compile_()(*args))
