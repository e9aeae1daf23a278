"""Self-test cases: seeded inputs at the min, opt and max shapes, with reference outputs for them.

The reference is the function traced from its Python source by ``jax.jit`` at each case's concrete
shapes: independent of everything an artifact adds (the symbolic export, the weight split and prep
program, the profiles, padding). Eager, op-by-op JAX would be independent too but costs 3-4x more
(each op compiles for each shape: 2-6 s per shape for the transformer block here).

An executable that pads gets one more case, ``padded``, at shapes just above a bucket, so that the
padding path is checked wherever the artifact is verified.

Every artifact carries them so that ``verify`` can check, on any host, that the executables it
loads compute what the model computed when it was built, without the model's code.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .spec import InputInfo

CASES = ("min", "opt", "max")
PREFIX = "selftest"
RTOL = {"float16": 1e-2, "bfloat16": 2e-2}
DEFAULT_RTOL = 1e-4


@dataclass
class Case:
    name: str
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def sample(info: InputInfo, shape: Sequence[int], seed: Sequence[int]) -> np.ndarray:
    rng = np.random.default_rng(list(seed))
    kind = info.dtype.kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind in "iu":
        return rng.integers(0, 4, shape).astype(info.dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(info.dtype)


def make(flat_fn: Callable, leaves: Sequence[tuple[str, InputInfo]], fixed: dict[int, Any] | None = None,
         seed: int = 0, extra: dict[int, tuple[int, ...]] | None = None) -> list[Case]:
    """Run ``flat_fn`` (traced from its source with ``jax.jit``) on seeded inputs.

    Leaves in ``fixed`` (bound inputs such as weights) take those values and are not stored in the case.
    ``extra`` gives the shape of every leaf for one more case, ``padded``.
    """
    fixed = fixed or {}
    shapes = {which: {li: getattr(info.shape_bounds, which) for li, (_, info) in enumerate(leaves)} for which in CASES}
    if extra:
        shapes["padded"] = extra
    cases = []
    for ci, (which, case_shapes) in enumerate(shapes.items()):
        sampled = {li: sample(info, case_shapes[li], (seed, ci, li))
                   for li, (_, info) in enumerate(leaves) if li not in fixed}
        full = [fixed[li] if li in fixed else sampled[li] for li in range(len(leaves))]
        args = [jax.numpy.asarray(x) for x in full]
        outputs = jax.tree_util.tree_leaves(run_once(flat_fn, *args))
        cases.append(Case(which, list(sampled.values()), [np.asarray(o) for o in outputs]))
    return cases


ONCE_OPTIONS = {"xla_backend_optimization_level": 0}


def run_once(fn: Callable, *args: Any) -> Any:
    """``jax.jit(fn)(*args)`` for code that runs once: LLVM at -O0 compiles in ~60% of the time.

    The backend level changes how fast the code runs, not what it computes (no fast-math, no
    reassociation), and a reference compiled differently from the profiles is a better check.
    """
    return jax.jit(fn).lower(*args).compile(compiler_options=ONCE_OPTIONS)(*args)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def to_files(cases: Sequence[Case], rtol: float | None = None) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Manifest entries and file contents (``.npy``, no pickle) for ``cases``; ``rtol`` overrides the per-dtype one."""
    entries, files = [], {}
    for case in cases:
        entry = {"name": case.name, "inputs": [], "outputs": [],
                 "dtypes": [np.dtype(a.dtype).name for a in (*case.inputs, *case.outputs)]}
        for kind, arrays in (("inputs", case.inputs), ("outputs", case.outputs)):
            for i, a in enumerate(arrays):
                rel = f"{PREFIX}/{case.name}/{kind[:-1]}{i}.npy"
                files[rel] = _npy(a)
                entry[kind].append(rel)
        entry["rtol"] = rtol or max((RTOL.get(np.dtype(o.dtype).name, DEFAULT_RTOL) for o in case.outputs),
                                    default=DEFAULT_RTOL)
        entry["atol"] = entry["rtol"]
        entries.append(entry)
    return entries, files


def from_files(entries: Sequence[dict[str, Any]], files: dict[str, bytes]) -> list[tuple[Case, float, float]]:
    from .serialization import from_npy

    out = []
    for e in entries:
        rels = [*e["inputs"], *e["outputs"]]
        arrays = [from_npy(files[r], r, d) for r, d in zip(rels, e.get("dtypes") or [None] * len(rels))]
        case = Case(e["name"], arrays[:len(e["inputs"])], arrays[len(e["inputs"]):])
        out.append((case, float(e["rtol"]), float(e["atol"])))
    return out


def file_names(entries: Sequence[dict[str, Any]]) -> list[str]:
    return [rel for e in entries for rel in (*e["inputs"], *e["outputs"])]


def check(call: Callable, case: Case, rtol: float, atol: float) -> tuple[bool, float]:
    """Run one case through ``call`` (the case's flat inputs -> output pytree); (passed, max abs error)."""
    got = [np.asarray(o) for o in jax.tree_util.tree_leaves(call(*case.inputs))]
    if len(got) != len(case.outputs) or any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got, case.outputs)):
        return False, float("inf")
    worst, ok = 0.0, True
    for g, w in zip(got, case.outputs):
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        err = np.abs(g64 - w64)
        worst = max(worst, float(err.max(initial=0.0)))
        ok = ok and bool(np.all(err <= atol + rtol * np.abs(w64)))
    return ok, worst
