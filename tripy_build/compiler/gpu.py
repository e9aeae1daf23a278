"""``target.gpu``: the NVIDIA GPU a build's CUDA executables are for, whether or not it is on the build machine.

XLA compiles for a GPU from a description of it (its ``GpuTargetConfigProto``): the compute capability it
generates code for, and the SM count, memory sizes, bandwidth and clock its fusion, tiling and scheduling
heuristics weigh. With the GPU present, jax's CUDA backend reads that from the device, and XLA also times
candidate kernels on it (autotuning). Without it, jax's CUDA plugin makes a compile-only device from a
description (``jax.experimental.topologies``): nothing runs, nothing is timed, kernels are picked by XLA's
heuristics, and the code is native to that GPU model (``sm_90a`` for an H100) and no other. That needs only
the plugin (``jax-cuda13-plugin``), not a driver, CUDA libraries or ``ptxas``.

The descriptions below are written from NVIDIA's published specifications of each board (SMs, memory, L2,
bandwidth, boost clock) and CUDA's per-compute-capability limits (threads, shared memory and registers per
SM). ``name`` is the CUDA device name, which is what a loader compares with the GPU it finds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..host import plugin_version, version

HOST = "host"  # target.gpu's default: the build machine's own GPU, compiled for on the device (autotuned)


@dataclass(frozen=True)
class GpuSpec:
    """One NVIDIA GPU model, as XLA's compiler needs to know it."""

    key: str  # target.gpu's value
    name: str  # the CUDA device name (cudaDeviceProp.name; jax's ``device_kind``)
    compute_capability: tuple[int, int]
    accelerated: bool  # the architecture-specific features (sm_90a, sm_100a: wgmma, TMA multicast) may be used
    sms: int  # streaming multiprocessors
    fp32_per_sm: int  # FP32 lanes per SM
    threads_per_sm: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes a block may ask for beyond the default 48 KiB
    l2_bytes: int
    memory_bytes: int
    bandwidth: float  # device memory, bytes/s
    clock_ghz: float  # boost clock

    @property
    def sm(self) -> str:
        """The code target: ``sm_90a``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}{'a' if self.accelerated else ''}"

    @property
    def capability(self) -> str:
        """``9.0``: as jax's device reports it (``compute_capability``)."""
        return "{}.{}".format(*self.compute_capability)

    def target_config(self) -> str:
        """The description as XLA reads it: a ``stream_executor.GpuTargetConfigProto`` in protobuf text format."""
        major, minor = self.compute_capability
        extension = "\n    feature_extension: ACCELERATED_FEATURES" if self.accelerated else ""
        fields = {
            "threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 * 1024,
            "shared_memory_per_core": self.shared_memory_per_sm, "threads_per_core_limit": self.threads_per_sm,
            "core_count": self.sms, "fpus_per_core": self.fp32_per_sm, "block_dim_limit_x": 2**31 - 1,
            "block_dim_limit_y": 65535, "block_dim_limit_z": 65535, "memory_bandwidth": int(self.bandwidth),
            "l2_cache_size": self.l2_bytes, "clock_rate_ghz": self.clock_ghz, "device_memory_size": self.memory_bytes,
            "shared_memory_per_block_optin": self.shared_memory_per_block_optin,
            "registers_per_core_limit": 65536, "registers_per_block_limit": 65536,
            "thread_dim_limit_x": 1024, "thread_dim_limit_y": 1024, "thread_dim_limit_z": 64,
        }
        lines = [f"  {k}: {v}" for k, v in fields.items()]
        lines.append(f"  cuda_compute_capability {{\n    major: {major}\n    minor: {minor}{extension}\n  }}")
        lines += ['  device_vendor: "NVIDIA Corporation"', f'  name: "{self.name}"']
        return ("gpu_device_info {\n" + "\n".join(lines) + "\n}\n"
                f'platform_name: "CUDA"\ndevice_description_str: "{self.name}"\n')


GiB, MiB = 2**30, 2**20
# Hopper and Blackwell datacenter parts: 2048 threads, 228 KiB of shared memory per SM (227 to one block);
# Ampere A100: 2048 threads, 164 KiB (163); Ada and GA10x: 1536 threads, 100 KiB (99).
_HOPPER = dict(fp32_per_sm=128, threads_per_sm=2048, shared_memory_per_sm=228 * 1024,
               shared_memory_per_block_optin=227 * 1024)
_A100 = dict(compute_capability=(8, 0), accelerated=False, sms=108, fp32_per_sm=64, threads_per_sm=2048,
             shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024, l2_bytes=40 * MiB,
             clock_ghz=1.41)
_ADA = dict(fp32_per_sm=128, threads_per_sm=1536, shared_memory_per_sm=100 * 1024,
            shared_memory_per_block_optin=99 * 1024)

GPUS: dict[str, GpuSpec] = {s.key: s for s in (
    GpuSpec("h100", "NVIDIA H100 80GB HBM3", (9, 0), True, sms=132, l2_bytes=50 * MiB, memory_bytes=80 * GiB,
            bandwidth=3.35e12, clock_ghz=1.98, **_HOPPER),
    GpuSpec("h100_pcie", "NVIDIA H100 PCIe", (9, 0), True, sms=114, l2_bytes=50 * MiB, memory_bytes=80 * GiB,
            bandwidth=2.0e12, clock_ghz=1.755, **_HOPPER),
    GpuSpec("h200", "NVIDIA H200", (9, 0), True, sms=132, l2_bytes=50 * MiB, memory_bytes=141 * GiB,
            bandwidth=4.8e12, clock_ghz=1.98, **_HOPPER),
    GpuSpec("b200", "NVIDIA B200", (10, 0), True, sms=148, l2_bytes=126 * MiB, memory_bytes=180 * GiB,
            bandwidth=8.0e12, clock_ghz=1.965, **_HOPPER),
    GpuSpec("a100", "NVIDIA A100-SXM4-80GB", memory_bytes=80 * GiB, bandwidth=2.039e12, **_A100),
    GpuSpec("a100_40", "NVIDIA A100-SXM4-40GB", memory_bytes=40 * GiB, bandwidth=1.555e12, **_A100),
    GpuSpec("l4", "NVIDIA L4", (8, 9), False, sms=58, l2_bytes=48 * MiB, memory_bytes=24 * GiB, bandwidth=300e9,
            clock_ghz=2.04, **_ADA),
    GpuSpec("a10g", "NVIDIA A10G", (8, 6), False, sms=80, l2_bytes=6 * MiB, memory_bytes=24 * GiB, bandwidth=600e9,
            clock_ghz=1.71, **_ADA),
)}


def names() -> list[str]:
    """What ``target.gpu`` accepts: ``host`` and every GPU described here."""
    return [HOST, *GPUS]


def spec(target: str) -> GpuSpec | None:
    """The description ``target.gpu=target`` names (None for ``host``); a one-line error for any other name."""
    if target == HOST:
        return None
    found = GPUS.get(str(target).lower())
    if found is None:
        import difflib

        close = difflib.get_close_matches(str(target).lower(), names(), n=1)
        raise ConfigError(f"target.gpu: {target!r} is not a GPU tripy_build can compile for; use "
                          f"{', '.join(names())}" + (f". Did you mean {close[0]!r}?" if close else "."))
    return found


def compile_device(target: GpuSpec) -> Any:
    """A compile-only jax device for ``target`` (jax's CUDA plugin, no GPU needed)."""
    plugin = plugin_version()
    if plugin is None or plugin.split()[-1] != version("jaxlib"):
        found = f"{plugin} does not match jaxlib {version('jaxlib')}" if plugin else "jax's CUDA plugin is not installed"
        raise ConfigError(
            f"target.gpu={target.key}: compiling for the {target.name} without it needs jax's CUDA plugin of this jaxlib's "
            f"version, and {found}: pip install 'jax-cuda13-plugin=={version('jaxlib')}' (or '.[cuda-deviceless]').")
    return _topology_device(target)


@functools.lru_cache(maxsize=None)
def _topology_device(target: GpuSpec) -> Any:
    """The device, made once per process (each entry of a multi-entry build asks for it)."""
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=target.target_config(),
                                                topology="1x1x1")
    except (NotImplementedError, RuntimeError, ValueError) as e:
        raise ConfigError(
            f"target.gpu={target.key}: jax's CUDA plugin cannot make a compile-only {target.name} here ({e}). "
            "Install it: pip install -e '.[cuda13]' (or only jax-cuda13-plugin, matching jax's version, "
            "on a machine without a GPU).") from None
    return topology.devices[0]


def record(device: Any, described: GpuSpec | None = None) -> dict[str, Any]:
    """What a CUDA executable compiled for ``device`` asks of a host (its manifest entry's ``depends_on``): the jax,
    jaxlib and CUDA plugin that compiled it, and the GPU. ``described``: the spec a compile-only device was made
    from (``deviceless``; what that leaves undone is ``not_done``)."""
    capability = getattr(device, "compute_capability", None) or (described.capability if described else None)
    return {
        "jax": version("jax"), "jaxlib": version("jaxlib"), "cuda_plugin": plugin_version(),
        "gpu": device.device_kind, "compute_capability": str(capability),
        "gpu_target": described.key if described is not None else HOST, "deviceless": described is not None,
        **({"code": described.sm, "not_done": list(NOT_DONE)} if described is not None else {}),
    }


# What a build for a GPU that is not there leaves undone (recorded with each such executable, and said by the build)
NOT_DONE = ("autotuning: XLA picked the kernels by its heuristics, not by timing them on the GPU",
            "the self-test on the GPU: it runs at the artifact's first load there (tripy_build.load), or by verify")
