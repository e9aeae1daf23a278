"""KServe v2 tensors: datatypes, and shapes and ranges as the protocol's metadata gives them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CallError


# KServe v2 datatypes <-> numpy dtype names (BYTES, strings, has no tensor here).
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BF16": "bfloat16"}
_BY_DTYPE = {v: k for k, v in DATATYPES.items()}


def datatype(dtype: Any) -> str:
    """The v2 datatype of a numpy dtype (its upper-cased name where v2 has none, e.g. ``FLOAT8_E4M3FN``)."""
    name = np.dtype(dtype).name
    return _BY_DTYPE.get(name, name.upper())


def wire_dtype(given: Any, info: Any) -> np.dtype:
    """The dtype a request's tensor is read as: the input's own, or int64 where INT64 is sent for an INT32 input
    (token ids as tokenizers give them), narrowed to int32 after reading where every value fits
    (``core.signature.narrowed``)."""
    if given == "INT64" and info.dtype == np.int32:
        return np.dtype(np.int64)
    return info.dtype


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


def quote(value: Any) -> str:
    """A client's value in an error message: its repr, cut to 100 characters (a value can be huge)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 100 else text[:97] + "..."


def from_json_data(name: str, data: Any, dtype: Any) -> np.ndarray:
    """An input's JSON ``"data"`` (flat or nested lists) as an array of ``dtype``, refusing what JSON data
    must not carry: ``null``, strings, ``true`` for a number, a fraction for an integer, and values outside
    the datatype's range (numpy would turn them into NaN, parse them, or wrap them around silently)."""
    dtype = np.dtype(dtype)
    want = datatype(dtype)
    if not isinstance(data, list):
        raise CallError(f'input {name!r}: "data" must be a list of {want} values, got {type(data).__name__}.')
    try:
        raw = np.asarray(data)
    except ValueError:
        raise CallError(f'input {name!r}: "data" must be a flat list, or lists nested as its shape with every '
                        "row the same length; its rows differ in length.") from None
    if raw.size == 0:
        return np.zeros(raw.shape, dtype)
    kind = raw.dtype.kind
    numeric = dtype.kind in "fc" or dtype.name == "bfloat16" or dtype.kind == "V"
    accepted = "b" if dtype.kind == "b" else "iu" if dtype.kind in "iu" else "iuf"
    if kind not in accepted:
        raise CallError(f"input {name!r}: {want} data must be "
                        f"{'true/false' if dtype.kind == 'b' else 'integers' if dtype.kind in 'iu' else 'numbers'}, "
                        f"but it holds {_first_unlike(raw.ravel(), accepted)}.")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = raw.min(), raw.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise CallError(f"input {name!r}: {bad} is outside {want}'s range [{info.min}, {info.max}].")
    with np.errstate(over="ignore", invalid="ignore"):
        out = raw.astype(dtype)
    if numeric and not np.isfinite(out.astype(np.float32) if dtype.kind == "V" else out).all():
        flat = raw.ravel()
        bad = float(flat[~np.isfinite(out.ravel().astype(np.float64))][0])
        raise CallError(f"input {name!r}: {bad!r} is outside {want}'s range.")
    return out


def length_prefixed(data: bytes | memoryview, name: str) -> list[bytes]:
    """A BYTES tensor's elements from their binary form (Triton's: each a 4-byte little-endian length, then its
    bytes), as HTTP's binary data and gRPC's raw_input_contents carry them."""
    out, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise CallError(f"input {name!r}: its BYTES data ends inside an element's 4-byte length.")
        n = int.from_bytes(data[at:at + 4], "little")
        if at + 4 + n > len(data):
            raise CallError(f"input {name!r}: a BYTES element of {n} bytes runs past the data's end.")
        out.append(bytes(data[at + 4:at + 4 + n]))
        at += 4 + n
    return out


def _first_unlike(flat: np.ndarray, kinds: str) -> str:
    """The first element of ``flat`` whose kind is not among ``kinds``, said for an error message."""
    for i, v in enumerate(flat.tolist()):
        if v is None:
            what = "null"
        elif isinstance(v, bool):
            what = None if "b" in kinds else str(v).lower()
        elif isinstance(v, int):
            text = str(v) if v.bit_length() <= 64 else f"of {v.bit_length()} bits"
            what = (f"an integer {text}, beyond 64 bits" if not -(1 << 63) <= v < (1 << 64)
                    else None if "i" in kinds else f"the integer {text}")
        elif isinstance(v, float):
            what = None if "f" in kinds else repr(v)
        else:
            what = f"{type(v).__name__} {str(v)[:30]!r}"
        if what is not None:
            return f"{what} at position {i}"
    return f"values of numpy kind {flat.dtype.kind!r}"


def to_json_data(array: np.ndarray) -> Any:
    """An output's values for a JSON ``"data"`` list: the flat array as it is (serialized without a copy),
    or, where a float is NaN or infinite (which JSON has no number for), a list with the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` in their place, as protobuf's JSON mapping writes them."""
    flat = np.ascontiguousarray(array).ravel()
    if flat.dtype.kind == "V" or flat.dtype.name == "bfloat16" or flat.dtype == np.float16:
        flat = flat.astype(np.float32)
    if flat.dtype.kind != "f" or np.isfinite(flat).all():
        return flat
    return [v if np.isfinite(v) else "NaN" if v != v else "Infinity" if v > 0 else "-Infinity" for v in flat.tolist()]
