"""Cache attention (``models._layers.attend_cache``): a chunk of new tokens reads only the cache window its
queries may see, and gives what attention over the whole cache gives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tripy_build.models._layers import attend_cache, cache_windows, mask_bias

B, HEADS, HD, MAX = 2, 3, 4, 64


def test_windows_are_the_cache_length_and_its_halves():
    assert cache_windows(256) == [16, 32, 64, 128, 256]
    assert cache_windows(48) == [24, 48]
    assert cache_windows(20) == [20]


def _attend(q, cache, start, s):
    """attend_cache over ``cache: [2, B, HEADS, MAX, HD]`` for ``s`` new tokens per row at ``start``, and the
    same attention computed over the whole cache."""
    query_at = jnp.asarray(start)[:, None] + jnp.arange(s)[None, :]
    keep = (jnp.arange(MAX)[None, None, :] <= query_at[:, :, None])[:, None]      # [B, 1, s, MAX]
    bias = mask_bias(keep)
    out = jax.jit(lambda q, cache: attend_cache(q, lambda kind, size: cache[kind, :, :, :size], bias, query_at,
                                                cache_windows(MAX)))
    scores = jnp.einsum("bqnh,bnkh->bnqk", q, cache[0]) + bias
    whole = jnp.einsum("bnqk,bnkh->bqnh", jax.nn.softmax(scores, axis=-1), cache[1])
    return np.asarray(out(q, cache)), np.asarray(whole)


@pytest.mark.parametrize("start, s, window", [([0, 0], 8, 16), ([3, 10], 4, 16), ([20, 0], 8, 32), ([40, 2], 8, 64)])
def test_a_chunk_reads_only_the_window_its_queries_see(start, s, window):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, s, HEADS, HD)), jnp.float32)
    cache = rng.standard_normal((2, B, HEADS, MAX, HD)).astype(np.float32)
    got, whole = _attend(q, jnp.asarray(cache), start, s)
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
    if window < MAX:  # what lies past the window is never read: NaN there leaves the result as it was
        cache[:, :, :, window:] = np.nan
        poisoned, _ = _attend(q, jnp.asarray(cache), start, s)
        np.testing.assert_allclose(poisoned, got, rtol=1e-6, atol=1e-7)
    cache[:, :, :, window // 2:] = np.nan  # a query sees a position past the next smaller window
    assert np.isnan(_attend(q, jnp.asarray(cache), start, s)[0]).any()
