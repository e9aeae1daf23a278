"""``CompiledModel``: everything a compile made, as one frozen record (the in-memory twin of
``artifact.manifest.Manifest``, as jax's ``Exported`` is for ``jax.export``).

The compiler makes one (``compiler/pipeline.py``), ``runtime/save.py`` writes it, ``tb.load`` makes one from an
artifact (``runtime/loader.py``), and ``Executable.bind`` makes a new one; nothing changes one after it is made.
``Executable`` runs one and keeps only what calls change: the shapes it has routed, the profiles it compiled
on first use, the latencies its warm-up measured. ``exe.compiled`` is the record it runs.

Its executables (``Precompiled``) are the one exception to "made once": each holds the bytes it was made from
and deserializes them on first use (and may let go of the loaded executable again: ``Precompiled.unload``),
so a record of BERT-base's 50 profiles costs their bytes, not 50 loaded executables.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from ..artifact import selftest as selftest_files
from ..artifact.manifest import Compiler, ExecutableEntry
from ..core.dispatch import Dispatcher
from ..core.profiles import DimPlan, mask_inputs
from ..core.signature import Parameter, named_uses
from ..core.spec import DimSize, InputInfo, count_leaves, flatten_like, structure_template
from .program import Program, resolve


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


@dataclass(frozen=True)
class Reference:
    """Where a just-compiled model's self-test comes from: the traced function (its expected outputs) and the
    compiler's case maker, ``(reference, leaves, fixed, extra, ones, rows) -> cases`` (``compiler/selftest.py``)."""

    function: Callable
    make: Callable


@dataclass(frozen=True)
class StoredSelfTest:
    """Where a loaded model's self-test comes from: its artifact's files."""

    path: Any  # the artifact directory
    entries: tuple[dict[str, Any], ...]  # the manifest's self-test entries (their files under ``path``)


@dataclass(frozen=True, eq=False)  # its arrays and programs have no equality of their own: one record is itself
class CompiledModel:
    """A compiled model: its programs, weights, profiles and what they were compiled with; frozen.

    Its fields are those the artifact's manifest records (docs/artifact.md) for one entry: a model with several
    (``compile`` of ``Entry`` records) is one ``CompiledModel`` per entry (``exe.entry(name).compiled``). Change
    one by making another (``replace``); ``Executable.bind`` does.

    Example::

        exe = tb.compile(geglu, args=[tb.InputInfo(((1, 4, 8), 16), "float32"), params])
        record = exe.compiled
        [p.target for p in record.profiles]  # [(1,), (2,), (4,), (8,)]: one executable per batch bucket
        record.compiler_options["cpu"]  # the XLA options every profile was compiled with
    """

    name: str  # the program's name: the function's (or the model's), an entry's prefixed (``gpt2_decode``)
    program: Program  # the exported main and prep programs, the weights they take and where each leading argument comes from
    program_bytes: bytes  # ``program.main`` serialized (``jax.export``): the portable program the artifact stores
    prep_bytes: bytes | None  # ``program.prep`` serialized; None where nothing is prepared
    parameters: tuple[Parameter, ...]  # the runtime arguments, in the function's order, with their tree templates
    leaves: tuple[tuple[str, InputInfo], ...]  # every flat runtime input, in program order: (path, ``InputInfo``)
    sizes: tuple[tuple[str, DimSize], ...]  # the ``DimSize`` arguments: (path, the dim whose true size it receives)
    outputs: tuple[InputInfo, ...]  # every flat output's shape (with its dims) and dtype
    dims: tuple[DimPlan, ...]  # every dynamic dim: range, buckets, padding, where inputs use it
    dispatcher: Dispatcher  # a call's shapes -> the profile that runs them (``core/dispatch.py``)
    optimization_level: int  # 0..5 (``compiler/optimization.py``)
    platforms: tuple[str, ...]  # what it was compiled for: ``cpu``, ``cuda`` or both
    compiler: Compiler = field(default_factory=Compiler)  # which compiler made the executables, and how
    # platform -> the XLA options its executables were compiled with; run-time compiles use them too
    compiler_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profiles: tuple[Precompiled, ...] = ()  # the precompiled profiles this process runs, one per target
    universal: Precompiled | None = None  # one executable for every shape (IREE's dynamic module), or None
    # prep's chunks compiled, one per ``program.chunks``; () where prep runs whole, through jax
    prep_executables: tuple[Precompiled, ...] = ()
    prepared: tuple[Any, ...] = ()  # prep's outputs, on the device (the entries with the same prep share them)
    # executables for the other platforms of ``platforms`` (a GPU that is not here, the CPU beside this
    # machine's GPU): saved with the artifact, never run in this process; and, where none of ``platforms`` runs
    # here (``profiles`` are a twin program's, compiled for this CPU), the prep chunks compiled for the first of them
    foreign: tuple[Precompiled, ...] = ()
    foreign_prep: tuple[Precompiled, ...] | None = None
    # runtime inputs fixed to a value (``bind``): name -> (the value on the device, its folder in the artifact)
    bound: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # what the build records: model, build key, labels, ...
    donated: tuple[str, ...] = ()  # runtime input paths whose buffers every call donates to the outputs
    tolerance: float | None = None  # the self-test's, when compute runs at reduced precision
    selftest_from: Reference | StoredSelfTest | None = None  # where ``selftest`` comes from; None: no self-test

    # --- what follows from the fields -----------------------------------------------------------
    @functools.cached_property
    def program_digest(self) -> str:
        """The exported program's sha256: it names run-time compiles in the compile cache."""
        return hashlib.sha256(self.program_bytes).hexdigest()

    @functools.cached_property
    def output_structure(self) -> Any:
        """The tree the program returns, as ``core.spec.structure_template`` writes it (the manifest's)."""
        out_tree = self.program.main.out_tree
        return structure_template(jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves)))

    @functools.cached_property
    def named_uses(self) -> Any:
        return named_uses(list(self.leaves))

    @functools.cached_property
    def leaf_slices(self) -> dict[str, slice]:
        """Each runtime argument's flat leaves, as a slice of ``leaves``."""
        out, start = {}, 0
        for p in self.parameters:
            n = count_leaves(p.template)
            out[p.name] = slice(start, start + n)
            start += n
        return out

    @functools.cached_property
    def bound_leaves(self) -> dict[str, list[Any]]:
        """Each bound input's flat leaves."""
        out = {}
        for name, (value, _) in self.bound.items():
            leaves: list[Any] = []
            flatten_like(next(p for p in self.parameters if p.name == name).template, value, name, leaves)
            out[name] = leaves
        return out

    def bound_by_index(self) -> dict[int, Any]:
        """The bound inputs' leaves by their index in ``leaves``."""
        return {self.leaf_slices[name].start + i: value
                for name, values in self.bound_leaves.items() for i, value in enumerate(values)}

    @property
    def leading(self) -> list[Any]:
        """The leading arguments of every call: the weights ``main`` takes as they are, and prep's outputs."""
        direct = {s.index for s in self.program.sources if s.kind == "weight"}
        weights = self.program.weights
        return resolve(self.program.sources, [weights[i].array() if i in direct else None for i in range(len(weights))],
                       list(self.prepared))

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The positions of the donated inputs among the program's arguments (weights first)."""
        paths = [p for p, _ in self.leaves]
        return tuple(len(self.program.sources) + paths.index(p) for p in self.donated)

    def saved_executables(self) -> list[Precompiled]:
        """The executables an artifact of it holds: IREE's one module; else every profile of each platform it was
        built for (those run in this process, unless they are a twin program's, then the other platforms')."""
        if self.universal is not None:
            return [self.universal]
        return [p for p in self.profiles if p.entry.platform in self.platforms] + list(self.foreign)

    def saved_prep(self) -> list[Precompiled]:
        """The prep chunks' executables an artifact of it holds: those for its first platform."""
        return list(self.prep_executables if self.foreign_prep is None else self.foreign_prep)

    def replace(self, **changes: Any) -> "CompiledModel":
        """A copy with ``changes``, keeping the self-test made already where nothing it depends on changed
        (``metadata`` only)."""
        new = dataclasses.replace(self, **changes)
        if set(changes) <= {"metadata"} and "selftest" in self.__dict__:
            new.__dict__["selftest"] = self.__dict__["selftest"]
        return new

    # --- the self-test -------------------------------------------------------------------------
    @functools.cached_property
    def selftest(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """The self-test's manifest entries and files: made from the traced function (its expected outputs at
        min, opt and max, and just above a bucket where a dim pads), or read from the artifact."""
        source = self.selftest_from
        if isinstance(source, StoredSelfTest):
            from ..artifact.read import read_files

            return list(source.entries), read_files(source.path, selftest_files.file_names(list(source.entries)))[1]
        if source is None:
            return [], {}
        def reference(*leaves: Any) -> Any:
            sizes = self.dispatcher.route(tuple(np.shape(x) for x in leaves)).sizes
            return source.function(*leaves, *[jax.numpy.int32(n) for n in sizes])
        cases = source.make(reference, list(self.leaves), self.bound_by_index(), extra=self._padded_case(),
                            ones=mask_inputs(list(self.dims), [p for p, _ in self.leaves]), rows=self._row_axes())
        return selftest_files.to_files(cases, self.tolerance)

    def _row_axes(self) -> tuple[dict[int, int], list[int]] | None:
        """A dim declared ``rows`` that every output has and no ``DimSize`` tells: its axis in each flat input
        that has it and in each output (the self-test's reference runs a row at a time along it)."""
        sizes = {s.name for _, s in self.sizes}
        for di, d in enumerate(self.dims):
            if d.padding != "rows" or d.name in sizes:
                continue
            outs = [next((a for a, at in enumerate(axes) if at == di), None) for axes in self.dispatcher.out_axes]
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
        return dict(enumerate(self.dispatcher.leaf_shapes(sizes)))


def shares_prep(model: CompiledModel, prep_bytes: bytes | None, weights: Sequence[Any]) -> bool:
    """Whether ``model``'s prep is the same weight-only work on the same weights (prepared once, held once)."""
    return (prep_bytes is not None and model.prep_bytes == prep_bytes and len(model.program.weights) == len(weights)
            and all(x.value is y.value for x, y in zip(model.program.weights, weights)))
