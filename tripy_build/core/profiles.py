"""Shape profiles: which concrete shapes are compiled ahead of time, and how every other shape is served.

Each dynamic dim of the program gets a ``DimPlan``:

- ``buckets``: the sizes precompiled along it: ``"pow2"`` (powers of two clipped to ``[min, max]``,
  plus ``max``; the default), ``"pow2:N"`` (the same, from N up: sizes below N run the first bucket),
  ``"fine"`` / ``"fine:N"`` (the powers of two and the sizes halfway between them, 3 x 2^k: a padded
  size runs at most 1.5x its length instead of 2x, for about twice the profiles), an explicit list,
  or ``"none"``;
- ``padding``: what the model declares about padding it: ``"rows"`` (slices along the dim are
  independent, so zero rows appended and then sliced off change nothing: a batch), ``"mask"`` (the
  model takes the dim's true size as a ``DimSize`` and masks the padding itself: a sequence under
  attention) or a ``MaskInput`` (the model takes an attention mask input and ignores every position
  where it is 0: padded positions get mask 0, other inputs a pad value, 0 by default: Hugging Face's
  text models); ``None`` means the dim is never padded;
- the ``strategy`` that follows: ``padded`` (every size up to the largest bucket runs the smallest
  bucket that covers it), ``buckets`` (bucket sizes run precompiled, others compile on first use) or
  ``compile`` (every size but ``opt`` compiles on first use).

The profiles are the cross product of the dims' bucket sets (``opt`` for a dim without buckets) plus
the all-``opt`` profile. Their number grows fast with several bucketed dims, so a build has a budget
(``max_profiles``); a set over budget is refused before anything compiles, with the count per dim.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import SpecError

PADDING_KINDS = ("rows", "mask")
GEOMETRIC_POLICIES = ("pow2", "fine")
DEFAULT_BUCKETS = "pow2"
DEFAULT_MAX_PROFILES = 64


def resolve_buckets(spec: Any, bounds: tuple[int, int, int], what: str) -> tuple[int, ...]:
    """The sorted bucket sizes of one dim from its policy (``"pow2"``, ``"pow2:N"``, ``"fine"``, ``"fine:N"``,
    ``"none"`` or sizes)."""
    lo, _, hi = bounds
    if spec is None or spec == "none":
        return ()
    policy, colon, start = spec.partition(":") if isinstance(spec, str) else (None, "", "")
    if policy in GEOMETRIC_POLICIES:
        if colon and not (start.isdigit() and int(start) >= 1):
            raise SpecError(f"{what}: '{policy}:N' needs a positive integer N (the smallest bucket), got {spec!r}.")
        floor = max(lo, int(start or 1))
        sizes = {1 << k for k in range(hi.bit_length())}
        if policy == "fine":
            sizes |= {3 << k for k in range(hi.bit_length())}
        return tuple(sorted({s for s in sizes if floor <= s <= hi} | {hi}))
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(b, int) and not isinstance(b, bool) for b in spec):
        outside = [b for b in spec if not lo <= b <= hi]
        if outside:
            raise SpecError(f"{what}: bucket sizes {outside} lie outside the dim's range [{lo}, {hi}]; "
                            "every bucket must be a size the dim can take.")
        return tuple(sorted(set(spec)))
    raise SpecError(f"{what}: buckets must be 'pow2', 'pow2:N', 'fine', 'fine:N', 'none' or a non-empty list of sizes, "
                    f"got {spec!r}.")


@dataclass(frozen=True)
class MaskInput:
    """A dim padded through an input mask: ``input`` (a flat input's path, e.g. ``attention_mask``) is 0 at every
    padded position, and the function ignores positions where it is 0; the other inputs are padded with their
    ``pad_values`` (by path; 0 when not listed). Declared as ``{"mask_input": NAME, "pad_values": {PATH: V}}``."""

    input: str
    pad_values: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, value: Any, what: str) -> "MaskInput":
        if isinstance(value, MaskInput):
            return value
        if not isinstance(value, Mapping) or not isinstance(value.get("mask_input"), str) or \
                set(value) - {"mask_input", "pad_values"}:
            raise SpecError(f"{what}: a mask-input padding is {{'mask_input': INPUT, 'pad_values': {{INPUT: VALUE}}}} "
                            f"(pad_values optional, 0 by default), got {value!r}.")
        pads = value.get("pad_values") or {}
        if not isinstance(pads, Mapping) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                     for v in pads.values()):
            raise SpecError(f"{what}: pad_values maps input names to numbers, got {pads!r}.")
        return cls(value["mask_input"], tuple(sorted((str(k), v) for k, v in pads.items())))

    def to_json(self) -> dict[str, Any]:
        return {"mask_input": self.input, **({"pad_values": dict(self.pad_values)} if self.pad_values else {})}

    def __str__(self) -> str:
        return f"mask input {self.input}"


@dataclass(frozen=True)
class DimPlan:
    """How one dynamic dim of the program is served."""

    symbol: str  # the dim variable in the exported program
    name: str | None  # the NamedDimension's name; None for an independent (unnamed) dim
    bounds: tuple[int, int, int]
    uses: tuple[tuple[int, int], ...]  # (flat input index, axis) where the dim appears
    buckets: tuple[int, ...]
    padding: str | MaskInput | None  # "rows", "mask", a MaskInput, or None: never padded

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else f"'{self.symbol}'"

    @property
    def strategy(self) -> str:
        if self.padding and self.buckets:
            return "padded"
        return "buckets" if self.buckets else "compile"

    def target(self, size: int) -> int:
        """The size to run ``size`` at: the smallest covering bucket if padded, else ``size`` itself."""
        if self.padding and self.buckets and size <= self.buckets[-1]:
            return next(b for b in self.buckets if b >= size)
        return size

    def to_json(self, leaf_paths: Sequence[str]) -> dict[str, Any]:
        lo, opt, hi = self.bounds
        return {"symbol": self.symbol, "name": self.name, "min": lo, "opt": opt, "max": hi,
                "uses": [[leaf_paths[i], a] for i, a in self.uses], "buckets": list(self.buckets),
                "padding": self.padding.to_json() if isinstance(self.padding, MaskInput) else self.padding,
                "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], leaf_paths: Sequence[str]) -> "DimPlan":
        index = {p: i for i, p in enumerate(leaf_paths)}
        padding = data["padding"]
        return cls(str(data["symbol"]), data["name"], (int(data["min"]), int(data["opt"]), int(data["max"])),
                   tuple((index[p], int(a)) for p, a in data["uses"]), tuple(int(b) for b in data["buckets"]),
                   MaskInput.parse(padding, f"dims[{data['symbol']!r}].padding") if isinstance(padding, Mapping)
                   else padding)


def mask_inputs(dims: Sequence[DimPlan], leaf_paths: Sequence[str]) -> frozenset[int]:
    """The flat inputs that are attention masks of a mask-input dim (by index): a self-test or a proof sets
    them to ones at the real positions (a row that attends to nothing has no meaning to keep)."""
    masks = {d.padding.input for d in dims if isinstance(d.padding, MaskInput)}
    return frozenset(i for i, p in enumerate(leaf_paths) if p in masks)


def pad_values(dims: Sequence[DimPlan], leaf_paths: Sequence[str]) -> list[float]:
    """The value each flat input is padded with: 0, or its ``pad_values`` entry under a mask-input dim."""
    fills = [0.0] * len(leaf_paths)
    index = {p: i for i, p in enumerate(leaf_paths)}
    for d in dims:
        if isinstance(d.padding, MaskInput):
            for path, value in d.padding.pad_values:
                if path in index:
                    fills[index[path]] = value
    return fills


def first_use_compiles(dim: DimPlan, strategy: str | None = None) -> str:
    """In words, the sizes of ``dim`` that no precompiled profile serves, so that their first call compiles;
    ``""`` when every in-range size runs without compiling. ``strategy`` overrides the plan's own
    (``dynamic``: one module for every shape)."""
    lo, opt, hi = dim.bounds
    strategy = strategy or dim.strategy
    if strategy == "dynamic":
        return ""
    if strategy == "padded":
        return "" if dim.buckets[-1] >= hi else f"sizes {dim.buckets[-1] + 1}..{hi}"
    kept = list(dim.buckets) if strategy == "buckets" else [opt]
    if len(kept) >= hi - lo + 1:
        return ""
    return f"sizes other than {' '.join(map(str, kept))}"


def plan_dims(symbols: Sequence[Any], leaf_paths: Sequence[str], buckets: Any = DEFAULT_BUCKETS,
              padding: Mapping[str, Any] | None = None) -> list[DimPlan]:
    """One ``DimPlan`` per program symbol (``export.Symbol``).

    ``buckets`` is one policy for every dim, or ``{dim name: policy}`` (unlisted dims get the default);
    ``padding`` is ``{dim name: "rows" | "mask" | {"mask_input": INPUT}}``. Both are keyed by ``NamedDimension``
    name.
    """
    padding = dict(padding or {})
    per_dim = dict(buckets) if isinstance(buckets, Mapping) else {}
    default = DEFAULT_BUCKETS if isinstance(buckets, Mapping) else buckets
    names = [s.named for s in symbols if s.named]
    for what, table in (("buckets", per_dim), ("padding", padding)):
        unknown = sorted(set(table) - set(names))
        if unknown:
            raise SpecError(
                f"{what}: {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not a named dim "
                f"of this function; its named dims are: {', '.join(map(repr, names)) or 'none'} "
                "(only NamedDimensions can be bucketed or padded by name)."
            )
    for name, kind in list(padding.items()):
        if isinstance(kind, (Mapping, MaskInput)):
            mask = padding[name] = MaskInput.parse(kind, f"padding[{name!r}]")
            symbol = next(s for s in symbols if s.named == name)
            uses = {path for path, _ in symbol.uses}
            for path in [mask.input, *(p for p, _ in mask.pad_values)]:
                if path not in leaf_paths:
                    raise SpecError(f"padding[{name!r}]: {path!r} is not an input; inputs: {', '.join(leaf_paths)}.")
            if mask.input not in uses:
                raise SpecError(f"padding[{name!r}]: the mask input {mask.input!r} has no {name!r} dim, so it cannot mark "
                                f"that dim's padded positions; inputs with it: {', '.join(sorted(uses))}.")
        elif kind not in PADDING_KINDS:
            raise SpecError(f"padding[{name!r}]: must be one of {', '.join(map(repr, PADDING_KINDS))} or "
                            f"{{'mask_input': INPUT}}, got {kind!r}.")
    index = {p: i for i, p in enumerate(leaf_paths)}
    plans = []
    for s in symbols:
        spec = per_dim.get(s.named, default) if s.named else default
        what = f"buckets[{s.named!r}]" if s.named else f"buckets (dim {s.describe()})"
        plans.append(DimPlan(s.name, s.named, s.bounds, tuple((index[p], a) for p, a in s.uses),
                             resolve_buckets(spec, s.bounds, what), padding.get(s.named) if s.named else None))
    return plans


def profiles(dims: Sequence[DimPlan], max_profiles: int = DEFAULT_MAX_PROFILES) -> list[tuple[int, ...]]:
    """Every profile as one size per dim (in ``dims`` order): opt first, then the bucket product."""
    if isinstance(max_profiles, bool) or not isinstance(max_profiles, int) or max_profiles < 1:
        raise SpecError(f"max_profiles must be a positive integer, got {max_profiles!r}.")
    choices = [d.buckets or (d.bounds[1],) for d in dims]
    count = math.prod(len(c) for c in choices)
    opt = tuple(d.bounds[1] for d in dims)
    total = count + (0 if all(o in c for o, c in zip(opt, choices)) else 1)
    if total > max_profiles:
        per = ", ".join(f"{d.label}: {len(c)}" for d, c in zip(dims, choices) if len(c) > 1)
        raise SpecError(
            f"{total} shape profiles exceed the budget of {max_profiles} executables (buckets per dim: {per}; "
            "profiles are their product, plus opt). Raise the budget (shapes.max_profiles=N in a build's config, "
            "compile(max_profiles=N) in Python), give a dim fewer buckets (an explicit list: "
            "shapes.buckets.<dim>=[1,8,64], compile(buckets={dim: [1, 8, 64]})), or set a dim's buckets to 'none'."
        )
    return list(dict.fromkeys([opt, *itertools.product(*choices)]))
