"""``Executable``: a compiled model run with a signature, input checks and shape dispatch.

It runs a ``CompiledModel`` (``runtime/compiled.py``: what the compile made, frozen) and holds only what calls
change. Every call is checked against the declared specs before it reaches XLA. ``dispatch`` then maps the
call's shapes to a profile: a precompiled executable runs as is, or with the inputs padded up to a
bucket and the outputs sliced back where the model declared that exact. A shape no profile covers
is compiled from the exported program once (``runtime/compile_here.py``), kept for the process and stored in
the compile cache for the next one. Calls whose shapes were seen before take a fast path of one dictionary
lookup on top of jax's own dispatch. The weights are device arrays the record holds and every call passes;
``bind`` makes a new record with them replaced (or runtime inputs fixed) without recompiling (``runtime/bind.py``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from .. import host
from ..artifact.manifest import Compiler
from ..core import dispatch
from ..core.profiles import DimPlan
from ..core.signature import bind_call, check_leaves, input_infos, value_checks
from ..core.spec import InputInfo, flatten_like, output_names
from ..errors import CallError
from .bind import with_inputs, with_weights
from .compile_here import compile_profile
from .compiled import CompiledModel, Precompiled
from .entries import MultiEntry
from .save import DEFAULT_WEIGHTS
from .warmup import (RUN_LIMIT_S, Warmed, calibrate, calls, extrapolate, fastest_run, flops, start as start_warmup,
                     stopping as warmup_stopping, too_costly, warm_in_order)

log = logging.getLogger(__name__)

_FAST_CACHE_LIMIT = 4096


class Executable(MultiEntry):
    """A compiled function. Call it like the original, with only the runtime inputs.

    It runs a ``CompiledModel`` (``exe.compiled``: what the compile made, frozen) and holds only what calls
    change: the routes of the shapes it has seen, the profiles it compiled on first use, the latencies its
    warm-up measured. ``like``: an executable of the same programs whose call-time state it shares (``bind``).
    """

    def __init__(self, compiled: CompiledModel, *, like: "Executable | None" = None):
        self._model = compiled
        self._generation: Any = None  # generation_steps(), made on first use (MultiEntry)
        # the other entries of a multi-entry executable, by name, this one included (``compile`` of ``Entry``)
        self.entries: dict[str, Executable] = {}
        if like is not None:  # the same programs: what was compiled or measured for them holds for this one too
            self._by_target, self._latency, self._run_s = like._by_target, like._latency, like._run_s
        else:
            self._by_target: dict[tuple[int, ...], Any] = {p.target: p for p in compiled.profiles}
            self._latency: dict[tuple[int, ...], float] = {}  # seconds per profile for split plans (warmup.calibrate)
            self._run_s: dict[tuple[int, ...], float] = {}  # a run of each profile the warm-up ran (its fastest)
        self._compile_lock = threading.Lock()
        self._leading = compiled.leading
        self._visible = [p for p in compiled.parameters if p.name not in compiled.bound]
        self._args = [leaf for p in self._visible for leaf in compiled.leaves[compiled.leaf_slices[p.name]]]
        self._all_leaf_params = all("leaf" in p.template for p in self._visible)
        self._fast: dict[tuple, Callable] = {}
        self._runners: dict[tuple, Callable] = {}
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, getattr(inspect.Parameter, p.kind)) for p in self._visible]
        )
        self.__name__ = compiled.name

    @property
    def compiled(self) -> CompiledModel:
        """What the compile made: programs, weights, profiles, options (``runtime/compiled.py``)."""
        return self._model

    @property
    def compiled_entries(self) -> dict[str, CompiledModel]:
        """Each entry's record by name (``{"": exe.compiled}`` for a single function): what ``save`` writes."""
        return {name: e.compiled for name, e in (self.entries or {"": self}).items()}

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What the build recorded: ``model``, ``build_key``, ``params``, ``precision``, ``labels``, ``generate``."""
        return self._model.metadata

    @property
    def compiler(self) -> Compiler:
        return self._model.compiler

    @property
    def compiler_options(self) -> Mapping[str, Mapping[str, Any]]:
        return self._model.compiler_options

    @property
    def platforms(self) -> tuple[str, ...]:
        return self._model.platforms

    @property
    def optimization_level(self) -> int:
        return self._model.optimization_level

    @property
    def tolerance(self) -> float | None:
        return self._model.tolerance

    @property
    def donated(self) -> tuple[str, ...]:
        return self._model.donated

    @property
    def dims(self) -> list[DimPlan]:
        return list(self._model.dims)

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The positions of the donated inputs among the program's arguments (weights first)."""
        return self._model.donate_argnums

    @property
    def weights(self) -> dict[str, Any]:
        """The weights the program takes, by path (e.g. ``params['proj']['weight']``)."""
        return {w.path: w.array() for w in self._model.program.weights}

    def bind(self, **values: Any) -> "Executable":
        """A new executable with some arguments replaced, without recompiling.

        A runtime input bound to a value disappears from the signature (``load`` restores it from the
        artifact). A constant argument (e.g. ``params``) gets new weights: the same tree, shapes and
        dtypes as at compile time (leaves the program does not use are ignored), never cast.
        """
        model = self._model
        runtime = {p.name for p in model.parameters}
        constants = {w.argument for w in model.program.weights if w.argument}
        for name in values:
            if name not in runtime | constants:
                raise CallError(
                    f"bind(): {name!r} is not an input or a constant argument with weights; inputs: "
                    f"{', '.join(sorted(runtime)) or 'none'}; constant arguments: {', '.join(sorted(constants)) or 'none'}."
                )
        inputs = {n: v for n, v in values.items() if n in runtime}
        swapped = {n: v for n, v in values.items() if n in constants and n not in runtime}
        if swapped and model.universal is not None and model.compiler.name == "iree":
            raise CallError(f"bind({', '.join(swapped)}=...): this IREE module holds its weights as constants (IREE packs "
                            "them when it compiles); build again with the new params.")
        entries = dict(self.entries) or {"": self}
        models = {}
        for name, e in entries.items():  # the other entries take the new weights too (their runtime inputs stay)
            m = e._model
            if e is self and inputs:
                m = with_inputs(m, inputs, {n: m.bound.get(n, (None, f"bound/{n}"))[1] for n in inputs})
            if any(w.argument in swapped for w in m.program.weights):
                m = with_weights(m, swapped)
            models[name] = m
        mine = next(name for name, e in entries.items() if e is self)
        return together(models, like=entries)[mine]

    # --- introspection ---------------------------------------------------------------------------
    @property
    def input_infos(self) -> dict[str, Any]:
        return input_infos(list(self._model.leaves), list(self._model.parameters), self._visible)

    @property
    def output_infos(self) -> list[InputInfo]:
        return list(self._model.outputs)

    def get_input_info(self) -> list[Any]:
        return list(self.input_infos.values())

    def get_output_info(self) -> list[InputInfo]:
        return self.output_infos

    @property
    def profiles(self) -> list[dict[str, int]]:
        """The precompiled profiles, each as ``{dim: size}`` (dims by name, or symbol if unnamed)."""
        return [{d.name or d.symbol: n for d, n in zip(self.dims, p.target)} for p in self._model.profiles]

    @property
    def dispatcher(self) -> dispatch.Dispatcher:
        return self._model.dispatcher

    @property
    def flat_inputs(self) -> list[tuple[str, InputInfo]]:
        """Every runtime input leaf in program order, by path (bound ones included)."""
        return list(self._model.leaves)

    @property
    def flat_args(self) -> list[tuple[str, InputInfo]]:
        """The leaves ``call_flat`` takes, in order: (path, ``InputInfo``); bound inputs are not among them."""
        return list(self._args)

    @property
    def output_names(self) -> list[str]:
        """Each flat output's name: its key in the returned dict (``last_hidden_state``), else ``output<i>``."""
        return output_names(self._model.output_structure, len(self._model.outputs))

    def route(self, shapes: Sequence[Sequence[int]]) -> dispatch.Route:
        """How a call with these flat input shapes runs: the profile, any padding, a split plan (by the latencies
        the warm-up measured)."""
        return self._model.dispatcher.route(tuple(tuple(s) for s in shapes), self._latency)

    @property
    def precompiled_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Input shapes that run a precompiled executable as they are (without padding or compiling)."""
        return [self._model.dispatcher.leaf_shapes(p.target) for p in self._model.profiles]

    def unload_profiles(self, targets: Sequence[tuple[int, ...]] | None = None) -> None:
        """Let go of every loaded profile (or those of ``targets``) that can be deserialized again
        (``Precompiled.unload``), each loading again on its next use: a build that only saves them held
        BERT-base's 50 loaded, ~570 MB."""
        picked = self._model.profiles if targets is None else [self._by_target[t] for t in targets if t in self._by_target]
        if [p for p in picked if p.unload()]:
            self._runners.clear()  # they hold the executables let go
            self._fast.clear()
            host.return_freed_memory()

    def load_all(self) -> int:
        """Deserialize every precompiled profile now (loading defers each to its first use); their count."""
        return sum(p.ready() is not None for p in self._model.profiles)

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
        if self._model.universal is not None:
            return [self._model.universal]
        return sorted(self._model.profiles, key=lambda p: math.prod(p.target))

    def _prepare_sizes(self) -> list[int] | None:
        """The bytes of each executable a warm-up deserializes (``warmup.prepare_at_load``); None where that is
        not what preparing them costs (compiled here: ``trust_executables=False``; IREE's dynamic module)."""
        if self._model.universal is not None or any(not p.blob for p in self._model.profiles):
            return None
        return [len(p.blob) for p in self._model.profiles]

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
            log.warning("%s: background warm-up stopped: %s", self.__name__, e)

    def _calibrate(self, quiet: bool = True) -> None:
        """Time the profiles the warm-up ran (each within ``warmup.RUN_LIMIT_S``) for split plans, by
        ``warmup.calibrate``: only a ``rows`` dim is split, so only an artifact that has one."""
        if self._model.universal is not None or not any(d.padding == "rows" for d in self.dims):
            return
        timed = [p for p in self._model.profiles if p.call is not None and self._run_s.get(p.target, 1e9) <= RUN_LIMIT_S]
        runs = {p.target: (p.call, self._zeros_args(p)) for p in timed}

        def time_one(target: tuple[int, ...]) -> float:
            call, args = runs[target]
            return fastest_run(lambda: jax.block_until_ready(call(*args)), budget_s=0, most=1)

        try:
            latency = calibrate(sorted(runs, key=math.prod), time_one, warmup_stopping, quiet)
        except Exception as e:  # noqa: BLE001 - without latencies a call pads, as before the warm-up
            log.warning("%s: timing the profiles for split plans stopped: %s", self.__name__, e)
            return
        if latency:  # the profiles too slow to time, estimated from their work (prepared ones: ``call`` is set)
            latency = extrapolate(latency, {p.target: flops(p.call) for p in self._model.profiles if p.call is not None})
        self._latency.update(latency)
        self._runners.clear()  # routes planned before the latencies were known
        self._fast.clear()

    def _zeros_args(self, p: Precompiled) -> tuple[Any, ...]:
        """Every argument of a run of ``p`` on zeros: the weights, the inputs at its shapes, its dims' sizes."""
        dispatcher = self._model.dispatcher
        shapes = dispatcher.leaf_shapes(p.target if p is not self._model.universal else
                                        tuple(d.bounds[1] for d in self.dims))
        zeros = [np.zeros(s, info.dtype) for s, (_, info) in zip(shapes, self._model.leaves)]
        return (*self._leading, *zeros, *[np.int32(n) for n in dispatcher.route(shapes).sizes])

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
        return f"<tripy_build.Executable {self.__name__}({args})>"

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
        return bind_call(self.__name__, self._visible, args, kwargs, self.input_infos.__getitem__)

    def check_leaves(self, leaves: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        """Validate flat inputs against the specs; the tuple of their shapes."""
        return check_leaves(leaves, list(self._model.leaves), self._model.named_uses)

    def call_flat(self, *leaves: Any) -> list[np.ndarray]:
        """Call with the unbound inputs flattened in order (``flat_args``); the flat outputs, as numpy arrays (as
        ``Runtime.call_flat``: the self-tests and the server call either loader so)."""
        full = self._assemble(leaves)
        with calls:
            out = self._runner(self.check_leaves(full))(full)
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]

    def check_flat(self, *leaves: Any) -> None:
        """Validate the unbound flat inputs as ``call_flat`` does, without running them (``CallError``)."""
        self.check_leaves(self._assemble(leaves))

    def needs_compile(self, *leaves: Any) -> bool:
        """Whether a call with these (checked) unbound flat inputs runs shapes that no profile serves yet, so that
        it compiles first (a server runs such calls apart, not holding the others up)."""
        if self._model.universal is not None:
            return False
        return self.route([np.shape(x) for x in self._assemble(leaves)]).target not in self._by_target

    def _assemble(self, leaves: Sequence[Any]) -> list[Any]:
        """Every flat input: the bound ones, with ``leaves`` in the unbound places."""
        self._check_count(leaves, self._args)
        bound, it = self._model.bound_by_index(), iter(leaves)
        return [bound[i] if i in bound else next(it) for i in range(len(self._model.leaves))]

    def run_profile(self, target: Sequence[int], leaves: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
        """Run the program compiled for ``target`` (sizes per dim) on inputs already of its shapes; flat outputs."""
        with calls:
            return self._run_flat(tuple(target), leaves, sizes)

    def _assemble_named(self, values: dict[str, Any]) -> list[Any]:
        leaves: list[Any] = []
        bound = self._model.bound_leaves
        for p in self._model.parameters:
            if p.name in bound:
                leaves.extend(bound[p.name])
            else:
                flatten_like(p.template, values[p.name], p.name, leaves)
        return leaves

    def _checked_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        leaves = self._assemble_named(self._bind(args, kwargs))
        run = self._runner(self.check_leaves(leaves))
        out = run(leaves)
        if self._all_leaf_params and not kwargs and len(args) == len(self._visible) and not (
                self._model.bound and any(info.values is not None or info.holds is not None
                                          for _, info in self._model.leaves)):
            if len(self._fast) >= _FAST_CACHE_LIMIT:
                self._fast.clear()
            self._fast[tuple([(type(a), a.shape, a.dtype) for a in args])] = self._fast_path(run)
        return out

    def _fast_path(self, run: Callable) -> Callable:
        """What later calls with the same argument shapes run: the compiled call itself where possible, after
        checking the values of inputs that declare a range (their shapes and dtypes were checked already)."""
        fast = self._fast_call(run)
        check = value_checks(list(self._model.leaves)) if not self._model.bound else None
        if check is None:
            return fast

        def checked(*args: Any) -> Any:
            check(args)
            return fast(*args)
        return checked

    def _fast_call(self, run: Callable) -> Callable:
        exact = getattr(run, "exact", None)
        if self._model.bound:
            bound, n = self._model.bound_by_index(), len(self._model.leaves)

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
        run = self._route_runner(self._model.dispatcher.route(shapes, self._latency))
        if len(self._runners) >= _FAST_CACHE_LIMIT:
            self._runners.clear()
        self._runners[shapes] = run
        return run

    def _route_runner(self, route: dispatch.Route) -> Callable:
        """A function of the flat (validated) inputs that runs them by ``route``."""
        if self._model.universal is not None:  # every shape runs as it is
            fn, lead, sizes = self._model.universal.ready(), tuple(self._leading), tuple(np.int32(n) for n in route.sizes)

            def run(leaves: Sequence[Any]) -> Any:
                return fn(*lead, *leaves, *sizes)
        elif route.split is None and not route.padded and not any(c is not None for c in route.slices):
            fn = self._callable(route.target)
            lead, sizes = tuple(self._leading), tuple(np.int32(n) for n in route.sizes)

            def run(leaves: Sequence[Any]) -> Any:
                return fn(*lead, *leaves, *sizes)
            run.exact = (fn, lead, sizes)  # type: ignore[attr-defined]
        else:
            tree, dispatcher = self._model.program.main.out_tree, self._model.dispatcher

            def run(leaves: Sequence[Any]) -> Any:
                outs = dispatcher.run(route, leaves, self._run_flat)
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
            fn = compile_profile(self._model, target)
            self._by_target[target] = fn
            return fn

    # --- self-test and saving --------------------------------------------------------------------
    def selftest_cases(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """Self-test manifest entries and files: made from the traced function, or read from the artifact."""
        return self._model.selftest

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
        from .stored_tokenizer import DIR, stored_files

        main = self._main  # the checkpoint's tokenizer goes with it
        names = (main.metadata.get("tokenizer") or []) if main.artifact_dir else []
        tokenizer = {DIR + n: b for n, b in stored_files(main.artifact_dir, names, self.__name__).items()}
        return str(save(self.compiled_entries, path, weights=weights, extra_files=tokenizer))

    # --- generation (``runtime/generate.Steps``) ------------------------------------------------
    def _place(self, x: np.ndarray) -> Any:
        return jax.device_put(x)

    def _fetch(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def _step(self, target: tuple[int, ...], leaves: list[Any], names: tuple[str, ...]) -> tuple[Any, ...]:
        with calls:
            flat = jax.tree_util.tree_leaves(self._callable(target)(*self._leading, *leaves))
        return tuple(flat[self._output_index[n]] for n in names)


def together(models: Mapping[str, CompiledModel], like: Mapping[str, Executable] | None = None) -> dict[str, Executable]:
    """An executable per entry of a model (``{"": model}`` for a single function), each holding all in ``entries``;
    ``like``: the executables of the same programs whose call-time state they share."""
    exes = {name: Executable(m, like=(like or {}).get(name)) for name, m in models.items()}
    if len(models) > 1 or next(iter(models)) != "":
        for e in exes.values():
            e.entries = exes
    return exes
