"""Run a built artifact without importing jax: numpy in, numpy out, for the fastest cold start.

``import jax`` alone costs ~0.5 s here, more than everything else a loaded artifact needs. ``Runtime`` runs an
artifact's XLA executables on jaxlib's PJRT clients directly (``runtime/pjrt.py``): the CPU's, or, for an artifact
with a GPU's executables on a machine with an NVIDIA GPU (``platform_for``), one of jax's CUDA plugin loaded
without jax (not yet run on a card). It deserializes the executables, puts the inputs on the device and reads
the outputs back (on the CPU through DLPack, without a copy), never touching the ``jax`` package. Measured here,
spawn -> first result of a GEGLU artifact drops from ~0.66 s (``tripy_build.load``) to ~0.25 s.

Everything else is shared with ``tripy_build.load``: the same digest checks before anything is
deserialized, the same input validation and error messages, the same profiles, padding and
``DimSize`` values, the same background warm-up. A shape that no
profile covers needs a compile; the first such call loads the full ``Executable`` (and jax) once
and delegates to it.

An IREE artifact whose one dynamic-shape module runs here needs neither jax nor jaxlib: the module
is loaded by ``iree.runtime`` and serves every in-range shape. IREE's per-profile modules (and its
artifacts where IREE is not installed) are served through ``tripy_build.load``.

On the CPU a call runs on the caller's thread (the client is synchronous), and XLA's outputs are read-only numpy
arrays that view the result buffers (no copy). On a jaxlib the runtime was not tested with, ``load`` raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import host
from ..artifact.compat import incompatibility
from ..artifact.manifest import ExecutableEntry, Manifest
from ..artifact.read import Contents, read_contents
from ..core.dispatch import Dispatcher, output_axes_static
from ..core.profiles import pad_values
from ..core.signature import bind_call, check_leaves, input_infos, named_uses, value_checks
from ..core.spec import count_leaves, flatten_like, output_names, rebuild, to_dtype
from ..errors import ArtifactError
from ..jaxlib_api import Aval
from .entries import MultiEntry, Shared
from .first_run import never_run_here, selftest_once
from .pjrt import Compiled, Device, client
from .warmup import (RUN_LIMIT_S, Warmed, calibrate, calls, extrapolate, fastest_run, flops, prepare_at_load,
                     start as start_warmup, stopping as warmup_stopping, too_costly, warm_in_order, yield_to_calls)


class Runtime(MultiEntry):
    """A built artifact, loaded without jax. Call it like ``Executable``; outputs are numpy arrays."""

    def __init__(self, contents: Contents, warmup: str = "none", shared: "Shared | None" = None):
        c = contents
        m = c.manifest
        self._shared = shared or Shared()
        self.entries: dict[str, Runtime] = {}  # a multi-entry artifact's entries by name, this one included
        self.donated = m.donated
        self.platform = platform_for(m)
        c.check_platform(self.platform)
        self._contents = c
        self._manifest = m
        self.__name__ = m.function
        self._iree = _iree_module(c) if self.platform == "cpu" else None  # IREE's dynamic module: every shape, no jaxlib
        self._device = Device(self.platform) if self._iree is None else None
        runs_on = self._device.client if self._device is not None else None  # asked which CPU features or GPU it has
        self._leaves = list(m.leaves)
        self._uses = named_uses(self._leaves)
        bound = c.bound_values() if m.bound_inputs else {}
        self._bound = {n: _flat(next(p for p in m.parameters if p.name == n).template, v, n) for n, v in bound.items()}
        self._counts = [count_leaves(p.template) for p in m.parameters]  # flat leaves per parameter
        self._args, start = [], 0
        for p, n in zip(m.parameters, self._counts):
            if p.name not in bound:
                self._args.extend(self._leaves[start:start + n])
            start += n
        self._all_parameters = list(m.parameters)
        self._visible = [p for p in m.parameters if p.name not in bound]
        self._profiles = {e.target: e for e in m.executables  # XLA's; IREE's per-profile modules: tb.load
                          if e.platform == self.platform and e.is_xla and c.usable(e, runs_on)}
        self._compiled: dict[tuple[int, ...], Compiled] = {}
        self._locks = {t: threading.Lock() for t in self._profiles}  # one per profile: deserialized once
        self._sizes = {t: len(c.files[e.file]) for t, e in self._profiles.items()}  # executables' bytes
        self._generation: Any = None  # generation_steps(), made on first use (MultiEntry)
        self._ran: set[tuple[int, ...]] = set()  # profiles run at least once (their first run is the slow one)
        self._run_s: dict[tuple[int, ...], float] = {}  # a run of each profile the warm-up ran (its fastest)
        self._latency: dict[tuple[int, ...], float] = {}  # seconds per profile for split plans (warmup.calibrate)
        self._lock = threading.Lock()
        self._full: Any = None
        self._dispatcher = Dispatcher(m.dims, [info.shape_bounds.opt for _, info in self._leaves],
                                      [s.name for _, s in m.sizes], output_axes_static(m.outputs, m.dims),
                                      list(self._profiles), pad_values(m.dims, m.leaf_paths))
        self._fast: dict[tuple, Any] = {}  # (type, shape, dtype) per positional numpy input -> its route
        self._simple = not self._bound and all("leaf" in p.template for p in self._visible)
        self._opt = self._dispatcher.route(self._dispatcher.leaf_shapes(tuple(d.bounds[1] for d in self._dispatcher.dims))).target
        self._prepared = threading.Event()  # set once the weights are placed (or placing them failed)
        self._placed = False
        if warmup == "background":
            self.warm_up(background=True)  # starts while the weights are placed below
        try:
            self._leading = self._prepare() if self._iree is None else []
            self._placed = True
        finally:
            self._prepared.set()
        if warmup == "now":
            self.warm_up()

    def _prepare(self) -> list[Any]:
        """Weights on the device, with the prep program run on them chunk by chunk, each chunk's raw weights
        let go once it has run (falling back to jax where the chunks cannot run here); a chunk stored
        prepared (``runtime/save.py``) is placed as stored. The weights are read
        and checked ahead, in the order they are placed (``Contents.take_weights``)."""
        c, m, shared = self._contents, self._manifest, self._shared
        direct = {i for kind, i in m.sources if kind == "weight"}
        key = (m.prep.file, tuple(w.file for w in m.weights)) if m.prep else None
        prepared: dict[int, Any] = shared.prepared.get(key, {})
        needs_prep = any(kind == "prep" for kind, _ in m.sources) and not prepared
        chunks = m.prep.chunks if needs_prep and m.prep else ()
        # a chunk compiled for another platform (a GPU's artifact built on a CPU machine) runs whole, through jax
        usable = (chunk.executable.platform == self.platform and c.usable(chunk.executable, self._device.client)
                  for chunk in chunks if not chunk.at_rest)
        if needs_prep and (not chunks or not all(usable)):
            # jax's arrays belong to jax's client: each is read (on the CPU, viewed) and placed on this one
            return [self._device.put(np.asarray(x), Aval(x.shape, x.dtype))
                    for x in self._full_executable()._leading[:len(m.sources)]]
        placing = sorted(i for i in direct if m.weights[i].file not in shared.placed)
        reads = [m.weights[i] for i in placing]
        for chunk in chunks:  # a chunk stored prepared is placed as stored; the others read their raw weights
            reads += chunk.at_rest or [m.weights[i] for i in chunk.weights if i not in direct]
        with contextlib.closing(c.take_weights(reads)) as values:
            for i, value in zip(placing, values):
                w = m.weights[i]
                shared.placed[w.file] = self._device.put(value, Aval(w.shape, to_dtype(w.dtype)))
            for chunk in chunks:
                if chunk.at_rest:
                    prepared.update((k, self._device.put(value, Aval(w.shape, to_dtype(w.dtype))))
                                    for k, w, value in zip(chunk.outputs, chunk.at_rest, values))
                    continue
                run = Compiled(self._device, c.files.pop(chunk.executable.file), chunk.executable,
                                c.where(chunk.executable.file))
                raw = dict(zip([i for i in chunk.weights if i not in direct], values))
                outs = run.device_outputs([shared.placed[m.weights[i].file] if i in direct else raw[i]
                                           for i in chunk.weights])
                for o in outs:
                    o.block_until_ready()
                prepared.update(zip(chunk.outputs, outs))
                del raw, outs
        if chunks:
            shared.prepared[key] = prepared
        return [shared.placed[m.weights[i].file] if kind == "weight" else prepared[i] for kind, i in m.sources]

    @property
    def metadata(self) -> dict[str, Any]:
        """What the build recorded (the manifest's ``metadata``): ``model``, ``build_key``, ``labels``, ``generate``."""
        return self._manifest.metadata

    @property
    def profiles(self) -> list[dict[str, int]]:
        """The precompiled profiles this loader runs, each as ``{dim: size}`` (dims by name, or symbol if unnamed)."""
        return [{d.name or d.symbol: n for d, n in zip(self._dispatcher.dims, t)} for t in self._profiles]

    @property
    def input_infos(self) -> dict[str, Any]:
        return input_infos(self._leaves, self._all_parameters, self._visible)

    @property
    def output_infos(self) -> list[Any]:
        return list(self._manifest.outputs)

    @property
    def output_names(self) -> list[str]:
        """Each flat output's name: its key in the returned dict (``last_hidden_state``), else ``output<i>``."""
        return output_names(self._manifest.output_structure, len(self._manifest.outputs))

    def __repr__(self) -> str:
        return f"<tripy_build.runtime.Runtime {self.__name__}({', '.join(f'{p}: {i!r}' for p, i in self._leaves)})>"

    def warm_up(self, background: bool = False) -> threading.Thread | None:
        """Deserialize every profile and run it once on zeros (their first run costs more than the next):
        the opt profile first, then the cheapest first.

        With ``background``, a daemon thread does it, by ``warmup.warm_in_order``'s policy: at once, beside
        calls, the smallest profiles, those whose first call could not prepare them on time; then, at the
        idle scheduling class, it runs profiles until one takes longer than ``warmup.RUN_LIMIT_S`` and only
        deserializes the rest, within ``warmup.MemoryBudget``, the large ones in quiet moments; a profile
        ``warmup.too_costly`` to run it only deserializes. A call that
        needs a profile before the thread reaches it prepares that one itself (each profile has its own
        lock, so it never waits for another's). A second thread then times the profiles it ran, in quiet
        moments, for split plans (``warmup.calibrate``); ``warmup="now"`` times them before returning.
        """
        if not background:
            self._warm_all(stop=lambda: False, limit=float("inf"), judge=False)
            self._calibrate(quiet=False)
            return None
        self._warming = start_warmup(lambda: self._warm_all(stop=warmup_stopping, limit=None, costly=self._too_costly),
                                     then=self._calibrate)
        return self._warming

    def _warm_at_load(self) -> None:
        """The background warm-up's work done on this thread before ``load`` returns (``warmup.prepare_at_load``):
        no quiet moment waited for (no call can be in flight yet), nothing at the idle scheduling class, no run
        timed but the first; the profiles are timed for split plans in the background (``_calibrate``)."""
        self._warm_all(stop=lambda: False, limit=None, costly=self._too_costly, judge=False, quiet=False)
        self._warming = start_warmup(self._calibrate)

    def _calibrate(self, quiet: bool = True) -> None:
        """Time the profiles the warm-up ran (each within ``warmup.RUN_LIMIT_S``) for split plans, by
        ``warmup.calibrate``: only a ``rows`` dim is split, so only an artifact that has one."""
        if self._iree is not None or not self._placed or not any(d.padding == "rows" for d in self._dispatcher.dims):
            return
        runs = {t: (self._compiled[t], self._zeros_args(t)) for t, s in list(self._run_s.items())
                if s <= RUN_LIMIT_S and t in self._compiled}
        latency = calibrate(sorted(runs, key=lambda t: int(np.prod(t))),
                            lambda t: fastest_run(lambda: runs[t][0](runs[t][1]), budget_s=0, most=1),
                            warmup_stopping, quiet)
        if latency:  # the profiles too slow to time, estimated from their work
            latency = extrapolate(latency, {t: flops(c.loaded) for t, c in list(self._compiled.items())})
        self._latency.update(latency)
        self._fast.clear()  # routes planned before the latencies were known

    def _zeros_args(self, target: tuple[int, ...]) -> list[Any]:
        """Every argument of a run of ``target`` on zeros: the weights, the inputs at its shapes, its dims' sizes."""
        shapes = self._dispatcher.leaf_shapes(target)
        zeros = [np.zeros(s, info.dtype) for s, (_, info) in zip(shapes, self._leaves)]
        return [*self._leading, *zeros, *[np.asarray(n, np.int32) for n in self._dispatcher.route(shapes).sizes]]

    def _warm_all(self, stop: Any, limit: float | None, costly: Any = lambda target: False, judge: bool = True,
                  quiet: bool = True) -> None:
        """``judge``: time each profile's steady run to tell whether its first call would be late; without
        it (``warmup="now"``, which runs every profile anyway) each is run once."""
        if self._iree is not None:
            yield_to_calls()
            opt = tuple(d.bounds[1] for d in self._dispatcher.dims)
            shapes = self._dispatcher.leaf_shapes(opt)
            self._iree.flat([*[np.zeros(s, info.dtype) for s, (_, info) in zip(shapes, self._leaves)],
                             *[np.asarray(n, np.int32) for n in self._dispatcher.route(shapes).sizes]])
            return
        opt = self._opt
        if opt in self._locks:
            self._deserialize(opt)  # while the weights are read and prepared, where a core is free
        self._prepared.wait()
        if not self._placed:
            return  # placing the weights failed: the load raised
        weight_bytes = sum(w.nbytes for w in self._manifest.weights)
        first = opt in self._profiles and not costly(opt)  # a costly opt profile waits its turn by size
        if first and not stop():
            self._warm(opt, judge=False)  # whatever it takes: the request a server sees first
        order = sorted((t for t in self._profiles if not (first and t == opt)), key=lambda t: int(np.prod(t)))
        warm_in_order(order, functools.partial(self._warm, judge=judge), self._deserialize, weight_bytes, stop, limit,
                      costly, self._sizes.__getitem__, quiet=quiet)

    def _warm(self, target: tuple[int, ...], judge: bool = True) -> Warmed | None:
        """Run a profile once on zeros, if no call has, then twice more: what preparing it cost (its
        deserializing, whenever that was, and the first run) against the faster of the next two
        (``warmup.Warmed``). None for one a call ran already (timed all the same, as ``tb.load`` does). Without
        ``judge`` it is run once only: its first run stands for its steady one (no faster)."""
        with self._locks[target]:
            ran = target not in self._ran
            args = self._zeros_args(target)
            compiled = self._profile(target)
            if ran:
                t0 = time.perf_counter()
                compiled(args)
                self._ran.add(target)
                first = time.perf_counter() - t0
        if not judge:
            if not ran:
                return None
            self._run_s[target] = first
            return Warmed(compiled.seconds + first, first)
        if not ran:
            self._run_s[target] = fastest_run(lambda: compiled(args))
            return None
        # the faster of two: a call running beside one would make its profile look on time
        self._run_s[target] = fastest_run(lambda: compiled(args), budget_s=float("inf"), most=2)
        return Warmed(compiled.seconds + first, self._run_s[target])

    def _deserialize(self, target: tuple[int, ...]) -> None:
        with self._locks[target]:
            self._profile(target)

    def _too_costly(self, target: tuple[int, ...]) -> bool:
        """``warmup.too_costly`` for a profile, deserialized to ask XLA."""
        with self._locks[target]:
            return too_costly(self._profile(target).loaded)

    @property
    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    @property
    def flat_inputs(self) -> list[tuple[str, Any]]:
        """Every runtime input leaf in program order, by path (bound ones included)."""
        return list(self._leaves)

    def route(self, shapes: Sequence[Sequence[int]]) -> Any:
        """How a call with these flat input shapes runs (``dispatch.Route``): the profile, any padding, a split plan
        (by the latencies the warm-up measured)."""
        return self._dispatcher.route(tuple(tuple(s) for s in shapes), self._latency)

    @property
    def flat_args(self) -> list[tuple[str, Any]]:
        """The leaves ``call_flat`` takes, in order: (path, ``InputInfo``); bound inputs are not among them."""
        return list(self._args)

    @property
    def dims(self) -> list[Any]:
        """Every dynamic dim (``profiles.DimPlan``): its name, range, buckets, padding and where inputs use it."""
        return list(self._dispatcher.dims)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            try:
                fast = self._fast.get(tuple([(type(a), a.shape, a.dtype) for a in args]))
            except AttributeError:
                fast = None
            if fast is not None:
                return fast(args)
        values = bind_call(self.__name__, self._visible, args, kwargs, self.input_infos.__getitem__)
        leaves: list[Any] = []
        for p in self._manifest.parameters:
            leaves.extend(self._bound[p.name] if p.name in self._bound else _flat(p.template, values[p.name], p.name))
        run = self._flat_runner(leaves)
        if run is None:
            import jax

            outs = self._full_executable()(*args, **kwargs)
            return self._structure([np.asarray(o) for o in jax.tree_util.tree_leaves(outs)])
        if self._simple and not kwargs and len(args) == len(self._visible) and all(type(a) is np.ndarray for a in args):
            # shapes and dtypes checked once per shape; declared value ranges on every call
            check = value_checks(self._leaves) or (lambda xs: None)
            self._fast[tuple([(np.ndarray, a.shape, a.dtype) for a in args])] = \
                lambda xs: (check(xs), self._structure(run(xs)))[1]
        return self._structure(run(leaves))

    def call_flat(self, *leaves: Any) -> list[np.ndarray]:
        """Call with the unbound inputs flattened in order (``flat_args``); the flat outputs, as numpy arrays."""
        full = self._assemble(leaves)
        run = self._flat_runner(full)
        if run is None:
            return self._full_executable().call_flat(*leaves)
        return run(full)

    def needs_compile(self, *leaves: Any) -> bool:
        """Whether a call with these (checked) unbound flat inputs runs shapes that no precompiled profile
        serves, so that it compiles first (a server runs such calls apart, not holding the others up)."""
        if self._iree is not None:
            return False
        shapes = [np.shape(x) for x in self._assemble(leaves)]
        return self._dispatcher.route(shapes).target not in self._profiles

    def check_flat(self, *leaves: Any) -> None:
        """Validate the unbound flat inputs as ``call_flat`` does, without running them (``CallError``)."""
        check_leaves(self._assemble(leaves), self._leaves, self._uses)

    def _assemble(self, leaves: Sequence[Any]) -> list[Any]:
        """Every flat input: the bound ones, with ``leaves`` in the unbound places."""
        self._check_count(leaves, self._args)
        it = iter(leaves)
        full: list[Any] = []
        for p, n in zip(self._manifest.parameters, self._counts):
            full.extend(self._bound[p.name] if p.name in self._bound else [next(it) for _ in range(n)])
        return full

    def _flat_runner(self, leaves: list[Any]) -> Any:
        """Validate every flat input (host arrays made of them in place); how to run them, or None when
        their shapes need a compile (the full ``Executable`` runs them)."""
        shapes = check_leaves(leaves, self._leaves, self._uses)
        # Host arrays only: a jax array belongs to jax's own PJRT client, not this one (on the CPU,
        # np.asarray of it is a view, not a copy).
        leaves[:] = [x if type(x) is np.ndarray else np.asarray(x) for x in leaves]
        return self._route_runner(self._dispatcher.route(shapes, self._latency))

    def _route_runner(self, route: Any) -> Any:
        """How to run flat host inputs by ``route`` (a ``dispatch.Route``), or None when it needs a compile."""
        if self._iree is not None:
            sizes = [np.asarray(n, np.int32) for n in route.sizes]
            return lambda xs: self._iree.flat([*xs, *sizes])
        if route.target not in self._profiles:
            return None
        if route.split is None and not route.padded:
            return lambda xs: self._run_profile(route.target, xs, route.sizes)
        return lambda xs: self._dispatcher.run(route, xs, self._run_profile)

    def _run_profile(self, target: tuple[int, ...], leaves: Sequence[Any], sizes: Sequence[int]) -> list[np.ndarray]:
        compiled = self._compiled.get(target)
        with calls:  # the warm-up waits for a quiet moment
            if compiled is None or target not in self._ran:
                with self._locks[target]:  # prepared once, by this call or the warm-up, whichever comes first
                    outs = self._profile(target)([*self._leading, *leaves, *[np.asarray(n, np.int32) for n in sizes]])
                    self._ran.add(target)
                    return outs
            return compiled([*self._leading, *leaves, *[np.asarray(n, np.int32) for n in sizes]])

    def _profile(self, target: tuple[int, ...]) -> Compiled:
        """The profile's executable, deserialized on first need (the caller holds its lock)."""
        compiled = self._compiled.get(target)
        if compiled is None:
            entry = self._profiles[target]
            compiled = Compiled(self._device, self._contents.files[entry.file], entry, self._contents.where(entry.file))
            self._compiled[target] = compiled
            if not any(e.file == entry.file for t, e in self._profiles.items() if t not in self._compiled):
                del self._contents.files[entry.file]  # its bytes are not needed again (BERT's 50: 33 MB)
        return compiled

    # --- generation (``runtime/generate.Steps``) ------------------------------------------------
    def _place(self, x: np.ndarray) -> Any:
        return self._device.put(x, Aval(x.shape, x.dtype))

    def _fetch(self, x: Any) -> np.ndarray:
        return self._device.to_host(x)

    def _step(self, target: tuple[int, ...], leaves: list[Any], names: tuple[str, ...]) -> tuple[Any, ...]:
        with calls:
            with self._locks[target]:
                compiled = self._profile(target)
            outs = compiled.device_outputs([*self._leading, *leaves])
            self._ran.add(target)
        return tuple(outs[self._output_index[n]] for n in names)

    def _structure(self, outputs: list[np.ndarray]) -> Any:
        template = self._manifest.output_structure
        return rebuild(template, outputs) if template is not None else outputs

    def _full_executable(self) -> Any:
        """The full ``Executable`` (imports jax), for shapes that need compiling."""
        with self._lock:
            if self._full is None:
                from .loader import load as full_load

                full = full_load(self._contents.path, warmup="none")
                self._full = full.entry(self._contents.entry) if self._contents.entry else full
        return self._full


def platform_for(manifest: Manifest) -> str:
    """The platform the runtime runs an artifact on here, as ``tripy_build.load`` would: its GPU's executables where
    it has them and this machine has an NVIDIA GPU, else its CPU's."""
    return "cuda" if "cuda" in manifest.platforms and host.gpu_present() else "cpu"


def _iree_entry(manifest: Manifest) -> ExecutableEntry | None:
    """The artifact's IREE dynamic-shape module if it can run here (IREE installed, same release and CPU)."""
    entry = next((e for e in manifest.executables if e.is_iree and e.dynamic), None)
    return entry if entry is not None and incompatibility(entry) is None else None


def _iree_module(c: Contents) -> Any:
    entry = _iree_entry(c.manifest)
    if entry is None:
        return None
    from .iree import Module

    return Module(c.files[entry.file], 0, None, c.where(entry.file))


def _flat(template: Any, value: Any, path: str) -> list[Any]:
    out: list[Any] = []
    flatten_like(template, value, path, out)
    return out


WARMUPS = ("background", "now", "none")


def load(path: str | os.PathLike, warmup: str = "background") -> Runtime:
    """Load an artifact without jax: ``Runtime(*inputs) -> numpy outputs``.

    Args:
        path: an artifact directory.
        warmup: ``"background"`` (default): returns at once; a thread at the idle scheduling class
            deserializes and runs each profile once (opt first, then cheapest first), so that no call
            pays a profile's first use, without taking a core from calls; where that is estimated to take
            under a second and the thread would hold profiles back for quiet moments
            (``warmup.prepare_at_load``: ~10 MB of executables at most, some over 192 KiB), it is done
            before returning instead. ``"now"``: all of it before returning. ``"none"``: each profile is prepared
            by the first call that needs it.

    Returns:
        A ``Runtime`` with the artifact's signature and checks; its outputs are read-only numpy arrays.

    Example::

        from tripy_build import runtime
        rt = runtime.load("artifacts/geglu/2bb85d9bc22e7905")
        y = rt(np.ones((37, 512), np.float32))  # numpy in, numpy out
    """
    if warmup not in WARMUPS:
        from ..errors import SpecError

        raise SpecError(f"runtime.load(warmup={warmup!r}): must be one of {', '.join(map(repr, WARMUPS))}.")
    # Importing jaxlib (~30 ms) and checking the files' digests (hashing releases the GIL) overlap.
    started: list[BaseException] = []

    def start_client() -> None:
        try:
            client(platform)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            started.append(e)

    from ..artifact.read import read_manifest

    thread = threading.Thread(target=start_client, name="tripy_build-jaxlib")
    try:
        manifest = read_manifest(Path(path))
    except ArtifactError:
        manifest = None  # read_contents below says what is wrong
    platform = platform_for(manifest) if manifest is not None else "cpu"
    needs_jaxlib = manifest is None or platform != "cpu" or _iree_entry(manifest) is None
    if needs_jaxlib:
        thread.start()
    try:
        contents = read_contents(path, manifest=manifest)
    finally:
        if needs_jaxlib:
            thread.join()
    if started:
        raise started[0]
    m = contents.manifest
    views = {name: contents.for_entry(name) for name, _ in m.all_entries()} if m.entry else {"": contents}
    small = warmup == "background" and (platform != "cpu" or _iree_entry(m) is None) and prepare_at_load([
        len(c.files[e.file]) for c in views.values() for e in c.manifest.executables if e.platform == platform and e.is_xla])
    shared = Shared()
    runtimes = {name: Runtime(c, "none" if small else warmup, shared) for name, c in views.items()}
    if never_run_here(m, platform):  # compiled for this GPU without it: its self-test runs here first (first_run.py)
        first = next(iter(runtimes.values()))
        selftest_once(Path(contents.path), m, runtimes, first._device.device.device_kind)
    for rt in runtimes.values():
        rt.artifact_dir = Path(contents.path)
        if m.entry:
            rt.entries = runtimes
        if small:  # preparing every profile costs little against the load (warmup.prepare_at_load)
            rt._warm_at_load()
    return runtimes[m.entry]
