"""Dynamic batching: the default batch size, requests of different masked lengths in one call, and a
run-time compile that holds up no other request."""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.errors import CallError
from tripy_build import runtime
from tripy_build.serve.endpoint import Endpoint

W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


def pooled(x, mask, w):
    """x: (batch, seq, 4), mask: (batch, seq) int32 -> per position (batch, seq, 3) and masked mean (batch, 3)."""
    m = mask[..., None].astype(jnp.float32)
    h = jnp.tanh(x @ w) * m
    return h, h.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    batch, seq = tb.NamedDimension("batch", 1, 2, 12), tb.NamedDimension("seq", 1, 4, 8)
    exe = tb.compile(pooled, args=(tb.InputInfo((batch, seq, 4), "float32"), tb.InputInfo((batch, seq), "int32"), W),
                     padding={"batch": "rows", "seq": {"mask_input": "mask", "pad_values": {"x": 7.0}}},
                     buckets={"batch": [1, 2, 4, 8], "seq": "pow2"})
    path = tmp_path_factory.mktemp("batching") / "pooled"
    exe.save(path)
    return path


def case(rng, rows: int, seq: int):
    x = rng.standard_normal((rows, seq, 4)).astype(np.float32)
    mask = np.ones((rows, seq), np.int32)
    mask[0, seq - 1:] = 0  # a request's own padding stays its own
    return x, mask


def submit_together(ep: Endpoint, cases) -> list:
    """Every case queued while the batcher waits out its delay; their outputs."""
    for c in cases:
        ep.runtime.check_flat(*c)
    futures = [ep.batcher.submit(list(c)) for c in cases]
    return [f.result(timeout=120) for f in futures]


def test_max_batch_defaults_to_the_largest_precompiled_size(masked):
    ep = Endpoint.load(masked)
    try:
        assert ep.plan.max_batch == 8  # batch's buckets are 1, 2, 4, 8 (9-12 compile on first use); not its max, 12
        assert "requests of different 'seq' in one bucket share a call" in ep.batching
    finally:
        ep.close()


def test_requests_of_different_masked_lengths_in_one_bucket_share_a_call(masked):
    rng = np.random.default_rng(1)
    direct = runtime.load(masked)
    cases = [case(rng, 1, 5), case(rng, 2, 8), case(rng, 1, 6), case(rng, 2, 3), case(rng, 1, 4)]
    ep = Endpoint.load(masked, max_delay_ms=400)
    try:
        answers = submit_together(ep, cases)
        stats = ep.statistics()
    finally:
        ep.close()
    for (x, mask), got in zip(cases, answers):
        want = direct.call_flat(x, mask)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # seq 5, 8 and 6 share bucket 8; 3 and 4 share bucket 4: two calls for five requests
    assert stats["execution_count"] == 2, stats
    assert sorted(b["batch_size"] for b in stats["batch_stats"]) == [3, 4], stats


def test_a_run_time_compile_holds_up_no_other_request(tmp_path):
    """seq has no buckets: a new length compiles on first use, on its own thread, while requests at the
    precompiled length keep being answered."""
    batch, seq = tb.NamedDimension("batch", 1, 2, 8), tb.NamedDimension("seq", 1, 4, 64)
    exe = tb.compile(lambda x: jnp.tanh(x).sum(axis=1), args=(tb.InputInfo((batch, seq), "float32"),),
                     padding={"batch": "rows"}, buckets={"batch": "pow2", "seq": "none"})
    exe.save(tmp_path / "rows")
    ep = Endpoint.load(tmp_path / "rows")
    try:
        assert ep.runtime.needs_compile(np.zeros((2, 37), np.float32))
        assert not ep.runtime.needs_compile(np.zeros((3, 4), np.float32))
        slow = ep.batcher.submit([np.ones((2, 37), np.float32)])
        answered_while_compiling = []
        for i in range(5):
            x = np.full((1, 4), i, np.float32)
            out = ep.batcher.submit([x]).result(timeout=60)
            np.testing.assert_allclose(out[0], np.tanh(x).sum(axis=1), rtol=1e-6)
            answered_while_compiling.append(not slow.done())
        np.testing.assert_allclose(slow.result(timeout=120)[0], np.full(2, np.tanh(1.0) * 37), rtol=1e-5)
    finally:
        ep.close()
    assert all(answered_while_compiling), answered_while_compiling
    assert threading.active_count() < 50


def test_a_request_of_several_calls_counts_once_in_the_statistics(masked):
    """``submit_all``: a client request that runs as several calls (a long text's windows, zero-shot's hypotheses)
    is one request in Triton's statistics, with every call's rows; one whose part fails counts once, as failed."""
    rng = np.random.default_rng(2)
    ep = Endpoint.load(masked, max_delay_ms=0)
    try:
        parts = [list(case(rng, 2, 5)), list(case(rng, 1, 8)), list(case(rng, 3, 3))]
        answers = [f.result(timeout=120) for f in ep.batcher.submit_all(parts)]
        assert len(answers) == 3
        one = ep.statistics()
        bad = [list(case(rng, 1, 4)), [np.zeros((1, 4, 5), np.float32), np.ones((1, 4), np.int32)]]  # a wrong width
        futures = ep.batcher.submit_all(bad)
        futures[0].result(timeout=120)
        with pytest.raises(CallError, match="input 'x' dim 2 is 5"):
            futures[1].result(timeout=120)
        two = ep.statistics()
    finally:
        ep.close()
    success, fail = one["inference_stats"]["success"]["count"], one["inference_stats"]["fail"]["count"]
    assert (success, fail, one["inference_count"], one["inference_stats"]["queue"]["count"]) == (1, 0, 6, 1), one
    assert one["execution_count"] >= 1
    assert (two["inference_stats"]["success"]["count"], two["inference_stats"]["fail"]["count"]) == (1, 1), two
    assert two["inference_count"] == 6, two  # a failed request's rows are not inferences
