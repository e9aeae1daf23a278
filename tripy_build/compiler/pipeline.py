"""``tripy_build.compiler``: trace once, export with symbolic shapes, compile every profile ahead of time.

The flow is spec -> trace -> export (weights split off) -> profiles -> compile -> ``Executable``. The
user's function is traced exactly once; every executable is compiled from the exported program, so
what is precompiled and what a host compiles later are the same program. Profiles compile in a
thread pool (XLA releases the GIL while it compiles). A padding declaration is proven on the built
executables before the executable is returned: a false one fails the compile, naming the dim.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import jax

from ..artifact.describe import human_size

from ..artifact.selftest import RTOL
from ..core import profiles as profiles_lib
from ..core.dispatch import Dispatcher, output_axes
from ..core.entry import Entry, check_entries
from ..core.signature import Parameter
from ..core.spec import collect_named_dims, count_leaves, undeclared_values
from ..errors import SpecError
from ..host import host_features, target_of, usable_cores
from ..runtime import xla as xla_executable
from ..runtime.compiled import CompiledModel, Precompiled, Reference, shares_prep
from ..runtime.executable import Executable, together
from ..runtime.prepare import prepare
from . import eager, selftest
from . import precision as precision_lib
from .export import export, output_infos, symbolic_specs
from .gpu import HOST, record as gpu_record
from .optimization import DEFAULT_LEVEL, check_level, compiler_options
from .proofs import prove_padding
from .target import compile_plan
from .trace import Placed, bind_arguments, flat_function, runtime_leaves, size_leaves, weight_owners

log_compile = logging.getLogger(__name__)


def compile(func: Callable | Mapping[str, Entry], optimization_level: int = DEFAULT_LEVEL, *, args: Sequence[Any] = (),  # noqa: A001
            kwargs: dict[str, Any] | None = None, buckets: Any = profiles_lib.DEFAULT_BUCKETS,
            padding: Mapping[str, str] | None = None, max_profiles: int = profiles_lib.DEFAULT_MAX_PROFILES,
            precision: str | None = None, max_error: float | None = None, backend: str = "xla") -> Executable:
    """Compile ``func`` for the runtime inputs described by ``InputInfo`` arguments.

    ``InputInfo`` arguments (also nested in dicts, lists and tuples) become the executable's inputs,
    in ``func``'s parameter order; ``DimSize`` arguments receive the true size of a named dim at run
    time; every other argument is a compile-time constant. Arrays in constants are weights: stored
    once, prepared once, passed to every profile, and replaceable with ``Executable.bind``.

    Args:
        func: a pure function of arrays; or, for an executable with several entry points over the same
            weights, a dict of entry name -> ``Entry`` (each with its own arguments, buckets, padding
            and donated inputs; ``args``, ``kwargs``, ``buckets``, ``padding`` and ``max_profiles`` are
            then given per entry, not here).
        optimization_level: 0..5.
        args, kwargs: ``func``'s arguments: ``InputInfo``, ``DimSize`` or constants.
        buckets: the sizes to precompile along each dynamic dim: ``"pow2"`` (default: powers of two
            clipped to the dim's range, plus its max), ``"pow2:N"`` (from N up), ``"fine"``/``"fine:N"`` (the
            powers of two and 3 x 2^k between them: a padded size runs at most 1.5x its length, not 2x),
            ``"none"`` (only opt), or a dict keyed by
            ``NamedDimension`` name whose values are those policies or explicit size lists.
        padding: ``{dim name: "rows" | "mask"}``: dims that may be padded up to a bucket. ``rows``:
            slices along the dim are independent (a batch). ``mask``: ``func`` takes the dim's
            ``DimSize`` and masks the padding itself. The declaration is checked on the compiled
            executables; undeclared dims are never padded.
        max_profiles: the budget of precompiled executables; a larger profile set is refused.
        precision: ``"bfloat16"`` or ``"float16"``: weights stored and compute done at that precision,
            floating inputs and outputs keep their dtypes; the error against float32 is measured on
            the self-test inputs (``exe.metadata["precision"]``). ``"float32"`` or None: unchanged.
        max_error: the largest error allowed, relative to each output's scale (default 0.08 for
            bfloat16, 0.005 for float16); a larger one fails the compile.
        backend: ``"xla"`` (default) or ``"iree"``: the same program compiled by IREE for the host CPU
            (one dynamic-shape module where IREE accepts it, else one module per profile); needs
            ``pip install -e '.[iree]'``.

    Returns:
        An ``Executable``: every in-range shape runs a precompiled profile, padded where declared;
        other shapes compile on first use, once. A multi-entry compile returns the first entry's
        executable (calling it calls that entry) with every entry in ``exe.entries``; ``save`` writes
        them as one artifact, each weight stored once. With ``TRIPY_BUILD_DISABLE_COMPILE=1`` in the
        environment, nothing compiles: the function runs eagerly on every call (``print`` and
        breakpoints work), with the same signature and input checks.

    Example::

        batch = tb.NamedDimension("batch", 1, 8, 64)
        exe = tb.compile(model.apply, args=[params, tb.InputInfo((batch, 512), "float32")],
                         padding={"batch": "rows"})
        y = exe(np.ones((37, 512), np.float32))  # runs the batch-64 profile on padded input

        exe = tb.compile({"encode": tb.Entry(encode, args=[params, text]),
                          "score": tb.Entry(score, args=[params, query, docs])})
        exe.entries["score"](q, d)
    """
    if isinstance(func, Mapping):
        if args or kwargs or padding is not None or buckets != profiles_lib.DEFAULT_BUCKETS or \
                max_profiles != profiles_lib.DEFAULT_MAX_PROFILES:
            raise SpecError("compile(): with a dict of entries, give args=, kwargs=, buckets=, padding= and "
                            "max_profiles= to each tb.Entry, not to compile().")
        return build_entries(func, optimization_level, precision=precision, max_error=max_error, backend=backend)
    return build_executable(func, optimization_level, args=args, kwargs=kwargs, buckets=buckets,
                            padding=padding, max_profiles=max_profiles, precision=precision, max_error=max_error,
                            backend=backend)


def build_executable(func: Callable, optimization_level: int = DEFAULT_LEVEL, *, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None, platforms: Sequence[str] = ("cpu",),
                     name: str | None = None, log: Callable[[str, float], None] | None = None,
                     buckets: Any = profiles_lib.DEFAULT_BUCKETS, padding: Mapping[str, str] | None = None,
                     max_profiles: int = profiles_lib.DEFAULT_MAX_PROFILES, precision: str | None = None,
                     max_error: float | None = None, backend: str = "xla", donate: Sequence[str] = (),
                     prep_name: str | None = None, keep_loaded: bool = True, gpu: str = HOST,
                     cpu: str = "host", warn_values: bool = True, metadata: Mapping[str, Any] | None = None,
                     earlier: Sequence[CompiledModel] = (), placed: Placed | None = None) -> Executable:
    """``compile`` with the build system's knobs: target ``platforms``, the program's ``name``, a stage ``log``;
    ``donate``: the runtime inputs whose buffers each call gives to the outputs (``Entry.donate``);
    ``keep_loaded=False``: each profile is kept as its bytes once compiled, loaded only while the build runs it
    (a build that saves the executable: BERT-base's 50 profiles held ~570 MB loaded); ``gpu``: the GPU ``cuda``
    executables are for (``target.gpu``: ``host``, or a name in ``compiler/gpu.py``, compiled for without it);
    ``cpu``: the CPU ``cpu`` executables are for (``target.cpu``: ``host``, ``portable`` or a baseline in
    ``compiler/target.py``); ``warn_values``: warn of integer inputs without declared values (a build from a
    config warns in its own words, naming the config key); ``metadata``: what the build records with it (its key,
    model, labels); ``earlier``: the entries compiled before this one, whose prepared weights it shares where its
    prep is the same work on the same weights; ``placed``: the constants' numpy arrays they placed on the device
    (the same array given to several entries is placed once, and their preps are then the same work).

    Every platform of ``platforms`` gets its executables (``target.compile_plan``). Those of the platform that
    runs here are the ones the padding proof and the precision measure run; those of the others (a GPU that is
    not here, or the CPU beside this machine's GPU) are saved with the artifact. Where none runs here (a cuda
    build on a CPU machine), a twin of the program exported for this CPU runs them, and is not saved."""
    check_level(optimization_level)
    if not isinstance(args, (list, tuple)):
        raise SpecError(f"args= must be a list or tuple of arguments, got {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise SpecError(f"kwargs= must be a dict of keyword arguments, got {type(kwargs).__name__}.")
    if not callable(func):
        raise SpecError(f"compile() needs a callable, got {type(func).__name__}.")
    if padding is not None and not isinstance(padding, Mapping):
        raise SpecError(f"padding= must be a dict of dim name -> 'rows' or 'mask', got {padding!r}.")
    log = log or (lambda stage, seconds: None)

    reduced, budget = precision_lib.check(precision, max_error)
    if backend not in ("xla", "iree"):
        raise SpecError(f"backend must be 'xla' or 'iree', got {backend!r}.")
    if backend == "iree":
        from ..runtime.iree import require

        require()
    t0 = time.perf_counter()
    arguments = bind_arguments(func, args, kwargs or {}, placed)
    leaves, sizes = runtime_leaves(arguments), size_leaves(arguments)
    collect_named_dims(leaves)
    undeclared = undeclared_values(leaves)
    if warn_values and undeclared:
        log_compile.warning(
            "%s: integer input(s) %s have no declared values: an id outside what the model indexes (past an "
            "embedding table's rows) gives NaN or another row's values without a word. Declare the values each may "
            "hold, InputInfo(shape, dtype, values=(lo, hi)) with hi exclusive (token ids: (0, vocab_size)), and "
            "every call is checked against them.", name or getattr(func, "__name__", "compile"),
            ", ".join(repr(p) for p in undeclared))
    reference = flat_function(func, arguments)  # float32: the error of a reduced precision is measured against it
    if reduced:
        arguments = [a if a.traced else dataclasses.replace(a, value=precision_lib.cast_constant(a.value, reduced, placed))
                     for a in arguments]
    flat = flat_function(func, arguments)
    if reduced:
        specs, _ = symbolic_specs(leaves)
        flat = precision_lib.wrap(flat, reference, reduced, [*specs, *[jax.ShapeDtypeStruct((), "int32")] * len(sizes)])
    if name:
        for f in (flat, reference):
            f.__name__ = f.__qualname__ = name
    donated = _donated_paths(arguments, leaves, donate, flat.__name__)
    if donated and backend == "iree":
        raise SpecError(f"{flat.__name__}: donate= needs backend='xla' (IREE's modules take no donated buffers).")
    if eager.disabled():
        return eager.EagerFunction(flat, [Parameter(a.name, a.kind.name, a.template) for a in arguments if a.runtime],
                                   leaves, sizes)
    plan = compile_plan(platforms, gpu, cpu) if backend == "xla" else None
    program = export(flat, leaves, sizes, weight_owners(arguments), platforms, prep_name)
    exported_bytes = bytes(program.main.serialize())
    prep_bytes = bytes(program.prep.serialize()) if program.prep is not None else None
    target_program = program
    if plan is not None and plan.twin:
        program = export(flat, leaves, sizes, weight_owners(arguments), (plan.run,), prep_name)
    dims = profiles_lib.plan_dims(program.symbols, [p for p, _ in leaves], buckets, padding)
    size_names = [s.name for _, s in sizes]
    for d in dims:
        if d.padding == "mask" and d.name not in size_names:
            raise SpecError(
                f"padding[{d.name!r}] is 'mask', but {flat.__name__} does not receive the true size of "
                f"{d.name!r}: pass tb.DimSize({d.name!r}) as the argument it masks with, or declare 'rows' "
                "if slices along the dim are independent."
            )
    outputs = output_infos(program, leaves, len(sizes))
    out_axes = output_axes(program.main.out_avals, dims)
    targets = profiles_lib.profiles(dims, max_profiles)
    dispatcher = Dispatcher(dims, [info.shape_bounds.opt for _, info in leaves], size_names, out_axes, targets,
                            profiles_lib.pad_values(dims, [p for p, _ in leaves]))
    log("trace+export", time.perf_counter() - t0)

    host_platform = plan.run if plan is not None else "cpu"
    run_device = (plan.devices.get(host_platform) if plan is not None else None) or jax.devices(host_platform)[0]
    options = {p: compiler_options(optimization_level, p) for p in platforms}  # recorded; run-time compiles use them
    run_options = compiler_options(optimization_level, host_platform)  # the twin's too, not recorded
    twin_prep = next((m for m in earlier if shares_prep(m, prep_bytes, program.weights)), None)
    prep_exes: tuple[Precompiled, ...] = ()
    if twin_prep is not None:  # the same weight-only work on the same weights: prepared once, held once
        prep_exes, prepared = twin_prep.prep_executables, twin_prep.prepared
    elif program.prep is not None:
        t0 = time.perf_counter()
        prep_exes = tuple(_compile_one(exported, [program.weights[i].value.shape for i in chunk.weights], (),
                                       host_platform, None, run_options, device=run_device)
                          for chunk, exported in program.chunks)
        prepared = prepare(program, prep_exes)
        log("compile prep", time.perf_counter() - t0)
    else:
        prepared = ()
    record = CompiledModel(
        name=flat.__name__, program=program, program_bytes=exported_bytes, prep_bytes=prep_bytes,
        parameters=tuple(Parameter(a.name, a.kind.name, a.template) for a in arguments if a.runtime),
        leaves=tuple(leaves), sizes=tuple(sizes), outputs=tuple(outputs), dims=tuple(dims), dispatcher=dispatcher,
        optimization_level=optimization_level, platforms=tuple(platforms), compiler_options=options,
        prep_executables=prep_exes, prepared=prepared, metadata=dict(metadata or {}), donated=donated,
        tolerance=RTOL.get(reduced), selftest_from=Reference(flat, selftest.make),
    )
    leading = [a.shape for a in program.leading_avals()]
    shapes = [[*leading, *dispatcher.leaf_shapes(t), *[()] * len(sizes)] for t in targets]

    def compile_all(one: Callable[[int, dict[str, int]], Precompiled]) -> list[Precompiled]:
        return _compile_all(one, targets, log, dims)
    if backend == "iree":
        from .iree import compile_profiles

        profiles, universal, made_by = compile_profiles(record.leaves, record.leading, program, shapes, targets,
                                                        len(sizes), log, compile_all)
        record = dataclasses.replace(record, profiles=tuple(profiles), universal=universal, compiler=made_by)
    else:
        t0 = time.perf_counter()
        donate_argnums = record.donate_argnums
        profiles = compile_all(lambda i, profile: _compile_one(program.main, shapes[i], targets[i], host_platform,
                                                               profile, run_options, donate_argnums,
                                                               None if keep_loaded else flat.__name__, run_device))
        twin = f" for this {host_platform.upper()} (a twin to prove padding on; not saved)" if plan.twin else ""
        log(f"compile {len(profiles)} profile(s){twin}", time.perf_counter() - t0)
        foreign: list[Precompiled] = []
        foreign_prep = None
        for p in [p for p in platforms if p != host_platform]:
            t0 = time.perf_counter()
            other = functools.partial(_compile_one, platform=p, options=options[p], donate=donate_argnums,
                                      device=plan.devices[p], gpu=plan.deviceless.get(p), keep=False)
            made = compile_all(lambda i, profile, other=other: other(target_program.main, shapes[i], targets[i],
                                                                     profile=profile))
            foreign += made
            if plan.twin and foreign_prep is None:
                foreign_prep = tuple(other(exported, [program.weights[i].value.shape for i in chunk.weights], (),
                                           profile=None) for chunk, exported in target_program.chunks)
            name = plan.devices[p].device_kind if p == "cuda" else p
            log(f"compile {len(made)} profile(s) for {name}", time.perf_counter() - t0)
        record = dataclasses.replace(record, profiles=tuple(profiles), foreign=tuple(foreign), foreign_prep=foreign_prep)
    exe = Executable(record)
    if profiles and record.universal is None and any(d.strategy == "padded" for d in dims):
        t0 = time.perf_counter()
        prove_padding(exe, budget=budget if reduced else None)
        log("prove padding", time.perf_counter() - t0)
    if reduced:
        t0 = time.perf_counter()
        measured = precision_lib.measure_precision(exe, reference, reduced, budget, flat.rewritten)
        exe = Executable(record.replace(metadata={**record.metadata, "precision": measured}), like=exe)
        log(f"measure {reduced} error", time.perf_counter() - t0)
    if not keep_loaded:
        exe.unload_profiles()
    return exe


def _donated_paths(arguments: Sequence[Any], leaves: Sequence[tuple[str, Any]], donate: Sequence[str],
                   name: str) -> tuple[str, ...]:
    """The flat input paths of the runtime arguments named in ``donate``."""
    runtime = [a for a in arguments if a.runtime]
    names = [a.name for a in runtime]
    unknown = [d for d in donate if d not in names]
    if unknown:
        raise SpecError(f"{name}: donate={list(donate)!r} names {unknown[0]!r}, which is not a runtime input; its "
                        f"inputs: {', '.join(names) or 'none'}.")
    paths, start = [], 0
    for a in runtime:
        n = count_leaves(a.template)
        if a.name in donate:
            paths += [p for p, _ in leaves[start:start + n]]
        start += n
    return tuple(paths)


def build_entries(entries: Mapping[str, Entry], optimization_level: int = DEFAULT_LEVEL, *,
                  platforms: Sequence[str] = ("cpu",), name: str | None = None,
                  log: Callable[[str, float], None] | None = None, precision: str | None = None,
                  max_error: float | None = None, backend: str = "xla", keep_loaded: bool = True,
                  gpu: str = HOST, cpu: str = "host", warn_values: bool = True,
                  metadata: Mapping[str, Any] | None = None) -> Executable:
    """Compile each entry (``compile`` of a dict of ``Entry``); the first entry's executable, with all in
    ``entries``. ``name`` prefixes each entry's program name (``gpt2_decode``); ``keep_loaded``, ``gpu``, ``cpu``
    and ``warn_values``: as for ``build_executable``; ``metadata``: recorded with the first entry (the artifact's
    top level). An entry whose prep program and weights are an earlier entry's shares its prepared weights."""
    entries = check_entries(entries)
    log = log or (lambda stage, seconds: None)
    models: dict[str, Any] = {}
    placed = Placed()
    for n, (key, e) in enumerate(entries.items()):
        log(f"entry {key}", 0.0)
        exe = build_executable(
            e.func, optimization_level, args=e.args, kwargs=dict(e.kwargs) if e.kwargs is not None else None,
            platforms=platforms, name=f"{name}_{key}" if name else key, log=log, buckets=e.buckets,
            padding=e.padding, max_profiles=e.max_profiles, precision=precision, max_error=max_error,
            backend=backend, donate=e.donate, prep_name=f"{name or 'entries'}_prep", keep_loaded=keep_loaded, gpu=gpu,
            cpu=cpu, warn_values=warn_values, metadata=metadata if n == 0 else None,
            earlier=[m for m in models.values() if isinstance(m, CompiledModel)], placed=placed)
        models[key] = exe.compiled if isinstance(exe, Executable) else exe
    if not all(isinstance(m, CompiledModel) for m in models.values()):  # TRIPY_BUILD_DISABLE_COMPILE
        return next(iter(models.values()))
    return next(iter(together(models).values()))


def _compile_one(exported: jax.export.Exported, shapes: Sequence[Sequence[int]], target: tuple[int, ...],
                 platform: str, profile: Any, options: dict[str, Any], donate: Sequence[int] = (),
                 unloaded_as: str | None = None, device: Any = None, gpu: Any = None, keep: bool = True) -> Precompiled:
    """One profile compiled and serialized for ``device`` (None: jax's default; ``gpu``: the ``gpu.GpuSpec`` of a
    compile-only one); with ``unloaded_as`` (the program's name) only its bytes are kept, deserialized when first
    run (``Precompiled.unload``), as they are for a compile-only CPU's (a ``target.cpu`` baseline: the code runs
    here once this CPU's client loads it); with ``keep=False`` only its bytes, never to run in this process
    (another platform's)."""
    t0 = time.perf_counter()
    compiled = xla_executable.compile_shapes(exported, shapes, options, donate, device)
    seconds = time.perf_counter() - t0
    blob, entry = xla_executable.serialize(compiled)
    if platform == "cuda":
        depends = gpu_record(device, gpu)
    else:
        depends = dict(host_features())
        built_for = target_of(blob) if platform == "cpu" else None
        if built_for is not None:
            depends.update(target_cpu=built_for["cpu"], isa=built_for["isa"])
        if xla_executable.compile_only(device):  # the build host's CPU says nothing of a baseline's code
            del depends["cpu_model"], depends["cpu_features"]
    entry = dataclasses.replace(entry, platform=platform, profile=dict(profile or {}), depends_on=depends,
                                compiler_options=dict(options))
    if not keep:
        return Precompiled(tuple(target), blob, entry, None, seconds=seconds)
    if unloaded_as is None and xla_executable.compile_only(device):
        unloaded_as = exported.fun_name
    if unloaded_as is None:
        return Precompiled(tuple(target), blob, entry, compiled, seconds=seconds)
    del compiled
    reload = functools.partial(xla_executable.load, blob, entry, exported.out_tree, unloaded_as, platform)
    return Precompiled(tuple(target), blob, entry, None, reload, seconds=seconds, reload=reload)


def _compile_all(compile_one: Callable[[int, dict[str, int]], Precompiled], targets: Sequence[tuple[int, ...]],
                 log: Callable[[str, float], None], dims: Sequence[Any]) -> list[Precompiled]:
    """Compile every profile in a thread pool (XLA releases the GIL; IREE compiles in a subprocess).

    One XLA compile already keeps ~1.6 of this machine's 2 cores busy (parallel codegen), so two
    threads gain ~10%; on larger hosts they gain more.
    """
    done = itertools.count(1)

    def one(i: int) -> Precompiled:
        profile = {d.name or d.symbol: n for d, n in zip(dims, targets[i])}
        pre = compile_one(i, profile)
        label = " ".join(f"{k}={v}" for k, v in profile.items()) or "static"
        log(f"  profile {next(done)}/{len(targets)} {label} ({human_size(len(pre.blob))})", pre.seconds)
        return pre

    workers = max(1, min(len(targets), len(usable_cores())))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tripy_build-compile") as pool:
        return list(pool.map(one, range(len(targets))))


