"""KServe v2 tensors: datatypes, and shapes and ranges as the protocol's metadata gives them."""

from __future__ import annotations

from typing import Any

import numpy as np


# KServe v2 datatypes <-> numpy dtype names (BYTES, strings, has no tensor here).
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BF16": "bfloat16"}
_BY_DTYPE = {v: k for k, v in DATATYPES.items()}


def datatype(dtype: Any) -> str:
    """The v2 datatype of a numpy dtype (its upper-cased name where v2 has none, e.g. ``FLOAT8_E4M3FN``)."""
    name = np.dtype(dtype).name
    return _BY_DTYPE.get(name, name.upper())


def metadata_shape(info: Any) -> list[int]:
    """An input's shape as v2 metadata gives it: ``-1`` for an axis whose size varies."""
    return [lo if lo == hi else -1 for lo, hi in zip(info.shape_bounds.min, info.shape_bounds.max)]


def ranges(info: Any) -> list[Any]:
    """Each axis's size, or its range (and its dim's name) where it varies: what ``-1`` in the shape stands for."""
    out = []
    for i, (lo, hi) in enumerate(zip(info.shape_bounds.min, info.shape_bounds.max)):
        name = info.dimension_names.get(i)
        out.append(lo if lo == hi else {"name": name, "min": lo, "max": hi} if name else {"min": lo, "max": hi})
    return out
