"""Every private jax and jaxlib call tripy_build makes to load, run and serialize executables, in one place.

The loaders run executables the way jax does inside, without its tracing: ``tripy_build.runtime`` talks to
jaxlib's C++ module (``jaxlib._jax``) directly, without importing jax, and ``tripy_build.load`` rebuilds jax's
executable wrapper from the manifest instead of unpickling it. Neither is public API: names and signatures
change between jaxlib releases without notice (0.11 dropped ``array_result_handler``'s ``_skip_checks``, which
0.10 needed; 0.12 moved ``ClosedJaxpr`` out of ``jax._src.core``). So each such call is made here and nowhere
else, with the releases it was run on. ``TESTED`` is that list; the package's pins (jax, jaxlib >= 0.11.2,
< 0.13) admit only those series, and ``.ci/run`` runs the suite on 0.12 and a smoke set on 0.11.2.

An executable is native code for the jaxlib that compiled it: the manifest records that version, and a loader
refuses another (``artifact/compat.py``) before any of these calls sees its bytes.

Nothing here imports jax at module level: the jax-free runtime imports this module.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

TESTED = ("0.11.2", "0.12.0.1")  # the jaxlib releases every call below was run with
TESTED_SERIES = ("0.11.", "0.12.")


def single_device_sharding(device: Any) -> Any:
    """jax's sharding of one device. 0.12.1 deprecates the class's constructor (``SingleDeviceSharding(device)``,
    a DeprecationWarning at each call) for ``make_single_device_sharding``, which 0.12.0.1 has too; the constructor
    where the function is missing. Tested: 0.11.2, 0.12.0.1, 0.12.1."""
    import jax

    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)


def jaxlib() -> Any:
    """jaxlib's C++ module. Tested: 0.11.2, 0.12.0.1."""
    from jaxlib import _jax

    return _jax


# --- the jax-free runtime (runtime/pjrt.py) -------------------------------------------------------------------

def cpu_client() -> Any:
    """A synchronous PJRT CPU client: a call runs on the caller's thread. Tested: 0.11.2, 0.12.0.1."""
    return jaxlib().get_tfrt_cpu_client(asynchronous=False)


CUDA_PLUGIN = "tripy_build_cuda"
"""The name the runtime loads jax's CUDA plugin under. Not ``cuda``: a name is registered once per process, and jax
registers ``cuda`` when it starts (it would fail with ALREADY_EXISTS and run on the CPU instead); the same library
under another name is a second, independent client."""

# NVIDIA's pip libraries, loaded before the plugin as jax's plugin package does (its ``_load_nvidia_libraries``), so
# that the plugin's own loads find these copies: (package under ``nvidia``, files), cuda13's and cuda12's. A library
# not installed is skipped (the plugin then looks on the system's library path), as jax does.
NVIDIA_LIBRARIES = (
    ("cu13", ("libcudart.so.13", "libnvrtc.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcupti.so.13",
              "libcusparse.so.12", "libcusolver.so.12", "libcufft.so.12")),
    ("cuda_runtime", ("libcudart.so.12",)), ("cuda_nvrtc", ("libnvrtc.so.12",)),
    ("cublas", ("libcublas.so.12", "libcublasLt.so.12")), ("nccl", ("libnccl.so.2",)),
    ("cuda_cupti", ("libcupti.so.12",)), ("cusparse", ("libcusparse.so.12",)), ("cusolver", ("libcusolver.so.11",)),
    ("cufft", ("libcufft.so.11",)), ("nvshmem", ("libnvshmem_host.so.3",)), ("cudnn", ("libcudnn.so.9",)),
)


def _folders(package: str) -> list[str]:
    """Where an installed package's files are, found without importing it (jax's CUDA plugin package imports jax);
    [] where it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        return []
    return list(spec.submodule_search_locations or []) if spec is not None else []


def cuda_plugin_library() -> str | None:
    """The file of jax's CUDA PJRT plugin installed here (``jax_plugins/xla_cuda13/xla_cuda_plugin.so``, else
    cuda12's); None where none is."""
    import os

    for package in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        for folder in _folders(package):
            path = os.path.join(folder, "xla_cuda_plugin.so")
            if os.path.exists(path):
                return path
    return None


def cuda_client(library: str) -> Any:
    """A PJRT client on this host's NVIDIA GPUs from jax's CUDA plugin ``library``, without jax: the plugin loaded and
    initialized under ``CUDA_PLUGIN``, with the options jax would give it (``xla_client.
    generate_pjrt_gpu_plugin_options``: the ``XLA_PYTHON_CLIENT_*`` variables) but for preallocation, which is off
    unless ``XLA_PYTHON_CLIENT_PREALLOCATE`` asks for it: jax's client, should this process start one (a shape
    no profile covers compiles through it), preallocates 75% of the GPU's memory and would find it taken. Where jax
    has started its own CUDA client in this process, that one is returned: one client per GPU.
    ``load_pjrt_plugin``, ``initialize_pjrt_plugin``, ``get_c_api_client``. Tested (on the CPU, up to the client's
    "No visible GPU devices"): 0.11.2, 0.12.0.1."""
    import ctypes
    import os
    import sys

    started = getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None) or {}
    if "cuda" in started:
        return started["cuda"]
    for package, files in NVIDIA_LIBRARIES:
        for folder in _folders(f"nvidia.{package}"):
            for file in files:
                try:
                    ctypes.cdll.LoadLibrary(os.path.join(folder, "lib", file))
                except OSError:
                    pass
    _jax = jaxlib()
    from jaxlib import xla_client

    if not _jax.pjrt_plugin_loaded(CUDA_PLUGIN):
        _jax.load_pjrt_plugin(CUDA_PLUGIN, library, None)
    if not _jax.pjrt_plugin_initialized(CUDA_PLUGIN):
        _jax.initialize_pjrt_plugin(CUDA_PLUGIN)
    options = dict(xla_client.generate_pjrt_gpu_plugin_options())
    options.setdefault("preallocate", False)
    return _jax.get_c_api_client(CUDA_PLUGIN, options)


class Aval:
    """What jaxlib's C++ reads from an abstract value (jax's ``ShapedArray``) when it places or returns an array."""

    __slots__ = ("shape", "dtype", "weak_type")

    def __init__(self, shape: Sequence[int], dtype: Any):
        self.shape, self.dtype, self.weak_type = tuple(shape), np.dtype(dtype), False


class Device:
    """A client's first device, with the sharding object jaxlib's ``batched_device_put`` and result handlers
    expect (jax's ``SingleDeviceSharding`` plus the two attributes jax's Python subclass adds).
    Tested: 0.11.2, 0.12.0.1."""

    def __init__(self, client: Any) -> None:
        _jax = jaxlib()
        from jaxlib import _hlo

        replicated = _hlo.HloSharding.replicate()

        class Sharding(_jax.SingleDeviceSharding):
            _to_xla_hlo_sharding = staticmethod(lambda num_dimensions: replicated)
            memory_kind = None

        self.client = client
        self.device = client.local_devices()[0]
        self.sharding = Sharding(self.device)
        self.devices = [self.device]
        self.device_list = _jax.DeviceList((self.device,))
        self._put = _jax.batched_device_put
        self._handler = _jax.array_result_handler
        self._zero_copy = _jax.HostBufferSemantics.ZERO_COPY
        self.array_type = _jax.ArrayImpl

    def put(self, array: Any, aval: Aval) -> Any:
        """A C-contiguous numpy array as a device array (on the CPU without a copy where its memory is aligned).
        ``batched_device_put(aval, sharding, xs, devices, committed, force_copy, semantics, enable_x64)``."""
        return self._put(aval, self.sharding, [array], self.devices, True, False, self._zero_copy, False)

    def result_handler(self, aval: Aval) -> Any:
        """What turns a result buffer into an array: ``array_result_handler(aval, sharding, committed)``
        (0.10 also took ``_skip_checks=True``; 0.11 removed it)."""
        return self._handler(aval, self.sharding, True)

    def deserialize(self, blob: bytes) -> Any:
        """An executable from its bytes: ``client.deserialize_executable(blob, device_list, options=None)``."""
        return self.client.deserialize_executable(blob, self.device_list, None)


def execute(loaded: Any, placed: Sequence[Any], handlers: Sequence[Any]) -> list[Any]:
    """Run a deserialized executable on placed arrays: ``execute_sharded(...).consume_with_handlers(...)``.
    Tested: 0.11.2, 0.12.0.1."""
    return loaded.execute_sharded(placed).consume_with_handlers(handlers)


def dlpack_capsule(array: Any) -> Any:
    """A result array as a DLPack capsule (``np.from_dlpack`` views it). Tested: 0.11.2, 0.12.0.1."""
    return jaxlib().buffer_to_dlpack_managed_tensor(array)


def host_copy(array: Any) -> Any:
    """A result array copied to a numpy array by jaxlib (bfloat16 and the float8s, which DLPack has no code for).
    Tested: 0.11.2, 0.12.0.1."""
    return array._single_device_array_to_np_array_did_copy()[0]


# --- what a host's CPU compiles for (host.py) -----------------------------------------------------------------

def compile_probe(client: Any, mlir: str) -> bytes:
    """Compile a StableHLO module on ``client``'s first device and return the executable's bytes.
    ``client.compile_and_load(module, DeviceList)`` and ``client.serialize_executable``. Tested: 0.11.2, 0.12.0.1."""
    _jax = jaxlib()
    exe = client.compile_and_load(mlir, _jax.DeviceList((client.local_devices()[0],)))
    return bytes(client.serialize_executable(exe))


# --- jax's side (runtime/xla.py, runtime/compile_cache.py) -----------------------------------------------------

def backend_started() -> bool:
    """Whether jax has created its backends in this process (after which ``XLA_FLAGS`` are read).
    ``jax._src.xla_bridge._backends``. Tested: 0.11.2, 0.12.0.1."""
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def compiled_parts(compiled: Any) -> tuple[Any, Any]:
    """``(xla_executable, unloaded)`` of a ``jax.stages.Compiled``: XLA's executable (loaded, or compile-only for a
    device that is not here) and jax's ``UnloadedMeshExecutable`` (its avals and the inputs XLA kept).
    ``compiled._executable._unloaded_executable``. Tested: 0.11.2, 0.12.0.1."""
    unloaded = compiled._executable._unloaded_executable
    return unloaded.xla_executable, unloaded


def serialize(executable: Any) -> bytes:
    """An XLA executable's bytes (``compiled_parts``' first), by its own ``serialize()``: a compile-only client (a
    GPU compiled for without one) holds an unloaded executable, which ``backend.serialize_executable`` refuses
    (TypeError); both give the same bytes for a loaded one. Tested: 0.11.2, 0.12.0.1."""
    return bytes(executable.serialize())


def wrap(executable: Any, backend: Any, device: Any, inputs: Sequence[tuple[Sequence[int], str]],
         outputs: Sequence[tuple[Sequence[int], str]], kept: set[int], name: str, out_tree: Any) -> Any:
    """A deserialized executable as a ``jax.stages.Compiled`` (jax's C++ fast call path), as jax's own
    ``UnloadedMeshExecutable`` would make it for one device; ``inputs`` and ``outputs``: (shape, dtype) of each.
    Tested: 0.11.2, 0.12.0.1."""
    from jax._src import core, stages
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc

    in_avals = [core.ShapedArray(tuple(s), np.dtype(d)) for s, d in inputs]
    out_avals = [core.ShapedArray(tuple(s), np.dtype(d)) for s, d in outputs]
    devices = xc.DeviceList((device,))
    sharding = single_device_sharding(device)
    n_in, n_out = len(in_avals), len(out_avals)
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=executable, device_list=devices, backend=backend,
        input_avals=list(in_avals), input_shardings=[sharding] * n_in,
        output_avals=list(out_avals), output_shardings=[sharding] * n_out,
        committed=True, name=name, unordered_effects=[], ordered_effects=[], keepalive=[],
        host_callbacks=[], kept_var_idx=set(kept), mut=None,
        xla_in_layouts=[None] * n_in, dispatch_in_layouts=[None] * n_in, xla_out_layouts=[None] * n_out,
        all_args_info=None, pgle_profiler=None,
    )
    args_info = (tuple(stages.ArgInfo(a, False) for a in in_avals), {})
    return stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=True)


def cpu_compile_device(cpu: str, features: str) -> Any:
    """A compile-only CPU device that compiles for LLVM's ``cpu`` with exactly ``features`` (``"+avx2,+fma,..."``),
    whatever this host is. jaxlib exposes no constructor for it: the host's CPU topology
    (``_jax.get_topology_for_devices``) is serialized, its ``TargetMachineOptionsProto`` (``CpuTopologyProto``
    field 5: triple 1, cpu 2, features 3) given the target's CPU and features, and deserialized
    (``DeviceTopology.deserialize``, ``_make_compile_only_devices``). XLA's CPU compiler compiles for a
    compile-only device's target machine instead of the host's. Tested: 0.11.2, 0.12.0.1."""
    import jax

    topology = jaxlib().get_topology_for_devices(jax.devices("cpu")[:1])

    def edit(fields: list[tuple[int, int, Any]], number: int, change: Any) -> list[tuple[int, int, Any]]:
        return [(f, w, change(v) if f == number else v) for f, w, v in fields]

    def machine(blob: bytes) -> bytes:
        kept = [(f, w, v) for f, w, v in _wire_fields(blob) if f not in (2, 3)]
        return _wire_bytes([*kept, (2, 2, cpu.encode()), (3, 2, features.encode())])

    def topology_any(blob: bytes) -> bytes:  # google.protobuf.Any: type_url 1, value 2
        return _wire_bytes(edit(_wire_fields(blob), 2, lambda v: _wire_bytes(edit(_wire_fields(v), 5, machine))))

    blob = _wire_bytes(edit(_wire_fields(topology.serialize()), 9, topology_any))
    return jaxlib().DeviceTopology.deserialize(blob)._make_compile_only_devices()[0]


def _wire_fields(blob: bytes) -> list[tuple[int, int, Any]]:
    """A protobuf message's fields as (number, wire type, value): varints and length-delimited bytes only."""
    fields, i = [], 0
    while i < len(blob):
        key, i = _varint(blob, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(blob, i)
        elif wire == 2:
            n, i = _varint(blob, i)
            value, i = blob[i:i + n], i + n
        else:
            raise ValueError(f"protobuf wire type {wire} in jaxlib's CPU topology: this jaxlib is not one of {TESTED}")
        fields.append((number, wire, value))
    return fields


def _wire_bytes(fields: Sequence[tuple[int, int, Any]]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint_bytes(number << 3 | wire)
        out += _varint_bytes(value) if wire == 0 else _varint_bytes(len(value)) + bytes(value)
    return bytes(out)


def _varint(blob: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = blob[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def deserialize(backend: Any, blob: bytes, device: Any) -> Any:
    """``backend.deserialize_executable(blob, executable_devices=DeviceList)``. Tested: 0.11.2, 0.12.0.1."""
    from jax._src.lib import xla_client as xc

    return backend.deserialize_executable(blob, executable_devices=xc.DeviceList((device,)))


def lru_cache(path: str, max_size: int) -> Any:
    """jax's size-bounded file cache (``jax._src.lru_cache.LRUCache``: get/put by key, least recently used
    evicted). Tested: 0.11.2, 0.12.0.1."""
    from jax._src.lru_cache import LRUCache

    return LRUCache(path, max_size=max_size)
