"""``tripy_build.runtime``: a built artifact run without importing jax, against ``tripy_build.load``.

The runtime shares validation, profiles and padding with ``Executable``; these tests check that it
agrees with it (values, structure, errors), that it really never imports jax, and that a shape no
profile covers still works (through the full executable).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from conftest import assert_close

ROWS = {"batch": "rows"}


def affine(x, params):
    return jnp.tanh(x @ params["w"] + params["b"])


@pytest.fixture(scope="module")
def affine_artifact(tmp_path_factory):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 6)).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)}
    batch = tb.NamedDimension("batch", 1, 4, 20)
    path = tmp_path_factory.mktemp("rt") / "affine"
    tb.compile(affine, args=[tb.InputInfo((batch, 8), "float32"), params], padding=ROWS,
               buckets={"batch": [1, 4, 8, 16]}).save(path)
    return path, params


@pytest.fixture
def background_warm_up(monkeypatch):
    """Loads as a large model's (``warmup.prepare_at_load`` says no: its profiles' preparation would break the
    cold start): ``load`` returns at once and the background warm-up prepares the profiles."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "PREPARE_AT_LOAD_S", 0.0)


def _x(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def test_runtime_matches_the_executable_exact_and_padded(affine_artifact):
    path, params = affine_artifact
    rt, exe = runtime.load(path), tb.load(path, warmup="none")
    for n in (1, 3, 4, 5, 8, 16):
        y = rt(_x(n, n))
        assert isinstance(y, np.ndarray) and y.shape == (n, 6) and y.dtype == np.float32
        assert not y.flags.writeable  # a view of the result buffer
        assert_close(y, np.asarray(exe(_x(n, n))), rtol=1e-6, atol=1e-6)
        assert_close(y, affine(jnp.asarray(_x(n, n)), params))
    assert list(rt.input_infos) == ["x"] and rt.output_infos == exe.output_infos


def test_runtime_never_imports_jax(affine_artifact, tmp_path):
    path, params = affine_artifact
    np.save(tmp_path / "x.npy", _x(3))
    code = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from tripy_build import runtime
        rt = runtime.load({str(path)!r}, warmup="now")
        y = rt(np.load({str(tmp_path / 'x.npy')!r}))
        print(json.dumps({{"jax": "jax" in sys.modules, "y": y.tolist()}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["jax"] is False
    assert_close(np.asarray(out["y"], np.float32), affine(jnp.asarray(_x(3)), params))
    assert "pjrt_client" not in proc.stderr  # jaxlib's INFO lines stay quiet, as under jax


def test_uncovered_shape_falls_back_to_the_full_executable(affine_artifact):
    path, params = affine_artifact
    rt = runtime.load(path)
    y = rt(_x(19))  # batch 19 > the largest bucket (16): compiled once, through jax
    assert isinstance(y, np.ndarray) and y.shape == (19, 6)
    assert_close(y, affine(jnp.asarray(_x(19)), params))


def test_runtime_errors_are_the_executables(affine_artifact):
    path, _ = affine_artifact
    rt, exe = runtime.load(path), tb.load(path, warmup="none")
    for bad in ([_x(21)], [_x(3).astype(np.float64)], [_x(3), _x(3)], [[1.0] * 8], []):
        with pytest.raises(tb.TripyBuildError) as ours:
            rt(*bad)
        with pytest.raises(tb.TripyBuildError) as theirs:
            exe(*bad)
        assert str(ours.value) == str(theirs.value)


def test_runtime_keeps_structure_named_dims_and_bound_inputs(pair_exe, nested_exe, tmp_path, rng):
    pair_exe.save(tmp_path / "pair")
    rt = runtime.load(tmp_path / "pair")
    a, b = rng.standard_normal((5, 5)).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32)
    s, p = rt(a, b)
    assert_close(s, a + b)
    assert_close(p, a * b)
    with pytest.raises(tb.TripyBuildError, match="NamedDimension 'batch' must have one size"):
        rt(a, b[:4])

    exe, fn = nested_exe
    exe.save(tmp_path / "nested")
    d = {"a": rng.standard_normal((2, 3)).astype(np.float32),
         "b": [rng.standard_normal(3).astype(np.float32), (np.arange(2, dtype=np.int32), np.ones(2, np.int32))]}
    got = runtime.load(tmp_path / "nested")(d=d)
    want = fn(d, 2.5)
    assert type(got) is type(want) and len(got) == 2
    for g, w in zip(got, want):
        assert_close(g, np.asarray(w))

    def scaled(x, scale):
        return x * scale

    batch = tb.NamedDimension("batch", 1, 2, 4)
    exe = tb.compile(scaled, args=[tb.InputInfo((batch, 5), "float32"), tb.InputInfo((5,), "float32")])
    exe.bind(scale=np.arange(5, dtype=np.float32)).save(tmp_path / "bound")
    rt = runtime.load(tmp_path / "bound")
    assert list(rt.input_infos) == ["x"]
    assert_close(rt(a[:3]), a[:3] * np.arange(5, dtype=np.float32))


def test_runtime_checks_digests_first(affine_artifact, tmp_path):
    import shutil

    path, _ = affine_artifact
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    weight = next((copy / "weights").iterdir())
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0xFF
    weight.write_bytes(bytes(data))
    with pytest.raises(tb.TripyBuildError, match=f"weights/{weight.name}: blake3"):
        runtime.load(copy)
    with pytest.raises(tb.TripyBuildError, match="warmup='soon'"):
        runtime.load(path, warmup="soon")


def test_weights_are_read_ahead_in_order_within_the_read_ahead_bound(tmp_path, monkeypatch):
    """``Contents.take_weights``: each weight checked, in the order asked, at most READ_AHEAD_BYTES read beyond
    the one the caller holds; a damaged weight stops the stream when it is reached, naming its file."""
    import threading

    from tripy_build.artifact import read

    weights = {f"w{i}": np.full((64, 64), i, np.float32) for i in range(6)}  # 16 KiB each
    tb.compile(lambda x, p: x @ sum(p.values()), args=[tb.InputInfo((2, 64), "float32"), weights]).save(tmp_path / "a",
                                                                                               weights="raw")
    contents = read.read_contents(tmp_path / "a")
    entries = list(contents.manifest.weights)
    started, lock = [], threading.Lock()
    take = read.Contents.take_weight

    def counted(self, entry):
        with lock:
            started.append(entry.file)
        return take(self, entry)

    monkeypatch.setattr(read.Contents, "take_weight", counted)
    monkeypatch.setattr(read, "READ_AHEAD_BYTES", 2 * 64 * 64 * 4)
    for i, value in enumerate(contents.take_weights(entries)):
        assert value.shape == (64, 64) and len(set(value.ravel().tolist())) == 1
        assert len(started) <= i + 3, (i, started)  # the one held and at most two ahead
    assert started == [e.file for e in entries]
    assert sorted(float(contents.take_weight(e)[0, 0]) for e in entries) == list(range(6))

    damaged = tmp_path / "a" / entries[3].file
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    got = []
    with pytest.raises(tb.TripyBuildError, match=f"{entries[3].file}: blake3"):
        for value in contents.take_weights(entries):
            got.append(value)
    assert len(got) == 3


@pytest.mark.parametrize("loader", ["runtime", "tb.load"])
def test_weights_are_placed_where_they_were_read_without_a_copy(tmp_path, monkeypatch, loader):
    """A weight file of ``ALIGNED_MIN_BYTES`` or more is read into page-aligned memory, whose array XLA then
    uses as the device buffer (a model's weights held once); a smaller one is read as bytes and copied."""
    from tripy_build.artifact import read

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((256, 128)).astype(np.float32), "b": rng.standard_normal(128).astype(np.float32)}
    assert params["w"].nbytes >= read.ALIGNED_MIN_BYTES > params["b"].nbytes
    exe = tb.compile(affine, args=[tb.InputInfo((tb.NamedDimension("batch", 1, 2, 4), 256), "float32"), params])
    exe.save(tmp_path / "a")
    read_arrays = []
    from_npy = read.from_npy

    def recorded(data, where, dtype=None):
        array = from_npy(data, where, dtype)
        read_arrays.append((array.shape, (array, type(data))))
        return array

    monkeypatch.setattr(read, "from_npy", recorded)
    loaded = runtime.load(tmp_path / "a", warmup="none") if loader == "runtime" else tb.load(tmp_path / "a", warmup="none")
    arrays = dict(read_arrays)
    (w, w_read), (b, b_read) = arrays.pop((256, 128)), arrays.popitem()[1]
    assert b.shape == (1, 128) and b_read is bytes  # the bias, as prep left it: read as bytes (XLA copies it)
    assert w_read is memoryview
    assert not w.flags.writeable and w.ctypes.data % 64 == 0
    assert w.ctypes.data in {buffer.unsafe_buffer_pointer() for buffer in loaded._leading}  # the array read is placed
    x = rng.standard_normal((3, 256)).astype(np.float32)
    assert_close(loaded(x), affine(jnp.asarray(x), params))


def test_a_weight_file_is_read_whole_where_the_kernel_returns_it_in_parts(tmp_path, monkeypatch):
    """Linux returns at most 0x7ffff000 bytes from one read(2): a weight file past 2 GiB (Llama-3-8B's float32
    embeddings) was read short, and the load refused the artifact as damaged. Here every read returns at most 64 KiB
    of a 600 KiB weight; it is read whole, and both loaders run the model with it."""
    import io

    from tripy_build.artifact import read

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((1200, 128)).astype(np.float32), "b": rng.standard_normal(128).astype(np.float32)}
    x = rng.standard_normal((2, 1200)).astype(np.float32)
    tb.compile(affine, args=[tb.InputInfo((tb.NamedDimension("batch", 1, 2, 4), 1200), "float32"), params]).save(
        tmp_path / "a")

    class Short(io.FileIO):
        def readinto(self, buffer):
            return super().readinto(memoryview(buffer)[:64 << 10])
    reads = []

    def opened(path, mode="r", buffering=-1, **kwargs):
        reads.append(path)
        return Short(path, mode) if buffering == 0 else open(path, mode, buffering, **kwargs)
    monkeypatch.setattr(read, "open", opened, raising=False)
    for loader in (runtime.load, tb.load):
        assert_close(loader(tmp_path / "a", warmup="none")(x), affine(jnp.asarray(x), params))
    assert any(str(p).endswith(".npy") for p in reads)


def test_runtime_takes_jax_arrays_from_a_process_that_uses_jax(affine_artifact):
    """jax's arrays live in jax's PJRT client, not the runtime's: they are read as host arrays."""
    import jax

    path, params = affine_artifact
    rt = runtime.load(path)
    rt(_x(4))  # numpy first: the fast path for this shape must still convert jax arrays
    x = jax.device_put(_x(4))
    assert_close(rt(x), affine(x, params))
    assert_close(rt(jax.device_put(_x(5))), affine(jnp.asarray(_x(5)), params))  # padded


def test_outputs_of_dtypes_dlpack_lacks_come_back(tmp_path):
    """bfloat16 and float8 results have no DLPack code: the runtime copies them to the host instead of failing."""
    import ml_dtypes

    def f(x):
        return (x * 2).astype(jnp.bfloat16), x.astype(jnp.float8_e4m3fn), x + 1

    exe = tb.compile(f, args=(tb.InputInfo((tb.NamedDimension("b", 1, 2, 4), 3), "float32"),))
    exe.save(tmp_path / "narrow")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    got = runtime.load(tmp_path / "narrow", warmup="now")(x)
    want = exe(x)
    assert [g.dtype for g in got] == [np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn), np.float32]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_background_warm_up_prepares_every_profile_and_then_yields_to_calls(affine_artifact, background_warm_up):
    """The default warm-up deserializes and runs each profile once, on a thread that yields every core to calls
    once it has prepared the profiles whose first call would have been late."""
    import os
    import threading

    from tripy_build.runtime import warmup

    path, params = affine_artifact
    rt = runtime.load(path)  # warmup="background"
    y = rt(_x(3))  # a call while the thread works: it prepares its own profile if the thread has not
    assert_close(y, affine(jnp.asarray(_x(3)), params))
    for t in [t for t in threading.enumerate() if t.name == "tripy_build-warmup"]:
        t.join(30)
    assert rt._ran == set(rt._profiles) == {(1,), (4,), (8,), (16,)}

    # the profiles whose first call would be late at the normal class, the rest at the idle one
    seen = []

    def run(p):
        seen.append((p, os.sched_getscheduler(0)))
        return warmup.Warmed(prepare_s=1.0 if p < (2,) else 0.0, steady_s=0.0)  # (0,), (1,) late; (2,) on time

    warmup.start(lambda: warmup.warm_in_order([(0,), (1,), (2,), (3,)], run, lambda p: None, 0, limit=1.0)).join(30)
    normal = os.sched_getscheduler(0)
    assert normal != os.SCHED_IDLE  # the caller's own thread is untouched
    assert seen == [((0,), normal), ((1,), normal), ((2,), normal), ((3,), os.SCHED_IDLE)]


def _wait_for(condition, timeout=30.0):
    """Until ``condition()`` holds (the warm-up thread's progress), then a moment more for anything it should not do."""
    import time

    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)


def _join_warmups():
    import threading

    for t in [t for t in threading.enumerate() if t.name == "tripy_build-warmup"]:
        t.join(30)


def test_the_warm_up_runs_no_profile_that_costs_more_flops_than_its_limit(affine_artifact, background_warm_up,
                                                                          monkeypatch):
    """A profile XLA counts above ``RUN_LIMIT_FLOPS`` is deserialized, never run on zeros (a run of ViT's
    opt profile held the cores for 1.6 s after load), once the warm-up has found a profile whose first call
    would be on time: the smallest is run to learn that. ``warmup="now"`` still runs every profile."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)  # every first call on time: the flops decide
    path, params = affine_artifact
    probe = runtime.load(path, warmup="none")
    flops = {t: probe._profile(t).loaded.cost_analysis()["flops"] for t in probe._profiles}
    assert flops[(1,)] < flops[(4,)] < flops[(8,)] < flops[(16,)]

    monkeypatch.setattr(warmup, "RUN_LIMIT_FLOPS", (flops[(4,)] + flops[(8,)]) / 2)
    rt = runtime.load(path)
    _join_warmups()
    assert rt._ran == {(1,), (4,)} and set(rt._compiled) == set(rt._profiles)
    exe = tb.load(path)
    _join_warmups()
    assert {p.target for p in exe.compiled.profiles if p.warm} == {(1,), (4,)}
    assert all(p.call is not None for p in exe.compiled.profiles)

    monkeypatch.setattr(warmup, "RUN_LIMIT_FLOPS", flops[(1,)] / 2)  # the opt profile (4,) too: only the smallest runs
    rt = runtime.load(path)
    _join_warmups()
    assert rt._ran == {(1,)} and set(rt._compiled) == set(rt._profiles)
    assert_close(rt(_x(5)), affine(jnp.asarray(_x(5)), params))
    assert runtime.load(path, warmup="now")._ran == set(rt._profiles)
    import os

    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # "now" warms on this thread, which keeps its class


def test_a_warm_up_of_large_profiles_waits_while_a_call_is_in_flight(affine_artifact, background_warm_up, call_in_flight,
                                                                     monkeypatch):
    """A profile whose executable is over QUIET_ABOVE_BYTES (BERT-base's: 100-150 ms of deserializing on XLA's
    own pool threads, at the normal scheduling class), and whose first call could prepare it on time, is not
    started while any call in the process is in flight, nor until QUIET_S after the last one ends; both
    loaders. The smallest profile is prepared at once, which is how the warm-up learns that, and the
    runtime's opt profile (deserialized during the load) is run at once."""
    import time

    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)  # every profile counts as large
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)  # and every first call is on time
    path, params = affine_artifact
    rt = runtime.load(path)  # warmup="background"
    exe = tb.load(path)
    _wait_for(lambda: {rt._opt, (1,)} <= rt._ran and any(p.warm for p in exe.compiled.profiles if p.target == (1,)))
    assert set(rt._compiled) == rt._ran == {rt._opt, (1,)}
    assert [p.target for p in exe.compiled.profiles if p.call is not None] == [(1,)]
    assert_close(rt(_x(3)), affine(jnp.asarray(_x(3)), params))  # calls are served meanwhile
    assert_close(exe(_x(3)), affine(jnp.asarray(_x(3)), params))
    call_in_flight.set()
    time.sleep(0.01)
    ended = time.monotonic()
    _join_warmups()
    assert set(rt._compiled) == set(rt._profiles) and all(p.call is not None for p in exe.compiled.profiles)
    assert time.monotonic() - ended >= warmup.QUIET_S - 0.01


def test_wait_warmed_waits_for_the_background_warm_up_or_its_timeout(affine_artifact, background_warm_up, call_in_flight,
                                                                     monkeypatch):
    """``wait_warmed`` returns False while the warm-up still has profiles to prepare (held back here by a call
    in flight), True once it is done, with every profile prepared, and at once when no warm-up was started."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)  # every profile waits for a quiet moment
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)  # none is late: the first pass takes only the smallest
    path, params = affine_artifact
    loaded = [runtime.load(path), tb.load(path)]
    for one in loaded:
        assert one.wait_warmed(timeout=0.3) is False
    assert set(loaded[0]._compiled) != set(loaded[0]._profiles)
    assert not all(p.call is not None for p in loaded[1].compiled.profiles)
    call_in_flight.set()
    for one in loaded:
        assert one.wait_warmed(timeout=30) is True
        assert one.wait_warmed(timeout=0) is True
    assert set(loaded[0]._compiled) == set(loaded[0]._profiles)
    assert all(p.call is not None for p in loaded[1].compiled.profiles)
    for warm in ("none", "now"):
        assert runtime.load(path, warmup=warm).wait_warmed(timeout=0) is True
        assert tb.load(path, warmup=warm).wait_warmed(timeout=0) is True


def test_a_warm_up_of_small_profiles_goes_on_beside_calls(affine_artifact, background_warm_up, call_in_flight,
                                                          monkeypatch):
    """Small profiles (the zoo's deserialize in 2-10 ms) cost a call less than preparing its own would: the
    warm-up does not wait for calls."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 1 << 40)
    monkeypatch.setattr(warmup, "RUN_LIMIT_S", 10.0)  # every profile is run, however loaded the machine
    path, _ = affine_artifact
    rt = runtime.load(path)
    exe = tb.load(path)
    _join_warmups()  # while the call is still in flight
    assert rt._ran == set(rt._profiles) and all(p.warm for p in exe.compiled.profiles)


def test_a_warm_up_prepares_at_once_every_profile_whose_first_call_would_be_late(affine_artifact, background_warm_up,
                                                                                 call_in_flight, monkeypatch):
    """A profile that costs more to deserialize and run once than twice its next run plus
    ``FIRST_CALL_MARGIN_S`` (BERT-base's under ~200 tokens: 150-280 ms against 17-100) is deserialized and run
    at once, beside a call in flight, whatever its size and flops: left to the call that needs it, a stream
    without pauses stalled at each one's first use. Both loaders; here every profile counts as late, large
    and costly."""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)
    monkeypatch.setattr(warmup, "RUN_LIMIT_FLOPS", 0.0)
    monkeypatch.setattr(warmup, "FIRST_CALL_FACTOR", 0.0)
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 0.0)
    path, params = affine_artifact
    rt = runtime.load(path)
    exe = tb.load(path)
    _join_warmups()  # while the call is still in flight
    assert rt._ran == set(rt._profiles) and all(p.warm for p in exe.compiled.profiles)
    assert_close(rt(_x(3)), affine(jnp.asarray(_x(3)), params))
    assert_close(exe(_x(3)), affine(jnp.asarray(_x(3)), params))

    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)  # none late: the smallest only, the rest wait
    rt = runtime.load(path)
    exe = tb.load(path)
    _wait_for(lambda: (1,) in rt._ran and any(p.warm for p in exe.compiled.profiles if p.target == (1,)))
    assert rt._ran == {(1,)} and [p.target for p in exe.compiled.profiles if p.warm] == [(1,)]
    call_in_flight.set()
    _join_warmups()  # the rest only deserialized (all count as costly)
    assert rt._ran == {(1,)} and set(rt._compiled) == set(rt._profiles)
    assert all(p.call is not None for p in exe.compiled.profiles)


def test_the_first_pass_prepares_every_profile_not_above_one_found_on_time():
    """Over a 2-D grid (BERT's batch x seq), a profile is left to the second pass only when it is no smaller
    in every dim than one whose first call was found on time: (1, 2) on time does not vouch for (4, 1)."""
    from tripy_build.runtime import warmup

    late = {(1, 1), (2, 1)}
    grid = sorted([(1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1)], key=lambda t: t[0] * t[1])
    seen, deserialized = [], []

    def run(p):
        seen.append(p)
        return warmup.Warmed(prepare_s=1.0 if p in late else 0.0, steady_s=0.1)  # steady over the limit

    warmup.start(lambda: warmup.warm_in_order(grid, run, deserialized.append, 0, limit=0.05)).join(30)  # it yields its thread
    assert seen == [(1, 1), (1, 2), (2, 1), (4, 1)]  # (4, 1): above no profile found on time
    assert deserialized == [(2, 2), (1, 4)]  # the second pass: runs had passed the limit, so only deserialized


def test_the_hosts_cpu_features_are_probed_once_per_jaxlib_and_cpu(monkeypatch, tmp_path):
    """The probe compile runs once; later processes read its answer from the cache, and a damaged
    cache entry is probed again and rewritten."""
    from tripy_build import host
    from tripy_build.runtime import pjrt

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(host, "_HOST_ISA", [])
    client = pjrt.client()
    probed = host.host_isa(client)
    assert probed and probed["isa"]
    (entry,) = (tmp_path / "tripy_build" / "host_isa").iterdir()
    assert json.loads(entry.read_text()) == probed

    def no_probe(client):
        raise AssertionError("probed again despite the cache")

    monkeypatch.setattr(host, "_HOST_ISA", [])
    monkeypatch.setattr(host, "_probe_isa", no_probe)
    assert host.host_isa(client) == probed

    entry.write_text('{"cpu": "x", "isa": [1')  # torn or damaged
    monkeypatch.setattr(host, "_HOST_ISA", [])
    monkeypatch.setattr(host, "_probe_isa", lambda client: probed)
    assert host.host_isa(client) == probed
    assert json.loads(entry.read_text()) == probed

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")  # another answer: another entry
    assert host._isa_cache_path() != entry


def test_the_warm_up_memory_budget_is_the_weights_size_and_counts_what_the_process_holds():
    from tripy_build.runtime.warmup import MIN_BUDGET_BYTES, MemoryBudget

    assert MemoryBudget(10).limit == MIN_BUDGET_BYTES and MemoryBudget(1 << 30).limit == 1 << 30
    budget = MemoryBudget(0)
    assert not budget.spent()
    held = np.ones(MIN_BUDGET_BYTES // 4 + (16 << 20), np.float32)  # touched: resident
    assert budget.spent()
    del held


# --- what load prepares before it returns (warmup.prepare_at_load) ------------------------------------------

def test_a_small_artifacts_profiles_are_all_prepared_when_load_returns(affine_artifact, call_in_flight, monkeypatch):
    """Profiles the background would hold back for quiet moments (here every one counts as over
    ``QUIET_ABOVE_BYTES``, as the 2-layer BERT's 270 KB do, and none as late), and few bytes in all
    (``prepare_at_load``): both loaders prepare them all before ``load`` returns, a call in flight (another
    model's) notwithstanding, and time them for split plans in the background once calls pause. (The 2-layer
    BERT's, left to the background, stalled 13-14 of 150 calls right after load.)"""
    from tripy_build.runtime import warmup

    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)
    path, params = affine_artifact
    rt, exe = runtime.load(path), tb.load(path)  # warmup="background", the default
    assert rt._ran == set(rt._compiled) == set(rt._profiles) == {(1,), (4,), (8,), (16,)}
    assert all(p.warm and p.call is not None for p in exe.compiled.profiles)
    assert warmup.prepare_at_load(list(rt._sizes.values())) and warmup.prepare_at_load(exe._prepare_sizes())
    assert not rt._latency and not exe._latency  # timed once calls pause
    call_in_flight.set()
    assert rt.wait_warmed(timeout=30) is True and exe.wait_warmed(timeout=30) is True
    assert set(rt._latency) == set(rt._profiles) and set(exe._latency) == {p.target for p in exe.compiled.profiles}
    assert_close(rt(_x(3)), affine(jnp.asarray(_x(3)), params))
    assert_close(exe(_x(3)), affine(jnp.asarray(_x(3)), params))
    untrusted = tb.load(path, trust_executables=False)  # preparing is compiling here: never at load
    assert untrusted._prepare_sizes() is None and not any(p.warm for p in untrusted.compiled.profiles)
    untrusted.wait_warmed(60)


def test_a_large_artifact_keeps_the_background_warm_up(affine_artifact, call_in_flight, monkeypatch):
    """The same artifact as a large one, through the rule's input (its executables' bytes against the rate they
    prepare at): ``load`` returns with the profiles left to the background thread, which a call in flight holds
    back here (every profile counting as large, none as late), both loaders."""
    from tripy_build.runtime import warmup

    path, _ = affine_artifact
    sizes = list(runtime.load(path, warmup="none")._sizes.values())
    monkeypatch.setattr(warmup, "QUIET_ABOVE_BYTES", 0)
    monkeypatch.setattr(warmup, "PREPARE_BYTES_PER_S", sum(sizes) / (2 * warmup.PREPARE_AT_LOAD_S))  # 2 s to prepare
    assert not warmup.prepare_at_load(sizes) and warmup.prepare_at_load(sizes[:1])
    monkeypatch.setattr(warmup, "FIRST_CALL_MARGIN_S", 1e3)
    rt, exe = runtime.load(path), tb.load(path)
    assert rt.wait_warmed(timeout=0.3) is False and exe.wait_warmed(timeout=0.3) is False
    assert rt._ran != set(rt._profiles) and not all(p.warm for p in exe.compiled.profiles)
    assert not rt._latency and not exe._latency  # nor timed for split plans beside the call
    call_in_flight.set()
    assert rt.wait_warmed(timeout=30) is True and exe.wait_warmed(timeout=30) is True
    assert set(rt._compiled) == set(rt._profiles) and all(p.call is not None for p in exe.compiled.profiles)


def test_the_rule_prepares_at_load_what_the_background_would_hold_back_when_it_is_little():
    """~10 MB of executables at most (a second at ``PREPARE_BYTES_PER_S``), some of them over
    ``QUIET_ABOVE_BYTES``: the 2-layer BERT's 28 profiles of ~270 KB (7.3 MB) are prepared at load; BERT-base's
    50 of ~750 KB (37 MB) in the background, as are profiles the background prepares beside calls (the zoo's
    transformer block's 63 of ~100 KB, GEGLU's 7 of 22 KB) and profiles compiled here (None)."""
    from tripy_build.runtime import warmup

    assert warmup.prepare_at_load([270_000] * 28)  # BERT, 2 layers of hidden 32
    assert not warmup.prepare_at_load([750_000] * 50)  # BERT-base
    assert not warmup.prepare_at_load([100_000] * 63) and not warmup.prepare_at_load([22_000] * 7)
    assert not warmup.prepare_at_load(None)
    most = int(warmup.PREPARE_AT_LOAD_S * warmup.PREPARE_BYTES_PER_S)
    assert warmup.prepare_at_load([most - 300_000, 300_000]) and not warmup.prepare_at_load([most - 300_000, 300_001])


# --- the latencies split plans use (warmup.calibrate) --------------------------------------------------------

def test_split_latencies_come_only_from_rounds_no_call_came_into():
    """``calibrate`` times every profile once per round, keeps a round only if no call started during it, and
    gives each profile's lower quartile over the kept rounds; a profile over ``RUN_LIMIT_S`` is dropped. With
    calls in flight throughout it gives nothing (then calls pad), rather than timings taken beside them (the
    warm-up's own, beside ``tripy-build bench``'s stream, made GEGLU's 64 profile look 2x its cost)."""
    from tripy_build.runtime import warmup

    rounds: list[int] = []

    def time_one(p):
        if p == 1:
            rounds.append(len(rounds))
        if len(rounds) in (2, 4) and p == 8:  # a call arrives during the second and fourth rounds
            with warmup.calls:
                pass
            return 1.0
        return 30.0 if p == 16 else p * 1e-3 * (1 + len(rounds) / 100)

    got = warmup.calibrate([1, 4, 8, 16], time_one, quiet=False)
    assert len(rounds) == 7  # five kept, two dropped
    kept = [r for r in range(1, 8) if r not in (2, 4)]
    assert got == {p: p * 1e-3 * (1 + kept[1] / 100) for p in (1, 4, 8)}  # the second fastest of five; 16: too slow


def test_no_split_latencies_while_calls_are_always_in_flight(call_in_flight):
    """Without a quiet round (a call in flight throughout, as a server's under a steady stream) nothing is timed."""
    from tripy_build.runtime import warmup

    timed = []
    assert warmup.calibrate([1, 4], lambda p: timed.append(p) or 1e-3, quiet=False) == {}
    assert timed == []


def test_both_loaders_split_a_rows_dim_by_their_latencies_and_agree(affine_artifact):
    """A padded call along a rows dim runs as bucket-sized calls where the loader's latencies say so, with the
    same result as padding; both loaders plan alike from the same latencies."""
    path, params = affine_artifact
    compute_bound = {(1,): 1e-3, (4,): 4e-3, (8,): 8e-3, (16,): 40e-3}  # 13 rows: 8 + 4 + 1 beats one call at 16
    for loaded in (runtime.load(path, warmup="now"), tb.load(path, warmup="now")):
        route = loaded.dispatcher.route(((13, 8),), compute_bound)
        assert [(a, b) for a, b, _ in route.split[1]] == [(0, 8), (8, 12), (12, 13)]
        padded = np.asarray(loaded(_x(13)))
        loaded._latency.clear()
        loaded._latency.update(compute_bound)
        loaded._fast.clear()
        getattr(loaded, "_runners", {}).clear()
        split = np.asarray(loaded(_x(13)))
        assert split.shape == (13, 6)
        assert_close(split, affine(jnp.asarray(_x(13)), params))
        np.testing.assert_allclose(split, padded, rtol=1e-6, atol=1e-6)


def test_profiles_too_slow_to_time_are_estimated_from_their_work():
    """A profile ``calibrate`` does not time (over ``RUN_LIMIT_S``, too costly to run, or found slow beside the
    calls) gets the time per flop of the timed one nearest below it in work (the least one below them all): a
    split plan needs the latency of every bucket up to the one a call would pad to, so without it no call
    padding past 20 ms was ever split (BERT-base: none). Those XLA gives no count for stay without one."""
    from tripy_build.runtime import warmup

    latency = {2: 1e-3, 8: 3e-3}
    counts = {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0, 16: 1600.0, 32: None}
    assert warmup.extrapolate(latency, counts) == {1: 0.5e-3, 2: 1e-3, 4: 2e-3, 8: 3e-3, 16: 6e-3}
    assert warmup.extrapolate({}, counts) == {} and warmup.extrapolate(latency, {}) == latency


def test_both_loaders_estimate_the_profiles_they_did_not_time(affine_artifact, monkeypatch):
    """Through both loaders' calibration: with only the smallest profile timed, the others get estimates from
    their deserialized executables' flops, each larger than the last."""
    import tripy_build.runtime.executable as executable_module
    import tripy_build.runtime.runtime as runtime_module

    path, _ = affine_artifact
    fake = lambda profiles, *a, **k: {sorted(profiles, key=np.prod)[0]: 1e-3}  # noqa: E731
    monkeypatch.setattr(runtime_module, "calibrate", fake)
    monkeypatch.setattr(executable_module, "calibrate", fake)
    for loaded in (runtime.load(path, warmup="now"), tb.load(path, warmup="now")):
        latency = loaded._latency
        assert sorted(latency) == [(1,), (4,), (8,), (16,)] and latency[(1,)] == 1e-3
        assert latency[(1,)] < latency[(4,)] < latency[(8,)] < latency[(16,)]
