"""Warming profiles in the background: the threads that do it, and stopping them before the interpreter exits.

A profile's first run costs 1-20 ms more than the next on the zoo's models, 60-170 ms on BERT-base's
(XNNPACK and YNNPACK prepare the executable), on top of deserializing it (2-10 ms; BERT-base: ~110);
both loaders' ``warm_up`` runs each once so that no call pays for it, in a daemon thread registered
here. A daemon thread killed inside XLA while Python shuts down aborts the process, so at exit each
stops after the profile it is running.

The thread first prepares, at the normal scheduling class, the profiles whose first call would be late
(``Warmed.late``), then moves to the idle class (Linux's ``SCHED_IDLE``) for the rest, and waits for a
quiet moment (``calls``) before each large one of those: XLA deserializes on threads of its client's
own pool, at the normal class, so the idle class of the thread that asks does not reach that work
(``warm_in_order``). Deserializing releases the GIL, so a call is not held up behind it either.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence


RUN_LIMIT_S = 0.020
"""Warm-up runs profiles (cheapest first) until one takes longer than this; the rest it only deserializes.
A first run costs 1-20 ms more than the next, which is noise beside a profile this slow, while running it
on zeros would keep XLA's worker threads (at the normal scheduling class) from the calls for as long."""


RUN_LIMIT_FLOPS = 2e9
"""Nor does it run a profile that XLA's cost analysis counts at more floating-point operations than this
(~20 ms at the ~100 GFLOP/s two cores reach here); it only deserializes it. Measuring a run cannot
tell in advance, and one run is the harm: ViT-B/16's opt profile (batch 8, 285 GFLOP) ran 1.6 s on
zeros after load, and the calls made meanwhile took twice their steady time (batch 1: 456 ms against
204). The zoo's small models stay under it (the transformer block's opt profile: 0.9 GFLOP)."""


def flops(executable: Any) -> float | None:
    """The floating-point operations XLA's cost analysis counts for a deserialized executable (jaxlib's or
    jax's; both have ``cost_analysis``); None where it gives no count."""
    try:
        cost = executable.cost_analysis()
    except Exception:  # noqa: BLE001 - an executable without a cost model has no count
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    count = cost.get("flops") if isinstance(cost, dict) else None
    return float(count) if count is not None and float(count) > 0 else None


def too_costly(executable: Any) -> bool:
    """Whether a deserialized executable does more than ``RUN_LIMIT_FLOPS``; False where XLA gives no count."""
    count = flops(executable)
    return count is not None and count > RUN_LIMIT_FLOPS


QUIET_S = 0.050
"""The warm-up starts a large profile only after this long with no call in flight (``Calls``)."""


QUIET_ABOVE_BYTES = 192 << 10
"""Profiles whose executable is larger wait for a quiet moment; smaller ones are prepared beside calls.
XLA deserializes ~10 MB/s here, so this is ~20 ms of work on a core the calls want: the transformer
block's profiles (~100 KB) take 8 ms, ResNet-50's (216 KB) 20-30, BERT-base's and ViT-B/16's (700-800 KB)
100-180. The small ones cost a call less than preparing its own profile would (the 63-profile
transformer block: 15 stalls in 200 calls right after load when all of them waited, 1 when none did);
the large ones would slow every call made meanwhile by as much (BERT-base at 1x128: 250 ms per call
instead of 140 for the 4 s its warm-up deserialized 25 profiles beside them)."""


class Calls:
    """The calls in flight in this process, through either loader, and when the last one ended: what the
    warm-up waits on before each large profile (``wait_quiet``, ``QUIET_ABOVE_BYTES``).

    Why it must wait rather than rely on its idle scheduling class: XLA deserializes an executable on a
    thread of its client's pool, at the normal class, whichever thread asked. BERT-base's calls at 1x128
    took 250 ms instead of 140 for the ~4 s its warm-up deserialized 25 profiles beside them. Those pool
    threads could be put in the idle class, but an unprivileged thread cannot leave it (Linux), and a call
    that needs its own profile prepared would then wait behind any other work on the machine. So the
    warm-up yields instead: a call that arrives while a profile is being prepared shares the cores with
    that one profile at most, and a stream of calls with no pause of ``QUIET_S`` never meets the warm-up
    (a call then prepares the profile it needs itself). ``tb.load``'s calls return once dispatched (jax's
    CPU dispatch is asynchronous), so for it "in flight" ends at the dispatch, not at the result.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._ended = 0.0
        self._started = 0

    def __enter__(self) -> None:
        with self._cond:
            self._active += 1
            self._started += 1

    def token(self) -> int | None:
        """None while a call is in flight; else a token that ``token()`` returns again only while no call
        has started since (``calibrate`` keeps a round of timings only if none came in during it)."""
        with self._cond:
            return None if self._active else self._started

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._active -= 1
            self._ended = time.monotonic()

    def wait_quiet(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Return once no call has been in flight for ``QUIET_S`` (or ``stop()``)."""
        with self._cond:
            while not stop():
                left = QUIET_S if self._active else self._ended + QUIET_S - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)


calls = Calls()
"""This process's: a server holding several artifacts warms none of them while any serves a call."""


MIN_BUDGET_BYTES = 64 << 20


class MemoryBudget:
    """How much resident memory the warm-up may add by deserializing the profiles it does not run: as much
    as the weights, and at least 64 MiB. A deserialized profile holds from ~1 MB (the transformer block) to
    ~18 MB (BERT-base, whose 50 profiles would hold 0.9 GB); those it leaves are deserialized by their
    first call, which costs little beside a profile that takes over ``RUN_LIMIT_S``. Measured as the
    process's resident set (Linux); elsewhere unbounded."""

    def __init__(self, weight_bytes: int):
        self.limit = max(int(weight_bytes), MIN_BUDGET_BYTES)
        self.start = _rss_bytes()

    def spent(self) -> bool:
        now = _rss_bytes()
        return self.start is not None and now is not None and now - self.start > self.limit


FIRST_CALL_FACTOR, FIRST_CALL_MARGIN_S = 2.0, 0.001
"""A profile's first call is on time if it costs at most this factor of its steady latency plus this margin
(issue 21's rule; ``tripy-build bench`` reports against it)."""


@dataclass(frozen=True)
class Warmed:
    """What preparing one profile cost: deserializing it and its first run (``prepare_s``), and its steady
    run after that (``steady_s``: the faster of two in the runtime, the fastest of a few in ``tb.load``)."""

    prepare_s: float
    steady_s: float

    @property
    def late(self) -> bool:
        """Whether a call that found this profile unprepared would have been late (``FIRST_CALL_FACTOR``)."""
        return self.prepare_s > FIRST_CALL_FACTOR * self.steady_s + FIRST_CALL_MARGIN_S


def warm_in_order(profiles: Sequence[Any], run: Callable[[Any], "Warmed | None"], deserialize: Callable[[Any], Any],
                  weight_bytes: int, stop: Callable[[], bool] = lambda: False, limit: float | None = None,
                  costly: Callable[[Any], bool] = lambda p: False, size: Callable[[Any], int] = lambda p: 0,
                  target: Callable[[Any], Sequence[int]] = lambda p: p, quiet: bool = True) -> None:
    """Both loaders' warm-up policy, over ``profiles`` cheapest first, in two passes.

    First, at once and beside any calls, every profile whose first call could be late (``Warmed.late``:
    its preparation costs more than twice its run plus 1 ms, as for BERT-base's profiles under ~200 tokens: 150-280
    ms against 17-100) is deserialized and ``run``, whatever its size or cost. Which those are is learnt by
    preparing them: a profile no smaller in every dim (``target``: its size per dim) than one found on
    time runs at least as long for about the same preparation, so it is left for the second pass; every
    other is prepared. Left to the call that needed it, such a profile stalled a stream of calls at each
    small shape's first use.

    Then the profiles that can wait: ``run`` each until one takes longer than ``limit`` (the steady
    seconds; by default ``RUN_LIMIT_S``) or is ``costly`` (``too_costly``: not run at all), then only
    ``deserialize`` them, within a ``MemoryBudget`` of ``weight_bytes``; one whose executable is over
    ``QUIET_ABOVE_BYTES`` (``size``) waits until ``calls`` is quiet. ``run`` returns None for a profile a
    call already prepared. ``stop`` ends it early (the interpreter exiting). Without ``quiet`` no profile
    waits for ``calls``: a load that prepares its profiles before it returns (``prepare_at_load``) has no call
    of its own to wait for.

    The first pass runs at the normal scheduling class; the thread then moves to the idle class
    (``yield_to_calls``), for good (it cannot come back). At the idle class, a run on zeros (the runtime's
    client runs on the calling thread) got no core while calls kept both busy, so a BERT-base stream met
    as many stalls as with no warm-up at all.
    """
    limit = RUN_LIMIT_S if limit is None else limit
    on_time: list[tuple[int, ...]] = []
    later, running = [], True
    for p in profiles:
        if stop():
            return
        at = tuple(target(p))
        if any(all(a <= b for a, b in zip(o, at)) for o in on_time):
            later.append(p)
            continue
        warmed = run(p)
        if warmed is not None:
            if not warmed.late:
                on_time.append(at)
            running = running and warmed.steady_s <= limit
    yield_to_calls()
    budget = None
    for p in later:
        if quiet and size(p) > QUIET_ABOVE_BYTES:
            calls.wait_quiet(stop)
        if stop():
            return
        if running and not costly(p):
            warmed = run(p)
            running = warmed is None or warmed.steady_s <= limit
            continue
        running = False
        budget = budget or MemoryBudget(weight_bytes)
        if budget.spent():
            return
        deserialize(p)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def fastest_run(run: Callable[[], Any], budget_s: float = 0.004, most: int = 10) -> float:
    """A profile's latency: the fastest of a few calls of ``run`` (which returns once the result is ready),
    at least one, ~``budget_s`` in all, at most ``most``."""
    best, spent, n = float("inf"), 0.0, 0
    while n < most and (n < 2 or spent < budget_s) and not (n >= 1 and spent > budget_s):
        t0 = time.perf_counter()
        run()
        t = time.perf_counter() - t0
        best, spent, n = min(best, t), spent + t, n + 1
    return best


CALIBRATE_ROUNDS, CALIBRATE_MIN_ROUNDS = 5, 3
"""``calibrate`` times each profile in this many interleaved rounds (and gives up with fewer than the second)."""


def calibrate(profiles: Sequence[Any], time_one: Callable[[Any], float], stop: Callable[[], bool] = lambda: False,
              quiet: bool = True, rounds: int | None = None) -> dict[Any, float]:
    """Each profile's latency for split plans (``core.dispatch.split_plan``): the lower quartile of its times
    over ``rounds`` interleaved rounds (the second fastest of 5), each round timing every profile once
    (``time_one``: one run on zeros, waited for), the cheapest first; a profile over ``RUN_LIMIT_S`` in a
    round is not timed again, nor given.

    A split is planned from these, so they must be what a call would see, and the warm-up's own timings are
    not: taken beside the calls that follow ``load`` (and at the idle scheduling class), they were up to 20x
    the steady latency, and ``tripy-build bench`` ran GEGLU's batch 63 as 32 + 32 (0.9 ms) instead of one
    call at 64 (0.84) because the 64 profile had been timed at 1.6 ms beside the stream (0.77 steady). So a
    round starts only at a quiet moment (no call of this process in flight for ``QUIET_S``; without ``quiet``
    it does not wait) and is dropped if a call started during it; interleaving spreads other processes' load
    over every profile alike, and the lower quartile drops the rounds it hit. Not the median: on a quiet
    machine XLA's runs are bimodal (GEGLU's batch 32: 0.44 or 0.75 ms, as its pool's second thread joins the
    work or not), and a median of 5 took either. ``{}`` (no split plans) when fewer than
    ``CALIBRATE_MIN_ROUNDS`` rounds were kept out of four times as many tries, or on ``stop``. Run it on a
    thread at the normal scheduling class: at the idle class a run waits for every other process's work.
    """
    rounds = CALIBRATE_ROUNDS if rounds is None else rounds
    live, samples = list(profiles), {p: [] for p in profiles}
    kept = 0
    for _ in range(4 * rounds):
        if kept == rounds or not live or stop():
            break
        if quiet:
            calls.wait_quiet(stop)
        token = calls.token()
        if token is None:
            if not quiet:
                time.sleep(QUIET_S / 5)
            continue
        times = [time_one(p) for p in live]
        if calls.token() != token:
            continue
        kept += 1
        for p, t in zip(live, times):
            samples[p].append(t)
        live = [p for p, t in zip(live, times) if t <= RUN_LIMIT_S]
    if kept < CALIBRATE_MIN_ROUNDS or stop():
        return {}
    return {p: float(sorted(v)[len(v) // 4]) for p, v in samples.items() if len(v) == kept}


def extrapolate(latency: dict[Any, float], counts: dict[Any, float | None]) -> dict[Any, float]:
    """``latency`` (``calibrate``'s) with each profile it lacks estimated from its work (``counts``: XLA's flops
    per profile) at the time per flop of the timed profile nearest below it in work (the least one, for a
    profile below them all).

    ``calibrate`` times no profile over ``RUN_LIMIT_S`` (nor one ``too_costly`` to run at all, nor one the
    warm-up's own run found over the limit beside the calls), and a split plan needs the latency of every bucket
    up to the one a call would pad to, so without this no call that pads past 20 ms was ever split: the
    transformer block's 34 rows at seq 64 padded to 64 (27 ms) where 32 + 2 took 13, and BERT-base, whose
    profiles from batch 2 are over the limit, never split. A smaller profile does less work per second, so a
    larger one estimated from it comes out slower than it is (the transformer block's 64 at 44 ms against 24
    measured, from its batch-2 profile): a padded call looks dearer, and so do the large chunks of a split,
    which must still win by ``SPLIT_MIN_GAIN``."""
    timed = sorted((counts[k], t) for k, t in latency.items() if counts.get(k))
    if not timed:
        return dict(latency)
    out = dict(latency)
    for k, c in counts.items():
        if c and k not in latency:
            work, seconds = max((w for w in timed if w[0] <= c), default=timed[0])
            out[k] = seconds * c / work
    return out


PREPARE_AT_LOAD_S = 1.0
"""``load`` (both loaders, ``warmup="background"``, the default) prepares every profile before it returns when
that is estimated to take at most this long and the background would hold some back (``prepare_at_load``)."""

PREPARE_BYTES_PER_S = 10e6
"""What the estimate takes preparing a profile to cost: its executable's bytes at this rate (deserializing,
and its first run). Measured on the 2-core VM: the 2-layer BERT's 28 profiles of ~270 KB, 14 ms to deserialize
and 3-8 ms to run first each, 7.3 MB in 0.56 s (13 MB/s); BERT-base's 700-800 KB in 100-180 ms (4-8 MB/s)."""


def prepare_at_load(sizes: Sequence[int] | None) -> bool:
    """Whether a load prepares every profile (``sizes``: their executables' bytes; None: unknown, e.g. compiled
    here) before it returns, by ``warm_in_order``'s policy on the loading thread (no quiet moment waited for, not
    at the idle class, none timed: ``calibrate`` follows in the background): where the background warm-up would
    hold some back for quiet moments (over ``QUIET_ABOVE_BYTES``) and all of them are estimated to prepare within
    ``PREPARE_AT_LOAD_S`` (at most ~10 MB at ``PREPARE_BYTES_PER_S``).

    The 2-layer BERT (hidden 32; batch [1, 8] x seq [1, 64]): its 28 profiles of ~270 KB each wait for quiet
    moments that a stream of calls never leaves, and 13-14 of 150 random calls right after load prepared their
    own (20-50 ms against 0.1-1 ms steady); preparing them at load takes ~0.6 s. BERT-base's (37 MB, 4-15 s)
    stay in the background: before ``load`` returned they would multiply its cold start. So do profiles the
    background prepares beside calls (none over ``QUIET_ABOVE_BYTES``): the zoo's transformer block's 63 of
    ~100 KB stalled 0-2 calls of 150 from the background, and prepared at load took 2 s more to load."""
    return sizes is not None and any(s > QUIET_ABOVE_BYTES for s in sizes) and \
        sum(sizes) / PREPARE_BYTES_PER_S <= PREPARE_AT_LOAD_S


_WARMUPS: set[threading.Thread] = set()
_WARMUPS_LOCK = threading.Lock()
_STOPPING = threading.Event()


def start(target: Callable[[], None], then: Callable[[], None] | None = None) -> threading.Thread:
    """Run ``target`` on a daemon warm-up thread, registered so that exit waits for its current profile.
    The thread starts at the normal scheduling class: ``warm_in_order`` moves it to the idle one. ``then``
    runs once ``target`` is done, on a second such thread that stays at the normal class (``calibrate``
    times runs there: a thread cannot leave the idle class); the thread returned is the last to end."""
    def run(fn: Callable[[], None], after: threading.Thread | None = None) -> None:
        try:
            if after is not None:
                after.join()
            if after is None or not stopping():
                fn()
        finally:
            with _WARMUPS_LOCK:
                _WARMUPS.discard(threading.current_thread())

    first = threading.Thread(target=run, args=(target,), name="tripy_build-warmup", daemon=True)
    threads = [first] + ([threading.Thread(target=run, args=(then, first), name="tripy_build-calibrate", daemon=True)]
                         if then is not None else [])
    with _WARMUPS_LOCK:
        _WARMUPS.update(threads)
    for t in threads:
        t.start()
    return threads[-1]


def yield_to_calls() -> None:
    """Put the calling warm-up thread (``start``'s) in the idle scheduling class, where the OS has one
    (Linux). Any other thread is left as it is: ``warmup="now"`` warms on the caller's own thread."""
    if threading.current_thread() not in _WARMUPS:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread, on Linux
    except (AttributeError, OSError):
        pass


def stopping() -> bool:
    """Whether the interpreter is exiting: a warm-up thread stops before its next profile."""
    return _STOPPING.is_set()


@atexit.register
def _stop_warmups() -> None:
    """Let warm-up threads finish the profile they are running before the interpreter exits.

    A daemon thread killed inside XLA while Python shuts down aborts the process; stopping between
    profiles costs at most one profile's run.
    """
    _STOPPING.set()
    with _WARMUPS_LOCK:
        threads = list(_WARMUPS)
    for t in threads:
        t.join()
