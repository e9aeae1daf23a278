"""Dynamic batching: concurrent requests gathered into one call along a ``rows`` dim.

Gathering requests is only exact where a model treats the rows of a dim independently, and that is
what a ``rows`` padding declaration says and what the build proved (random values in padded rows
must not change the real rows' outputs). So requests are batched along such a dim alone: each
request's inputs are concatenated along it, the batch runs once (its size picks a bucket as any call
does), and every output is split back at the same offsets.

Requests are compatible when all their other dims agree, with one exception: a dim padded through a
mask input (a transformer's ``seq`` with its ``attention_mask``) only has to fall in the same bucket,
since the call runs at the bucket's size anyway: each request is padded to the longest in the batch
(its mask with 0, the other inputs with their declared pad values) and its outputs are cut back to its
own length. The oldest request waiting sets the deadline, ``max_delay_ms`` after it
arrived; compatible requests join it, oldest first, until the rows reach ``max_batch`` or the
deadline passes. While a batch runs, the next one gathers, so under load batches grow on their own:
that is why the default delay is 0 (Triton's default too). Measured here (``bench/serve.py``), a
2 ms delay cost more in latency than it won in batch size at every load tried.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..core.profiles import MaskInput, pad_values
from ..errors import CallError, ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """Along which dim requests are gathered, and how far."""

    dim: str  # the NamedDimension's name
    max_batch: int  # most rows in one call (at most the dim's max)
    max_delay_s: float  # longest a request waits for others to join it
    in_axes: tuple[int, ...]  # per flat input: the axis that is ``dim``
    out_axes: tuple[int, ...]  # per flat output: the axis that is ``dim``
    # The mask-padded dims requests of different sizes may share a call in: (its DimPlan, per flat input its
    # axis or None, per flat output its axis or None).
    ragged: tuple[tuple[Any, tuple[int | None, ...], tuple[int | None, ...]], ...] = ()
    fills: tuple[float, ...] = ()  # per flat input: the value it is padded with along a ragged dim

    def describe(self) -> str:
        wait = (f"a request waiting at most {self.max_delay_s * 1e3:g} ms for others" if self.max_delay_s else
                "no waiting: a batch is what queued while the last call ran")
        ragged = "".join(f"; requests of different {d.name!r} in one bucket share a call" for d, _, _ in self.ragged)
        return f"batching along {self.dim!r}: up to {self.max_batch} rows a call, {wait}{ragged}"


def _axes(dim: Any, args: Sequence[tuple[str, Any]], outputs: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """The axis of ``dim`` in every input and output, or why requests cannot be gathered along it."""
    in_axes = []
    for path, info in args:
        found = [a for a, n in info.dimension_names.items() if n == dim.name]
        if len(found) != 1:
            return f"input {path!r} has {'no' if not found else 'more than one'} {dim.name!r} axis"
        in_axes.append(found[0])
    out_axes = []
    for i, info in enumerate(outputs):
        found = [a for a, n in info.dimension_names.items() if n == dim.name]
        if len(found) != 1:
            return f"output {i} has {'no' if not found else 'more than one'} {dim.name!r} axis"
        out_axes.append(found[0])
    return tuple(in_axes), tuple(out_axes)


def plan(args: Sequence[tuple[str, Any]], outputs: Sequence[Any], dims: Sequence[Any], dim: str = "auto",
         max_batch: int | None = None, max_delay_ms: float = 0.0) -> tuple[BatchPlan | None, str]:
    """The batching of a model with these flat inputs, outputs and dims, or None and why not.

    Args:
        args: the flat inputs a request supplies: (path, ``InputInfo``).
        outputs: the flat outputs' ``InputInfo``.
        dims: the model's dynamic dims (``profiles.DimPlan``).
        dim: a dim's name; ``"auto"``: the one ``rows`` dim that every input and output has, if any;
            ``"none"``: no batching.
        max_batch: most rows in one call; default: the dim's largest precompiled size (its largest bucket), so
            that a batch never forms a size that must compile.
        max_delay_ms: longest a request waits for others to join it.

    Returns:
        ``(BatchPlan, description)``, or ``(None, why requests run one by one)``.

    Raises:
        ConfigError: ``dim`` names no dim, or one that is not ``rows``-padded or not in every input and
            output, or ``max_batch``/``max_delay_ms`` is out of range.
    """
    if not (isinstance(max_delay_ms, (int, float)) and 0 <= max_delay_ms <= 10_000):
        raise ConfigError(f"max_delay_ms: must be a number of milliseconds in 0..10000, got {max_delay_ms!r}.")
    if dim == "none":
        return None, "batching off (batch dim 'none'): each request runs as its own call"
    named = {d.name: d for d in dims if d.name}
    if dim == "auto":
        rows = [d for d in named.values() if d.padding == "rows" and not isinstance(_axes(d, args, outputs), str)]
        if len(rows) != 1:
            why = ("no dim is declared rows-padded and in every input and output" if not rows else
                   f"several dims could be: {', '.join(repr(d.name) for d in rows)}; choose one with --batch-dim")
            return None, f"batching off: {why}; each request runs as its own call"
        chosen = rows[0]
    else:
        chosen = named.get(dim)
        if chosen is None:
            raise ConfigError(f"batch dim {dim!r}: the model has no such dynamic dim; its dims are "
                              f"{', '.join(repr(n) for n in named) or 'none'}. Use one of them, 'auto' or 'none'.")
        if chosen.padding != "rows":
            raise ConfigError(
                f"batch dim {dim!r} is not declared rows-padded (padding: {chosen.padding or 'none'}), so gathering "
                f"requests along it could mix their rows. Declare it (model.padding.{dim}=rows in the build config, or "
                f"compile(padding={{{dim!r}: 'rows'}})) and rebuild, so that the build proves the rows independent, or "
                "serve with batch dim 'none'.")
    axes = _axes(chosen, args, outputs)
    if isinstance(axes, str):
        if dim == "auto":
            return None, f"batching off: {axes}; each request runs as its own call"
        raise ConfigError(f"batch dim {dim!r}: {axes}, so requests cannot be gathered along it. Serve with batch dim 'none'.")
    lo, _, hi = chosen.bounds
    if max_batch is None:
        max_batch = chosen.buckets[-1] if chosen.buckets else hi
    if not (isinstance(max_batch, int) and lo <= max_batch <= hi):
        raise ConfigError(f"max_batch: must be an integer in the range of {chosen.name!r}, {lo}..{hi}, got {max_batch!r}.")
    p = BatchPlan(chosen.name, max_batch, max_delay_ms / 1e3, *axes, _ragged(dims, chosen, args, outputs),
                  tuple(pad_values(dims, [path for path, _ in args])))
    return p, p.describe()


def _ragged(dims: Sequence[Any], chosen: Any, args: Sequence[tuple[str, Any]], outputs: Sequence[Any]) -> tuple:
    """The dims padded through a mask input (other than ``chosen``), with their axis in every input and output."""
    def axis(info: Any, name: str) -> int | None:
        found = [a for a, n in info.dimension_names.items() if n == name]
        return found[0] if len(found) == 1 else None

    out = []
    for d in dims:
        if d is chosen or not d.name or not isinstance(d.padding, MaskInput) or not d.buckets:
            continue
        out.append((d, tuple(axis(info, d.name) for _, info in args), tuple(axis(info, d.name) for info in outputs)))
    return tuple(out)


@dataclass
class Stats:
    """Counts and times since the model was loaded (Triton's statistics extension reports these)."""

    requests: int = 0  # requests answered, successfully or not
    rows: int = 0  # rows of the successful requests (Triton's inference_count)
    calls: int = 0  # calls run (Triton's execution_count)
    failed: int = 0
    queue_ns: int = 0  # waiting for a batch to start, summed over requests
    compute_ns: int = 0  # running calls, summed over calls
    batches: dict[int, list[int]] = field(default_factory=dict)  # rows in a call -> [calls, ns]
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, rows: int, ns: int) -> None:
        with self.lock:
            self.calls += 1
            self.compute_ns += ns
            entry = self.batches.setdefault(rows, [0, 0])
            entry[0] += 1
            entry[1] += ns

    def answered(self, rows: int, waited_ns: int, ok: bool) -> None:
        with self.lock:
            self.requests += 1
            self.rows += rows if ok else 0
            self.failed += not ok
            self.queue_ns += waited_ns


class _Tally:
    """The parts of one client request that runs as several calls (a long text's windows, zero-shot's hypotheses,
    more texts than a call holds): the statistics count it once, when its last part is answered, with every part's
    rows, its longest wait, and failed if any part failed."""

    __slots__ = ("left", "rows", "waited", "ok")

    def __init__(self, parts: int):
        self.left, self.rows, self.waited, self.ok = parts, 0, 0, True


class _Request:
    __slots__ = ("leaves", "rows", "key", "sizes", "future", "arrived", "tally")

    def __init__(self, leaves: list[np.ndarray], rows: int, key: tuple, sizes: tuple[int, ...], arrived: int,
                 tally: _Tally | None = None):
        self.leaves, self.rows, self.key, self.sizes, self.arrived = leaves, rows, key, sizes, arrived
        self.tally = tally
        self.future: Future = Future()


class Batcher:
    """Runs ``call_flat`` on requests, gathered per ``plan`` (or one by one with no plan), on one thread.

    Requests are expected to be valid on their own (the caller checks each before submitting), so that
    one bad request cannot fail the others in its batch. A batch whose shapes no precompiled profile serves
    (``needs_compile``) runs on a thread of its own, so that its compile holds up no other request.
    """

    def __init__(self, call_flat: Callable[..., list[np.ndarray]], plan: BatchPlan | None, name: str = "model",
                 needs_compile: Callable[..., bool] | None = None):
        self._call = call_flat
        self._needs_compile = needs_compile
        self._compiling = ThreadPoolExecutor(1, thread_name_prefix=f"tripy_build-compile-{name}")
        self.plan = plan
        self.stats = Stats()
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"tripy_build-batcher-{name}", daemon=True)
        self._thread.start()

    def submit_all(self, calls: Sequence[Sequence[np.ndarray]]) -> list[Future]:
        """Queue the calls one client request runs as (``submit`` each), counted in the statistics as one request;
        a future of each call's flat outputs."""
        tally = _Tally(len(calls)) if len(calls) > 1 else None
        return [self.submit(leaves, tally) for leaves in calls]

    def submit(self, leaves: Sequence[np.ndarray], tally: _Tally | None = None) -> Future:
        """Queue one request's flat inputs; a future of its flat outputs."""
        p = self.plan
        leaves = list(leaves)
        if p is None:
            rows, key, sizes = 1, (), ()
        else:
            rows = int(leaves[0].shape[p.in_axes[0]])
            shapes = [list(x.shape) for x in leaves]
            sizes = []
            for d, in_axes, _ in p.ragged:  # compatible across a mask-padded dim's bucket
                leaf = next(i for i, a in enumerate(in_axes) if a is not None)
                sizes.append(shapes[leaf][in_axes[leaf]])
                for shape, a in zip(shapes, in_axes):
                    if a is not None:
                        shape[a] = d.target(sizes[-1])
            key = tuple(tuple(s[:a] + s[a + 1:]) for s, a in zip(shapes, p.in_axes))
            sizes = tuple(sizes)
        r = _Request(leaves, rows, key, sizes, time.monotonic_ns(), tally)
        with self._cond:
            if self._closed:
                raise CallError("the server is stopping; send the request again to a running one.")
            self._queue.append(r)
            self._cond.notify()
        return r.future

    def queued(self) -> int:
        """Requests waiting for a batch now."""
        return len(self._queue)

    def close(self) -> None:
        """Stop taking requests; those still queued fail, the call in progress finishes."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for r in pending:
            r.future.set_exception(CallError("the server stopped before this request ran; send it again."))
        self._thread.join(timeout=60)
        self._compiling.shutdown(wait=True)

    def _take(self) -> list[_Request] | None:
        """The next batch: the oldest request and the compatible ones that fit, once full or due."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            p = self.plan
            if p is None:
                return [self._queue.popleft()]
            first = self._queue[0]
            due = first.arrived + int(p.max_delay_s * 1e9)
            while True:
                group, rows = [], 0
                for r in self._queue:
                    if r.key == first.key and (not group or rows + r.rows <= p.max_batch):
                        group.append(r)
                        rows += r.rows
                now = time.monotonic_ns()
                if rows >= p.max_batch or now >= due or self._closed:
                    break
                self._cond.wait((due - now) / 1e9)
            taken = set(map(id, group))
            self._queue = deque(r for r in self._queue if id(r) not in taken)
            return group

    def _loop(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            try:
                leaves = self._gather(group)
                apart = self._needs_compile is not None and self._needs_compile(*leaves)
            except Exception as e:  # noqa: BLE001 - given to every request of the batch
                self._answer(group, None, e, time.monotonic_ns())
                continue
            if apart:
                self._compiling.submit(self._run, group, leaves)
            else:
                self._run(group, leaves)

    def _gather(self, group: list[_Request]) -> list[np.ndarray]:
        """The batch's flat inputs: the requests' own, or theirs padded along ragged dims and concatenated."""
        if len(group) == 1:
            return group[0].leaves
        p = self.plan
        per_request = [list(r.leaves) for r in group]
        for k, (_, in_axes, _) in enumerate(p.ragged):
            longest = max(r.sizes[k] for r in group)
            for leaves, r in zip(per_request, group):
                if r.sizes[k] != longest:
                    leaves[:] = [x if a is None else _pad_axis(x, a, longest, p.fills[i])
                                 for i, (x, a) in enumerate(zip(leaves, in_axes))]
        return [np.concatenate([leaves[i] for leaves in per_request], axis=a) for i, a in enumerate(p.in_axes)]

    def _run(self, group: list[_Request], leaves: list[np.ndarray]) -> None:
        started = time.monotonic_ns()
        try:
            outs = self._call(*leaves)
            if len(group) == 1:
                parts = [outs]
            else:
                p = self.plan
                cuts = np.cumsum([r.rows for r in group])[:-1]
                split = [np.split(o, cuts, axis=a) for o, a in zip(outs, p.out_axes)]
                parts = [[s[k] for s in split] for k in range(len(group))]
                for k, (_, _, out_axes) in enumerate(p.ragged):
                    for part, r in zip(parts, group):
                        part[:] = [o if a is None or o.shape[a] == r.sizes[k] else
                                   o[(slice(None),) * a + (slice(0, r.sizes[k]),)] for o, a in zip(part, out_axes)]
        except Exception as e:  # noqa: BLE001 - given to every request of the batch
            self._answer(group, None, e, started)
            return
        self._answer(group, parts, None, started)

    def _answer(self, group: list[_Request], parts: list[list[np.ndarray]] | None, error: Exception | None,
                started: int) -> None:
        done = time.monotonic_ns()
        self.stats.call(sum(r.rows for r in group), done - started)
        for k, r in enumerate(group):
            self._answered(r, started - r.arrived, error is None)
            if error is None:
                r.future.set_result(parts[k])
            else:
                r.future.set_exception(error)

    def _answered(self, r: _Request, waited_ns: int, ok: bool) -> None:
        """``r`` in the statistics: at once, or (a part of a request, ``submit_all``) with its request's last part."""
        t = r.tally
        if t is None:
            self.stats.answered(r.rows, waited_ns, ok)
            return
        with self.stats.lock:  # its parts may be answered on two threads (one compiling a shape on first use)
            t.left -= 1
            t.rows += r.rows
            t.waited = max(t.waited, waited_ns)
            t.ok = t.ok and ok
            last = t.left == 0
        if last:
            self.stats.answered(t.rows, t.waited, t.ok)


def _pad_axis(x: np.ndarray, axis: int, size: int, fill: float) -> np.ndarray:
    """``x`` padded with ``fill`` at the end of ``axis`` up to ``size``."""
    shape = list(x.shape)
    shape[axis] = size
    out = np.full(shape, fill, x.dtype) if fill else np.zeros(shape, x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out
