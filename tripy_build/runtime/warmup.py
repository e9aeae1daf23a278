"""Warming profiles in the background: the threads that do it, and stopping them before the interpreter exits.

A profile's first run costs 5-20 ms more than the next (XNNPACK prepares the executable), on top of
deserializing it; ``Executable.warm_up`` runs each once so that no call pays for it, in a daemon thread
registered here. A daemon thread killed inside XLA while Python shuts down aborts the process, so at exit
each stops after the profile it is running.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Callable, Sequence

import jax


def fastest_run(call: Callable, args: Sequence[Any], budget_s: float = 0.004, most: int = 10) -> float:
    """A profile's latency for planning splits: the fastest of a few runs (at least one, ~4 ms in all)."""
    best, spent, n = float("inf"), 0.0, 0
    while n < most and (n < 2 or spent < budget_s) and not (n >= 1 and spent > budget_s):
        t0 = time.perf_counter()
        jax.block_until_ready(call(*args))
        t = time.perf_counter() - t0
        best, spent, n = min(best, t), spent + t, n + 1
    return best


_WARMUPS: set[threading.Thread] = set()
_WARMUPS_LOCK = threading.Lock()
_STOPPING = threading.Event()


def start(target: Callable[[], None]) -> threading.Thread:
    """Run ``target`` on a daemon warm-up thread, registered so that exit waits for its current profile."""
    def run() -> None:
        try:
            target()
        finally:
            with _WARMUPS_LOCK:
                _WARMUPS.discard(threading.current_thread())

    thread = threading.Thread(target=run, name="tripy_build-warmup", daemon=True)
    with _WARMUPS_LOCK:
        _WARMUPS.add(thread)
    thread.start()
    return thread


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
