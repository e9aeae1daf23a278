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
import itertools
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from . import eager
from ..runtime import iree as iree_backend
from . import precision as precision_lib
from ..core import profiles as profiles_lib
from ..runtime import xla as xla_executable
from ..artifact.layout import human_size
from ..core.dispatch import Dispatcher, output_axes
from ..errors import SpecError
from ..runtime.executable import Executable, Precompiled
from .export import export, output_infos, symbolic_specs
from ..host import host_features, target_of, usable_cores
from .optimization import check_level, compiler_options
from ..core.signature import Parameter
from ..core.spec import collect_named_dims
from .trace import bind_arguments, flat_function, runtime_leaves, size_leaves, weight_owners

GARBAGE_SCALE = 8.0  # padding in the proof is filled with large random values, so any leak shows


def compile(func: Callable, optimization_level: int = 3, *, args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None, buckets: Any = profiles_lib.DEFAULT_BUCKETS,
            padding: Mapping[str, str] | None = None, max_profiles: int = profiles_lib.DEFAULT_MAX_PROFILES,
            precision: str | None = None, max_error: float | None = None, backend: str = "xla") -> Executable:
    """Compile ``func`` for the runtime inputs described by ``InputInfo`` arguments.

    ``InputInfo`` arguments (also nested in dicts, lists and tuples) become the executable's inputs,
    in ``func``'s parameter order; ``DimSize`` arguments receive the true size of a named dim at run
    time; every other argument is a compile-time constant. Arrays in constants are weights: stored
    once, prepared once, passed to every profile, and replaceable with ``Executable.bind``.

    Args:
        func: a pure function of arrays.
        optimization_level: 0..5.
        args, kwargs: ``func``'s arguments: ``InputInfo``, ``DimSize`` or constants.
        buckets: the sizes to precompile along each dynamic dim: ``"pow2"`` (default: powers of two
            clipped to the dim's range, plus its max), ``"none"`` (only opt), or a dict keyed by
            ``NamedDimension`` name whose values are those policies or explicit size lists.
        padding: ``{dim name: "rows" | "mask"}``: dims that may be padded up to a bucket. ``rows``:
            slices along the dim are independent (a batch). ``mask``: ``func`` takes the dim's
            ``DimSize`` and masks the padding itself. The declaration is checked on the compiled
            executables; undeclared dims are never padded.
        max_profiles: the budget of precompiled executables; a larger profile set is refused.
        precision: ``"bfloat16"`` or ``"float16"``: weights stored and compute done at that precision,
            floating inputs and outputs keep their dtypes; the error against float32 is measured on
            the self-test inputs (``exe.metadata["precision"]``). ``"float32"`` or None: unchanged.
        max_error: the largest error allowed, relative to each output's scale (default 0.02 for
            bfloat16, 0.005 for float16); a larger one fails the compile.
        backend: ``"xla"`` (default) or ``"iree"``: the same program compiled by IREE for the host CPU
            (one dynamic-shape module where IREE accepts it, else one module per profile); needs
            ``pip install -e '.[iree]'``.

    Returns:
        An ``Executable``: every in-range shape runs a precompiled profile, padded where declared;
        other shapes compile on first use, once. With ``TRIPY_BUILD_DISABLE_COMPILE=1`` in the
        environment, nothing compiles: the function runs eagerly on every call (``print`` and
        breakpoints work), with the same signature and input checks.

    Example::

        batch = tb.NamedDimension("batch", 1, 8, 64)
        exe = tb.compile(model.apply, args=[params, tb.InputInfo((batch, 512), "float32")],
                         padding={"batch": "rows"})
        y = exe(np.ones((37, 512), np.float32))  # runs the batch-64 profile on padded input
    """
    return build_executable(func, optimization_level, args=args, kwargs=kwargs, buckets=buckets,
                            padding=padding, max_profiles=max_profiles, precision=precision, max_error=max_error,
                            backend=backend)


def build_executable(func: Callable, optimization_level: int = 3, *, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None, platforms: Sequence[str] = ("cpu",),
                     name: str | None = None, log: Callable[[str, float], None] | None = None,
                     buckets: Any = profiles_lib.DEFAULT_BUCKETS, padding: Mapping[str, str] | None = None,
                     max_profiles: int = profiles_lib.DEFAULT_MAX_PROFILES, precision: str | None = None,
                     max_error: float | None = None, backend: str = "xla") -> Executable:
    """``compile`` with the build system's knobs: target ``platforms``, the program's ``name``, a stage ``log``."""
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
        iree_backend.require()
    t0 = time.perf_counter()
    arguments = bind_arguments(func, args, kwargs or {})
    leaves, sizes = runtime_leaves(arguments), size_leaves(arguments)
    collect_named_dims(leaves)
    reference = flat_function(func, arguments)  # float32: the error of a reduced precision is measured against it
    if reduced:
        arguments = [a if a.traced else dataclasses.replace(a, value=precision_lib.cast_constant(a.value, reduced))
                     for a in arguments]
    flat = flat_function(func, arguments)
    if reduced:
        specs, _ = symbolic_specs(leaves)
        flat = precision_lib.wrap(flat, reference, reduced, [*specs, *[jax.ShapeDtypeStruct((), "int32")] * len(sizes)])
    if name:
        for f in (flat, reference):
            f.__name__ = f.__qualname__ = name
    if eager.disabled():
        return eager.EagerFunction(flat, [Parameter(a.name, a.kind.name, a.template) for a in arguments if a.runtime],
                                   leaves, sizes)
    program = export(flat, leaves, sizes, weight_owners(arguments), platforms)
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
    dispatcher = Dispatcher(dims, [info.shape_bounds.opt for _, info in leaves], size_names, out_axes, targets)
    exported_bytes = bytes(program.main.serialize())
    prep_bytes = bytes(program.prep.serialize()) if program.prep is not None else None
    log("trace+export", time.perf_counter() - t0)

    host_platform = jax.default_backend()
    if host_platform not in platforms:
        raise SpecError(
            f"platforms {list(platforms)}: this host runs {host_platform!r}, and a build runs what it compiles (the "
            f"self-test, the padding proof); include {host_platform!r} (e.g. backend=[{host_platform},{platforms[0]}]), "
            f"or build on a {platforms[0]} host. The others compile from the portable program where the artifact loads."
        )
    prep_exe = None
    if host_platform in platforms and program.prep is not None:
        t0 = time.perf_counter()
        prep_exe = _compile_one(program.prep, [w.value.shape for w in program.weights], (), host_platform, None,
                                compiler_options(optimization_level, host_platform))
        log("compile prep", time.perf_counter() - t0)
    parameters = [Parameter(a.name, a.kind.name, a.template) for a in arguments if a.runtime]
    exe = Executable(
        program=program, program_bytes=exported_bytes, prep_bytes=prep_bytes, name=flat.__name__,
        parameters=parameters, leaves=leaves, sizes=sizes, outputs=outputs, dims=dims, dispatcher=dispatcher,
        optimization_level=optimization_level, platforms=platforms, precompiled=[], prep_exe=prep_exe,
        selftest_source=flat,
    )
    exe.tolerance = precision_lib.TOLERANCE.get(reduced)
    leading = [a.shape for a in program.leading_avals()]
    shapes = [[*leading, *dispatcher.leaf_shapes(t), *[()] * len(sizes)] for t in targets]
    if backend == "iree":
        precompiled = _compile_iree(exe, program, shapes, targets, dims, len(sizes), log)
    else:
        t0 = time.perf_counter()
        options = compiler_options(optimization_level, host_platform)
        precompiled = _compile_all(lambda i, profile: _compile_one(program.main, shapes[i], targets[i], host_platform,
                                                                   profile, options), targets, log, dims)
        exe.add_profiles(precompiled)
        log(f"compile {len(precompiled)} profile(s)", time.perf_counter() - t0)
    if precompiled and exe._universal is None and any(d.strategy == "padded" for d in dims):
        t0 = time.perf_counter()
        prove_padding(exe)
        log("prove padding", time.perf_counter() - t0)
    if reduced:
        t0 = time.perf_counter()
        measure_precision(exe, reference, reduced, budget)
        log(f"measure {reduced} error", time.perf_counter() - t0)
    return exe


def measure_precision(exe: Executable, reference: Callable, dtype: str, budget: float | None) -> None:
    """Compare ``exe`` with the float32 ``reference`` on the self-test inputs; record it; enforce the budget."""
    from .selftest import from_files, run_once

    worst_abs, worst_rel, names = 0.0, 0.0, []
    for case, _, _ in from_files(*exe.selftest_cases()):
        got = jax.tree_util.tree_leaves(exe.call_flat(*case.inputs))
        sizes = exe.dispatcher.route([np.shape(x) for x in case.inputs]).sizes
        want = jax.tree_util.tree_leaves(run_once(reference, *case.inputs, *[np.int32(n) for n in sizes]))
        a, r = precision_lib.error(got, want)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        names.append(case.name)
    exe.metadata["precision"] = {"dtype": dtype, "max_abs_error": worst_abs, "max_rel_error": worst_rel,
                                 "max_error": budget, "measured_on": names}
    if budget is not None and worst_rel > budget:
        raise SpecError(
            f"precision {dtype}: the outputs differ from float32 by up to {worst_rel:.3g} of their scale (max abs "
            f"{worst_abs:.3g}) on the self-test inputs ({', '.join(names)}), over the budget max_error={budget:g}. "
            "Raise the budget, or build in float16 or float32."
        )


def _compile_iree(exe: Executable, program: Any, shapes: Sequence[Sequence[Sequence[int]]],
                  targets: Sequence[tuple[int, ...]], dims: Sequence[Any], n_sizes: int,
                  log: Callable[[str, float], None]) -> list[Precompiled]:
    """IREE modules: one for every shape if IREE accepts the dynamic program, else one per profile."""
    depends = dict(host_features(), **iree_backend.versions())
    base = {"format": iree_backend.FORMAT, "platform": "cpu", "flags": list(iree_backend.FLAGS), "depends_on": depends}
    specs, _ = symbolic_specs(exe.flat_inputs)
    vmfb, reason, seconds = iree_backend.compile_dynamic(program.main, exe._leading,
                                                         [*specs, *[jax.ShapeDtypeStruct((), "int32")] * n_sizes])
    n_lead = len(program.sources)
    out_tree = program.main.out_tree
    if vmfb is not None:
        meta = dict(base, dynamic=True, profile={})
        pre = Precompiled((), vmfb, meta, iree_backend.loader(vmfb, meta, out_tree, n_lead, "iree")(), seconds=seconds)
        exe.set_universal(pre)
        exe.compiler = {"name": "iree", "mode": "dynamic", "flags": list(iree_backend.FLAGS)}
        log("compile (one dynamic-shape module)", seconds)
        return [pre]
    log(f"  IREE rejected the dynamic program ({reason}); one module per profile", seconds)

    def one(i: int, profile: dict[str, int]) -> Precompiled:
        blob, secs = iree_backend.compile_static(program.main, shapes[i])
        meta = dict(base, profile=profile)
        return Precompiled(tuple(targets[i]), blob, meta, iree_backend.loader(blob, meta, out_tree, n_lead, "iree")(),
                           seconds=secs)

    t0 = time.perf_counter()
    compiled = _compile_all(one, targets, log, dims)
    exe.add_profiles(compiled)
    exe.compiler = {"name": "iree", "mode": "profiles", "why": reason, "flags": list(iree_backend.FLAGS)}
    log(f"compile {len(compiled)} profile(s)", time.perf_counter() - t0)
    return compiled


def _compile_one(exported: jax.export.Exported, shapes: Sequence[Sequence[int]], target: tuple[int, ...],
                 platform: str, profile: Any, options: dict[str, Any]) -> Precompiled:
    t0 = time.perf_counter()
    compiled = xla_executable.compile_shapes(exported, shapes, options)
    seconds = time.perf_counter() - t0
    blob, meta = xla_executable.serialize(compiled)
    depends = dict(host_features())
    built_for = target_of(blob) if platform == "cpu" else None
    if built_for is not None:
        depends.update(target_cpu=built_for["cpu"], isa=built_for["isa"])
    meta.update(platform=platform, profile=profile, depends_on=depends, compiler_options=options)
    return Precompiled(tuple(target), blob, meta, compiled, seconds=seconds)


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


def prove_padding(exe: Executable, seed: int = 0) -> None:
    """Check every padding declaration on the compiled executables, at every bucket boundary.

    For a padded dim with buckets ``b0 < b1 < ...`` and every pair ``(b_i, b_i+1)``: random inputs of
    size ``b_i`` run exactly, and the same inputs filled up to ``b_i+1`` with large random values (not
    zeros, so that a model mixing rows or ignoring its mask shows it) run the larger bucket with the
    true size in ``DimSize``; the outputs, sliced back, must agree within the self-test tolerance.
    The other dims sit at their smallest bucket. Raises ``SpecError`` naming the dim.
    """
    from .selftest import DEFAULT_RTOL, RTOL, sample

    rng = np.random.default_rng(seed)
    dispatcher = exe.dispatcher
    base = [d.buckets[0] if d.buckets else d.bounds[1] for d in exe.dims]
    for di, d in enumerate(exe.dims):
        if d.strategy != "padded":
            continue
        for small, large in zip(d.buckets, d.buckets[1:]):
            at_small = tuple(small if i == di else n for i, n in enumerate(base))
            at_large = tuple(large if i == di else n for i, n in enumerate(base))
            leaf_infos = [info for _, info in exe.flat_inputs]
            inputs = [sample(info, s, (seed, di, small, li))
                      for li, (info, s) in enumerate(zip(leaf_infos, dispatcher.leaf_shapes(at_small)))]
            filled = [x if x.shape == big else _fill(x, big, rng) for x, big in zip(inputs, dispatcher.leaf_shapes(at_large))]
            true_sizes = dispatcher.route([x.shape for x in inputs]).sizes
            want = exe.run_profile(at_small, inputs, true_sizes)
            got = exe.run_profile(at_large, filled, true_sizes)
            for o, (w, g, axes) in enumerate(zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got),
                                                 dispatcher.out_axes)):
                g = np.asarray(g)[tuple(slice(0, at_small[a]) if a is not None else slice(None) for a in axes)]
                w = np.asarray(w)
                rtol = exe.tolerance or RTOL.get(w.dtype.name, DEFAULT_RTOL)
                err = np.abs(g.astype(np.float64) - w.astype(np.float64))
                bad = err > rtol + rtol * np.abs(w.astype(np.float64))
                if g.shape != w.shape or bad.any():
                    worst = float(err.max()) if g.shape == w.shape else float("inf")
                    raise SpecError(
                        f"padding[{d.name!r}] = {d.padding!r} is not exact for {exe.__name__}: with {d.name}={small} "
                        f"padded to the bucket {large}, output {o} differs from the unpadded result by up to "
                        f"{worst:.3g} (tolerance {rtol:g}). "
                        + ("Slices along this dim are not independent; remove the declaration."
                           if d.padding == "rows" else
                           f"The model must mask every position at or beyond DimSize({d.name!r}); fix the "
                           "masking or remove the declaration.")
                    )


def _fill(x: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``x`` enlarged to ``shape``, the new positions filled with random values far from zero."""
    if x.dtype.kind == "f":
        out = (rng.standard_normal(shape) * GARBAGE_SCALE + GARBAGE_SCALE / 2).astype(x.dtype)
    elif x.dtype.kind == "b":
        out = rng.random(shape) < 0.5
    else:
        out = rng.integers(0, 4, shape).astype(x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out
