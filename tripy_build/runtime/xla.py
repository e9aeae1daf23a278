"""Compiled XLA executables stored as their own bytes, with our metadata in JSON: no pickle.

``jax.experimental.serialize_executable`` pickles jax internals around the executable, so loading
one can run arbitrary code and breaks across jax versions. Here the PJRT client serializes the
executable itself and we rebuild jax's thin wrapper from JSON metadata. That wrapper is jax-internal:
the calls are in ``jaxlib_api``, with the releases they were tested on.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from .. import jaxlib_api
from ..artifact.manifest import XLA_FORMAT, ExecutableEntry


backend_started = jaxlib_api.backend_started


def local_platform() -> str:
    """The platform jax runs on here by default, as ``jax.export`` and manifests name platforms (``cuda``; jax's
    ``default_backend()`` says ``gpu``)."""
    return jax.export.default_export_platform()


def compile_only(device: Any) -> bool:
    """Whether ``device`` compiles for a machine that is not this one (``jax.experimental.topologies``, or a
    ``target.cpu`` baseline): its executables are bytes to load, here or elsewhere."""
    return device is not None and device not in jax.devices(device.platform)


def _backend(platform_name: str):
    return jax.devices(platform_name)[0].client


def serialize(compiled: jax.stages.Compiled, platform: str = "cpu") -> tuple[bytes, ExecutableEntry]:
    """The executable's bytes and what is needed to call it again (its file and profile are the caller's)."""
    executable, unloaded = jaxlib_api.compiled_parts(compiled)
    blob = jaxlib_api.serialize(executable)
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
    backend = _backend(platform_name)
    device = backend.local_devices()[0]
    executable = jaxlib_api.deserialize(backend, blob, device)
    return jaxlib_api.wrap(executable, backend, device, list(zip(entry.input_shapes, entry.input_dtypes)),
                           list(zip(entry.output_shapes, entry.output_dtypes)), set(entry.kept_inputs), name, out_tree)


def compile_shapes(exported: jax.export.Exported, shapes: Sequence[Sequence[int]],
                   options: dict[str, Any] | None = None, donate: Sequence[int] = (), device: Any = None
                   ) -> jax.stages.Compiled:
    """Compile the exported program for one concrete shape per input, with XLA ``options``, for ``device``
    (jax's default where None; a compile-only device compiles for a GPU that is not here); the arguments
    at positions ``donate`` are donated (an output of the same shape and dtype reuses their buffer)."""
    sharding = jaxlib_api.single_device_sharding(device) if device is not None else None
    specs = [jax.ShapeDtypeStruct(tuple(s), a.dtype, sharding=sharding) for s, a in zip(shapes, exported.in_avals)]
    lowered = jax.jit(exported.call, donate_argnums=tuple(donate)).lower(*specs)
    return lowered.compile(compiler_options=options or None)
