"""``BuildRequest``: what to build, validated, in plain Python values (the CLI's config makes one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.spec import NamedDimension
from ..runtime.save import DEFAULT_WEIGHTS


@dataclass(frozen=True)
class BuildRequest:
    """What to build, validated, in plain Python values (``config.validate`` makes one from a Hydra config)."""

    model: dict[str, Any]  # with _target_ and name, and padding if the config overrides the model's
    shapes: dict[str, int | NamedDimension]
    shapes_name: str
    buckets: dict[str, Any]  # dim name -> "pow2[:N]" | "fine[:N]" | "none" | [sizes]; unlisted dims get "pow2"
    max_profiles: int
    platforms: list[str]  # XLA platforms the program is exported for; executables for the build host's
    compiler: str  # xla, or iree (CPU only): which compiler makes the executables
    target_cpu: str  # host | portable | a baseline of compiler/target.CPU_BASELINES
    optimization_level: int
    precision: str  # the compute dtype: float32, bfloat16 or float16
    max_error: float | None  # the error budget against float32, relative to each output's scale
    params_seed: int
    params_checkpoint: str | None
    artifacts_dir: str
    force: bool
    cache_max_bytes: int | None = None  # after building, keep artifacts_dir within this (artifact/store.collect)
    cache_max_age_days: float | None = None
    cache_remote: str | None = None  # an fsspec URL shared by builders (remote.py)
    # a directory where builds in several processes share a model's random init (``init_cache``);
    # a sweep's jobs use their sweep directory's
    shared_init_dir: str | None = None
    params_checkpoint_key: str | None = None  # the params' sub-tree in a checkpoint that saved more
    # task=generate: {"max_length": cache positions, "eos_token_id": "auto" or ids, "sampling" and "beams": "auto"
    # or defaults (the build resolves auto, and adds "pad_token_id": builder/generate.resolved)}; None: the model's
    # forward pass
    generate: dict[str, Any] | None = None
    weights: str = DEFAULT_WEIGHTS  # how the artifact stores the weights prep reads: prepared | raw (runtime/save.py)
    # the GPU cuda executables are for: host (this machine's), or a GPU described in compiler/gpu.py (deviceless)
    target_gpu: str = "host"
    # the settings the user left at their defaults (of ``DERIVABLE``), which the build derives from the model's
    # limits where they would contradict them (a checkpoint's position table, generate.max_length)
    derivable: tuple[str, ...] = ()


DERIVABLE = ("shapes.dims.seq", "generate.max_length")
