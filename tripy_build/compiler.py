"""``tripy_build.compile``: trace once, export with symbolic shapes, compile ahead of time.

The flow is spec -> trace -> export -> compile -> ``Executable``. The user's function is traced
exactly once (for the export); executables for concrete shapes are compiled from the exported
program, so what is precompiled and what is compiled later on a host are the same program.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax

from . import xla_executable
from .errors import SpecError
from .executable import Executable, Parameter, Precompiled
from .export import export, output_infos
from .spec import collect_named_dims
from .trace import bind_arguments, flat_function, runtime_leaves

OPTIMIZATION_LEVELS = range(0, 6)


def check_optimization_level(level: Any) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level not in OPTIMIZATION_LEVELS:
        raise SpecError(
            f"optimization_level must be an integer from 0 to 5, got {level!r}. "
            "Higher levels may compile longer for faster code; 3 is the default."
        )
    return level


def compile(func: Callable, optimization_level: int = 3, *, args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None) -> Executable:
    """Compile ``func`` for the runtime inputs described by ``InputInfo`` arguments.

    ``InputInfo`` arguments (also nested in dicts, lists and tuples) become the executable's inputs,
    in ``func``'s parameter order; every other argument is a compile-time constant folded into the
    program. The result runs without compiling at its opt shapes, validates every call against the
    declared ranges, and can be saved as an artifact.
    """
    return build_executable(func, optimization_level, args=args, kwargs=kwargs)


def build_executable(func: Callable, optimization_level: int = 3, *, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None, platforms: Sequence[str] = ("cpu",),
                     name: str | None = None, log: Callable[[str, float], None] | None = None) -> Executable:
    """``compile`` with the build system's knobs: target ``platforms``, the program's ``name``, a stage ``log``."""
    check_optimization_level(optimization_level)
    if not isinstance(args, (list, tuple)):
        raise SpecError(f"args= must be a list or tuple of arguments, got {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise SpecError(f"kwargs= must be a dict of keyword arguments, got {type(kwargs).__name__}.")
    if not callable(func):
        raise SpecError(f"compile() needs a callable, got {type(func).__name__}.")
    log = log or (lambda stage, seconds: None)

    t0 = time.perf_counter()
    arguments = bind_arguments(func, args, kwargs or {})
    leaves = runtime_leaves(arguments)
    collect_named_dims(leaves)
    flat = flat_function(func, arguments)
    if name:
        flat.__name__ = flat.__qualname__ = name
    exported, symbols = export(flat, leaves, platforms)
    exported_bytes = bytes(exported.serialize())
    outputs = output_infos(exported, leaves, symbols)
    log("trace+export", time.perf_counter() - t0)

    precompiled = []
    host_platform = jax.default_backend()
    if host_platform in platforms:
        opt_shapes = tuple(info.shape_bounds.opt for _, info in leaves)
        t0 = time.perf_counter()
        compiled = xla_executable.compile_shapes(exported, opt_shapes)
        blob, meta = xla_executable.serialize(compiled)
        meta.update(platform=host_platform, profile="opt", depends_on=xla_executable.host_features())
        precompiled.append(Precompiled(opt_shapes, blob, meta, compiled))
        log(f"compile {host_platform} {' '.join('x'.join(map(str, s)) or 'scalar' for s in opt_shapes)}",
            time.perf_counter() - t0)

    parameters = [Parameter(a.name, a.kind.name, a.template) for a in arguments if a.runtime]
    return Executable(
        exported=exported, exported_bytes=exported_bytes, name=flat.__name__, parameters=parameters,
        leaves=leaves, outputs=outputs, optimization_level=optimization_level, platforms=platforms,
        precompiled=precompiled, selftest_source=flat,
    )
