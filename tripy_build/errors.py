"""The one exception family tripy_build raises for user mistakes.

Every message names what was given, what was expected and how to fix it. Subclasses let callers
catch one kind of failure; catching ``TripyBuildError`` catches them all.
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Callable


class TripyBuildError(Exception):
    """Base class of every error tripy_build raises for a user mistake."""


class SpecError(TripyBuildError, ValueError):
    """An ``InputInfo`` or ``NamedDimension`` is malformed."""


class TraceError(TripyBuildError):
    """The function could not be traced or exported as written."""


class CallError(TripyBuildError, TypeError):
    """A call to an ``Executable`` did not match its signature or declared shapes."""


class ArtifactError(TripyBuildError):
    """An artifact on disk is missing, damaged, or of an unknown version."""


class ConfigError(TripyBuildError):
    """A build configuration is invalid."""


class CompileError(TripyBuildError):
    """A compiler refused a program that tripy_build gave it (IREE's first error is quoted)."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_library_frame(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    parts = path.split(os.sep)
    return any(p in ("site-packages", "dist-packages") for p in parts) or "<frozen" in filename


def user_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of a traceback that belongs to the user's code, not to a library."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        if not _is_library_frame(frame.filename):
            return frame
    return None


# Libraries a model is traced through, not written with: a frame in one of them is never the model's line.
_MACHINERY = ("jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum", "scipy")


def model_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of a traceback in the model's code: the user's own, else the library the model
    comes from (``equinox/nn/_linear.py`` for ``equinox.nn.MLP``), never JAX's or tripy_build's."""
    found = user_frame(tb)
    if found is not None:
        return found
    for frame in reversed(traceback.extract_tb(tb)):
        path = os.path.abspath(frame.filename)
        parts = path.split(os.sep)
        if path.startswith(_PACKAGE_DIR + os.sep) or "<frozen" in frame.filename:
            continue
        if "site-packages" in parts or "dist-packages" in parts:
            top = parts[max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")) + 1]
            if top.split(".")[0] not in _MACHINERY:
                return frame
    return None


def describe_frame(frame: traceback.FrameSummary | None) -> str:
    if frame is None:
        return "(location unknown)"
    line = f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}'
    if frame.line:
        line += f"\n    {frame.line}"
    return line


def raised_in_user_code(err: BaseException, what: str) -> TraceError | None:
    """Our error for an exception the user's code raised (or a library raised when the user's code called
    it): what raised, the message and the user's line. None when no user frame is on the traceback, which
    makes it our own bug, to be raised as it is."""
    frame = model_frame(err.__traceback__)
    if frame is None or isinstance(err, (TripyBuildError, KeyboardInterrupt, SystemExit, MemoryError)):
        return None
    message = str(err).strip().splitlines()[0][:500] if str(err).strip() else ""
    notes = "".join(f"\n{note}" for note in getattr(err, "__notes__", ()) if note.startswith("Likely cause:"))
    return TraceError(f"{what} raised {type(err).__name__}: {message}\n{describe_frame(frame)}{notes}")


def exit_status(command: Callable[[], None]) -> int:
    """Run a command-line action: 0, or 2 with our error on one line (no traceback for a user's mistake)."""
    import sys

    try:
        command()
    except TripyBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
