"""One inference request's input, whichever protocol carried it, and the one order it is checked in.

HTTP (JSON, or binary tensors after the JSON header) and gRPC (typed contents, or raw bytes) encode a tensor's
values differently; everything else about an input is the same: its name, datatype and shape as the client gave
them. Each protocol translates an input into an ``InputTensor`` whose ``values`` reads its encoding, and
``check`` judges it against the model's declaration in one order for both (shape well formed, datatype, rank,
then the values): a request wrong in several ways gets the same first error over either protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.signature import declared, narrowed
from ..errors import CallError
from .codec import datatype, quote, wire_dtype


@dataclass(frozen=True)
class InputTensor:
    """One input as a client sent it, its encoding aside."""

    name: str
    datatype: Any  # as given: a v2 datatype name ("FP32"), checked against the declaration
    shape: Any  # as given: a list of sizes, checked
    # (dtype to read as, element count, its v2 datatype) -> the values, flat; reads the protocol's encoding and
    # refuses (CallError) what is wrong with it (a size that disagrees, a value that is no number of the type)
    values: Callable[[np.dtype, int, str], np.ndarray]
    refusal: str | None = None  # what the protocol asked for that is not served (Triton's shared memory)
    # BYTES: the elements as the protocol carries them (JSON strings, or binary: ``codec.length_prefixed``)
    strings: Callable[[], list[Any]] | None = None


def check(tensor: InputTensor, info: Any) -> np.ndarray:
    """The input as an array of its declared dtype (an int32 input sent as INT64: narrowed where it fits), after
    its shape, datatype and rank; the dims' ranges and values are checked with the whole call."""
    name, shape = tensor.name, tensor.shape
    dtype = wire_dtype(tensor.datatype, info)
    want = datatype(dtype)
    rank = len(info.shape_bounds.max)
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise CallError(f"input {name!r}: \"shape\" must be a list of non-negative integers, got {quote(shape)}.")
    if tensor.datatype != want:
        why = " (strings: a tripy_build model takes numeric tensors only)" if tensor.datatype == "BYTES" else ""
        raise CallError(f"input {name!r}: datatype {quote(tensor.datatype)} given{why}, but it is {want} "
                        f"(declared as {declared(info, want)}); send it as {want}"
                        + (" (or INT64, whose values are then checked to fit)." if want == "INT32" else "."))
    if len(shape) != rank:
        raise CallError(f"input {name!r}: shape {quote(shape)} has {len(shape)} dims, but the input has {rank} "
                        f"(declared as {declared(info, want)}).")
    if tensor.refusal:
        raise CallError(f"input {name!r}: {tensor.refusal}")
    count = math.prod(shape)  # Python's integers: a dim of 10**30 must not wrap around as numpy's would
    return narrowed(tensor.values(dtype, count, want).reshape(shape), name, info)
