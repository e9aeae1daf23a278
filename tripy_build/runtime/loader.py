"""``tripy_build.load``: an artifact as an ``Executable``, without compiling and without pickle.

Every file a loader uses is checked against its digest before it is used (``artifact.read.read_contents``;
the weights one by one as they are placed, ``Contents.take_weight``), the manifest against the exported
program (``artifact.crosscheck``). The raw weights that only the prep program reads are not kept: the
executable holds what prep made of them (or what the artifact stores prepared: ``runtime/save.py``), and
reads them from the artifact again if asked (``Executable.weights``, ``save``, ``bind``). Precompiled executables are
deserialized on first use, so a process that serves a few shapes pays only for those; one built for
another host's CPU is skipped with a ``CompatibilityWarning``, and its shapes compile from the exported
program instead (with the options the manifest records); one built by another jaxlib, or for another GPU, is
refused (``artifact.compat.refusal``). Executables compiled for a GPU without it run their self-test at the
artifact's first load there (``first_run``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any

from ..artifact import crosscheck
from ..artifact.manifest import XLA_FORMAT, ExecutableEntry
from ..artifact.read import read_contents
from ..errors import ArtifactError, SpecError
from .entries import Shared


WARMUPS = ("background", "now", "none")


def load(path: str | os.PathLike, warmup: str = "background", trust_executables: bool = True) -> Any:
    """Load a built artifact, checking every file it uses against its digest first; nothing compiles.

    Args:
        path: the artifact directory (``Executable.save`` or ``python -m tripy_build``).
        warmup: ``"background"`` (default): the call returns at once and a thread deserializes each
            precompiled profile and runs it once, so no later call pays for a profile's first use; where
            that is estimated to take under a second and the thread would hold profiles back for quiet
            moments (``warmup.prepare_at_load``: ~10 MB of executables at most, some over 192 KiB), it
            is done before the call returns instead;
            ``"now"``: the same before returning (a server that must be ready when loaded);
            ``"none"``: each profile is prepared by the first call that needs it.
        trust_executables: ``False`` ignores the machine code the artifact ships (its precompiled
            executables are neither read nor deserialized) and compiles each profile from the portable
            exported program instead, on this host, through the compile cache: for an artifact from
            a source you do not trust to run native code from (docs/trust.md).

    Returns:
        An ``Executable`` with the artifact's signature, profiles and weights.

    Example::

        exe = tripy_build.load("artifacts/geglu/2bb85d9bc22e7905")
        y = exe(np.ones((37, 512), np.float32))
    """
    if warmup not in WARMUPS:
        raise SpecError(f"load(warmup={warmup!r}): must be one of {', '.join(map(repr, WARMUPS))}.")
    from .executable import together
    from .first_run import never_run_here, selftest_once
    from .xla import local_platform

    c = read_contents(path, executables=trust_executables)
    m = c.manifest
    platform = local_platform()
    c.check_platform(platform)
    shared = Shared()
    exes = together({name: _entry(c.for_entry(name), trust_executables, shared) for name, _ in m.all_entries()})
    for exe in exes.values():
        exe.artifact_dir = Path(c.path)
    if trust_executables and never_run_here(m, platform):
        import jax

        selftest_once(Path(c.path), m, exes, jax.devices(platform)[0].device_kind)
    if warmup == "background" and _small(exes.values()):
        for exe in exes.values():  # preparing them all costs little against the load (warmup.prepare_at_load)
            exe._warm_at_load()
    elif warmup != "none":
        for exe in exes.values():
            exe.warm_up(background=warmup == "background")
    return exes[m.entry]


def _small(exes: Any) -> bool:
    """Whether every entry's profiles are prepared before ``load`` returns (``warmup.prepare_at_load``)."""
    from .warmup import prepare_at_load

    sizes = [exe._prepare_sizes() for exe in exes]
    return None not in sizes and prepare_at_load([n for entry in sizes for n in entry])


def _entry(c: Any, trust_executables: bool, shared: Shared) -> Any:
    """One entry of the artifact (the whole of a single-function one) as a ``CompiledModel``."""
    import jax

    from ..core.dispatch import Dispatcher, output_axes
    from ..core.profiles import pad_values
    from ..core.spec import to_dtype
    from .compile_here import compile_profile
    from .compiled import CompiledModel, Precompiled, StoredSelfTest
    from .bind import with_inputs
    from .iree import loader as iree_loader
    from .prepare import prepare
    from .program import PrepChunk, Program, Source, Stored, Weight
    from .xla import load as load_xla, local_platform

    m = c.manifest
    client = jax.devices()[0].client

    def program(file: str) -> jax.export.Exported:
        try:
            exported = jax.export.deserialize(bytearray(c.files[file]))
        except Exception as e:  # noqa: BLE001 - any failure here means the program file is unusable
            raise ArtifactError(f"{c.where(file)}: cannot deserialize the exported program ({e}).") from None
        lo = jax.export.minimum_supported_calling_convention_version
        hi = jax.export.maximum_supported_calling_convention_version
        if not lo <= exported.calling_convention_version <= hi:
            raise ArtifactError(
                f"{c.where(file)}: exported with calling convention version {exported.calling_convention_version}, "
                f"but this jax ({jax.__version__}) runs versions {lo}..{hi}: the program is too "
                f"{'new' if exported.calling_convention_version > hi else 'old'} for it. Rebuild the artifact with "
                f"this jax, or install the jax it was built with ({m.toolchain.get('jax', '?')}).")
        return exported

    main = program(m.program.file)
    crosscheck.check(c.where(), m, main.in_avals[len(m.sources):], main.out_avals, c.files[m.program.file],
                     main.mlir_module)
    prep = program(m.prep.file) if m.prep else None
    direct = {i for kind, i in m.sources if kind == "weight"}
    unplaced = list({w.file: w for i, w in enumerate(m.weights) if i in direct and w.file not in shared.placed}.values())
    with contextlib.closing(c.take_weights(unplaced)) as values:
        for w, value in zip(unplaced, values):
            shared.placed[w.file] = jax.device_put(value)
    weights = [Weight(w.path, w.argument, shared.placed[w.file] if i in direct else
                      Stored(w.shape, to_dtype(w.dtype), functools.partial(c.take_weight, w)))
               for i, w in enumerate(m.weights)]
    prep_key = (m.prep.file, tuple(w.file for w in m.weights)) if m.prep else None
    prepared = shared.prepared.get(prep_key) if prep_key else None
    backend = local_platform()

    made: list[CompiledModel] = []  # the record, once made: untrusted profiles compile from its program

    def precompiled(entry: ExecutableEntry, exported: jax.export.Exported, label: str,
                    out_tree: Any = None) -> Precompiled | None:
        if not trust_executables:
            if exported is not main or entry.dynamic or entry.platform != backend:
                return None  # the prep program runs through jax; IREE's dynamic module has no portable twin
            here = ExecutableEntry("", XLA_FORMAT, backend, entry.target)
            return Precompiled(entry.target, b"", here, loader=lambda: compile_profile(made[0], entry.target))
        if entry.platform != backend or not c.usable(entry, client):
            return None
        pre = Precompiled(entry.target, c.files[entry.file], entry)
        if entry.is_iree:
            pre.loader = iree_loader(pre.blob, entry, exported.out_tree, len(m.sources), c.where(entry.file))
            return pre

        def loader() -> Any:
            try:
                return load_xla(pre.blob, entry, out_tree or exported.out_tree, label, entry.platform)
            except Exception as e:  # noqa: BLE001 - XLA's own errors for a blob that is not an executable
                raise ArtifactError(f"{c.where(entry.file)}: cannot deserialize the executable "
                                    f"({type(e).__name__}: {str(e)[:200]}).") from None
        pre.loader = loader
        return pre

    profiles = [p for p in (precompiled(e, main, m.function) for e in m.executables) if p is not None]
    universal = next((p for p in profiles if p.entry.dynamic), None)
    profiles = [p for p in profiles if p is not universal]
    chunks = [PrepChunk(c.weights, c.outputs) for c in (m.prep.chunks if m.prep else ())]
    prep_exes = [precompiled(c.executable, prep, f"{m.function}_prep{n}", jax.tree_util.tree_structure([0] * len(c.outputs)))
                 for n, c in enumerate(m.prep.chunks if m.prep else ())]
    if None in prep_exes:
        prep_exes = []  # the chunks not stored prepared run whole, through jax
    at_rest = {k: Stored(w.shape, to_dtype(w.dtype), functools.partial(c.take_weight, w))
               for chunk in (m.prep.chunks if m.prep else ()) for k, w in zip(chunk.outputs, chunk.at_rest)}
    try:
        dispatcher = Dispatcher(m.dims, [info.shape_bounds.opt for _, info in m.leaves], [s.name for _, s in m.sizes],
                                output_axes(main.out_avals, m.dims), [p.target for p in profiles],
                                pad_values(m.dims, m.leaf_paths))
    except (SpecError, KeyError) as e:
        raise ArtifactError(f"{c.where()}: the dims do not match the exported program ({e}).") from None
    program = Program(main, prep, weights, [Source(k, i) for k, i in m.sources],
                      chunks=[(chunk, None) for chunk in chunks], at_rest=at_rest)
    if prepared is None:
        prepared = prepare(program, prep_exes)
        if prep_key is not None:
            shared.prepared[prep_key] = prepared
    model = CompiledModel(
        name=m.function, program=program, program_bytes=c.files[m.program.file],
        prep_bytes=c.files.get(m.prep.file) if m.prep else None, parameters=tuple(m.parameters),
        leaves=tuple(m.leaves), sizes=tuple(m.sizes), outputs=tuple(m.outputs), dims=tuple(m.dims),
        dispatcher=dispatcher, optimization_level=m.optimization_level, platforms=tuple(m.platforms),
        compiler=m.compiler, compiler_options=m.compiler_options, profiles=tuple(profiles), universal=universal,
        prep_executables=tuple(prep_exes), prepared=prepared, metadata=m.metadata, donated=tuple(m.donated),
    )
    if m.bound_inputs:
        model = with_inputs(model, c.bound_values(), m.bound_inputs)
    model = model.replace(selftest_from=StoredSelfTest(c.path, tuple(m.selftest)))  # made with those bound inputs
    made.append(model)
    return model
