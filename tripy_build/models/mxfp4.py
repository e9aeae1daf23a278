"""MXFP4 tensors, as gpt-oss is published (the Open Compute Project's microscaling 4-bit float format).

A tensor ``[..., out, in]`` is stored as two: ``NAME_blocks`` (uint8 ``[..., out, in / 32, 16]``: each group of 32
values along ``in`` packed two to a byte, the first of each pair in the low nibble, each an FP4 E2M1 code) and
``NAME_scales`` (uint8 ``[..., out, in / 32]``: each group's power of two, biased by 127). A value is
``E2M1[code] * 2 ** (scale - 127)``: a 4-bit float times a power of two, which float32 and bfloat16 both hold exactly.
As transformers dequantizes gpt-oss's experts (``convert_moe_packed_tensors``), the result is returned with its last
two axes swapped, ``[..., in, out]``: the layout of the unquantized checkpoint's tensor of the same name.
"""

from __future__ import annotations

import numpy as np

# The sixteen FP4 (E2M1) values by code: sign bit, two exponent bits, one mantissa bit.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
GROUP = 32  # values per scale
BLOCKS, SCALES = "_blocks", "_scales"  # the two tensors' name suffixes


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 ``[..., in, out]`` from ``blocks: [..., out, groups, 16]`` and ``scales: [..., out, groups]``
    (uint8 both; see the module's docstring)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], GROUP)
    values = E2M1[codes] * np.exp2(scales.astype(np.int32) - 127).astype(np.float32)[..., None]
    return np.swapaxes(values.reshape(*blocks.shape[:-2], -1), -1, -2)


def shape(blocks_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dequantized tensor's shape, ``[..., in, out]``, from its blocks' ``[..., out, groups, 16]``."""
    *lead, out, groups, _ = blocks_shape
    return (*lead, groups * GROUP, out)
