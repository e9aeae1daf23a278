"""What a loader has measured of its profiles: the steady latency of each prepared one, and what preparing
one more costs (deserializing it, its first run). Both decide where a call runs whose own profile is not
prepared yet (``Costs.stand_in``).

Right after a load, the warm-up thread is still preparing profiles (``warmup.warm_in_order``), and a call
that needs one it has not reached prepared that one itself: BERT-base's (4, 32) took 370 ms instead of its
steady 100, 110-180 ms of it deserializing and 60-170 ms a first run that XNNPACK and YNNPACK spend
planning. The same call runs as calls at profiles already prepared, padded further or split along a
``rows`` dim (``Dispatcher.route_over``), in about 110 ms ((2, 32) and (1, 32)). So a call takes the
cheaper of the two, by these estimates:

- its own profile: a lower bound of its steady latency (the slowest prepared profile it covers in every
  dim) plus what preparing it is likely to cost: its executable's bytes at the deserializing rate seen
  so far (unless deserialized already), and the median first-run overhead seen so far;
- the stand-in: the prepared profiles' measured latencies (the fastest run seen of each).

With nothing measured yet (no warm-up, or none of its profiles done) a call prepares its own profile, as
it always did. The profile stood in for is then wanted: the warm-up prepares it next (``wanted``).
"""

from __future__ import annotations

import statistics
import threading
from typing import Any, Sequence

from ..core.dispatch import Dispatcher, Route


class Costs:
    """One entry's measurements (thread-safe: calls and the warm-up thread record into it)."""

    def __init__(self, sizes: dict[tuple[int, ...], int]):
        """``sizes``: each profile's executable, in bytes (what deserializing it costs scales with)."""
        self._sizes = sizes
        self.latency: dict[tuple[int, ...], float] = {}  # prepared profile -> its fastest run seen, s
        self._deserialized = [0, 0.0]  # bytes, seconds: every deserialize timed so far
        self._first_runs: list[float] = []  # first run minus steady run, s, per profile the warm-up judged
        self._wanted: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def ran(self, target: tuple[int, ...], seconds: float) -> None:
        """A steady run of a prepared profile took ``seconds`` (its first run is ``prepared``'s)."""
        if seconds < self.latency.get(target, float("inf")):
            self.latency[target] = seconds

    def deserialized(self, target: tuple[int, ...], seconds: float) -> None:
        with self._lock:
            self._deserialized[0] += self._sizes.get(target, 0)
            self._deserialized[1] += seconds

    def prepared(self, target: tuple[int, ...], first_s: float, steady_s: float) -> None:
        """The warm-up ran a profile for the first time (``first_s``), then steadily (``steady_s``)."""
        with self._lock:
            self._first_runs.append(max(first_s - steady_s, 0.0))
        self.ran(target, steady_s)

    def own(self, target: tuple[int, ...], deserialized: bool) -> float | None:
        """What a call at ``target`` is estimated to cost if it prepares the profile; None before the
        first profile's preparation was measured."""
        with self._lock:
            if not self._first_runs:
                return None
            first = statistics.median(self._first_runs)
            nbytes, seconds = self._deserialized
        load = 0.0 if deserialized or not nbytes else self._sizes.get(target, 0) * seconds / nbytes
        floor = max((s for q, s in list(self.latency.items()) if all(a <= b for a, b in zip(q, target))), default=0.0)
        return floor + first + load

    def stand_in(self, dispatcher: Dispatcher, shapes: Sequence[Sequence[int]], target: tuple[int, ...],
                 deserialized: bool) -> Route | None:
        """How to run ``shapes`` on prepared profiles other than ``target`` (not prepared), if that is
        estimated to cost less than preparing ``target``; None otherwise. ``target`` is then wanted."""
        own = self.own(target, deserialized)
        if own is None:
            return None
        route = dispatcher.route_over(shapes, dict(self.latency), own)
        if route is not None:
            with self._lock:
                if target not in self._wanted:
                    self._wanted.append(target)
        return route

    def wanted(self) -> Any:
        """The profile a call stood in for least recently, taken off the list; None if there is none."""
        with self._lock:
            return self._wanted.pop(0) if self._wanted else None
