"""The served model most serve tests share: ``two_heads``, built once per module, and its direct answers."""

from __future__ import annotations

from pathlib import Path

import pytest

import tripy_build as tb
from tripy_build import runtime
from serve.serving import W, two_heads


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    batch, seq = tb.NamedDimension("batch", 1, 4, 16), tb.NamedDimension("seq", 2, 2, 4)
    exe = tb.compile(two_heads, args=(tb.InputInfo((batch, seq, 4), "float32"), tb.InputInfo((batch,), "int32"), W),
                     padding={"batch": "rows"}, buckets={"batch": "pow2", "seq": [2, 4]})
    path = tmp_path_factory.mktemp("serve") / "two_heads"
    exe.save(path)
    return path


@pytest.fixture(scope="module")
def direct(artifact):
    """The artifact called directly: what every served answer must equal."""
    return runtime.load(artifact)


@pytest.fixture
def warm_up_held(call_in_flight, monkeypatch):
    """The warm-up held back by a call in flight (released by setting the event), while every profile counts
    as large (those wait for a quiet moment) and none as late (none is prepared at once)."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)
    monkeypatch.setattr(warmup, "PREPARE_AT_LOAD_S", 0.0)  # loaded as a large model: in the background
    return call_in_flight
