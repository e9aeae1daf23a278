"""Arrays in an artifact: ``.npy`` bytes, never pickled, with the dtypes numpy lacks (bfloat16, fp8) viewed back."""

from __future__ import annotations

import io
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


def from_npy(data: bytes | memoryview, where: str, dtype: Any = None) -> np.ndarray:
    """An array from ``.npy`` bytes, a read-only view of them (not a copy: a model's weights are read once);
    with ``dtype``, checked against it (``as_dtype``)."""
    try:
        header = io.BytesIO(data if isinstance(data, bytes) else bytes(data[:HEADER_MAX_BYTES]))
        version = np.lib.format.read_magic(header)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, stored = read_header(header)
        if stored.hasobject:
            raise ValueError("object arrays are never read (they would need pickle)")
        count = int(np.prod(shape, dtype=np.int64))
        array = np.frombuffer(data, stored, count=count, offset=header.tell())
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
