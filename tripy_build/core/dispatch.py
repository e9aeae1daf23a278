"""Dispatch: a call's input shapes -> the shapes to run at, and how to pad the inputs and slice the outputs.

A call whose shapes match a profile runs that executable as is. Otherwise each padded dim is rounded
up to its smallest covering bucket: the inputs are padded with zeros on the host (numpy) and the
outputs sliced back on the host, never with jax ops, which would compile once per shape. Dims
without declared padding keep their size; if the resulting shapes are no profile's, the caller
compiles them on first use. ``DimSize`` inputs always receive the true (unpadded) sizes.

A ``rows`` dim may instead be split: 34 rows run as 32 + 2 rather than as 64, when the profiles' latencies
(timed after the warm-up, ``runtime/warmup.calibrate``) say the calls cost well under one padded call
(``split_plan``). Padding wastes up to half the work at power-of-two buckets; compute-bound models feel that.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import SpecError
from .profiles import DimPlan


@dataclass(frozen=True)
class Route:
    """How to run one combination of input shapes."""

    target: tuple[int, ...]  # the size of every dim to run at (a profile, or shapes to compile)
    shapes: tuple[tuple[int, ...], ...]  # the shape of every flat input at ``target``
    pad: tuple[bool, ...]  # per flat input: whether it must be padded to its shape in ``shapes``
    slices: tuple[tuple[slice, ...] | None, ...]  # per flat output: the slice back to true sizes, or None
    sizes: tuple[int, ...]  # the values of the DimSize inputs (true sizes of their dims)
    # A split along one rows dim: (dim index, [(start, stop, route of that slice)]); None: one call.
    split: tuple[int, tuple[tuple[int, int, "Route"], ...]] | None = None

    @property
    def padded(self) -> bool:
        return any(self.pad)


SPLIT_CALL_COST_S = 50e-6
"""One more call, its slice and pad, and concatenating the outputs, charged against a split per extra call:
bench/split_vs_pad.py measured 30-50 us through tb.load (GEGLU, 33-48 rows as 32 + 1..16), less through the
runtime."""

SPLIT_MIN_GAIN = 0.7
"""Split only where estimated at most this fraction of the padded call. A profile's latency moves ~1.8x with
the machine's load (XLA's second thread free or not: GEGLU's batch 32 runs 0.42 or 0.77 ms on the 2-core VM),
between the warm-up's timing and a call; at 0.8, bench/split_vs_pad.py measured a split taken (39 rows as
32 + 8) 13% slower than padding. Splits that halve a call (the transformer block's 34 x 64 as 32 + 2:
13 ms against 27) are kept; GEGLU's 15-25% gains are not."""


def split_plan(n: int, buckets: Sequence[int], cost: Callable[[int], float | None], call_cost: float = SPLIT_CALL_COST_S,
               min_gain: float = SPLIT_MIN_GAIN) -> list[int] | None:
    """Chunk sizes for ``n`` rows that minimise estimated latency, or None if one padded call is best.

    ``cost(bucket)`` is a profile's measured latency (None if not measured: then no split). Only the buckets
    up to the one ``n`` pads to count (no chunk needs a larger one), so only theirs must be measured. Each
    chunk runs at the smallest bucket covering it; every chunk after the first costs ``call_cost`` more,
    and the split must be estimated at most ``min_gain`` of the padded call.
    """
    top = min((b for b in buckets if b >= n), default=None)
    if top is None or n <= 1:
        return None
    usable = sorted(b for b in buckets if b <= top)
    costs = {b: cost(b) for b in usable}
    if any(c is None for c in costs.values()):
        return None
    cover = lambda m: min((b for b in usable if b >= m), key=lambda b: costs[b], default=None)  # noqa: E731
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for m in range(1, n + 1):
        options = [(costs[b] + call_cost + best[m - b][0], [b, *best[m - b][1]]) for b in usable if b < m]
        c = cover(m)
        if c is not None:
            options.append((costs[c] + call_cost, [m]))
        best[m] = min(options, key=lambda o: o[0])
    single = cover(n)
    total, chunks = best[n]
    if single is None or len(chunks) < 2 or total - call_cost > min_gain * costs[single]:
        return None
    return sorted(chunks, reverse=True)


def output_axes(out_avals: Sequence[Any], dims: Sequence[DimPlan], what: str = "output") -> list[list[int | None]]:
    """Per flat output, per axis: the index in ``dims`` of the dim that axis is, or None if static.

    Padding a dim is only exact if every output axis that depends on it *is* that dim, so the padding
    can be sliced off; an output axis such as ``2*seq`` or ``seq - 1`` makes padding that dim an error.
    """
    by_symbol = {d.symbol: i for i, d in enumerate(dims)}
    axes = []
    for o, aval in enumerate(out_avals):
        row: list[int | None] = []
        for a, dim in enumerate(aval.shape):
            text = str(dim)
            if isinstance(dim, (int, np.integer)):
                row.append(None)
            elif text in by_symbol:
                row.append(by_symbol[text])
            else:
                for d in dims:
                    if d.padding and re.search(rf"\b{re.escape(d.symbol)}\b", text):
                        raise SpecError(
                            f"padding[{d.name!r}] ({d.padding}): {what} {o} axis {a} has size {text}, which "
                            f"depends on {d.name!r} but is not {d.name!r} itself, so padding cannot be sliced "
                            f"off the result. Remove the padding declaration for {d.name!r}."
                        )
                row.append(None)
        axes.append(row)
    return axes


def output_axes_static(outputs: Sequence[Any], dims: Sequence[DimPlan]) -> list[list[int | None]]:
    """``output_axes`` from the output specs alone (an artifact's manifest, without the program).

    An output spec names a dim only where the output axis is exactly that dim's symbol, so this
    agrees with ``output_axes`` on every artifact ``output_axes`` accepted when it was built.
    """
    by_name = {d.name: i for i, d in enumerate(dims) if d.name}
    return [[by_name.get(info.dimension_names.get(a)) for a in range(info.rank)] for info in outputs]


class Dispatcher:
    """Maps input shapes to a ``Route`` over a set of profiles (sizes per dim)."""

    def __init__(self, dims: Sequence[DimPlan], leaf_shapes: Sequence[Sequence[int]], size_names: Sequence[str],
                 out_axes: Sequence[Sequence[int | None]], profiles: Sequence[tuple[int, ...]],
                 fills: Sequence[float] | None = None):
        """``fills``: the value each flat input is padded with (``profiles.pad_values``; 0 by default)."""
        self.dims = list(dims)
        self._fills = list(fills) if fills is not None else [0] * len(leaf_shapes)
        self._static_shapes = [tuple(s) for s in leaf_shapes]  # opt shapes; dims' axes are overwritten
        self._axes = [dict() for _ in leaf_shapes]  # per leaf: axis -> dim index
        for di, d in enumerate(self.dims):
            for leaf, axis in d.uses:
                self._axes[leaf][axis] = di
        self._probe = [d.uses[0] for d in self.dims]
        by_name = {d.name: i for i, d in enumerate(self.dims) if d.name}
        self._size_dims = [by_name[n] for n in size_names]
        self.out_axes = [list(a) for a in out_axes]
        self.profiles = set(profiles)
        self._opt = tuple(d.bounds[1] for d in self.dims)

    def sizes_of(self, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
        return tuple(shapes[leaf][axis] for leaf, axis in self._probe)

    def leaf_shapes(self, sizes: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Every flat input's shape with the dims at ``sizes``."""
        out = []
        for static, axes in zip(self._static_shapes, self._axes):
            out.append(tuple(sizes[axes[a]] if a in axes else n for a, n in enumerate(static)))
        return tuple(out)

    def route(self, shapes: Sequence[Sequence[int]], latency: dict[tuple[int, ...], float] | None = None) -> Route:
        """How to run ``shapes``; with measured ``latency`` per profile, a padded rows dim may be split."""
        single = self._route(shapes)
        if latency and single.padded:
            sizes = self.sizes_of(shapes)
            for di, d in enumerate(self.dims):
                n = sizes[di]
                if d.padding != "rows" or single.target[di] == n:
                    continue
                chunks = split_plan(n, d.buckets, lambda b, at=di, t=single.target: latency.get(t[:at] + (b,) + t[at + 1:]))
                if chunks:
                    return self.split_route(shapes, di, chunks)
                break
        return single

    def split_route(self, shapes: Sequence[Sequence[int]], di: int, chunks: Sequence[int]) -> Route:
        """``shapes`` run as calls of ``chunks`` rows each along dim ``di`` (a ``rows`` dim), in order."""
        single, n = self._route(shapes), self.sizes_of(shapes)[di]
        d, parts, start = self.dims[di], [], 0
        for c in chunks:
            stop = min(start + c, n)
            sub = [tuple(stop - start if (li, a) in d.uses else k for a, k in enumerate(s)) for li, s in enumerate(shapes)]
            parts.append((start, stop, self._route(sub)))
            start = stop
        return Route(single.target, single.shapes, single.pad, single.slices, single.sizes, (di, tuple(parts)))

    def _route(self, shapes: Sequence[Sequence[int]]) -> Route:
        sizes = self.sizes_of(shapes)
        target = tuple(d.target(n) for d, n in zip(self.dims, sizes))
        if target != self._opt and self._opt in self.profiles and self._covers(self._opt, sizes) and (
                target not in self.profiles or math.prod(self._opt) < math.prod(target)):
            target = self._opt
        run_shapes = self.leaf_shapes(target)
        pad = tuple(tuple(s) != r for s, r in zip(shapes, run_shapes))
        slices = []
        for axes in self.out_axes:
            cut = [slice(0, sizes[d]) if d is not None and sizes[d] != target[d] else slice(None) for d in axes]
            slices.append(tuple(cut) if any(c != slice(None) for c in cut) else None)
        return Route(target, run_shapes, pad, tuple(slices), tuple(sizes[d] for d in self._size_dims))

    def _covers(self, profile: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
        return all(p == n or (d.padding is not None and p >= n) for d, p, n in zip(self.dims, profile, sizes))


    def run(self, route: Route, leaves: Sequence[Any], run_profile: Callable[..., Sequence[Any]]) -> list[np.ndarray]:
        """Run a route that pads or splits: the flat outputs, sliced back to the true sizes, on the host.

        ``run_profile(target, inputs, dim_sizes)`` runs one profile on inputs of its shapes and returns
        its flat outputs (arrays numpy can view).
        """
        if route.split is None:
            padded = [pad(x, s, f) if p else x for x, p, s, f in zip(leaves, route.pad, route.shapes, self._fills)]
            outs = run_profile(route.target, padded, route.sizes)
            return [np.asarray(o) if c is None else np.asarray(o)[c] for o, c in zip(outs, route.slices)]
        di, parts = route.split
        in_axes = [next((a for a, d in self._axes[li].items() if d == di), None) for li in range(len(leaves))]
        pieces = []
        for start, stop, sub in parts:
            cut = [x if a is None else np.asarray(x)[(slice(None),) * a + (slice(start, stop),)]
                   for x, a in zip(leaves, in_axes)]
            pieces.append(self.run(sub, cut, run_profile))
        out_axes = [next((a for a, d in enumerate(axes) if d == di), None) for axes in self.out_axes]
        return [np.concatenate([p[i] for p in pieces], axis=a) if a is not None else pieces[0][i]
                for i, a in enumerate(out_axes)]


def pad(x: Any, shape: tuple[int, ...], fill: float = 0) -> np.ndarray:
    """``x`` on the host, padded with ``fill`` (0: zeros) at the end of each axis up to ``shape``."""
    x = np.asarray(x)
    out = np.zeros(shape, x.dtype) if not fill else np.full(shape, fill, x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out
