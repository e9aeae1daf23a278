"""What an executable runs: the exported main and prep programs, and the weights they take.

``main`` takes its weights as leading arguments: some as stored (``weight``), some as the prep
program made them from the stored ones at load (``prep``: transposes, casts, concatenations, done once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Stored:
    """A weight left in its artifact file: read, its digest checked, when something needs its values.

    A loaded executable holds the prepared weights; the raw ones that only prep reads stay on disk
    (``Executable.weights``, ``save`` and ``bind`` of another argument read them back)."""

    shape: tuple[int, ...]
    dtype: Any
    read: Callable[[], np.ndarray] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


@dataclass(frozen=True)
class Weight:
    """One array the program takes as a weight: where it came from and its value."""

    path: str  # e.g. "params['proj']['weight']", or "const[3]" for an array the function closes over
    argument: str | None  # the constant argument it belongs to (bindable by that name), or None
    value: Any  # an array, or ``Stored``

    def array(self) -> Any:
        return self.value.read() if isinstance(self.value, Stored) else self.value

    @property
    def nbytes(self) -> int:
        return _nbytes(self.value.shape, self.value.dtype)


@dataclass(frozen=True)
class Source:
    """Where one leading argument of ``main`` comes from: a weight, or an output of ``prep``."""

    kind: str  # "weight" | "prep"
    index: int


@dataclass(frozen=True)
class PrepChunk:
    """A piece of the prep program: it reads only ``weights`` and makes only ``outputs`` (prep's output
    indices). Loaders run the chunks in turn and drop each chunk's weights after it, so raw and
    prepared weights are never both held in full (``compiler/weights.py``)."""

    weights: tuple[int, ...]
    outputs: tuple[int, ...]


def resolve(sources: Sequence[Source], weights: Sequence[Any], prepared: Sequence[Any]) -> list[Any]:
    return [weights[s.index] if s.kind == "weight" else prepared[s.index] for s in sources]


@dataclass
class Program:
    """A traced function as exported programs plus the weights they take."""

    main: jax.export.Exported  # (*leading, *inputs, *dim sizes) -> outputs
    prep: jax.export.Exported | None  # (*weights) -> prepared weights; None if there is nothing to prepare
    weights: list[Weight]
    sources: list[Source]  # where each leading argument of main comes from
    symbols: list[Any] = field(default_factory=list)  # the export's dim symbols (when just compiled)
    # prep in pieces, each exported (when just compiled: the build precompiles them) or not (loaded)
    chunks: list[tuple[PrepChunk, jax.export.Exported | None]] = field(default_factory=list)
    # prep's outputs as an artifact stores them, by output index (a chunk saved prepared: runtime/save.py)
    at_rest: dict[int, Stored] = field(default_factory=dict)

    def leading_avals(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.main.in_avals[:len(self.sources)]]
