"""Property-based tests (hypothesis) of shape specs and call validation.

Random ranges, named dims and shapes: every in-range call is accepted (and, compiled, matches eager
JAX); every out-of-range call is refused with the offending input and dim named.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra: pip install -e '.[dev]'")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.core.signature import check_leaves, named_uses  # noqa: E402


@st.composite
def ranges(draw, hi=12):
    lo = draw(st.integers(1, hi))
    top = draw(st.integers(lo, hi))
    return lo, draw(st.integers(lo, top)), top


@st.composite
def specs(draw):
    """1-3 inputs over up to two named dims and independent dims; returns (specs, named ranges)."""
    named = {n: draw(ranges()) for n in draw(st.lists(st.sampled_from(["batch", "seq"]), max_size=2, unique=True))}
    infos = []
    for i in range(draw(st.integers(1, 3))):
        dims = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["static", "range", *(["named"] if named else [])]))
            if kind == "static":
                dims.append(draw(st.integers(1, 6)))
            elif kind == "range":
                dims.append(draw(ranges()))
            else:
                name = draw(st.sampled_from(sorted(named)))
                dims.append(tb.NamedDimension(name, *named[name]))
        infos.append((f"in{i}", tb.InputInfo(dims, "float32")))
    return infos


def _shape_for(infos, draw, pick):
    """One shape per input, named dims equal, each size chosen by ``pick(lo, hi)``."""
    chosen: dict[str, int] = {}
    shapes = []
    for _, info in infos:
        shape = []
        for axis, (lo, hi) in enumerate(zip(info.shape_bounds.min, info.shape_bounds.max)):
            name = info.dimension_names.get(axis)
            if name is not None:
                shape.append(chosen.setdefault(name, draw(pick(lo, hi))))
            else:
                shape.append(draw(pick(lo, hi)))
        shapes.append(tuple(shape))
    return shapes


@settings(max_examples=300, deadline=None)
@given(data=st.data(), infos=specs())
def test_in_range_calls_are_accepted(data, infos):
    shapes = _shape_for(infos, data.draw, lambda lo, hi: st.integers(lo, hi))
    values = [np.zeros(s, np.float32) for s in shapes]
    assert check_leaves(values, infos, named_uses(infos)) == tuple(shapes)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), infos=specs())
def test_out_of_range_calls_name_the_input_and_dim(data, infos):
    shapes = [list(s) for s in _shape_for(infos, data.draw, lambda lo, hi: st.integers(lo, hi))]
    li = data.draw(st.integers(0, len(infos) - 1))
    path, info = infos[li]
    axis = data.draw(st.integers(0, info.rank - 1))
    lo, hi = info.shape_bounds.min[axis], info.shape_bounds.max[axis]
    bad = data.draw(st.sampled_from([s for s in (lo - 1, hi + 1, hi + 7) if s >= 0]))
    name = info.dimension_names.get(axis)
    for (_, other), shape in zip(infos, shapes):  # a named dim changes in every input that has it
        for a in range(len(shape)):
            if other is info and a == axis or (name is not None and other.dimension_names.get(a) == name):
                shape[a] = bad
    with pytest.raises(CallError) as e:
        check_leaves([np.zeros(s, np.float32) for s in shapes], infos, named_uses(infos))
    message = str(e.value)
    assert "dim" in message and (f"input '{path}'" in message or "input 'in" in message), message
    assert str(bad) in message, message


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), infos=specs())
def test_compiled_calls_match_eager_jax(data, infos):
    """Compiled with the spec (opt precompiled, other in-range shapes compiled on first use)."""
    def fn(*xs):
        return sum(jnp.sin(x).sum() * (i + 1) for i, x in enumerate(xs))

    exe = tb.compile(fn, args=[info for _, info in infos], buckets="none")
    for _ in range(2):
        shapes = _shape_for(infos, data.draw, lambda lo, hi: st.integers(lo, hi))
        xs = [np.random.default_rng(len(s)).standard_normal(s).astype(np.float32) for s in shapes]
        np.testing.assert_allclose(np.asarray(exe(*xs)), np.asarray(fn(*xs)), rtol=1e-5, atol=1e-4)
