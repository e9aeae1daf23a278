"""An ``Executable`` as an artifact: its ``Manifest`` made here, its files laid out, both written by
``artifact.write`` (atomically).

What is saved: the exported programs, the weights once (``.npy``, no pickle), one executable per
precompiled profile (or IREE's one dynamic module), the bound inputs, the self-test, and the manifest
that describes all of it (docs/artifact.md). Compile times go to the sidecar index: they vary from
build to build, and the manifest must not.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..artifact.layout import PREP_FILE, PROGRAM_FILE, executable_file, prep_executable_file, weight_file
from ..artifact.manifest import Manifest, PrepChunkEntry, PrepEntry, ProgramFile, WeightEntry
from ..artifact.npy import npy
from ..artifact.write import write
from ..core.spec import flatten_like, structure_template
from ..host import toolchain


def manifest(exe: Any, selftest: list[dict[str, Any]]) -> Manifest:
    """Everything the artifact's manifest says about ``exe`` (``artifact.write`` adds the file table)."""
    import jax

    program = exe._program
    compiled = [exe._universal] if exe._universal is not None else exe._precompiled
    executables = tuple(dataclasses.replace(p.entry, file=executable_file(i, p.entry.is_iree), target=tuple(p.target))
                        for i, p in enumerate(compiled))
    prep = None
    if program.prep is not None:
        prep = PrepEntry(PREP_FILE, "jax.export", tuple(
            PrepChunkEntry(chunk.weights, chunk.outputs, dataclasses.replace(pre.entry, file=prep_executable_file(n)))
            for n, ((chunk, _), pre) in enumerate(zip(program.chunks, exe._prep_exes))))
    out_tree = program.main.out_tree
    return Manifest(
        function=exe._name, parameters=tuple(exe._parameters), leaves=tuple(exe._leaves), sizes=tuple(exe._sizes),
        outputs=tuple(exe._outputs),
        output_structure=structure_template(jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))),
        optimization_level=exe.optimization_level, compiler_options=dict(exe.compiler_options),
        platforms=tuple(exe.platforms),
        program=ProgramFile(PROGRAM_FILE, "jax.export", program.main.calling_convention_version),
        prep=prep,
        weights=tuple(WeightEntry(weight_file(i), w.path, w.argument, np.dtype(w.value.dtype).name,
                                  tuple(w.value.shape)) for i, w in enumerate(exe._weights)),
        sources=tuple((s.kind, s.index) for s in program.sources),
        dims=tuple(exe.dims), compiler=exe.compiler, executables=executables, toolchain=toolchain(),
        bound_inputs={name: d for name, (_, d) in exe._bound.items()}, metadata=dict(exe.metadata),
        selftest=tuple(selftest),
    )


def save(exe: Any, path: str | os.PathLike, replace: bool = True) -> Path:
    """Write ``exe`` as an artifact; an existing artifact at ``path`` is replaced (or kept: ``replace=False``)."""
    entries, selftest_files = exe.selftest_cases()
    files = {PROGRAM_FILE: exe._program_bytes, **selftest_files}
    if exe._prep_bytes is not None:
        files[PREP_FILE] = exe._prep_bytes
    files.update({weight_file(i): npy(w.array()) for i, w in enumerate(exe._weights)})
    for name, (value, rel) in exe._bound.items():
        leaves: list[Any] = []
        flatten_like(next(p for p in exe._parameters if p.name == name).template, value, name, leaves)
        files.update({f"{rel}/{i}.npy": npy(leaf) for i, leaf in enumerate(leaves)})
    compiled = {executable_file(i, p.entry.is_iree): p
                for i, p in enumerate([exe._universal] if exe._universal is not None else exe._precompiled)}
    compiled.update({prep_executable_file(n): pre for n, pre in enumerate(exe._prep_exes)})
    files.update({rel: p.blob for rel, p in compiled.items()})
    seconds = {rel: round(p.seconds, 4) for rel, p in compiled.items()}
    return write(path, manifest(exe, entries), files, replace=replace, index_extra={"compile_seconds": seconds})
