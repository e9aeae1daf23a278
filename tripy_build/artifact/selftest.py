"""The self-test an artifact carries: seeded inputs at the min, opt and max shapes (and one padded), with
the outputs the model computed for them at build, in files; and the comparison ``verify`` makes.

Every artifact carries them so that ``verify`` can check, on any host, that the executables it loads
compute what the model computed when it was built, without the model's code. The cases are made at
build by ``compiler/selftest.py``. Within a size budget an array is a ``.npy`` file; beyond it an input
is the seed that makes it (regenerated and checked against its recorded sha256) and an output a sample
of its elements plus its sum and absolute sum, which bound the error of every element.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..core.spec import InputInfo
from ..errors import ArtifactError
from .npy import from_npy, npy


CASES = ("min", "opt", "max")
PREFIX = "selftest"
# The tolerance of a comparison at a dtype: two compiles of reduced-precision code round differently.
RTOL = {"float16": 1e-2, "bfloat16": 2e-2}
DEFAULT_RTOL = 1e-4

# The self-test's size budget. An input larger than this is stored as the seed that makes it (numpy
# regenerates it, checked against its recorded sha256); an output with more elements than
# OUTPUT_SAMPLE keeps that many evenly spaced elements plus its sum and absolute sum, which bound the
# error of every element. The default transformer artifact's self-test went from 33 MB to ~0.2 MB.
INPUT_INLINE_MAX_BYTES = 64 * 1024
OUTPUT_SAMPLE = 4096


@dataclass
class Sampled:
    """An output too large to keep whole: ``OUTPUT_SAMPLE`` evenly spaced elements (``sample_indices``) and its
    sum and absolute sum, accumulated in float64."""

    shape: tuple[int, ...]
    sample: np.ndarray
    sum: float
    abs_sum: float


class OutputSketch:
    """What the self-test keeps of one output, given whole or in slices along ``axis`` (``add``): the array
    when it has at most ``OUTPUT_SAMPLE`` elements, else a ``Sampled``. No slice is copied to float64 whole:
    GPT-2's logits at (16, 512) are 1.6 GB in float32."""

    def __init__(self, shape: Sequence[int], dtype: Any, axis: int | None = None):
        self.shape, self.axis = tuple(int(n) for n in shape), axis
        size = int(np.prod(self.shape, dtype=np.int64))
        self.whole = np.empty(self.shape, dtype) if size <= OUTPUT_SAMPLE else None
        if self.whole is None:
            self.coords = np.unravel_index(sample_indices(size), self.shape)
            self.sample = np.empty(len(self.coords[0]), dtype)
            self.sum = self.abs_sum = 0.0

    def add(self, part: np.ndarray, start: int = 0) -> None:
        """The slice of the output from ``start`` along ``axis`` (the whole output when ``axis`` is None)."""
        part = np.asarray(part)
        stop = start + (part.shape[self.axis] if self.axis is not None else 0)
        if self.whole is not None:
            self.whole[(slice(None),) * self.axis + (slice(start, stop),) if self.axis is not None else ...] = part
            return
        if self.axis is None:
            self.sample[:] = part[self.coords]
        else:
            along = self.coords[self.axis]
            inside = (along >= start) & (along < stop)
            self.sample[inside] = part[tuple(c[inside] - (start if a == self.axis else 0)
                                             for a, c in enumerate(self.coords))]
        self.sum += float(part.sum(dtype=np.float64))
        self.abs_sum += float(np.abs(part).sum(dtype=np.float64))

    def result(self) -> "np.ndarray | Sampled":
        if self.whole is not None:
            return self.whole
        return Sampled(self.shape, self.sample, self.sum, self.abs_sum)


def sketch(a: Any) -> "np.ndarray | Sampled":
    """What the self-test keeps of a whole output (``OutputSketch``)."""
    a = np.asarray(a)
    s = OutputSketch(a.shape, a.dtype)
    s.add(a)
    return s.result()


@dataclass
class Case:
    name: str
    inputs: list[np.ndarray]
    outputs: list[Any]  # each an array, or a ``Sampled`` (``sketch``); read back, a sampled one is its sample
    seeds: list[tuple[int, ...] | None] | None = None  # per input: the seed ``sample`` made it from (None: not sampled)
    sampled: list[dict[str, Any] | None] | None = None  # per output: its sample entry, or None when whole
    values: list[tuple[int, int] | None] | None = None  # per input: the value range ``sample`` drew from
    holds: list[int | None] | None = None  # per input: the value ``sample`` ended every row with (InputInfo.holds)


def sample(info: InputInfo, shape: Sequence[int], seed: Sequence[int]) -> np.ndarray:
    return sample_dtype(info.dtype, shape, seed, info.values, info.holds)


def sample_dtype(dtype: Any, shape: Sequence[int], seed: Sequence[int], values: Sequence[int] | None = None,
                 holds: int | None = None) -> np.ndarray:
    """Seeded inputs: booleans, integers (in the declared ``values`` range, else small ones: valid indices for
    gathers; every row ending in ``holds`` where the input declares one), or standard normals."""
    rng = np.random.default_rng(list(seed))
    dtype = np.dtype(dtype)
    kind = dtype.kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind in "iu":
        lo, hi = values if values is not None else (0, 4)
        x = rng.integers(lo, hi, shape).astype(dtype)
        if holds is not None and x.size:
            x[..., -1] = holds
        return x
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def sample_indices(size: int) -> np.ndarray:
    """The flat indices an output's sample keeps: ``OUTPUT_SAMPLE`` evenly spaced, first and last included."""
    return np.unique(np.linspace(0, size - 1, OUTPUT_SAMPLE).round().astype(np.int64))


def to_files(cases: Sequence[Case], rtol: float | None = None) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Manifest entries and file contents (``.npy``, no pickle) for ``cases``; ``rtol`` overrides the per-dtype one.

    Within the size budget an array is a file; beyond it an input is its seed and an output its sample.
    """
    entries, files = [], {}
    for case in cases:
        entry = {"name": case.name, "inputs": [], "outputs": [],
                 "dtypes": [np.dtype(_dtype(a)).name for a in (*case.inputs, *case.outputs)]}
        for i, a in enumerate(case.inputs):
            rel = f"{PREFIX}/{case.name}/input{i}.npy"
            if case.seeds is not None and case.seeds[i] is not None and a.nbytes > INPUT_INLINE_MAX_BYTES:
                entry["inputs"].append({"seed": list(case.seeds[i]), "shape": list(a.shape),
                                        **({"values": list(case.values[i])} if case.values and case.values[i] else {}),
                                        **({"holds": case.holds[i]} if case.holds and case.holds[i] is not None
                                           else {}),
                                        "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()})
            else:
                files[rel] = npy(a)
                entry["inputs"].append(rel)
        for i, a in enumerate(case.outputs):
            rel = f"{PREFIX}/{case.name}/output{i}.npy"
            kept = a if isinstance(a, Sampled) else sketch(a)
            if isinstance(kept, Sampled):
                files[rel] = npy(kept.sample)
                entry["outputs"].append({"file": rel, "shape": list(kept.shape), "sum": kept.sum,
                                         "abs_sum": kept.abs_sum})
            else:
                files[rel] = npy(kept)
                entry["outputs"].append(rel)
        entry["rtol"] = rtol or max((RTOL.get(np.dtype(_dtype(o)).name, DEFAULT_RTOL) for o in case.outputs),
                                    default=DEFAULT_RTOL)
        entry["atol"] = entry["rtol"]
        entries.append(entry)
    return entries, files


def _dtype(a: Any) -> Any:
    return a.sample.dtype if isinstance(a, Sampled) else a.dtype


def from_files(entries: Sequence[dict[str, Any]], files: dict[str, bytes]) -> list[tuple[Case, float, float]]:
    """The cases back: inputs read or regenerated from their seeds (digest-checked), outputs whole or sampled."""
    out = []
    for e in entries:
        dtypes = e.get("dtypes") or [None] * (len(e["inputs"]) + len(e["outputs"]))
        inputs = []
        for ref, dtype in zip(e["inputs"], dtypes):
            if isinstance(ref, str):
                inputs.append(from_npy(files[ref], ref, dtype))
                continue
            x = sample_dtype(dtype, ref["shape"], ref["seed"], ref.get("values"), ref.get("holds"))
            if hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest() != ref["sha256"]:
                raise ArtifactError(
                    f"self-test {e['name']}: the input numpy generates from seed {ref['seed']} differs from the one the "
                    f"build used (sha256 mismatch): this numpy ({np.__version__}) draws other numbers, or the "
                    "manifest was edited. Verify with the numpy the artifact was built with.")
            inputs.append(x)
        outputs, sampled = [], []
        for ref, dtype in zip(e["outputs"], dtypes[len(e["inputs"]):]):
            rel = ref if isinstance(ref, str) else ref["file"]
            outputs.append(from_npy(files[rel], rel, dtype))
            sampled.append(None if isinstance(ref, str) else ref)
        out.append((Case(e["name"], inputs, outputs, sampled=sampled), float(e["rtol"]), float(e["atol"])))
    return out


def file_names(entries: Sequence[dict[str, Any]]) -> list[str]:
    return [ref if isinstance(ref, str) else ref["file"] for e in entries
            for ref in (*e["inputs"], *e["outputs"]) if isinstance(ref, str) or "file" in ref]


def check(call: Callable, case: Case, rtol: float, atol: float) -> tuple[bool, float]:
    """Run one case through ``call`` (the case's flat inputs -> the flat outputs); (passed, max abs error).

    A sampled output is compared at its sampled elements, and its sum against the recorded one within
    the bound that the per-element tolerance implies (``atol * size + rtol * abs_sum``).
    """
    got = [np.asarray(o) for o in call(*case.inputs)]
    sampled = case.sampled or [None] * len(case.outputs)
    if len(got) != len(case.outputs):
        return False, float("inf")
    worst, ok = 0.0, True
    for g, w, s in zip(got, case.outputs, sampled):
        if g.dtype != w.dtype or (g.shape != w.shape if s is None else list(g.shape) != s["shape"]):
            return False, float("inf")
        if s is not None:
            kept = sketch(g)
            if not isinstance(kept, Sampled):
                return False, float("inf")
            ok = ok and abs(kept.sum - s["sum"]) <= atol * g.size + rtol * s["abs_sum"]
            g = kept.sample
        g64 = g.astype(np.float64)
        w64 = w.astype(np.float64)
        err = np.abs(g64 - w64)
        worst = max(worst, float(err.max(initial=0.0)))
        ok = ok and bool(np.all(err <= atol + rtol * np.abs(w64)))
    return ok, worst


def moved(entries: Sequence[dict[str, Any]], files: dict[str, bytes],
          prefix: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """The cases' manifest entries and files with every file under ``prefix`` (an entry's folder)."""
    def ref(r: Any) -> Any:
        if isinstance(r, str):
            return prefix + r
        return dict(r, file=prefix + r["file"]) if "file" in r else r
    return ([dict(e, inputs=[ref(r) for r in e["inputs"]], outputs=[ref(r) for r in e["outputs"]]) for e in entries],
            {prefix + rel: data for rel, data in files.items()})
