"""The manifest bound to the program it describes.

Digests tie every file to the manifest, but nothing tied the manifest's own descriptions to the
program: an input's max edited from 64 to 94 passed, and a call at 80 then failed deep in jax. Here
every input spec, dim, output spec and profile in the manifest is compared with the exported
program: its input and output avals (dtypes, ranks, static sizes, which dims share a symbol) and the
bounds jax compiled into it as shape assertions (``symbolic shape constraint batch <= 64``). Any
difference is an ``ArtifactError`` naming the manifest field.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ArtifactError
from .manifest import ExecutableEntry, Manifest

_CONSTRAINT = re.compile(r"symbolic shape constraint (\w+) (<=|>=) (-?\d+)")


def program_bounds(module_text: str) -> dict[str, list[int | None]]:
    """``{symbol: [min, max]}`` from the program's shape assertions (min defaults to 1, jax's own floor)."""
    bounds: dict[str, list[int | None]] = {}
    for symbol, op, value in _CONSTRAINT.findall(module_text):
        entry = bounds.setdefault(symbol, [1, None])
        entry[0 if op == ">=" else 1] = int(value)
    return bounds


def _fail(where: str, field: str, found: Any, program: Any) -> ArtifactError:
    return ArtifactError(f"{where}: {field} is {found}, but the exported program has {program}; the manifest does not "
                         "describe its program (it was edited or damaged). Rebuild the artifact.")


def check(where: str, manifest: Manifest, in_avals: Sequence[Any], out_avals: Sequence[Any],
          program_bytes: bytes, module_text: Callable[[], str]) -> None:
    """Compare the manifest's specs, dims and profiles with the program's avals and bounds.

    ``in_avals`` are the program's runtime inputs (after its leading weights), then the dim sizes. The
    bounds are read from the serialized program itself, where MLIR's bytecode keeps the assertions'
    messages as plain strings (0.02 ms); ``module_text`` (the module printed: 9-38 ms here) is asked only
    if a dim is not found that way.
    """
    leaves, dims = manifest.leaves, manifest.dims
    if len(in_avals) < len(leaves):
        raise _fail(where, "the number of input_specs", len(leaves), f"{len(in_avals)} inputs")
    bounds = program_bounds(program_bytes.decode("latin-1"))
    if any(d.symbol not in bounds for d in dims):
        bounds = program_bounds(module_text())
    symbols: dict[str, tuple[str | None, int, int]] = {}  # symbol -> (dim name, min, max) as the manifest says
    for d in dims:
        symbols[d.symbol] = (d.name, d.bounds[0], d.bounds[2])
        lo, hi = bounds.get(d.symbol, [1, None])
        if hi is None:
            raise _fail(where, f"dims[{d.symbol!r}]", "a dynamic dim", "no such bounded dim")
        if (d.bounds[0], d.bounds[2]) != (lo, hi):
            raise _fail(where, f"dims[{d.symbol!r}] range", f"[{d.bounds[0]}, {d.bounds[2]}]", f"{d.symbol} in [{lo}, {hi}]")
    for (path, info), aval in zip(leaves, in_avals):
        field = f"input_specs[{path!r}]"
        b = info.shape_bounds
        if info.dtype != np.dtype(aval.dtype):
            raise _fail(where, f"{field} dtype", info.dtype.name, np.dtype(aval.dtype).name)
        if info.rank != len(aval.shape):
            raise _fail(where, f"{field} rank", info.rank, f"rank {len(aval.shape)}")
        for axis, dim in enumerate(aval.shape):
            lo, hi, name = b.min[axis], b.max[axis], info.dimension_names.get(axis)
            if isinstance(dim, (int, np.integer)):
                if (lo, hi) != (int(dim), int(dim)):
                    raise _fail(where, f"{field} dim {axis}", f"[{lo}, {hi}]", f"a fixed size {int(dim)}")
                continue
            symbol = str(dim)
            if symbol not in symbols:
                raise _fail(where, f"{field} dim {axis}", f"[{lo}, {hi}]", f"dim {symbol}, which dims does not list")
            s_name, s_lo, s_hi = symbols[symbol]
            if (lo, hi) != (s_lo, s_hi) or (name is not None and name != s_name):
                raise _fail(where, f"{field} dim {axis}", f"{name or 'unnamed'} [{lo}, {hi}]",
                            f"{symbol} in [{bounds[symbol][0]}, {bounds[symbol][1]}]")
    outputs = manifest.outputs
    if len(outputs) != len(out_avals):
        raise _fail(where, "the number of outputs", len(outputs), f"{len(out_avals)} outputs")
    for i, (spec, aval) in enumerate(zip(outputs, out_avals)):
        b = spec.shape_bounds
        if spec.dtype != np.dtype(aval.dtype) or spec.rank != len(aval.shape):
            raise _fail(where, f"outputs[{i}]", f"{spec.dtype.name} of rank {spec.rank}",
                        f"{np.dtype(aval.dtype).name} of rank {len(aval.shape)}")
        for axis, dim in enumerate(aval.shape):
            if isinstance(dim, (int, np.integer)) and (b.min[axis], b.max[axis]) != (int(dim), int(dim)):
                raise _fail(where, f"outputs[{i}] dim {axis}", f"[{b.min[axis]}, {b.max[axis]}]", f"a fixed size {int(dim)}")


def consistent(where: str, leaves: Sequence[tuple[str, Any]], dims: Sequence[Any],
               executables: Sequence[ExecutableEntry], leading: int) -> None:
    """The manifest agrees with itself: every dynamic axis of an input spec is a listed dim with the same
    range and name, every bucket and profile lies in its dim's range, and each executable's recorded input
    dtypes and shapes are the specs' at its profile (``leading``: the weights before the inputs). Both
    loaders check this; the jax-free runtime cannot read the program, so this is all it checks of the specs."""
    def fail(field: str, found: Any, dims_say: Any) -> ArtifactError:
        return ArtifactError(f"{where}: {field} is {found}, but its entry in dims says {dims_say}; the manifest "
                             "contradicts itself (it was edited or damaged). Rebuild the artifact.")

    covered = set()
    for d in dims:
        lo, _, hi = d.bounds
        for li, axis in d.uses:
            path, info = leaves[li]
            b = info.shape_bounds
            covered.add((li, axis))
            if (b.min[axis], b.max[axis]) != (lo, hi) or (d.name and info.dimension_names.get(axis) != d.name):
                raise fail(f"input_specs[{path!r}] dim {axis}",
                           f"{info.dimension_names.get(axis) or 'unnamed'} [{b.min[axis]}, {b.max[axis]}]",
                           f"{d.name or d.symbol} [{lo}, {hi}]")
        for size in d.buckets:
            if not lo <= size <= hi:
                raise fail(f"dims[{d.symbol!r}] bucket", size, f"[{lo}, {hi}]")
    for li, (path, info) in enumerate(leaves):
        b = info.shape_bounds
        for axis in range(info.rank):
            if b.min[axis] != b.max[axis] and (li, axis) not in covered:
                raise fail(f"input_specs[{path!r}] dim {axis}", f"dynamic [{b.min[axis]}, {b.max[axis]}]", "nothing")
    for n, entry in enumerate(executables):
        sizes = {}
        for d, size in zip(dims, entry.target):
            lo, _, hi = d.bounds
            if not lo <= int(size) <= hi:
                raise fail(f"executables[{n}] size of {d.name or d.symbol}", size, f"[{lo}, {hi}]")
            sizes.update({use: int(size) for use in d.uses})
        dtypes = entry.input_dtypes[leading:leading + len(leaves)]
        shapes = entry.input_shapes[leading:leading + len(leaves)]
        for li, ((path, info), dtype, shape) in enumerate(zip(leaves, dtypes, shapes)):
            want = [sizes.get((li, a), info.shape_bounds.min[a]) for a in range(info.rank)]
            if dtype != info.dtype.name or (not entry.dynamic and list(shape) != want):
                raise ArtifactError(
                    f"{where}: input_specs[{path!r}] is {info.dtype.name} {want} at executables[{n}]'s profile, but "
                    f"that executable was compiled for {dtype} {list(shape)}; the manifest contradicts itself (it "
                    "was edited or damaged). Rebuild the artifact.")


def prep_chunks(where: str, manifest: Manifest) -> None:
    """The prep chunks make every prepared weight exactly once, each from stored weights whose shapes and
    dtypes its executable was compiled for, or store it prepared in those shapes; a weight without a file
    is one a chunk stores prepared (a loader runs them as the manifest says, so it must be true)."""
    m = manifest
    rest = {i for c in (m.prep.chunks if m.prep else ()) if c.at_rest for i in c.weights}
    direct = {i for kind, i in m.sources if kind == "weight"}
    missing = [w.path for i, w in enumerate(m.weights) if not w.stored and (i not in rest or i in direct)]
    if missing:
        raise ArtifactError(f"{where}: the weights {', '.join(missing)} have no file, and the program needs them as "
                            "stored or no prep chunk stores what is made of them; the manifest contradicts itself (it "
                            "was edited or damaged). Rebuild the artifact.")
    if m.prep is None or not m.prep.chunks:
        return
    wanted = sorted({i for kind, i in m.sources if kind == "prep"})
    made = sorted(k for c in m.prep.chunks for k in c.outputs)
    if made != wanted:
        raise ArtifactError(f"{where}: prep.chunks make the prepared weights {made}, but leading takes {wanted}; the "
                            "manifest contradicts itself (it was edited or damaged). Rebuild the artifact.")
    for n, c in enumerate(m.prep.chunks):
        e = c.executable
        if any(not 0 <= i < len(m.weights) for i in c.weights) or len(e.input_shapes) != len(c.weights) or any(
                (tuple(m.weights[i].shape), m.weights[i].dtype) != (tuple(s), d)
                for i, s, d in zip(c.weights, e.input_shapes, e.input_dtypes)) or len(e.output_shapes) != len(c.outputs):
            raise ArtifactError(f"{where}: prep.chunks[{n}] reads weights {list(c.weights)} and makes "
                                f"{len(c.outputs)} output(s), which its executable was not compiled for; the manifest "
                                "contradicts itself (it was edited or damaged). Rebuild the artifact.")
        if c.at_rest and (len(c.at_rest) != len(c.outputs) or any(
                (tuple(w.shape), w.dtype) != (tuple(s), d)
                for w, s, d in zip(c.at_rest, e.output_shapes, e.output_dtypes)) or not all(w.stored for w in c.at_rest)):
            raise ArtifactError(f"{where}: prep.chunks[{n}] stores {len(c.at_rest)} prepared array(s) that are not the "
                                f"{len(c.outputs)} its executable makes; the manifest contradicts itself (it was edited "
                                "or damaged). Rebuild the artifact.")

