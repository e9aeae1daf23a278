"""``optimization_level`` 0..5 -> the XLA compiler options each platform gets.

Measured on this project's 2-core x86 CPU host (``bench/opt_levels.py``): of the XLA CPU options that
can be set per compile, only the LLVM backend level moves the generated code's speed.
``exec_time_optimization_effort``, ``memory_fitting_effort``, ``xla_llvm_disable_expensive_passes``
and fast math changed nothing beyond noise for the zoo models (fast math also changes numerics), and
disabling XNNPACK made them 2-5x slower. One library choice does act, at every level: XLA hands
convolutions to YNNPACK by default, and its convolution kernels ran ResNet-50 at 69 / 572 ms (batch 1 / 8)
against 52 / 420 ms with XLA's own convolutions (ViT's patch embedding: 1.76 -> 1.36 ms at batch 1),
so every CPU level sets YNNPACK's fusions to dots only (``_CPU_LIBRARIES``; dots stay with YNNPACK, where
they are fastest). So on the CPU:

- 0: LLVM -O0: the transformer block compiles ~40% faster and runs ~3x slower;
- 1, 2: LLVM -O1, -O2: within noise of level 3 here;
- 3: XLA's defaults (LLVM -O3) but for the convolutions; the default;
- 4, 5: the same as 3: no CPU knob measured here buys more run-time speed for more build time.

Re-measured on jax 0.12.0.1 (``bench/xla_cpu_options.py``, BERT-base at 1x128 / 8x128 on a 2-core AMD EPYC VM):
XLA's default library list ran 1.02x / 1.03x faster than dots only (on BERT, which has no convolution; kept for
ResNet's), YNNPACK's dot fusions 0.93x / 0.98x, dots + elementwise 0.68x / 0.71x; oneDNN's or XNNPACK's dots in
place of YNNPACK's 0.77x / 0.95-0.98x, the same as XLA's own dots (this wheel's oneDNN fusion did nothing
measurable). Nothing moved it enough to adopt.

On CUDA the low levels also turn autotuning down (``xla_gpu_autotune_level`` 0..2; XLA's default, 4,
is the most thorough) and level 5 asks for more optimization effort; that mapping is untested here:
no GPU was available to measure it.
The resolved options enter the build key and the manifest, and run-time compiles use them too.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError

LEVELS = range(0, 6)
DEFAULT_LEVEL = 3

# Which ops XLA's CPU backend gives YNNPACK (a repeated enum in DebugOptions; one value replaces XLA's list).
_CPU_LIBRARIES = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
_CPU = {0: {**_CPU_LIBRARIES, "xla_backend_optimization_level": 0},
        1: {**_CPU_LIBRARIES, "xla_backend_optimization_level": 1},
        2: {**_CPU_LIBRARIES, "xla_backend_optimization_level": 2},
        3: _CPU_LIBRARIES, 4: _CPU_LIBRARIES, 5: _CPU_LIBRARIES}
_CUDA = {0: {"xla_backend_optimization_level": 0, "xla_gpu_autotune_level": 0},
         1: {"xla_backend_optimization_level": 1, "xla_gpu_autotune_level": 1},
         2: {"xla_backend_optimization_level": 2, "xla_gpu_autotune_level": 2},
         3: {}, 4: {}, 5: {"exec_time_optimization_effort": 1.0}}
_BY_PLATFORM = {"cpu": _CPU, "cuda": _CUDA, "rocm": _CUDA}


def check_level(level: Any) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS:
        raise SpecError(
            f"optimization_level: must be an integer in 0..5, got {level!r}. Higher levels may compile "
            f"longer for faster code; {DEFAULT_LEVEL} is the default (see tripy_build/compiler/optimization.py)."
        )
    return level


def compiler_options(level: int, platform: str) -> dict[str, Any]:
    """The XLA options ``optimization_level`` resolves to on ``platform`` (a copy: callers may keep it)."""
    return dict(_BY_PLATFORM.get(platform, _CPU)[check_level(level)])
