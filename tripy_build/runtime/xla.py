"""Compiled XLA executables stored as their own bytes, with our metadata in JSON: no pickle.

``jax.experimental.serialize_executable`` pickles jax internals around the executable, so loading
one can run arbitrary code and breaks across jax versions. Here the PJRT client serializes the
executable itself and we rebuild jax's thin wrapper from JSON metadata. That wrapper is jax-internal,
so it is only used on jax versions this was tested with; elsewhere the caller compiles the exported
program instead.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from ..artifact.manifest import XLA_FORMAT, ExecutableEntry


def backend_started() -> bool:
    """Whether jax has created its backends in this process (after which ``XLA_FLAGS`` are read)."""
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def _backend(platform_name: str):
    return jax.devices(platform_name)[0].client


def serialize(compiled: jax.stages.Compiled, platform: str = "cpu") -> tuple[bytes, ExecutableEntry]:
    """The executable's bytes and what is needed to call it again (its file and profile are the caller's)."""
    unloaded = compiled._executable._unloaded_executable
    blob = unloaded.backend.serialize_executable(unloaded.xla_executable)
    entry = ExecutableEntry(
        "", XLA_FORMAT, platform,
        input_shapes=tuple(tuple(a.shape) for a in unloaded.input_avals),
        input_dtypes=tuple(np.dtype(a.dtype).name for a in unloaded.input_avals),
        output_shapes=tuple(tuple(a.shape) for a in unloaded.output_avals),
        output_dtypes=tuple(np.dtype(a.dtype).name for a in unloaded.output_avals),
        kept_inputs=tuple(sorted(unloaded.kept_var_idx)))
    return blob, entry


def load(blob: bytes, entry: ExecutableEntry, out_tree: Any, name: str, platform_name: str = "cpu") -> jax.stages.Compiled:
    """Deserialize an executable and wrap it as a ``jax.stages.Compiled`` (jax's C++ fast call path)."""
    from jax._src import core, stages
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc

    backend = _backend(platform_name)
    device = backend.local_devices()[0]
    devices = xc.DeviceList((device,))
    executable = backend.deserialize_executable(blob, executable_devices=devices)
    in_avals = [core.ShapedArray(tuple(s), np.dtype(d)) for s, d in zip(entry.input_shapes, entry.input_dtypes)]
    out_avals = [core.ShapedArray(tuple(s), np.dtype(d)) for s, d in zip(entry.output_shapes, entry.output_dtypes)]
    sharding = jax.sharding.SingleDeviceSharding(device)
    n_in, n_out = len(in_avals), len(out_avals)
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=executable, device_list=devices, backend=backend,
        input_avals=in_avals, input_shardings=[sharding] * n_in,
        output_avals=out_avals, output_shardings=[sharding] * n_out,
        committed=True, name=name, unordered_effects=[], ordered_effects=[], keepalive=[],
        host_callbacks=[], kept_var_idx=set(entry.kept_inputs), mut=None,
        xla_in_layouts=[None] * n_in, dispatch_in_layouts=[None] * n_in, xla_out_layouts=[None] * n_out,
        all_args_info=None, pgle_profiler=None,
    )
    args_info = (tuple(stages.ArgInfo(a, False) for a in in_avals), {})
    return stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=True)


def compile_shapes(exported: jax.export.Exported, shapes: Sequence[Sequence[int]],
                   options: dict[str, Any] | None = None, donate: Sequence[int] = ()) -> jax.stages.Compiled:
    """Compile the exported program for one concrete shape per input, with XLA ``options``; the arguments
    at positions ``donate`` are donated (an output of the same shape and dtype reuses their buffer)."""
    specs = [jax.ShapeDtypeStruct(tuple(s), a.dtype) for s, a in zip(shapes, exported.in_avals)]
    lowered = jax.jit(exported.call, donate_argnums=tuple(donate)).lower(*specs)
    return lowered.compile(compiler_options=options or None)
