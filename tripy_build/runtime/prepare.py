"""The weights made ready for calls: the prep program run on them, chunk by chunk.

``main`` takes some weights as they are and some as the prep program makes them (transposes, casts,
concatenations: ``compiler/weights.py``), done once, by the compiler for a model it just compiled, by ``tb.load``
for one it loads, by ``bind`` for new weights. A chunk an artifact stores prepared (``runtime/save.py``) is placed
as stored; the others run, and a chunk's raw weights are let go once it has run, unless ``main`` takes them as
they are, so the raw and the prepared weights are never both held whole.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import jax
import numpy as np

from ..artifact.read import read_ahead
from .compiled import Precompiled
from .program import Program, Stored


def at_rest(program: Program, chunk: Any) -> bool:
    """Whether ``chunk``'s outputs are taken as the artifact stores them: stored prepared, and none of its weights
    given anew by ``bind`` since."""
    return all(k in program.at_rest for k in chunk.outputs) and \
        all(isinstance(program.weights[i].value, Stored) for i in chunk.weights)


def prepare(program: Program, prep_exes: Sequence[Precompiled]) -> tuple[Any, ...]:
    """Prep's outputs for ``program``'s weights, on the device; () where there is no prep program.

    ``prep_exes``: the chunks compiled (one per ``program.chunks``); where they are not (or one cannot run here)
    prep runs whole, through jax, and a chunk stored prepared gets zeros for the raw weights it lacks.
    """
    if program.prep is None:
        return ()
    weights = program.weights
    direct = {i: weights[i].array() for i in {s.index for s in program.sources if s.kind == "weight"}}
    prepared: list[Any] = [None] * len(program.prep.out_avals)
    rest = {n for n, (chunk, _) in enumerate(program.chunks) if at_rest(program, chunk)}
    stored = [k for n in sorted(rest) for k in program.chunks[n][0].outputs]
    with contextlib.closing(read_ahead([program.at_rest[k].read for k in stored],
                                       [program.at_rest[k].nbytes for k in stored])) as values:
        for k, value in zip(stored, values):
            prepared[k] = jax.device_put(value)
    runs = [(chunk, pre.ready()) for n, ((chunk, _), pre) in enumerate(zip(program.chunks, prep_exes)) if n not in rest]
    if not program.chunks or len(prep_exes) != len(program.chunks) or any(run is None for _, run in runs):
        lacking = {i for n in rest for i in program.chunks[n][0].weights}
        values = [np.zeros(w.value.shape, w.value.dtype) if i in lacking else direct[i] if i in direct else w.array()
                  for i, w in enumerate(weights)]
        made = jax.tree_util.tree_leaves(jax.jit(program.prep.call)(*values))
        return tuple(out if mine is None else mine for out, mine in zip(made, prepared))
    order = [i for chunk, _ in runs for i in chunk.weights if i not in direct]
    with contextlib.closing(read_ahead([weights[i].array for i in order], [weights[i].nbytes for i in order])) as values:
        for chunk, run in runs:
            raw = dict(zip([i for i in chunk.weights if i not in direct], values))
            outs = jax.block_until_ready(run(*[direct[i] if i in direct else raw[i] for i in chunk.weights]))
            for k, out in zip(chunk.outputs, outs):
                prepared[k] = out
            del raw
    return tuple(prepared)
