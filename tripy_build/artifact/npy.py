"""Arrays in an artifact: ``.npy`` bytes, never pickled, with the dtypes numpy lacks (bfloat16, fp8) viewed back."""

from __future__ import annotations

import io
import math
import re
import threading
import tokenize
from typing import Any

import numpy as np

from ..core.spec import to_dtype
from ..errors import ArtifactError
from .digest import digest_parts


def npy(array: Any) -> bytes:
    """``.npy`` bytes of ``array``, its shape kept (a scalar stays 0-d: ``np.ascontiguousarray`` would make it 1-d)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array, order="C"), allow_pickle=False)
    return buf.getvalue()


class NpyFile:
    """An array's ``.npy`` file as the parts it is written from (``parts``: the header, then the array's own
    bytes, not copied), for ``artifact.write`` to take where it takes bytes: saving BERT-base held its 418 MB of
    weights twice, as arrays and as file bytes. The same bytes as ``npy``."""

    def __init__(self, array: Any):
        self.source = array  # a device array becomes a host one only while it is written
        self._digest: str | None = None

    def parts(self) -> list[Any]:
        array = np.asarray(self.source, order="C")
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
        return [header.getvalue(), memoryview(array.reshape(-1).view(np.uint8))]

    def digest(self, parts: list[Any] | None = None) -> str:
        """The file's digest (``digest.ALGORITHM``), hashed once: from ``parts`` when the caller has them."""
        if self._digest is None:
            self._digest = digest_parts(parts if parts is not None else self.parts())
        return self._digest


HEADER_MAX_BYTES = 16 + 10000  # magic, version and length, and numpy's largest header (``_MAX_HEADER_SIZE``)

_HEADER = re.compile(
    r"\{'descr': '([<>|=][A-Za-z][A-Za-z0-9\[\]]{0,15})', 'fortran_order': (True|False), 'shape': \((\d+(?:, \d+)*,?)?\), \} *\n"
)
_numpy_header = threading.Lock()


def read_header(data: bytes | memoryview) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """The shape, Fortran order, dtype and data offset of ``.npy`` bytes.

    Why not numpy's reader alone: it parses the header with ``ast.literal_eval``, and CPython 3.11's AST
    constructor keeps its recursion depth in per-interpreter state, so two threads parsing at once can fail
    with ``SystemError: AST constructor recursion depth mismatch`` (cpython gh-106905) — and an artifact's
    files are read on two threads. The header numpy writes (``{'descr': '<f4', 'fortran_order': False,
    'shape': (8, 6), }``, padded) is matched here; any other form goes to numpy's reader, one thread at a time.
    """
    head = bytes(data[:HEADER_MAX_BYTES])
    if head[:6] != b"\x93NUMPY" or len(head) < 10:
        raise ValueError(f"no .npy magic string: the file starts {head[:10]!r}")
    major, minor = head[6], head[7]
    if (major, minor) == (1, 0):
        length, start = int.from_bytes(head[8:10], "little"), 10
    elif (major, minor) in ((2, 0), (3, 0)):
        length, start = int.from_bytes(head[8:12], "little"), 12
    else:
        raise ValueError(f".npy format version {major}.{minor} is not one numpy writes (1.0, 2.0 or 3.0)")
    end = start + length
    if end > HEADER_MAX_BYTES:
        raise ValueError(f"its header is {length} bytes, over numpy's limit of 10000")
    if len(head) < end:
        raise ValueError(f"the file ends {len(head) - start} bytes into its {length}-byte header")
    match = _HEADER.fullmatch(head[start:end].decode("latin1"))
    if match is None:
        buf = io.BytesIO(head)
        buf.seek(8)  # past the magic and version read above: numpy's reader starts at the header's length
        reader = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        try:
            with _numpy_header:
                shape, fortran, dtype = reader(buf)
        except (ValueError, SyntaxError, tokenize.TokenError) as e:  # numpy's tokenizer fails on a cut header
            raise ValueError(f"numpy cannot read its header: {e}") from None
        return shape, fortran, dtype, buf.tell()
    descr, fortran, dims = match.groups()
    try:
        dtype = np.dtype(descr)
    except TypeError:
        raise ValueError(f"descr {descr!r} is not a dtype") from None
    shape = tuple(int(d) for d in dims.replace(",", " ").split()) if dims else ()
    return shape, fortran == "True", dtype, end


def from_npy(data: bytes | memoryview, where: str, dtype: Any = None) -> np.ndarray:
    """An array from ``.npy`` bytes, a read-only view of them (not a copy: a model's weights are read once);
    with ``dtype``, checked against it (``as_dtype``)."""
    try:
        shape, fortran, stored, offset = read_header(data)
        if stored.hasobject:
            raise ValueError("object arrays are never read (they would need pickle)")
        count = math.prod(shape)
        if offset + count * stored.itemsize > len(data):
            raise ValueError(
                f"shape {shape} of {stored} needs {count * stored.itemsize} bytes after the header, "
                f"but the file has {len(data) - offset}"
            )
        array = np.frombuffer(data, stored, count=count, offset=offset)
        array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    except ValueError as e:
        raise ArtifactError(f"{where}: not a readable .npy array ({e}).") from None
    if dtype is None:
        return array
    viewed = as_dtype(array, dtype)
    if viewed is not None:
        return viewed
    want = to_dtype(dtype)
    raise ArtifactError(f"{where}: holds {array.dtype.name} data, but the manifest says {want.name}; the artifact is damaged.")


def as_dtype(array: np.ndarray, dtype: Any) -> np.ndarray | None:
    """``array`` as ``dtype``, or None where it holds another dtype. numpy has no bfloat16 (or fp8) of its
    own: ``.npy`` stores those as raw void items of the same size, which are viewed as ``dtype`` here."""
    want = to_dtype(dtype)
    if array.dtype == want:
        return array
    if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize:
        return array.view(want)
    return None
