"""A ``CompiledModel`` as an artifact: its ``Manifest`` made here, its files laid out, both written by
``artifact.write`` (atomically).

What is saved: the exported programs, the weights once (``.npy``, no pickle), one executable per
precompiled profile (or IREE's one dynamic module), the bound inputs, the self-test, and the manifest
that describes all of it (docs/artifact.md). Compile times go to the sidecar index: they vary from
build to build, and the manifest must not.

A model with several entries (``compile`` of ``Entry`` records) is saved as one artifact: the
main entry at the top, every other under ``entries/<name>/``. A weight whose bytes an earlier entry
stored already is not stored again, and an entry whose prep program and weights are an earlier entry's
shares that entry's prep files, so that loaders prepare the weights once for all entries.

The weights are saved ``"prepared"`` by default: a prep chunk (``compiler/weights.py``) is stored as the
arrays it makes (BERT's transposed and fused matrices, ResNet's folded convolutions) instead of the
weights it reads, so a loader places them as they are instead of reading the raw ones and running the
chunk (BERT-base: 12 chunks, 330-460 ms of a 700-850 ms load). The artifact is no larger, but the raw
values of those weights are not in it: ``Executable.weights`` and ``params.checkpoint=<artifact>`` cannot
read them back (``"raw"`` keeps them). A chunk is saved prepared only where ``bind`` can still work: none
of its weights is also taken as it is, and all belong to one constant argument (``bind`` of that argument
runs the chunk on the new values; ``bind`` of another leaves it as stored). The entries of a multi-entry
artifact store theirs once (a ``task=generate`` build's transposed output projection), and an IREE
executable is saved raw.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..artifact import selftest as selftest_files
from ..artifact.layout import (PREP_FILE, PROGRAM_FILE, entry_prefix, executable_file, prep_executable_file,
                               prepared_file, weight_file)
from ..artifact.manifest import Manifest, PrepChunkEntry, PrepEntry, ProgramFile, WeightEntry
from ..artifact.npy import NpyFile
from ..artifact.write import write
from ..errors import SpecError
from ..host import toolchain
from .compiled import CompiledModel

WEIGHT_FORMS = ("prepared", "raw")  # how ``save`` stores the weights prep reads (the module's docstring)
DEFAULT_WEIGHTS = WEIGHT_FORMS[0]


def at_rest(model: CompiledModel, weights: str) -> set[int]:
    """The indices of ``model``'s prep chunks that ``save(weights=weights)`` stores prepared."""
    if weights not in WEIGHT_FORMS:
        raise SpecError(f"save(weights={weights!r}): must be one of {', '.join(map(repr, WEIGHT_FORMS))}.")
    program = model.program
    if (weights == "raw" or model.compiler.name == "iree" or not program.chunks
            or len(model.prep_executables) != len(program.chunks)
            or len(model.prepared) != len(program.prep.out_avals)):
        return set()
    direct = {s.index for s in program.sources if s.kind == "weight"}
    return {n for n, (chunk, _) in enumerate(program.chunks)
            if chunk.weights and not direct & set(chunk.weights)
            and len({program.weights[i].argument for i in chunk.weights}) == 1}


def manifest(model: CompiledModel, selftest: list[dict[str, Any]], prefix: str = "",
             weights: str = DEFAULT_WEIGHTS) -> Manifest:
    """Everything the artifact's manifest says about ``model`` (``artifact.write`` adds the file table); every
    file of it under ``prefix`` (an entry's folder)."""
    program = model.program
    rest = at_rest(model, weights)
    unstored = {i for n in rest for i in program.chunks[n][0].weights}
    executables = tuple(dataclasses.replace(p.entry, file=prefix + executable_file(i, p.entry.is_iree),
                                            target=tuple(p.target)) for i, p in enumerate(model.saved_executables()))
    prep = None
    if program.prep is not None:
        prep = PrepEntry(prefix + PREP_FILE, "jax.export", tuple(
            PrepChunkEntry(chunk.weights, chunk.outputs,
                           dataclasses.replace(pre.entry, file=prefix + prep_executable_file(n)),
                           tuple(_prepared_entry(model, chunk, k, prefix) for k in chunk.outputs) if n in rest else ())
            for n, ((chunk, _), pre) in enumerate(zip(program.chunks, model.saved_prep()))))
    return Manifest(
        function=model.name, parameters=tuple(model.parameters), leaves=tuple(model.leaves), sizes=tuple(model.sizes),
        outputs=tuple(model.outputs),
        output_structure=model.output_structure,
        optimization_level=model.optimization_level,
        compiler_options={p: dict(o) for p, o in model.compiler_options.items()}, platforms=tuple(model.platforms),
        program=ProgramFile(prefix + PROGRAM_FILE, "jax.export", program.main.calling_convention_version),
        prep=prep,
        weights=tuple(WeightEntry("" if i in unstored else prefix + weight_file(i), w.path, w.argument,
                                  np.dtype(w.value.dtype).name, tuple(w.value.shape))
                      for i, w in enumerate(program.weights)),
        sources=tuple((s.kind, s.index) for s in program.sources),
        dims=tuple(model.dims), compiler=model.compiler, executables=executables, toolchain=toolchain(),
        bound_inputs={name: prefix + d for name, (_, d) in model.bound.items()}, metadata=dict(model.metadata),
        selftest=tuple(selftest), donated=tuple(model.donated),
    )


def _prepared_entry(model: CompiledModel, chunk: Any, k: int, prefix: str) -> WeightEntry:
    """The record of the prep program's output ``k`` (made by ``chunk``), stored prepared."""
    value = model.prepared[k]
    return WeightEntry(prefix + prepared_file(k), f"prep[{k}]", model.program.weights[chunk.weights[0]].argument,
                       np.dtype(value.dtype).name, tuple(value.shape))


def _entry(model: CompiledModel, prefix: str, weights: str) -> tuple[Manifest, dict[str, Any], dict[str, float]]:
    """One entry's manifest record, files and compile seconds, every file under ``prefix``."""
    entries, files = selftest_files.moved(*model.selftest, prefix)
    files[prefix + PROGRAM_FILE] = model.program_bytes
    if model.prep_bytes is not None:
        files[prefix + PREP_FILE] = model.prep_bytes
    m = manifest(model, entries, prefix, weights)
    files.update({w.file: NpyFile(model.program.weights[i].array()) for i, w in enumerate(m.weights) if w.stored})
    files.update({w.file: NpyFile(model.prepared[k]) for c in (m.prep.chunks if m.prep else ())
                  for k, w in zip(c.outputs, c.at_rest)})
    for name, leaves in model.bound_leaves.items():
        rel = model.bound[name][1]
        files.update({f"{prefix}{rel}/{i}.npy": NpyFile(leaf) for i, leaf in enumerate(leaves)})
    compiled = {prefix + executable_file(i, p.entry.is_iree): p for i, p in enumerate(model.saved_executables())}
    compiled.update({prefix + prep_executable_file(n): pre for n, pre in enumerate(model.saved_prep())})
    files.update({rel: p.blob for rel, p in compiled.items()})
    return m, files, {rel: round(p.seconds, 4) for rel, p in compiled.items()}


def _share(m: Manifest, files: dict[str, Any], stored: dict[str, str], preps: list[Manifest]) -> Manifest:
    """``m`` with each file of weights (raw, or stored prepared) whose bytes are in ``stored`` (digest -> file)
    pointed at that file (its own dropped from ``files``), and with an earlier entry's prep where the prep
    program, its chunks and every file of weights it reads or stores are the same."""
    def once(w: WeightEntry) -> WeightEntry:
        if not w.stored:
            return w
        digest = files[w.file].digest()  # kept for the write
        if digest in stored:
            del files[w.file]
            return dataclasses.replace(w, file=stored[digest])
        stored[digest] = w.file
        return w

    m = dataclasses.replace(m, weights=tuple(once(w) for w in m.weights))
    if m.prep is None:
        return m
    m = dataclasses.replace(m, prep=dataclasses.replace(m.prep, chunks=tuple(
        dataclasses.replace(c, at_rest=tuple(once(w) for w in c.at_rest)) for c in m.prep.chunks)))
    for earlier in preps:
        if ([w.file for w in earlier.weights] == [w.file for w in m.weights]
                and files.get(earlier.prep.file) == files[m.prep.file]
                and _chunks(earlier.prep) == _chunks(m.prep)):
            for rel in [m.prep.file, *(c.executable.file for c in m.prep.chunks)]:
                del files[rel]
            return dataclasses.replace(m, prep=earlier.prep)
    preps.append(m)
    return m


def _chunks(prep: PrepEntry) -> list[tuple]:
    """What two entries' prep must agree on to share one: each chunk's weights, outputs and stored outputs."""
    return [(c.weights, c.outputs, [w.file for w in c.at_rest]) for c in prep.chunks]


def save(compiled: CompiledModel | Mapping[str, CompiledModel], path: str | os.PathLike, replace: bool = True,
         weights: str = DEFAULT_WEIGHTS, index_extra: dict[str, Any] | None = None,
         extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write a compiled model as an artifact: one ``CompiledModel``, or a model's entries by name (the first is the
    main one); an existing artifact at ``path`` is replaced (or kept: ``replace=False``). ``weights``:
    ``"prepared"`` or ``"raw"`` (the module's docstring); ``index_extra``: tables for the sidecar index (what this
    build's machine says, outside the byte-reproducible manifest: where its checkpoint was); ``extra_files``: more
    files by relative path, digested in the manifest as every other (a checkpoint's tokenizer)."""
    entries = {"": compiled} if isinstance(compiled, CompiledModel) else dict(compiled)
    several = list(entries) != [""]
    files: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    stored: dict[str, str] = {}
    preps: list[Manifest] = []
    records = []
    for n, (name, model) in enumerate(entries.items()):
        m, fs, secs = _entry(model, "" if n == 0 else entry_prefix(name), weights)
        files.update(fs)
        seconds.update(secs)
        records.append((name, _share(m, files, stored, preps)))
    (main_name, main), others = records[0], records[1:]
    if several:
        main = dataclasses.replace(main, entry=main_name, entries=tuple(others))
    seconds = {rel: t for rel, t in seconds.items() if rel in files}  # not those an entry shares
    clash = sorted(set(files) & set(extra_files or {}))
    if clash:
        raise SpecError(f"save(extra_files=...): {clash[0]!r} is a file of the artifact itself; choose another path.")
    files.update(extra_files or {})
    return write(path, main, files, replace=replace, index_extra={**(index_extra or {}), "compile_seconds": seconds})
