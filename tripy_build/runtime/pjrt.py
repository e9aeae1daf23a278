"""jaxlib's PJRT clients as the jax-free runtime (``runtime/runtime.py``) uses them, without the ``jax`` package.

jaxlib's C++ module (``jaxlib._jax``, the C++ half of jax) imports in ~0.2 s with numpy, against ~0.5 s for
``import jax``. Through it: one process-wide client per platform (``client``: the CPU's, or an NVIDIA GPU's from
jax's CUDA plugin, loaded without its Python package), its device placing host arrays (``Device``), executables
deserialized from an artifact's bytes with their argument avals and result handlers (``Compiled``), and result
buffers read back as numpy arrays (``Device.to_host``: on the CPU a read-only view through DLPack, or jaxlib's own
copy for the dtypes DLPack has no code for; from a GPU, jaxlib's copy).

The CPU client is synchronous: a call runs on the caller's thread (XLA's own workers still split big kernels)
instead of being handed to a pool thread and waited for, which cost ~50 us per call, a third of a batch-1
GEGLU call. XLA releases the GIL while it runs.

The jaxlib internals these call are in ``jaxlib_api``, with the releases they were tested on; on another
jaxlib ``client`` raises.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

import numpy as np

from .. import host, jaxlib_api
from ..artifact.manifest import ExecutableEntry
from ..core.spec import to_dtype
from ..errors import ArtifactError

_clients: dict[str, Any] = {}
_client_lock = threading.Lock()


def client(platform: str = "cpu") -> Any:
    """The process-wide PJRT client of ``platform`` (created on first use, once: it starts thread pools, and a
    GPU's takes its memory). ``ArtifactError`` where it cannot be made here, saying why and what to do."""
    if not host.tested_jax():
        raise ArtifactError(
            f"tripy_build.runtime drives jaxlib's PJRT client directly and was tested with jaxlib "
            f"{', '.join(jaxlib_api.TESTED)}; this is {host.version('jaxlib')}. Use tripy_build.load instead."
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as ``import jax`` does: no INFO lines from C++
    with _client_lock:
        if platform not in _clients:
            _clients[platform] = jaxlib_api.cpu_client() if platform == "cpu" else _cuda_client()
    return _clients[platform]


def _cuda_client() -> Any:
    """The GPU's client, from jax's CUDA plugin of this jaxlib's version (an executable runs only in the XLA that
    compiled it, and the plugin is that XLA's GPU half)."""
    jaxlib = host.version("jaxlib")
    plugin = host.plugin_version()
    library = jaxlib_api.cuda_plugin_library()
    if plugin is None or library is None or plugin.split()[-1] != jaxlib:
        found = f"{plugin} does not match jaxlib {jaxlib}" if plugin and library else "jax's CUDA plugin is not installed"
        raise ArtifactError(f"tripy_build.runtime runs a GPU's executables through jax's CUDA plugin of this jaxlib's "
                            f"version, and {found}: pip install -e '.[cuda13]' (jax[cuda13]=={host.version('jax')}).")
    try:
        return jaxlib_api.cuda_client(library)
    except Exception as e:  # noqa: BLE001 - CUDA's and the plugin's own errors (no GPU visible, no driver)
        message = " ".join(str(e).split())[:300].rstrip(".")
        raise ArtifactError(f"tripy_build.runtime cannot start jax's CUDA plugin ({library}) on this machine: "
                            f"{type(e).__name__}: {message}. Check the GPU is visible here (nvidia-smi, "
                            f"CUDA_VISIBLE_DEVICES), or load the artifact with tripy_build.load.") from None


class DLPack:
    """Lets ``np.from_dlpack`` view a result buffer (it waits until the buffer is ready)."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: Any):
        self.buffer = buffer

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        return jaxlib_api.dlpack_capsule(self.buffer)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0


class Device(jaxlib_api.Device):
    """The first device of ``platform``'s client, placing host arrays (a jaxlib array, one of this client's outputs,
    as it is) and reading its results back (``to_host``)."""

    def __init__(self, platform: str = "cpu") -> None:
        super().__init__(client(platform))
        self.to_host = _view if platform == "cpu" else jaxlib_api.host_copy

    def put(self, value: Any, aval: jaxlib_api.Aval) -> Any:
        if type(value) is self.array_type:
            return value
        return super().put(np.ascontiguousarray(value), aval)


def _view(buffer: Any) -> np.ndarray:
    """A CPU result buffer as a numpy array: a read-only view through DLPack, or, for dtypes DLPack has no code for
    (bfloat16, the float8s), jaxlib's own copy."""
    try:
        return np.from_dlpack(DLPack(buffer))
    except (RuntimeError, BufferError):  # numpy < 2.5 raised RuntimeError, 2.5 BufferError
        return jaxlib_api.host_copy(buffer)


class Compiled:
    """One deserialized executable: its argument avals (only those XLA kept) and output handlers.

    ``where`` names the executable's file in errors: bytes that are not an executable raise ``ArtifactError``."""

    def __init__(self, device: Device, blob: bytes, entry: ExecutableEntry, where: str):
        t0 = time.perf_counter()
        try:
            self.loaded = device.deserialize(blob)
        except Exception as e:  # noqa: BLE001 - XLA's own errors for a blob that is not an executable
            raise ArtifactError(f"{where}: cannot deserialize the executable ({type(e).__name__}: {str(e)[:200]}).") from None
        self.seconds = time.perf_counter() - t0  # deserializing it: part of what its first call would cost
        self.device = device
        self.kept = list(entry.kept_inputs)
        avals = [jaxlib_api.Aval(s, to_dtype(d)) for s, d in zip(entry.input_shapes, entry.input_dtypes)]
        self.avals = [avals[i] for i in self.kept]
        self.handlers = [device.result_handler(jaxlib_api.Aval(s, to_dtype(d)))
                         for s, d in zip(entry.output_shapes, entry.output_dtypes)]

    def device_outputs(self, args: Sequence[Any]) -> list[Any]:
        """Run on every program input (host arrays or this client's arrays; those XLA dropped are not placed):
        the outputs as device arrays."""
        put = self.device.put
        placed = [put(args[i], aval) for i, aval in zip(self.kept, self.avals)]
        return jaxlib_api.execute(self.loaded, placed, self.handlers)

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        to_host = self.device.to_host
        return [to_host(o) for o in self.device_outputs(args)]
