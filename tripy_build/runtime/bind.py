"""``bind``'s new records: a compiled model with runtime inputs fixed to values, or with new weights for a
constant argument (prepared again), never recompiled (``Executable.bind``; ``tb.load`` fixes an artifact's bound
inputs with the first).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np

from ..core.signature import array_types, check_leaf
from ..core.spec import flatten_like
from ..errors import CallError
from .compiled import CompiledModel, Reference
from .prepare import prepare
from .program import Weight


def with_inputs(model: CompiledModel, values: Mapping[str, Any], dirs: Mapping[str, str]) -> CompiledModel:
    """``model`` with runtime inputs bound to ``values`` (checked as given, before ``device_put`` could cast:
    float64 -> float32), each saved to its folder of ``dirs`` in an artifact."""
    for name, value in values.items():
        leaves: list[Any] = []
        flatten_like(next(p for p in model.parameters if p.name == name).template, value, name, leaves)
        for leaf, (path, info) in zip(leaves, model.leaves[model.leaf_slices[name]]):
            check_leaf(leaf, path, info)
    bound = {**model.bound, **{n: (jax.tree_util.tree_map(jax.device_put, v), dirs[n]) for n, v in values.items()}}
    # a loaded model's stored self-test outputs were computed with other inputs
    return model.replace(bound=bound, selftest_from=model.selftest_from if isinstance(model.selftest_from, Reference)
                         or not values else None)


def with_weights(model: CompiledModel, swapped: Mapping[str, Any]) -> CompiledModel:
    """``model`` with the weights of the constant arguments in ``swapped`` taken from their new values (checked,
    never cast), and prepared again."""
    weights = [_replace_weight(w, swapped) if w.argument in swapped else w for w in model.program.weights]
    program = dataclasses.replace(model.program, weights=weights)
    # a loaded model's stored self-test outputs were computed with the old weights
    return model.replace(program=program, prepared=prepare(program, model.prep_executables),
                         selftest_from=model.selftest_from if isinstance(model.selftest_from, Reference) else None)


def _replace_weight(weight: Weight, values: dict[str, Any]) -> Weight:
    """``weight`` with its value taken from the new value of its argument, checked, never cast."""
    argument = weight.argument
    leaves = {argument + jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(values[argument])[0]}
    if weight.path not in leaves:
        raise CallError(f"bind({argument}=...): the new value has no leaf {weight.path}, which the program uses; "
                        "pass a tree with the same structure as at compile time.")
    value = leaves[weight.path]
    want = (tuple(weight.value.shape), np.dtype(weight.value.dtype))
    got = (tuple(np.shape(value)), np.dtype(getattr(value, "dtype", np.asarray(value).dtype)))
    if not isinstance(value, array_types()) or got != want:
        raise CallError(
            f"bind({argument}=...): {weight.path} must be an array of shape {want[0]} and dtype {want[1].name}, "
            f"got {type(value).__name__} of shape {got[0]} and dtype {got[1].name} (no silent casts)."
        )
    return Weight(weight.path, argument, jax.device_put(value))
