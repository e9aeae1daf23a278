"""``Executable``: a compiled function with a signature, input checks and shape dispatch.

Every call is checked against the declared specs before it reaches XLA. Shapes with a precompiled
executable run it directly; any other in-range shape runs the exported program, compiled on first
use and cached for the process. Calls whose shapes were already checked take a fast path that costs
one dictionary lookup on top of jax's own dispatch.
"""

from __future__ import annotations

import copy
import inspect
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import artifact, selftest, xla_executable
from .errors import ArtifactError, CallError, SpecError
from .spec import InputInfo, flatten_like, rebuild

PROGRAM_FILE = "program.jaxexport"
_FAST_CACHE_LIMIT = 4096
_ARRAY_TYPES = (np.ndarray, np.generic, jax.Array)


class CompatibilityWarning(UserWarning):
    """A precompiled executable in an artifact cannot run on this host and was skipped."""


@dataclass(frozen=True)
class Parameter:
    """A runtime parameter of the executable: its name, how it may be passed, its structure."""

    name: str
    kind: str  # an inspect.Parameter kind name
    template: Any

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "structure": self.template}


@dataclass
class Precompiled:
    """One precompiled executable: the shapes it serves, its bytes and what they depend on."""

    shapes: tuple[tuple[int, ...], ...]
    blob: bytes
    meta: dict[str, Any]
    call: Callable | None = None


class Executable:
    """A compiled function. Call it like the original, with only the runtime inputs."""

    def __init__(self, *, exported: jax.export.Exported, exported_bytes: bytes, name: str,
                 parameters: Sequence[Parameter], leaves: Sequence[tuple[str, InputInfo]],
                 outputs: Sequence[InputInfo], optimization_level: int, platforms: Sequence[str],
                 precompiled: Sequence[Precompiled], metadata: dict[str, Any] | None = None,
                 selftest_source: Callable | None = None, origin: tuple[str, list] | None = None):
        self._exported = exported
        self._exported_bytes = exported_bytes
        self._name = name
        self._parameters = list(parameters)
        self._leaves = list(leaves)
        self._outputs = list(outputs)
        self.optimization_level = optimization_level
        self.platforms = tuple(platforms)
        self._precompiled = list(precompiled)
        self.metadata = dict(metadata or {})
        self._selftest_source = selftest_source  # the traced function, run eagerly for self-test cases
        self._origin = origin  # (artifact path, self-test entries) for a loaded executable
        self._selftest_cache: tuple[list, dict[str, bytes]] | None = None
        self._fallback = jax.jit(exported.call)
        self._by_shape = {p.shapes: p.call for p in self._precompiled if p.call is not None}
        self._named_uses: dict[str, list[tuple[int, int]]] = {}
        for li, (_, info) in enumerate(self._leaves):
            for d, n in info.dimension_names.items():
                self._named_uses.setdefault(n, []).append((li, d))
        self._leaf_slices: dict[str, slice] = {}
        start = 0
        for p in self._parameters:
            n = _count_leaves(p.template)
            self._leaf_slices[p.name] = slice(start, start + n)
            start += n
        self._bound: dict[str, tuple[Any, str]] = {}
        self._derive()

    def _derive(self) -> None:
        """Recompute what depends on which parameters are bound."""
        self._visible = [p for p in self._parameters if p.name not in self._bound]
        self._positional = [p for p in self._visible if p.kind != "KEYWORD_ONLY"]
        self._bound_leaves: dict[str, list[Any]] = {}
        for name, (value, _) in self._bound.items():
            leaves: list[Any] = []
            flatten_like(next(p for p in self._parameters if p.name == name).template, value, name, leaves)
            self._bound_leaves[name] = leaves
        self._all_leaf_params = all("leaf" in p.template for p in self._visible)
        self._fast: dict[tuple, Callable] = {}
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, getattr(inspect.Parameter, p.kind)) for p in self._visible]
        )
        self.__name__ = self._name

    def bind(self, **values: Any) -> "Executable":
        """A new executable with some runtime inputs fixed to ``values`` (e.g. weights).

        The bound inputs disappear from the signature; saving writes them as orbax checkpoints and
        ``load`` restores them. Binding an already bound input swaps its value without recompiling.
        """
        return self._with_bound(values, {n: self._bound.get(n, (None, f"bound/{n}"))[1] for n in values})

    def _with_bound(self, values: dict[str, Any], dirs: dict[str, str]) -> "Executable":
        """``bind``, with the artifact directory each bound input is saved to."""
        names = {p.name for p in self._parameters}
        for name in values:
            if name not in names:
                raise CallError(f"bind(): {name!r} is not an input; inputs are: {', '.join(sorted(names))}.")
        new = copy.copy(self)
        new._bound = dict(self._bound)
        new._bound.update({n: (jax.tree_util.tree_map(jax.device_put, v), dirs[n]) for n, v in values.items()})
        new._selftest_cache = None
        if new._selftest_source is None:
            new._origin = None  # the stored self-test outputs were computed with the old values
        new._derive()
        for name in values:
            for value, (path, info) in zip(new._bound_leaves[name], new._leaves_of(name)):
                _check_leaf(value, path, info)
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
        infos = [info for _, info in self._leaves]
        return {p.name: rebuild(p.template, infos) for p in self._visible}

    @property
    def output_infos(self) -> list[InputInfo]:
        return list(self._outputs)

    def get_input_info(self) -> list[Any]:
        return list(self.input_infos.values())

    def get_output_info(self) -> list[InputInfo]:
        return self.output_infos

    @property
    def precompiled_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Input shapes that run without compiling (executables loaded or built in this process)."""
        return list(self._by_shape)

    def __repr__(self) -> str:
        args = ", ".join(f"{path}: {info!r}" for path, info in self._leaves)
        return f"<tripy_build.Executable {self._name}({args})>"

    # --- calling ---------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            try:
                fn = self._fast.get(tuple([(type(a), a.shape, a.dtype) for a in args]))
            except AttributeError:
                fn = None
            if fn is not None:
                return fn(*args) if not self._bound else fn(*self._assemble_named(dict(zip(self._names, args))))
        return self._checked_call(args, kwargs)

    @property
    def _names(self) -> list[str]:
        return [p.name for p in self._visible]

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        names = self._names
        if len(args) > len(self._positional):
            raise CallError(
                f"{self._name}() takes {len(self._positional)} positional input(s) "
                f"({', '.join(p.name for p in self._positional)}) but {len(args)} were given."
            )
        values: dict[str, Any] = {p.name: a for p, a in zip(self._positional, args)}
        for key, value in kwargs.items():
            if key not in names:
                raise CallError(
                    f"{self._name}() got an unexpected keyword argument {key!r}; its inputs are: "
                    f"{', '.join(names)} (compile-time constants cannot be passed)."
                )
            if key in values:
                raise CallError(f"{self._name}() got multiple values for input {key!r}.")
            values[key] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise CallError(
                f"{self._name}() is missing input(s) {', '.join(repr(m) for m in missing)}; "
                f"expected: {', '.join(f'{n}: {self.input_infos[n]!r}' for n in missing)}."
            )
        return values

    def check_leaves(self, leaves: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        """Validate flat inputs against the specs; the tuple of their shapes."""
        shapes = tuple(_check_leaf(v, path, info) for v, (path, info) in zip(leaves, self._leaves))
        for name, uses in self._named_uses.items():
            sizes = {shapes[li][d] for li, d in uses}
            if len(sizes) > 1:
                parts = ", ".join(f"input '{self._leaves[li][0]}' dim {d} is {shapes[li][d]}" for li, d in uses)
                raise CallError(f"NamedDimension {name!r} must have one size in every input, but {parts}.")
        return tuple(shapes)

    def _bound_by_index(self) -> dict[int, Any]:
        return {self._leaf_slices[name].start + i: value
                for name, values in self._bound_leaves.items() for i, value in enumerate(values)}

    def call_flat(self, *leaves: Any) -> Any:
        """Call with the unbound runtime inputs flattened in order (self-tests use this)."""
        bound, it = self._bound_by_index(), iter(leaves)
        full = [bound[i] if i in bound else next(it) for i in range(len(self._leaves))]
        return self._by_shape.get(self.check_leaves(full), self._fallback)(*full)

    def selftest_cases(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """Self-test manifest entries and files: made by running the function eagerly, or from the artifact."""
        if self._selftest_cache is None:
            if self._selftest_source is not None:
                cases = selftest.make(self._selftest_source, self._leaves, self._bound_by_index())
                self._selftest_cache = selftest.to_files(cases)
            elif self._origin is not None:
                path, entries = self._origin
                self._selftest_cache = (entries, artifact.read(path, selftest.file_names(entries))[1])
            else:
                self._selftest_cache = ([], {})
        return self._selftest_cache

    def _checked_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        leaves = self._assemble_named(self._bind(args, kwargs))
        shapes = self.check_leaves(leaves)
        fn = self._by_shape.get(shapes, self._fallback)
        out = fn(*leaves)
        if self._all_leaf_params and not kwargs and len(args) == len(self._visible):
            if len(self._fast) >= _FAST_CACHE_LIMIT:
                self._fast.clear()
            # A Compiled object's own dispatch function skips a Python frame per call.
            direct = getattr(fn, "_call", None) if isinstance(fn, jax.stages.Compiled) else None
            self._fast[tuple([(type(a), a.shape, a.dtype) for a in args])] = direct or fn
        return out

    # --- saving and loading ----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """Everything the artifact's manifest says about this executable (files are added on write)."""
        return {
            "function": self._name,
            "inputs": [p.to_json() for p in self._parameters],
            "input_specs": [dict(info.to_json(), path=path) for path, info in self._leaves],
            "outputs": [info.to_json() for info in self._outputs],
            "optimization_level": self.optimization_level,
            "platforms": list(self.platforms),
            "program": {"file": PROGRAM_FILE, "format": "jax.export",
                        "calling_convention_version": self._exported.calling_convention_version},
            "executables": [
                dict(p.meta, file=f"executables/{i}.xla") for i, p in enumerate(self._precompiled)
            ],
            "toolchain": toolchain(),
            "bound_inputs": {name: d for name, (_, d) in self._bound.items()},
            "metadata": self.metadata,
        }

    def save(self, path: str | os.PathLike) -> str:
        """Write this executable as an artifact directory; returns its path."""
        return str(self.write(path))

    def write(self, path: str | os.PathLike, writers: Sequence[Callable] = (), replace: bool = True):
        """``save`` with extra files from ``writers(tmpdir)``; see ``artifact.write`` for ``replace``."""
        from . import params as params_io

        entries, selftest_files = self.selftest_cases()
        files = {PROGRAM_FILE: self._exported_bytes, **selftest_files}
        files.update({f"executables/{i}.xla": p.blob for i, p in enumerate(self._precompiled)})
        bound_writers = [
            (lambda tmp, d=d, v=v: params_io.save(tmp / d, v)) for v, d in self._bound.values()
        ]
        manifest = dict(self.manifest(), selftest=entries)
        return artifact.write(path, manifest, files, [*bound_writers, *writers], replace=replace)

    @staticmethod
    def load(path: str | os.PathLike) -> "Executable":
        """Load an artifact written by ``save`` or the build command, without compiling."""
        where = os.path.join(path, artifact.MANIFEST)
        manifest = artifact.read_manifest(path)
        try:
            name, level = str(manifest["function"]), int(manifest["optimization_level"])
            platforms = [str(p) for p in manifest["platforms"]]
            program_file = manifest["program"]["file"]
            exe_entries = list(manifest["executables"])
            shapes = [tuple(tuple(int(d) for d in s) for s in e["input_shapes"]) for e in exe_entries]
            bound = {str(k): str(v) for k, v in (manifest.get("bound_inputs") or {}).items()}
            leaves = [(s["path"], InputInfo.from_json(s)) for s in manifest["input_specs"]]
            parameters = [Parameter(p["name"], p["kind"], p["structure"]) for p in manifest["inputs"]]
            outputs = [InputInfo.from_json(o) for o in manifest["outputs"]]
            names = [program_file] + [e["file"] for e in exe_entries]
        except (KeyError, TypeError, ValueError, AttributeError, SpecError) as e:
            raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e}); the artifact is damaged.") from None
        _, files = artifact.read(path, names, [f"{d.rstrip('/')}/" for d in bound.values()], manifest)
        try:
            exported = jax.export.deserialize(bytearray(files[program_file]))
        except Exception as e:  # noqa: BLE001 - any failure here means the program file is unusable
            raise ArtifactError(f"{os.path.join(path, program_file)}: cannot deserialize the exported program ({e}).") from None
        precompiled = []
        for entry, entry_shapes in zip(exe_entries, shapes):
            pre = Precompiled(entry_shapes, files[entry["file"]], entry)
            reason = _cannot_load(entry)
            if reason is None:
                pre.call = xla_executable.load(pre.blob, entry, exported.out_tree, name, entry["platform"])
            else:
                warnings.warn(
                    f"{os.path.join(path, entry['file'])}: skipped ({reason}); the exported program will be "
                    "compiled for these shapes on first use instead.",
                    CompatibilityWarning, stacklevel=2,
                )
            precompiled.append(pre)
        exe = Executable(
            exported=exported, exported_bytes=files[program_file], name=name, parameters=parameters,
            leaves=leaves, outputs=outputs, optimization_level=level, platforms=platforms,
            precompiled=precompiled, metadata=manifest.get("metadata", {}),
            origin=(str(path), manifest.get("selftest", [])),
        )
        return exe._restore_bound(path, bound) if bound else exe

    def _restore_bound(self, path: str | os.PathLike, bound: dict[str, str]) -> "Executable":
        """Bind inputs from the artifact's checkpoints (orbax is imported only for such artifacts)."""
        from . import params as params_io

        values = {}
        for name, rel in bound.items():
            param = next((p for p in self._parameters if p.name == name), None)
            if param is None:
                raise ArtifactError(f"{os.path.join(path, artifact.MANIFEST)}: bound input {name!r} is not an input.")
            leaves = self._leaves_of(name)
            like = rebuild(param.template, [jax.ShapeDtypeStruct(info.shape_bounds.opt, info.dtype) for _, info in leaves])
            values[name] = params_io.restore(os.path.join(path, artifact.safe_relpath(rel)), like,
                                             f"bound input {name!r}", ArtifactError)
        return self._with_bound(values, bound)

    def _leaves_of(self, name: str) -> list[tuple[str, InputInfo]]:
        return self._leaves[self._leaf_slices[name]]


def _check_leaf(value: Any, path: str, info: InputInfo) -> tuple[int, ...]:
    if not isinstance(value, _ARRAY_TYPES):
        raise CallError(f"input '{path}' must be an array (numpy or jax) of {info!r}, got {type(value).__name__}.")
    shape = tuple(value.shape)
    if len(shape) != info.rank:
        raise CallError(f"input '{path}' has rank {len(shape)} (shape {shape}) but expected rank {info.rank}: {info!r}.")
    if value.dtype != info.dtype:
        raise CallError(
            f"input '{path}' has dtype {np.dtype(value.dtype).name} but expected {info.dtype.name}; "
            f"convert it explicitly, e.g. x.astype('{info.dtype.name}') (no silent casts)."
        )
    for d, (size, lo, hi) in enumerate(zip(shape, info.shape_bounds.min, info.shape_bounds.max)):
        if not lo <= size <= hi:
            name = info.dimension_names.get(d)
            label = f" (NamedDimension {name!r})" if name else ""
            expected = f"fixed at {lo}" if lo == hi else f"in range [{lo}, {hi}]"
            raise CallError(
                f"input '{path}' dim {d}{label} is {size}, but it must be {expected}; "
                f"the input's shape is {shape}, declared as {info!r}."
            )
    return shape


def _count_leaves(template: Any) -> int:
    if "leaf" in template:
        return 1
    children = template.get("dict") or template.get("list") or template.get("tuple") or []
    return sum(_count_leaves(c[1] if "dict" in template else c) for c in children)


def _cannot_load(entry: dict[str, Any]) -> str | None:
    if entry.get("format") != xla_executable.FORMAT:
        return f"unknown executable format {entry.get('format')!r}"
    platform = entry.get("platform")
    try:
        jax.devices(platform)
    except RuntimeError:
        return f"no {platform} device on this host"
    return xla_executable.incompatibility(entry.get("depends_on", {}))


def toolchain() -> dict[str, Any]:
    import platform
    import jaxlib

    from . import __version__

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "tripy_build": __version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def load(path: str | os.PathLike) -> Executable:
    """Load a built artifact: ``tripy_build.load(path)``."""
    return Executable.load(path)
