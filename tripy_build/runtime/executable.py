"""``Executable``: a compiled function with a signature, input checks and shape dispatch.

Every call is checked against the declared specs before it reaches XLA. ``dispatch`` then maps the
call's shapes to a profile: a precompiled executable runs as is, or with the inputs padded up to a
bucket and the outputs sliced back where the model declared that exact. A shape no profile covers
is compiled from the exported program once, kept for the process and stored in the compile cache for
the next one. Calls whose shapes were seen before take a fast path of one dictionary lookup on top of
jax's own dispatch. The weights are device arrays held by the executable and passed to every call;
``bind`` replaces them (or fixes runtime inputs) without recompiling.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import inspect
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import host
from ..artifact import selftest
from ..artifact.manifest import Compiler, ExecutableEntry
from ..artifact.read import read_ahead
from ..core import dispatch
from ..core.profiles import DimPlan, mask_inputs
from ..core.signature import (Parameter, array_types, bind_call, check_leaf, check_leaves, input_infos, named_uses,
                              value_checks)
from ..core.spec import DimSize, InputInfo, count_leaves, flatten_like
from ..errors import CallError
from .compile_cache import key as compile_cache_key, shared as shared_compile_cache
from .warmup import (RUN_LIMIT_S, Warmed, calibrate, calls, fastest_run, start as start_warmup, stopping as warmup_stopping,
                     too_costly, warm_in_order)
from .xla import compile_shapes, load as load_xla, local_platform, serialize as serialize_xla
from .program import PrepChunk, Program, Stored, Weight, resolve
from .save import DEFAULT_WEIGHTS
from .entries import MultiEntry

log = logging.getLogger("tripy_build.executable")

_FAST_CACHE_LIMIT = 4096


@dataclass
class Precompiled:
    """One executable compiled ahead of time: the profile it serves, its bytes and how to call it."""

    target: tuple[int, ...]  # the size of each dynamic dim (empty for the prep program)
    blob: bytes
    entry: ExecutableEntry  # its manifest entry: format, platform, shapes and dtypes of its inputs, what it needs
    call: Callable | None = None  # None until loaded (loading is deferred to first use)
    loader: Callable[[], Callable] | None = field(default=None, repr=False)
    seconds: float = 0.0  # compile time; recorded in the sidecar index, not the manifest
    warm: bool = False  # run once already (a first run prepares the executable: its cost in runtime/warmup.py)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    reload: Callable[[], Callable] | None = field(default=None, repr=False)  # deserializes ``blob`` again (``unload``)

    def ready(self) -> Callable | None:
        if self.call is None and self.loader is not None:
            with self.lock:
                if self.call is None and self.loader is not None:
                    self.call, self.loader = self.loader(), None
        return self.call

    def unload(self) -> bool:
        """Let go of the loaded executable where ``reload`` can make it again (its next use does); whether it did."""
        with self.lock:
            if self.reload is None or self.call is None:
                return False
            self.call, self.loader, self.warm = None, self.reload, False
            return True


class Executable(MultiEntry):
    """A compiled function. Call it like the original, with only the runtime inputs."""

    def __init__(self, *, program: Program, program_bytes: bytes, prep_bytes: bytes | None, name: str,
                 parameters: Sequence[Parameter], leaves: Sequence[tuple[str, InputInfo]],
                 sizes: Sequence[tuple[str, DimSize]], outputs: Sequence[InputInfo], dims: Sequence[DimPlan],
                 dispatcher: dispatch.Dispatcher, optimization_level: int, platforms: Sequence[str],
                 precompiled: Sequence[Precompiled], prep_exes: Sequence[Precompiled] = (),
                 metadata: dict[str, Any] | None = None, selftest_source: Callable | None = None,
                 selftest_make: Callable | None = None, origin: tuple[str, list] | None = None,
                 compiler: Compiler | None = None, compiler_options: dict[str, dict[str, Any]] | None = None,
                 donated: Sequence[str] = (), leading: Sequence[Any] | None = None):
        self._program = program
        self._program_bytes = program_bytes
        self._prep_bytes = prep_bytes
        self._name = name
        self._generation: _Steps | None = None  # generation_steps(), made on first use (MultiEntry)
        self._parameters = list(parameters)
        self._leaves = list(leaves)
        self._sizes = list(sizes)
        self._outputs = list(outputs)
        self.dims = list(dims)
        self._dispatcher = dispatcher
        self.optimization_level = optimization_level
        self.platforms = tuple(platforms)
        self._precompiled = list(precompiled)
        self._prep_exes = list(prep_exes)  # one per ``program.chunks``; none: prep runs through jax, whole
        # executables for the other platforms of ``platforms`` (a GPU that is not here, the CPU beside this
        # machine's GPU): saved with the artifact, never run in this process; and, where none of ``platforms``
        # runs here (``_precompiled`` are a twin program's), the prep chunks compiled for the first of them
        self.foreign: list[Precompiled] = []
        self.foreign_prep: list[Precompiled] | None = None
        self.metadata = dict(metadata or {})
        self._selftest_source = selftest_source  # the traced function: the self-test reference
        self._selftest_make = selftest_make  # (reference, leaves, fixed, extra) -> cases: the compiler's
        self._origin = origin  # (artifact path, self-test entries) for a loaded executable
        self._selftest_cache: tuple[list, dict[str, bytes]] | None = None
        self._by_target: dict[tuple[int, ...], Any] = {p.target: p for p in self._precompiled}
        self._latency: dict[tuple[int, ...], float] = {}  # seconds per profile for split plans (warmup.calibrate)
        self._run_s: dict[tuple[int, ...], float] = {}  # a run of each profile the warm-up ran (its fastest)
        self._universal: Precompiled | None = None  # one executable for every shape (IREE's dynamic module)
        self.compiler = compiler or Compiler()  # which compiler made the executables, and how
        # platform -> the XLA options its executables were compiled with; run-time compiles use them too
        self.compiler_options = dict(compiler_options or {})
        self.tolerance: float | None = None  # the self-test's, when compute runs at reduced precision
        self._compile_lock = threading.Lock()
        self._program_digest = hashlib.sha256(program_bytes).hexdigest()
        self._named_uses = named_uses(self._leaves)
        self._leaf_slices: dict[str, slice] = {}
        start = 0
        for p in self._parameters:
            n = count_leaves(p.template)
            self._leaf_slices[p.name] = slice(start, start + n)
            start += n
        self._weights: list[Weight] = list(program.weights)
        # runtime input leaves (paths) whose buffers every call donates to the outputs (a cache updated in place)
        self.donated = tuple(donated)
        # the other entries of a multi-entry executable, by name, this one included (``compile`` of ``Entry``)
        self.entries: dict[str, Executable] = {}
        self._prepared: list[Any] = []  # the prep program's outputs (another entry with the same prep reuses them)
        self._leading = list(leading) if leading is not None else self._prepare()
        self._bound: dict[str, tuple[Any, str]] = {}
        self._derive()

    def _derive(self) -> None:
        """Recompute what depends on which parameters are bound."""
        self._visible = [p for p in self._parameters if p.name not in self._bound]
        self._bound_leaves: dict[str, list[Any]] = {}
        for name, (value, _) in self._bound.items():
            leaves: list[Any] = []
            flatten_like(next(p for p in self._parameters if p.name == name).template, value, name, leaves)
            self._bound_leaves[name] = leaves
        self._all_leaf_params = all("leaf" in p.template for p in self._visible)
        self._fast: dict[tuple, Callable] = {}
        self._runners: dict[tuple, Callable] = {}
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, getattr(inspect.Parameter, p.kind)) for p in self._visible]
        )
        self.__name__ = self._name

    # --- weights ---------------------------------------------------------------------------------
    def _prepare(self) -> list[Any]:
        """The leading arguments of every call: the weights, with the prep program run on them.

        Chunk by chunk (``PrepChunk``): a chunk stored prepared is placed as stored; the others run, and a
        chunk's raw weights are let go once it has run, unless ``main`` takes them as they are, so the raw
        and the prepared weights are never both held whole.
        """
        sources, program = self._program.sources, self._program
        direct = {i: self._weights[i].array() for i in {s.index for s in sources if s.kind == "weight"}}
        if program.prep is None:
            return resolve(sources, [direct.get(i) for i in range(len(self._weights))], [])
        prepared: list[Any] = [None] * len(program.prep.out_avals)
        rest = {n for n, (chunk, _) in enumerate(program.chunks) if self._at_rest(chunk)}
        stored = [k for n in sorted(rest) for k in program.chunks[n][0].outputs]
        with contextlib.closing(read_ahead([program.at_rest[k].read for k in stored],
                                           [program.at_rest[k].nbytes for k in stored])) as values:
            for k, value in zip(stored, values):
                prepared[k] = jax.device_put(value)
        runs = [(chunk, pre.ready()) for n, ((chunk, _), pre) in enumerate(zip(program.chunks, self._prep_exes))
                if n not in rest]
        if not program.chunks or len(self._prep_exes) != len(program.chunks) or any(run is None for _, run in runs):
            # prep runs whole, through jax; a chunk stored prepared gets zeros for the raw weights it lacks
            lacking = {i for n in rest for i in program.chunks[n][0].weights}
            values = [np.zeros(w.value.shape, w.value.dtype) if i in lacking else direct[i] if i in direct else w.array()
                      for i, w in enumerate(self._weights)]
            made = jax.tree_util.tree_leaves(jax.jit(program.prep.call)(*values))
            prepared = [out if mine is None else mine for out, mine in zip(made, prepared)]
            runs = []
        order = [i for chunk, _ in runs for i in chunk.weights if i not in direct]
        with contextlib.closing(read_ahead([self._weights[i].array for i in order],
                                           [self._weights[i].nbytes for i in order])) as values:
            for chunk, run in runs:
                raw = dict(zip([i for i in chunk.weights if i not in direct], values))
                outs = jax.block_until_ready(run(*[direct[i] if i in direct else raw[i] for i in chunk.weights]))
                for k, out in zip(chunk.outputs, outs):
                    prepared[k] = out
                del raw
        self._prepared = prepared
        return resolve(sources, [direct.get(i) for i in range(len(self._weights))], prepared)

    def _at_rest(self, chunk: PrepChunk) -> bool:
        """Whether ``chunk``'s outputs are taken as the artifact stores them: stored prepared, and none of its
        weights given anew by ``bind`` since."""
        return all(k in self._program.at_rest for k in chunk.outputs) and \
            all(isinstance(self._weights[i].value, Stored) for i in chunk.weights)

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The positions of the donated inputs among the program's arguments (weights first)."""
        paths = [p for p, _ in self._leaves]
        return tuple(len(self._program.sources) + paths.index(p) for p in self.donated)

    @property
    def weights(self) -> dict[str, Any]:
        """The weights the program takes, by path (e.g. ``params['proj']['weight']``)."""
        return {w.path: w.array() for w in self._weights}

    def bind(self, **values: Any) -> "Executable":
        """A new executable with some arguments replaced, without recompiling.

        A runtime input bound to a value disappears from the signature (``load`` restores it from the
        artifact). A constant argument (e.g. ``params``) gets new weights: the same tree, shapes and
        dtypes as at compile time (leaves the program does not use are ignored), never cast.
        """
        runtime = {p.name for p in self._parameters}
        constants = {w.argument for w in self._weights if w.argument}
        for name in values:
            if name not in runtime | constants:
                raise CallError(
                    f"bind(): {name!r} is not an input or a constant argument with weights; inputs: "
                    f"{', '.join(sorted(runtime)) or 'none'}; constant arguments: {', '.join(sorted(constants)) or 'none'}."
                )
        new = self._with_bound({n: v for n, v in values.items() if n in runtime},
                               {n: self._bound.get(n, (None, f"bound/{n}"))[1] for n in values if n in runtime})
        swapped = {n: v for n, v in values.items() if n in constants and n not in runtime}
        if swapped and self._universal is not None and self.compiler.name == "iree":
            raise CallError(f"bind({', '.join(swapped)}=...): this IREE module holds its weights as constants (IREE packs "
                            "them when it compiles); build again with the new params.")
        if swapped:
            new._swap_weights(swapped)
        if self.entries:  # the other entries take the new weights too (their runtime inputs stay as they were)
            entries = {}
            for name, e in self.entries.items():
                if e is self:
                    entries[name] = new
                else:
                    entries[name] = e._with_bound({}, {})
                    if any(w.argument in swapped for w in e._weights):
                        entries[name]._swap_weights(swapped)
            for e in entries.values():
                e.entries = entries
        return new

    def _swap_weights(self, swapped: dict[str, Any]) -> None:
        """Take new values for the weights of the constant arguments in ``swapped`` (this is a fresh copy)."""
        self._weights = [_replace_weight(w, swapped) if w.argument in swapped else w for w in self._weights]
        self._leading = self._prepare()
        self._selftest_cache = None
        if self._selftest_source is None:
            self._origin = None  # the stored self-test outputs were computed with the old weights
        self._derive()

    def _with_bound(self, values: dict[str, Any], dirs: dict[str, str]) -> "Executable":
        """``bind`` for runtime inputs, with the artifact directory each bound input is saved to."""
        for name, value in values.items():  # as given, before device_put could cast (float64 -> float32)
            leaves: list[Any] = []
            flatten_like(next(p for p in self._parameters if p.name == name).template, value, name, leaves)
            for leaf, (path, info) in zip(leaves, self._leaves_of(name)):
                check_leaf(leaf, path, info)
        new = copy.copy(self)
        new._generation = None  # its steps run the new executable, with spares of their own
        new._bound = dict(self._bound)
        new._bound.update({n: (jax.tree_util.tree_map(jax.device_put, v), dirs[n]) for n, v in values.items()})
        new._selftest_cache = None
        if values and new._selftest_source is None:
            new._origin = None
        new._derive()
        return new

    def _assemble_named(self, values: dict[str, Any]) -> list[Any]:
        leaves: list[Any] = []
        for p in self._parameters:
            if p.name in self._bound_leaves:
                leaves.extend(self._bound_leaves[p.name])
            else:
                flatten_like(p.template, values[p.name], p.name, leaves)
        return leaves

    # --- introspection ---------------------------------------------------------------------------
    @property
    def input_infos(self) -> dict[str, Any]:
        return input_infos(self._leaves, self._parameters, self._visible)

    @property
    def output_infos(self) -> list[InputInfo]:
        return list(self._outputs)

    def get_input_info(self) -> list[Any]:
        return list(self.input_infos.values())

    def get_output_info(self) -> list[InputInfo]:
        return self.output_infos

    @property
    def profiles(self) -> list[dict[str, int]]:
        """The precompiled profiles, each as ``{dim: size}`` (dims by name, or symbol if unnamed)."""
        return [{d.name or d.symbol: n for d, n in zip(self.dims, p.target)} for p in self._precompiled]

    @property
    def dispatcher(self) -> dispatch.Dispatcher:
        return self._dispatcher

    @property
    def flat_inputs(self) -> list[tuple[str, InputInfo]]:
        """Every runtime input leaf in program order, by path (bound ones included)."""
        return list(self._leaves)

    @property
    def precompiled_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Input shapes that run a precompiled executable as they are (without padding or compiling)."""
        return [self._dispatcher.leaf_shapes(p.target) for p in self._precompiled]

    def set_universal(self, executable: Precompiled) -> None:
        """Serve every in-range shape with one executable, exactly as given (no padding, no profiles)."""
        self._universal = executable
        self._runners.clear()
        self._fast.clear()

    def add_profiles(self, precompiled: Sequence[Precompiled]) -> None:
        """Serve these precompiled profiles too (the compiler adds them once they are built)."""
        self._precompiled.extend(precompiled)
        self._by_target.update({p.target: p for p in precompiled})
        self._runners.clear()
        self._fast.clear()

    def add_foreign(self, precompiled: Sequence[Precompiled], prep: Sequence[Precompiled] | None = None) -> None:
        """Save these executables for another platform with the artifact (the compiler adds them); ``prep``: its
        prep chunks, where the prep chunks this process runs are a twin program's (not saved)."""
        self.foreign.extend(precompiled)
        if prep is not None and self.foreign_prep is None:
            self.foreign_prep = list(prep)

    def unload_profiles(self, targets: Sequence[tuple[int, ...]] | None = None) -> None:
        """Let go of every loaded profile (or those of ``targets``) that can be deserialized again
        (``Precompiled.unload``), each loading again on its next use: a build that only saves them held
        BERT-base's 50 loaded, ~570 MB."""
        picked = self._precompiled if targets is None else [self._by_target[t] for t in targets if t in self._by_target]
        if [p for p in picked if p.unload()]:
            self._runners.clear()  # they hold the executables let go
            self._fast.clear()
            host.return_freed_memory()

    def load_all(self) -> int:
        """Deserialize every precompiled profile now (loading defers each to its first use); their count."""
        return sum(p.ready() is not None for p in self._precompiled)

    def warm_up(self, background: bool = False) -> threading.Thread | None:
        """Deserialize every profile and run it once on zeros, cheapest first, so no call pays for that.

        A profile's first run and its deserializing cost what ``runtime/warmup.py`` says (measured there). With
        ``background``, a daemon thread does it
        while calls are served (XLA releases the GIL), by ``warmup.warm_in_order``'s policy: at once, the
        smallest profiles, those whose first call could not prepare them on time; then, at the idle
        scheduling class, it runs profiles until one takes longer than
        ``warmup.RUN_LIMIT_S`` and only deserializes the rest (within ``warmup.MemoryBudget``, the large
        ones in quiet moments), and only deserializes one ``warmup.too_costly`` to run. A call that needs
        a profile first warms it itself. A second thread then times the profiles it ran, in quiet moments,
        for split plans (``warmup.calibrate``); without ``background`` they are timed before it returns.
        """
        profiles = self._warm_order()
        if not background:
            for p in profiles:
                self._warm(p)
            self._calibrate(quiet=False)
            return None
        self._warming = start_warmup(lambda: self._warm_all(profiles), then=self._calibrate)
        return self._warming

    def _warm_order(self) -> list[Precompiled]:
        if self._universal is not None:
            return [self._universal]
        return sorted(self._precompiled, key=lambda p: math.prod(p.target))

    def _prepare_sizes(self) -> list[int] | None:
        """The bytes of each executable a warm-up deserializes (``warmup.prepare_at_load``); None where that is
        not what preparing them costs (compiled here: ``trust_executables=False``; IREE's dynamic module)."""
        if self._universal is not None or any(not p.blob for p in self._precompiled):
            return None
        return [len(p.blob) for p in self._precompiled]

    def _warm_at_load(self) -> None:
        """The background warm-up's work done on this thread before ``load`` returns (``warmup.prepare_at_load``):
        no quiet moment waited for (no call can be in flight yet), nothing at the idle scheduling class, no run
        timed but the first; the profiles are timed for split plans in the background (``_calibrate``)."""
        self._warm_all(self._warm_order(), quiet=False, judge=False)
        self._warming = start_warmup(self._calibrate)

    def _warm_all(self, profiles: Sequence[Precompiled], quiet: bool = True, judge: bool = True) -> None:
        def costly(p: Precompiled) -> bool:
            call = p.ready()
            return call is not None and too_costly(call)

        try:
            warm_in_order(profiles, functools.partial(self._warm, judge=judge), Precompiled.ready,
                          sum(int(getattr(w, "nbytes", 0)) for w in self._leading),
                          warmup_stopping, costly=costly, size=lambda p: len(p.blob), target=lambda p: p.target,
                          quiet=quiet)
        except Exception as e:  # noqa: BLE001 - a failure shows again, as an error, on the call that needs it
            log.warning("%s: background warm-up stopped: %s", self._name, e)

    def _calibrate(self, quiet: bool = True) -> None:
        """Time the profiles the warm-up ran (each within ``warmup.RUN_LIMIT_S``) for split plans, by
        ``warmup.calibrate``: only a ``rows`` dim is split, so only an artifact that has one."""
        if self._universal is not None or not any(d.padding == "rows" for d in self.dims):
            return
        timed = [p for p in self._precompiled if p.call is not None and self._run_s.get(p.target, 1e9) <= RUN_LIMIT_S]
        runs = {p.target: (p.call, self._zeros_args(p)) for p in timed}

        def time_one(target: tuple[int, ...]) -> float:
            call, args = runs[target]
            return fastest_run(lambda: jax.block_until_ready(call(*args)), budget_s=0, most=1)

        try:
            latency = calibrate(sorted(runs, key=math.prod), time_one, warmup_stopping, quiet)
        except Exception as e:  # noqa: BLE001 - without latencies a call pads, as before the warm-up
            log.warning("%s: timing the profiles for split plans stopped: %s", self._name, e)
            return
        self._latency.update(latency)
        self._runners.clear()  # routes planned before the latencies were known
        self._fast.clear()

    def _zeros_args(self, p: Precompiled) -> tuple[Any, ...]:
        """Every argument of a run of ``p`` on zeros: the weights, the inputs at its shapes, its dims' sizes."""
        shapes = self._dispatcher.leaf_shapes(p.target if p is not self._universal else
                                              tuple(d.bounds[1] for d in self.dims))
        zeros = [np.zeros(s, info.dtype) for s, (_, info) in zip(shapes, self._leaves)]
        return (*self._leading, *zeros, *[np.int32(n) for n in self._dispatcher.route(shapes).sizes])

    def _warm(self, p: Precompiled, judge: bool = True) -> Warmed | None:
        """Prepare ``p`` and run it once if no call has (its first run is the slow one), then time it (outside
        its lock: a call that needs the profile does not wait for the timing). What that cost
        (``warmup.Warmed``), or None where a call prepared it or it was timed already. Without ``judge`` it is
        not timed: its first run stands for its steady one (no faster)."""
        if p.target in self._run_s:
            return None
        args = self._zeros_args(p)
        t0 = time.perf_counter()
        call = p.ready()
        if call is None:
            return None
        with p.lock:
            ran = not p.warm
            if ran:
                t1 = time.perf_counter()
                jax.block_until_ready(call(*args))
                first = time.perf_counter() - t1
                p.warm = True
        prepare = time.perf_counter() - t0
        if not judge:
            if not ran:
                return None
            self._run_s[p.target] = first
        else:
            self._run_s[p.target] = fastest_run(lambda: jax.block_until_ready(call(*args)))
        return Warmed(prepare, self._run_s[p.target]) if ran else None

    def __repr__(self) -> str:
        args = ", ".join(f"{name}: {info!r}" for name, info in self.input_infos.items())
        return f"<tripy_build.Executable {self._name}({args})>"

    # --- calling ---------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            with calls:  # the warm-up waits for a quiet moment
                if not kwargs:
                    try:
                        fn = self._fast.get(tuple([(type(a), a.shape, a.dtype) for a in args]))
                    except AttributeError:
                        fn = None
                    if fn is not None:
                        return fn(*args)
                return self._checked_call(args, kwargs)
        except ValueError as e:
            if "sharding" not in str(e):
                raise
            raise self._device_error(args, kwargs) from None

    def _device_error(self, args: Sequence[Any], kwargs: dict[str, Any]) -> CallError:
        """XLA's sharding mismatch, said as which input is on which device and how to move it."""
        device = jax.devices()[0]
        names = [*self._names[:len(args)], *kwargs]
        for name, value in zip(names, [*args, *kwargs.values()]):
            for leaf in jax.tree_util.tree_leaves(value):
                if isinstance(leaf, jax.Array) and leaf.devices() != {device}:
                    return CallError(f"input {name!r} is on {', '.join(map(str, leaf.devices()))}, but this executable "
                                     f"runs on {device}; move it first: jax.device_put({name}, jax.devices()[0]).")
        return CallError(f"an input is on a device this executable does not run on ({device}); move the inputs "
                         "there with jax.device_put.")

    @property
    def _names(self) -> list[str]:
        return [p.name for p in self._visible]

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        return bind_call(self._name, self._visible, args, kwargs, self.input_infos.__getitem__)

    def check_leaves(self, leaves: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        """Validate flat inputs against the specs; the tuple of their shapes."""
        return check_leaves(leaves, self._leaves, self._named_uses)

    def _bound_by_index(self) -> dict[int, Any]:
        return {self._leaf_slices[name].start + i: value
                for name, values in self._bound_leaves.items() for i, value in enumerate(values)}

    def call_flat(self, *leaves: Any) -> Any:
        """Call with the unbound runtime inputs flattened in order (self-tests use this)."""
        bound, it = self._bound_by_index(), iter(leaves)
        full = [bound[i] if i in bound else next(it) for i in range(len(self._leaves))]
        with calls:
            return self._runner(self.check_leaves(full))(full)

    def run_profile(self, target: Sequence[int], leaves: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
        """Run the program compiled for ``target`` (sizes per dim) on inputs already of its shapes; flat outputs."""
        with calls:
            return self._run_flat(tuple(target), leaves, sizes)

    def _checked_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        leaves = self._assemble_named(self._bind(args, kwargs))
        run = self._runner(self.check_leaves(leaves))
        out = run(leaves)
        if self._all_leaf_params and not kwargs and len(args) == len(self._visible) and not (
                self._bound and any(info.values is not None for _, info in self._leaves)):
            if len(self._fast) >= _FAST_CACHE_LIMIT:
                self._fast.clear()
            self._fast[tuple([(type(a), a.shape, a.dtype) for a in args])] = self._fast_path(run)
        return out

    def _fast_path(self, run: Callable) -> Callable:
        """What later calls with the same argument shapes run: the compiled call itself where possible, after
        checking the values of inputs that declare a range (their shapes and dtypes were checked already)."""
        fast = self._fast_call(run)
        check = value_checks(self._leaves) if not self._bound else None
        if check is None:
            return fast

        def checked(*args: Any) -> Any:
            check(args)
            return fast(*args)
        return checked

    def _fast_call(self, run: Callable) -> Callable:
        exact = getattr(run, "exact", None)
        if self._bound:
            bound, n = self._bound_by_index(), len(self._leaves)

            def assemble(*args: Any) -> Any:
                it = iter(args)
                return run([bound[i] if i in bound else next(it) for i in range(n)])
            return assemble
        if exact is not None:
            fn, lead, sizes = exact
            # A Compiled object's own dispatch function (made on its first call) skips a Python frame.
            direct = getattr(fn, "_call", None) if isinstance(fn, jax.stages.Compiled) else fn
            if direct is not None:
                return lambda *args: direct(*lead, *args, *sizes)
        return lambda *args: run(list(args))

    def _runner(self, shapes: tuple[tuple[int, ...], ...]) -> Callable:
        """A function of the flat (validated) inputs that runs them at this combination of shapes."""
        run = self._runners.get(shapes)
        if run is not None:
            return run
        run = self._route_runner(self._dispatcher.route(shapes, self._latency))
        if len(self._runners) >= _FAST_CACHE_LIMIT:
            self._runners.clear()
        self._runners[shapes] = run
        return run

    def _route_runner(self, route: dispatch.Route) -> Callable:
        """A function of the flat (validated) inputs that runs them by ``route``."""
        if self._universal is not None:  # every shape runs as it is
            fn, lead, sizes = self._universal.ready(), tuple(self._leading), tuple(np.int32(n) for n in route.sizes)

            def run(leaves: Sequence[Any]) -> Any:
                return fn(*lead, *leaves, *sizes)
        elif route.split is None and not route.padded and not any(c is not None for c in route.slices):
            fn = self._callable(route.target)
            lead, sizes = tuple(self._leading), tuple(np.int32(n) for n in route.sizes)

            def run(leaves: Sequence[Any]) -> Any:
                return fn(*lead, *leaves, *sizes)
            run.exact = (fn, lead, sizes)  # type: ignore[attr-defined]
        else:
            tree = self._program.main.out_tree

            def run(leaves: Sequence[Any]) -> Any:
                outs = self._dispatcher.run(route, leaves, self._run_flat)
                return jax.tree_util.tree_unflatten(tree, [jax.device_put(o) for o in outs])
        return run

    def _run_flat(self, target: tuple[int, ...], leaves: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
        """One profile on inputs of its shapes: its flat outputs."""
        out = self._callable(tuple(target))(*self._leading, *leaves, *[np.int32(n) for n in sizes])
        return jax.tree_util.tree_leaves(out)

    def _callable(self, target: tuple[int, ...]) -> Callable:
        """The compiled program for one profile: precompiled, or compiled now (once) and cached."""
        entry = self._by_target.get(target)
        if isinstance(entry, Precompiled):
            if not entry.warm and entry.lock.locked():
                with entry.lock:  # the warm-up thread is on it: wait rather than run it cold beside it
                    pass
            call = entry.ready()
            if call is not None:
                entry.warm = True
                return call
        elif entry is not None:
            return entry
        with self._compile_lock:
            entry = self._by_target.get(target)
            if entry is not None and not isinstance(entry, Precompiled):
                return entry
            fn = self._compile(target)
            self._by_target[target] = fn
            return fn

    def _compile(self, target: tuple[int, ...]) -> Callable:
        """Compile the exported program for ``target``, through the compile cache."""
        shapes = [a.shape for a in self._program.leading_avals()]
        shapes += list(self._dispatcher.leaf_shapes(target)) + [()] * len(self._sizes)
        platform = local_platform()
        iree = self.compiler.name == "iree"
        if iree:
            from .iree import FLAGS, Module, compile_static, versions

            options = {"iree": list(FLAGS), **versions()}
        else:
            options = self.compiler_options.get(platform, {})
        cache = shared_compile_cache() if host.tested_jax() else None
        key = compile_cache_key(program=self._program_digest, shapes=shapes, platform=platform, options=options,
                                host=host.host_features(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                                **({"donate": self.donate_argnums} if self.donated else {}))
        hit = cache.get(key) if cache is not None else None
        label = ", ".join(f"{d.name or d.symbol}={n}" for d, n in zip(self.dims, target))
        if hit is not None:
            blob, meta = hit
            try:
                fn = (Module(blob, 0, self._program.main.out_tree, "compile cache") if iree else
                      load_xla(blob, ExecutableEntry.from_json(meta), self._program.main.out_tree, self._name,
                               platform))
                log.info("%s: %s loaded from the compile cache", self._name, label)
                return fn
            except Exception as e:  # noqa: BLE001 - a bad entry is recompiled, never fatal
                log.warning("%s: compile cache entry for %s unusable (%s); compiling", self._name, label, e)
        t0 = time.perf_counter()
        if iree:
            blob, _ = compile_static(self._program.main, shapes)
            compiled, meta = Module(blob, 0, self._program.main.out_tree, self._name), {}
        else:
            compiled = compile_shapes(self._program.main, shapes, options, self.donate_argnums)
        log.info("%s: compiled %s on first use in %.0f ms (no profile covers it)", self._name, label,
                 (time.perf_counter() - t0) * 1e3)
        if cache is not None:
            if not iree:
                blob, entry = serialize_xla(compiled, platform)
                meta = entry.to_json()
            cache.put(key, blob, meta)
        return compiled

    # --- self-test and saving --------------------------------------------------------------------
    def selftest_cases(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """Self-test manifest entries and files: made from the traced function, or read from the artifact."""
        if self._selftest_cache is None:
            if self._selftest_source is not None and self._selftest_make is not None:
                source = self._selftest_source

                def reference(*leaves: Any) -> Any:
                    sizes = self._dispatcher.route(tuple(np.shape(x) for x in leaves)).sizes
                    return source(*leaves, *[jax.numpy.int32(n) for n in sizes])
                cases = self._selftest_make(reference, self._leaves, self._bound_by_index(), extra=self._padded_case(),
                                            ones=mask_inputs(self.dims, [p for p, _ in self._leaves]),
                                            rows=self._row_axes())
                self._selftest_cache = selftest.to_files(cases, self.tolerance)
            elif self._origin is not None:
                from ..artifact.read import read_files

                path, entries = self._origin
                self._selftest_cache = (entries, read_files(path, selftest.file_names(entries))[1])
            else:
                self._selftest_cache = ([], {})
        return self._selftest_cache

    def _row_axes(self) -> tuple[dict[int, int], list[int]] | None:
        """A dim declared ``rows`` that every output has and no ``DimSize`` tells: its axis in each flat input
        that has it and in each output (the self-test's reference runs a row at a time along it)."""
        sizes = {s.name for _, s in self._sizes}
        for di, d in enumerate(self.dims):
            if d.padding != "rows" or d.name in sizes:
                continue
            outs = [next((a for a, at in enumerate(axes) if at == di), None) for axes in self._dispatcher.out_axes]
            if outs and None not in outs:
                return dict(d.uses), outs
        return None

    def _padded_case(self) -> dict[int, tuple[int, ...]] | None:
        """Input shapes that need padding (each padded dim just above a bucket), for a self-test case."""
        sizes, padded = [], False
        for d in self.dims:
            lo, opt, hi = d.bounds
            above = [b + 1 for b in d.buckets if b + 1 <= hi and b + 1 not in d.buckets]
            if d.strategy == "padded" and above:
                sizes.append(min(above, key=lambda n: abs(n - opt)))
                padded = True
            else:
                sizes.append(opt)
        if not padded:
            return None
        return dict(enumerate(self._dispatcher.leaf_shapes(sizes)))

    @classmethod
    def load(cls, path: str | os.PathLike, warmup: str = "background", trust_executables: bool = True) -> "Executable":
        """Load an executable ``save`` wrote (or a build made): ``tripy_build.load``, by the name Tripy's
        ``Executable.load`` gives it.

        Args:
            path: the artifact directory.
            warmup, trust_executables: as for ``tripy_build.load``.

        Returns:
            The ``Executable``, every file checked against its digest; nothing compiles.

        Example::

            exe = tb.Executable.load("artifacts/geglu/3734fc869b77c72a")
        """
        # the loader makes Executables, so it depends on this module, not this module on it: it is looked up when
        # called (an import statement here, even in the function, would make the two modules a cycle)
        loader = importlib.import_module(f"{__package__}.loader")
        return loader.load(path, warmup=warmup, trust_executables=trust_executables)

    def save(self, path: str | os.PathLike, weights: str = DEFAULT_WEIGHTS) -> str:
        """Write this executable as an artifact directory; returns its path.

        Args:
            path: the directory (replaced if it holds an artifact; written atomically).
            weights: ``"prepared"`` (default) stores what the prep program makes of the weights wherever
                ``bind`` still works, so loading places them without running it; their raw values are then
                not in the artifact (``weights`` of the loaded executable cannot read them back).
                ``"raw"`` stores the weights as given (``runtime/save.py``).

        Example::

            exe.save("artifacts/geglu-prepared")
        """
        from .save import save

        return str(save(self, path, weights=weights))

    def _leaves_of(self, name: str) -> list[tuple[str, InputInfo]]:
        return self._leaves[self._leaf_slices[name]]


class _Steps:
    """``runtime/generate.py``'s steps on jax: a profile's compiled call, the cache a jax array kept on device."""

    def __init__(self, exe: Executable):
        from .generate import Spares

        self.exe = exe
        self.spares = Spares()

    def spec(self) -> Any:
        from .generate import Spec

        return Spec.from_metadata(self.exe.metadata, self.exe._name)

    def profiles(self, entry: str) -> list[dict[str, int]]:
        return self.exe.entry(entry).profiles

    def zeros(self, shape: Sequence[int], dtype: str) -> Any:
        return jax.device_put(np.zeros(shape, dtype))

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def put(self, x: np.ndarray) -> Any:
        return jax.device_put(x)

    def run(self, entry: str, profile: dict[str, int], leaves: list[Any]) -> tuple[np.ndarray, Any]:
        e = self.exe.entry(entry)
        with calls:
            out = e._callable(tuple(profile[d.name] for d in e.dims))(*e._leading, *leaves)
            return np.asarray(out["logits"]), out["cache"]


Executable._steps_class = _Steps


def _replace_weight(weight: Weight, values: dict[str, Any]) -> Weight:
    """``weight`` with its value taken from the new value of its argument, checked, never cast."""
    argument = weight.argument
    leaves = {argument + jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(values[argument])[0]}
    if weight.path not in leaves:
        raise CallError(f"bind({argument}=...): the new value has no leaf {weight.path}, which the program uses; "
                        "pass a tree with the same structure as at compile time.")
    value = leaves[weight.path]
    want = (tuple(weight.value.shape), np.dtype(weight.value.dtype))
    got = (tuple(np.shape(value)), np.dtype(getattr(value, "dtype", np.asarray(value).dtype)))
    if not isinstance(value, array_types()) or got != want:
        raise CallError(
            f"bind({argument}=...): {weight.path} must be an array of shape {want[0]} and dtype {want[1].name}, "
            f"got {type(value).__name__} of shape {got[0]} and dtype {got[1].name} (no silent casts)."
        )
    return Weight(weight.path, argument, jax.device_put(value))
