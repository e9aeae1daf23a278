"""``Entry``: one entry point of a multi-entry executable, as ``compile`` takes it.

Deployments that run several programs over one set of weights (a prefill and a decode step over a
key/value cache, an encoder and a decoder, embed and score) compile them together:
``tripy_build.compile({"prefill": Entry(...), "decode": Entry(...)})``. Each entry has its own inputs,
profiles and padding; the artifact stores the weights once and a loader places them once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import SpecError
from .profiles import DEFAULT_BUCKETS, DEFAULT_MAX_PROFILES

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Entry:
    """One function of a multi-entry ``compile``: its arguments and shape policy, as ``compile`` takes them.

    Args:
        func: a pure function of arrays.
        args, kwargs: its arguments: ``InputInfo``, ``DimSize`` or constants (weights are constants: an
            array given to several entries is stored and placed once).
        buckets, padding, max_profiles: as ``compile``'s, for this entry's dims.
        donate: names of runtime inputs whose buffers each call gives to the outputs: an output of the
            same shape and dtype is written in place (a key/value cache updated by a decode step is not
            copied). A device array passed there cannot be used again after the call.

    Example::

        exe = tb.compile({
            "prefill": tb.Entry(prefill, args=[params, tb.InputInfo((batch, prompt), "int32")]),
            "decode": tb.Entry(decode, args=[params, tb.InputInfo((batch, 1), "int32"), cache_info],
                               donate=["cache"]),
        })
        logits, cache = exe.entries["prefill"](ids)
    """

    func: Callable
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    buckets: Any = DEFAULT_BUCKETS
    padding: Mapping[str, Any] | None = None
    max_profiles: int = DEFAULT_MAX_PROFILES
    donate: Sequence[str] = field(default=())


def check_entries(entries: Any) -> dict[str, Entry]:
    """``compile``'s mapping of entry name -> ``Entry``, checked: at least one, names that can be folder
    names and Python identifiers, every value an ``Entry``."""
    if not isinstance(entries, Mapping) or not entries:
        raise SpecError(f"compile(): a multi-entry compile takes a non-empty dict of name -> tb.Entry, got {entries!r}.")
    for name, entry in entries.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise SpecError(f"compile(): entry name {name!r} is not usable; an entry is named like a Python identifier "
                            "(letters, digits and _, at most 64), e.g. 'prefill'.")
        if not isinstance(entry, Entry):
            raise SpecError(f"compile(): entry {name!r} is a {type(entry).__name__}; wrap the function and its "
                            f"arguments as tb.Entry(func, args=[...]).")
        if isinstance(entry.donate, str) or not all(isinstance(d, str) for d in entry.donate):
            raise SpecError(f"compile(): entry {name!r}: donate= is a list of input names, got {entry.donate!r}.")
    return dict(entries)
