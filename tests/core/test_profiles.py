"""Shape profiles, padding and the compile cache: which shapes run precompiled, padded or compiled.

Each test builds a small real executable. Compiles are counted with jax's monitoring events; the
dispatch decision for a shape is read from ``Executable.dispatcher``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build.core.profiles import resolve_buckets
from conftest import assert_close

ROWS = {"batch": "rows"}


def affine(x, params):
    return jnp.tanh(x @ params["w"] + params["b"])


def affine_params(dim_in=8, dim_out=6, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((dim_in, dim_out)).astype(np.float32),
            "b": rng.standard_normal(dim_out).astype(np.float32)}


def batch_info(lo=1, opt=4, hi=20, width=8):
    return tb.InputInfo((tb.NamedDimension("batch", lo, opt, hi), width), "float32")


@pytest.fixture(scope="module")
def padded_exe():
    """Batch 1..20 (opt 4), pow2 buckets 1 2 4 8 16 20, rows padding."""
    params = affine_params()
    return tb.compile(affine, args=[batch_info(), params], padding=ROWS), params


@pytest.fixture(scope="module")
def unpadded_exe():
    """The same function and buckets, no padding declared."""
    params = affine_params()
    return tb.compile(affine, args=[batch_info(), params]), params


def _x(n, width=8, seed=None):
    return np.random.default_rng(n if seed is None else seed).standard_normal((n, width)).astype(np.float32)


# --- bucket policies and the budget ---------------------------------------------------------------

@pytest.mark.parametrize("spec, bounds, expected", [
    ("pow2", (1, 8, 64), (1, 2, 4, 8, 16, 32, 64)),
    ("pow2", (3, 8, 20), (4, 8, 16, 20)),  # clipped to the range, plus max
    ("pow2:16", (8, 32, 64), (16, 32, 64)),
    ("pow2:16", (4, 8, 12), (12,)),  # nothing from 16 up fits: max alone covers the range
    ("fine", (1, 8, 64), (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)),  # and 3 x 2^k between: at most 1.5x padding
    ("fine", (5, 8, 40), (6, 8, 12, 16, 24, 32, 40)),
    ("fine:64", (1, 128, 256), (64, 96, 128, 192, 256)),
    ([8, 2, 8, 64], (1, 8, 64), (2, 8, 64)),
    ("none", (1, 8, 64), ()),
])
def test_bucket_policies(spec, bounds, expected):
    assert resolve_buckets(spec, bounds, "b") == expected


@pytest.mark.parametrize("spec, needle", [
    ([0, 8], "outside the dim's range [1, 64]"), ([128], "outside"), ("pow3", "'pow2', 'pow2:N', 'fine', 'fine:N', 'none'"),
    ("pow2:x", "'pow2:N' needs a positive integer N"), ("fine:0", "'fine:N' needs a positive integer N"),
    ("pow2:", "positive integer N"), ([], "non-empty list"), ([1.5], "non-empty list of sizes"),
])
def test_bad_bucket_policies(spec, needle):
    with pytest.raises(tb.TripyBuildError, match="b: ") as e:
        resolve_buckets(spec, (1, 8, 64), "b")
    assert needle in str(e.value)


def test_profile_budget_is_checked_before_compiling(compile_counter):
    batch, seq = tb.NamedDimension("batch", 1, 8, 64), tb.NamedDimension("seq", 1, 8, 256)
    before = compile_counter.count
    with pytest.raises(tb.TripyBuildError) as e:
        tb.compile(lambda x: x * 2, args=[tb.InputInfo((batch, seq), "float32")], max_profiles=20)
    assert compile_counter.count == before
    msg = str(e.value)
    assert "63 shape profiles exceed the budget of 20" in msg and "'batch': 7" in msg and "'seq': 9" in msg
    assert "max_profiles" in msg and "'none'" in msg
    exe = tb.compile(lambda x: x * 2, args=[tb.InputInfo((batch, seq), "float32")],
                     buckets={"seq": [8, 256]}, max_profiles=20)
    assert len(exe.profiles) == 7 * 2  # batch pow2 x seq [8, 256]; opt (8, 8) is among them


def test_buckets_and_padding_name_real_dims():
    with pytest.raises(tb.TripyBuildError, match="'seq' is not a named dim"):
        tb.compile(affine, args=[batch_info(), affine_params()], buckets={"seq": "pow2"})
    with pytest.raises(tb.TripyBuildError, match="padding\\['batch'\\]: must be one of 'rows', 'mask'"):
        tb.compile(affine, args=[batch_info(), affine_params()], padding={"batch": "columns"})


# --- exact profiles, padding and the fallback -----------------------------------------------------

def test_exact_profile_runs_as_is(padded_exe, compile_counter):
    exe, params = padded_exe
    assert [p["batch"] for p in exe.profiles] == [4, 1, 2, 8, 16, 20]
    assert exe.dims[0].strategy == "padded" and exe.dims[0].buckets == (1, 2, 4, 8, 16, 20)
    sizes = (1, 2, 4, 8, 16, 20)
    before = compile_counter.count
    got = [exe(_x(n)) for n in sizes]
    assert compile_counter.count == before
    for n, y in zip(sizes, got):
        route = exe.dispatcher.route([(n, 8)])
        assert route.target == (n,) and not route.padded and route.slices == (None,)
        assert_close(y, affine(_x(n), params))


def test_fine_buckets_pad_a_size_to_at_most_one_and_a_half_times_it(compile_counter):
    params = affine_params()
    exe = tb.compile(affine, args=[batch_info(), params], padding=ROWS, buckets={"batch": "fine"})
    assert exe.dims[0].buckets == (1, 2, 3, 4, 6, 8, 12, 16, 20)
    cases = [(5, 6), (7, 8), (9, 12), (13, 16), (17, 20)]
    before = compile_counter.count
    got = [exe(_x(n)) for n, _ in cases]
    assert compile_counter.count == before  # every size runs a precompiled bucket, padded
    for (n, bucket), y in zip(cases, got):
        assert exe.dispatcher.route([(n, 8)]).target == (bucket,)
        assert_close(y, affine(jnp.asarray(_x(n)), params))


@pytest.mark.parametrize("n, bucket", [(3, 4), (5, 8), (9, 16), (17, 20)])
def test_padded_bucket_matches_unpadded_eager(padded_exe, compile_counter, n, bucket):
    exe, params = padded_exe
    route = exe.dispatcher.route([(n, 8)])
    assert route.target == (bucket,) and route.pad == (True,) and route.slices[0] == (slice(0, n), slice(None))
    before = compile_counter.count
    got = exe(_x(n))
    again = exe(_x(n))  # the second call takes the fast path
    assert compile_counter.count == before
    assert isinstance(got, jax.Array) and got.shape == (n, 6)
    assert_close(got, affine(jnp.asarray(_x(n)), params))
    assert_close(again, got)


def test_undeclared_dim_is_never_padded(unpadded_exe, compile_counter):
    exe, params = unpadded_exe
    assert exe.dims[0].padding is None and exe.dims[0].strategy == "buckets"
    route = exe.dispatcher.route([(5, 8)])
    assert route.target == (5,) and not route.padded
    before = compile_counter.count
    assert_close(exe(_x(5)), affine(_x(5), params))  # compiled for exactly 5 rows, on first use
    assert compile_counter.count == before + 1
    assert_close(exe(_x(5, seed=1)), affine(_x(5, seed=1), params))
    assert compile_counter.count == before + 1  # once
    before = compile_counter.count
    exe(_x(8))  # a bucket: precompiled
    assert compile_counter.count == before


def test_false_rows_declaration_is_caught_when_compiling():
    def centered(x, params):  # mixes rows: each output depends on the batch mean
        return affine(x - x.mean(axis=0), params)

    with pytest.raises(tb.TripyBuildError) as e:
        tb.compile(centered, args=[batch_info(), affine_params()], padding=ROWS)
    msg = str(e.value)
    assert "padding['batch'] = 'rows' is not exact for centered" in msg
    assert "batch=1 padded to the bucket 2" in msg and "remove the declaration" in msg
    # undeclared, the same function compiles and is exact at every size
    exe = tb.compile(centered, args=[batch_info(), affine_params()])
    assert_close(exe(_x(3)), centered(jnp.asarray(_x(3)), affine_params()), rtol=1e-5, atol=1e-5)


def attend(x, length):
    """Mean over the sequence of x, counting only the first ``length`` positions."""
    keep = (jnp.arange(x.shape[1]) < length)[None, :, None]
    return jnp.sum(jnp.where(keep, x, 0.0), axis=1) / length.astype(x.dtype)


def seq_info(hi=12):
    return tb.InputInfo((2, tb.NamedDimension("seq", 1, 4, hi), 3), "float32")


def test_mask_padding_with_dim_size_matches_unpadded(compile_counter):
    exe = tb.compile(attend, args=[seq_info(), tb.DimSize("seq")], padding={"seq": "mask"})
    assert list(exe.input_infos) == ["x"]  # the DimSize is filled in by the runtime
    before = compile_counter.count
    for n in (1, 3, 5, 9, 12):
        x = np.random.default_rng(n).standard_normal((2, n, 3)).astype(np.float32)
        assert_close(exe(x), np.asarray(x).mean(axis=1), rtol=1e-5, atol=1e-6)
    assert compile_counter.count == before


def test_mask_needs_the_dim_size_and_a_wrong_mask_is_caught():
    with pytest.raises(tb.TripyBuildError, match="pass tb.DimSize\\('seq'\\)"):
        tb.compile(lambda x: x.mean(axis=1), args=[seq_info()], padding={"seq": "mask"})

    def ignores_length(x, length):
        return jnp.mean(x, axis=1) + 0 * length

    with pytest.raises(tb.TripyBuildError, match="must mask every position at or beyond DimSize\\('seq'\\)"):
        tb.compile(ignores_length, args=[seq_info(), tb.DimSize("seq")], padding={"seq": "mask"})
    with pytest.raises(tb.TripyBuildError, match="no input has a NamedDimension 'len'"):
        tb.compile(attend, args=[seq_info(), tb.DimSize("len")])


def test_padding_an_output_dim_that_is_not_the_dim_itself_is_refused():
    def doubled(x):
        return jnp.concatenate([x, x], axis=0)  # output rows: 2 * batch

    with pytest.raises(tb.TripyBuildError, match="output 0 axis 0 has size 2\\*batch"):
        tb.compile(doubled, args=[batch_info()], padding=ROWS)


def test_opt_profile_is_used_when_it_covers_more_cheaply():
    exe = tb.compile(affine, args=[batch_info(1, 12, 64), affine_params()], buckets={"batch": [1, 64]}, padding=ROWS)
    assert exe.dispatcher.route([(10, 8)]).target == (12,)  # opt (12) beats bucket 64
    assert exe.dispatcher.route([(13, 8)]).target == (64,)


# --- the compile cache ----------------------------------------------------------------------------

def test_a_second_process_reuses_run_time_compiles(tmp_path, unpadded_exe):
    exe, params = unpadded_exe
    exe.save(tmp_path / "artifact")
    x = _x(7)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import json, logging, jax, numpy as np, tripy_build as tb
        events = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda e, d, **k: events.append(e) if e == "/jax/core/compile/backend_compile_duration" else None)
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        exe = tb.load({str(tmp_path / 'artifact')!r})
        y = exe(np.load({str(tmp_path / 'x.npy')!r}))
        print(json.dumps({{"compiles": len(events), "y": np.asarray(y).tolist()}}))
    """)
    env = {**__import__("os").environ, "TRIPY_BUILD_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr))
    (first, first_log), (second, second_log) = runs
    assert first["compiles"] == 1 and "compiled batch=7 on first use" in first_log
    assert second["compiles"] == 0 and "batch=7 loaded from the compile cache" in second_log
    want = np.asarray(affine(jnp.asarray(x), params))
    np.testing.assert_allclose(first["y"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second["y"], want, rtol=1e-5, atol=1e-6)
    entries = list((tmp_path / "cache").glob("*-cache"))
    assert len(entries) == 1
    # a damaged entry is ignored (and recompiled), never trusted
    data = bytearray(entries[0].read_bytes())
    data[-1] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["compiles"] == 1
    assert "damaged" in proc.stderr


def test_compile_cache_is_bounded(tmp_path):
    from tripy_build.runtime.compile_cache import CompileCache

    cache = CompileCache(tmp_path / "c", max_bytes=3000)
    for i in range(5):
        cache.put(f"k{i}", bytes([i]) * 1000, {"i": i})
    stored = sorted(p.name for p in (tmp_path / "c").glob("*-cache"))
    assert len(stored) == 2 and stored == ["k3-cache", "k4-cache"]  # least recently used went first
    assert cache.get("k4") == (bytes([4]) * 1000, {"i": 4}) and cache.get("k0") is None


# --- splitting a rows dim -------------------------------------------------------------------------

def test_split_rows_match_unpadded_eager(padded_exe, compile_counter):
    exe, params = padded_exe
    split = exe.bind()  # a copy with its own routes; the latency table is shared, so restore it after
    saved = dict(split._latency)
    try:
        split._latency.clear()
        split._latency.update({(1,): 1e-3, (2,): 2e-3, (4,): 4e-3, (8,): 8e-3, (16,): 16e-3, (20,): 40e-3})
        split._runners.clear()
        route = split.dispatcher.route([(19, 8)], split._latency)
        assert route.split is not None and [(a, b) for a, b, _ in route.split[1]] == [(0, 16), (16, 18), (18, 19)]
        before = compile_counter.count
        got = [split(_x(n)) for n in (9, 19, 13)]
        assert compile_counter.count == before
        for n, y in zip((9, 19, 13), got):
            assert isinstance(y, jax.Array) and y.shape == (n, 6)
            assert_close(y, affine(jnp.asarray(_x(n)), params))
    finally:
        split._latency.clear()
        split._latency.update(saved)


def test_warm_up_prepares_every_profile_and_measures_it(tmp_path):
    params = affine_params()
    tb.compile(affine, args=[batch_info(), params], padding=ROWS).save(tmp_path / "a")
    exe = tb.load(tmp_path / "a", warmup="now")
    assert all(p.warm and p.call is not None for p in exe.compiled.profiles)
    assert set(exe._latency) == {(n,) for n in (1, 2, 4, 8, 16, 20)} and all(v > 0 for v in exe._latency.values())
    lazy = tb.load(tmp_path / "a", warmup="none")
    assert not any(p.warm or p.call is not None for p in lazy.compiled.profiles) and not lazy._latency
    assert_close(lazy(_x(5)), affine(_x(5), params))  # runs (and warms) the batch-8 profile
    lazy.warm_up()  # a profile a call used first is still timed, so splits can be planned over it
    assert set(lazy._latency) == set(exe._latency)
    background = tb.load(tmp_path / "a")
    assert_close(background(_x(7)), affine(_x(7), params))  # served while the thread warms up
    with pytest.raises(tb.TripyBuildError, match="warmup='later'"):
        tb.load(tmp_path / "a", warmup="later")
