"""An ``Executable`` to and from an artifact directory (``artifact`` does the files; this says what is in them).

Saving writes the exported programs, the weights once (``.npy``, no pickle), one executable per
profile, the self-test and a manifest that describes all of it (docs/artifact.md). ``read`` parses
the manifest and checks every file a loader will use against its digest, without jax, for both
loaders: ``load`` (here: jax arrays, every feature) and ``runtime.load`` (numpy, no jax).
Precompiled executables are deserialized on first use, so a process that serves a few shapes pays
only for those; one built for another host is skipped with a ``CompatibilityWarning`` and its shapes
compile from the exported program instead.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import host
from . import layout as artifact
from . import crosscheck
from ..errors import ArtifactError, SpecError
from ..compiler.optimization import compiler_options
from ..core.profiles import DimPlan
from ..core.signature import Parameter
from ..core.spec import DimSize, InputInfo, count_leaves, flatten_like, rebuild, to_dtype

PROGRAM_FILE = "program.jaxexport"
PREP_FILE = "prep.jaxexport"
PREP_EXECUTABLE = "executables/prep.xla"
WARMUPS = ("background", "now", "none")


def executable_file(i: int, meta: dict[str, Any]) -> str:
    return f"executables/{i}.{'vmfb' if meta.get('format') == 'iree-vmfb' else 'xla'}"


class CompatibilityWarning(UserWarning):
    """A precompiled executable in an artifact cannot run on this host and was skipped."""


def toolchain() -> dict[str, Any]:
    import platform

    from .. import __version__

    return {
        "python": platform.python_version(),
        "jax": host.version("jax"),
        "jaxlib": host.version("jaxlib"),
        "tripy_build": __version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def npy(array: Any) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(np.asarray(array)), allow_pickle=False)
    return buf.getvalue()


def from_npy(data: bytes, where: str, dtype: Any = None) -> np.ndarray:
    """An array from ``.npy`` bytes; with ``dtype``, checked against it (``as_dtype``)."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise ArtifactError(f"{where}: not a readable .npy array ({e}).") from None
    if dtype is None:
        return array
    viewed = as_dtype(array, dtype)
    if viewed is not None:
        return viewed
    want = to_dtype(dtype)
    raise ArtifactError(f"{where}: holds {array.dtype.name} data, but the manifest says {want.name}; the artifact is damaged.")


def as_dtype(array: np.ndarray, dtype: Any) -> np.ndarray | None:
    """``array`` as ``dtype``, or None where it holds another dtype. numpy has no bfloat16 (or fp8) of its
    own: ``.npy`` stores those as raw void items of the same size, which are viewed as ``dtype`` here."""
    want = to_dtype(dtype)
    if array.dtype == want:
        return array
    if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize:
        return array.view(want)
    return None


def structure_template(tree: Any) -> Any:
    """A JSON template (``spec.rebuild``'s format) of a pytree whose leaves are their flat indices, or None."""
    if isinstance(tree, int):
        return {"leaf": tree}
    if isinstance(tree, dict) and all(isinstance(k, str) for k in tree):
        children = [[k, structure_template(tree[k])] for k in sorted(tree)]
        return None if any(c is None for _, c in children) else {"dict": children}
    if type(tree) in (list, tuple):
        children = [structure_template(c) for c in tree]
        return None if any(c is None for c in children) else {type(tree).__name__: children}
    return None


# --- writing -------------------------------------------------------------------------------------

def manifest(exe: Any) -> dict[str, Any]:
    """Everything the artifact's manifest says about ``exe`` (``artifact.write`` adds the file table)."""
    import jax

    program = exe._program
    leaf_paths = [p for p, _ in exe._leaves]
    compiled = [exe._universal] if exe._universal is not None else exe._precompiled
    executables = [dict(p.meta, file=executable_file(i, p.meta), target=list(p.target)) for i, p in enumerate(compiled)]
    prep = None
    if program.prep is not None:
        prep = {"file": PREP_FILE, "format": "jax.export",
                "executable": None if exe._prep_exe is None else dict(exe._prep_exe.meta, file=PREP_EXECUTABLE)}
    out_tree = program.main.out_tree
    return {
        "function": exe._name,
        "inputs": [p.to_json() for p in exe._parameters],
        "input_specs": [dict(info.to_json(), path=path) for path, info in exe._leaves],
        "sizes": [{"path": path, "dim": size.name} for path, size in exe._sizes],
        "outputs": [info.to_json() for info in exe._outputs],
        "output_structure": structure_template(jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))),
        "optimization_level": exe.optimization_level,
        "compiler_options": {p: compiler_options(exe.optimization_level, p) for p in exe.platforms},
        "platforms": list(exe.platforms),
        "program": {"file": PROGRAM_FILE, "format": "jax.export",
                    "calling_convention_version": program.main.calling_convention_version},
        "prep": prep,
        "weights": [{"file": f"weights/{i}.npy", "path": w.path, "argument": w.argument,
                     "dtype": np.dtype(w.value.dtype).name, "shape": list(w.value.shape)}
                    for i, w in enumerate(exe._weights)],
        "leading": [s.to_json() for s in program.sources],
        "dims": [dict(d.to_json(leaf_paths), **({"strategy": "dynamic"} if exe._universal is not None else {}))
                 for d in exe.dims],
        "compiler": exe.compiler,
        "executables": executables,
        "toolchain": toolchain(),
        "bound_inputs": {name: d for name, (_, d) in exe._bound.items()},
        "metadata": exe.metadata,
    }


def save(exe: Any, path: str | os.PathLike, replace: bool = True) -> Path:
    """Write ``exe`` as an artifact; an existing artifact at ``path`` is replaced (or kept: ``replace=False``)."""
    entries, selftest_files = exe.selftest_cases()
    files = {PROGRAM_FILE: exe._program_bytes, **selftest_files}
    if exe._prep_bytes is not None:
        files[PREP_FILE] = exe._prep_bytes
    files.update({f"weights/{i}.npy": npy(w.value) for i, w in enumerate(exe._weights)})
    for name, (value, rel) in exe._bound.items():
        leaves: list[Any] = []
        flatten_like(next(p for p in exe._parameters if p.name == name).template, value, name, leaves)
        files.update({f"{rel}/{i}.npy": npy(leaf) for i, leaf in enumerate(leaves)})
    compiled = {executable_file(i, p.meta): p
                for i, p in enumerate([exe._universal] if exe._universal is not None else exe._precompiled)}
    if exe._prep_exe is not None:
        compiled[PREP_EXECUTABLE] = exe._prep_exe
    files.update({rel: p.blob for rel, p in compiled.items()})
    seconds = {rel: round(p.seconds, 4) for rel, p in compiled.items()}
    return artifact.write(path, dict(manifest(exe), selftest=entries), files, replace=replace,
                          index_extra={"compile_seconds": seconds})


# --- reading (no jax) ----------------------------------------------------------------------------

@dataclass
class Contents:
    """What a manifest says, parsed, and the checked bytes of every file a loader uses."""

    path: str
    manifest: dict[str, Any]
    name: str
    optimization_level: int
    platforms: list[str]
    parameters: list[Parameter]
    leaves: list[tuple[str, InputInfo]]
    sizes: list[tuple[str, DimSize]]
    outputs: list[InputInfo]
    output_structure: Any  # a spec.rebuild template, or None (outputs come back as a list)
    dims: list[DimPlan]
    weights: list[dict[str, Any]]  # manifest entries: file, path, argument, dtype, shape
    sources: list[tuple[str, int]]  # per leading argument of main: ("weight" | "prep", index)
    executables: list[dict[str, Any]]  # one per profile
    prep_executable: dict[str, Any] | None
    program_file: str
    prep_file: str | None
    bound: dict[str, str]  # parameter name -> directory of its .npy leaves
    bound_files: dict[str, list[str]]
    files: dict[str, bytes]

    def where(self, rel: str = artifact.MANIFEST) -> str:
        return os.path.join(self.path, rel)

    def array(self, rel: str, dtype: Any = None) -> np.ndarray:
        return from_npy(self.files[rel], self.where(rel), dtype)

    def weight(self, entry: dict[str, Any]) -> np.ndarray:
        return self.array(entry["file"], entry["dtype"])

    def bound_values(self) -> dict[str, Any]:
        values, start = {}, 0
        for p in self.parameters:
            n = count_leaves(p.template)
            if p.name in self.bound_files:
                infos = [info for _, info in self.leaves[start:start + n]]
                values[p.name] = rebuild(p.template, [self.array(f, info.dtype)
                                                      for f, info in zip(self.bound_files[p.name], infos)])
            start += n
        return values

    def usable(self, entry: dict[str, Any], client: Any = None) -> bool:
        """Whether a precompiled executable can run here (``client``: the PJRT client that would run it,
        asked which CPU features it compiles for); warns with the reason when it cannot."""
        reason = _cannot_load(entry, client)
        if reason is not None:
            warnings.warn(f"{self.where(entry['file'])}: skipped ({reason}); the exported program will be "
                          "compiled for these shapes on first use instead.", CompatibilityWarning, stacklevel=4)
        return reason is None

    def check_platform(self, platform: str) -> None:
        """Refuse an artifact whose program was not exported for ``platform`` (this host's)."""
        if platform not in self.platforms:
            raise ArtifactError(
                f"{self.where()}: built for {', '.join(self.platforms)} only, and this host runs {platform}: the "
                f"program cannot run here. Rebuild with backend=[{', '.join([*self.platforms, platform])}] (a "
                "multi-platform artifact: executables for the build host, the portable program for the rest)."
            )


def read(path: str | os.PathLike, executables: bool = True) -> Contents:
    """Parse an artifact's manifest and read every file a loader needs, each checked against its digest.

    With ``executables=False`` the precompiled executables are not read at all (``trust_executables``)."""
    from .store import reading

    with reading(path):
        return _read(str(path), executables)


def _read(path: str, executables: bool) -> Contents:
    where = os.path.join(path, artifact.MANIFEST)
    m = artifact.read_manifest(path)
    try:
        leaves = [(s["path"], InputInfo.from_json(s)) for s in m["input_specs"]]
        leaf_paths = [p for p, _ in leaves]
        parameters = [Parameter(p["name"], p["kind"], p["structure"]) for p in m["inputs"]]
        bound = {str(k): str(v) for k, v in (m.get("bound_inputs") or {}).items()}
        bound_files = {}
        for pname, rel in bound.items():
            param = next((p for p in parameters if p.name == pname), None)
            if param is None:
                raise ArtifactError(f"{where}: bound input {pname!r} is not an input of {m['function']}.")
            bound_files[pname] = [f"{rel}/{i}.npy" for i in range(count_leaves(param.template))]
        prep = m.get("prep") or {}
        contents = Contents(
            path=path, manifest=m, name=str(m["function"]), optimization_level=int(m["optimization_level"]),
            platforms=[str(p) for p in m["platforms"]], parameters=parameters, leaves=leaves,
            sizes=[(str(s["path"]), DimSize(str(s["dim"]))) for s in m["sizes"]],
            outputs=[InputInfo.from_json(o) for o in m["outputs"]], output_structure=m.get("output_structure"),
            dims=[DimPlan.from_json(d, leaf_paths) for d in m["dims"]], weights=list(m["weights"]),
            sources=[(str(k), int(i)) for entry in m["leading"] for k, i in entry.items()],
            executables=list(m["executables"]),
            prep_executable=prep.get("executable"), program_file=m["program"]["file"],
            prep_file=prep.get("file"), bound=bound, bound_files=bound_files, files={},
        )
        crosscheck.consistent(where, contents.leaves, contents.dims, contents.executables, len(contents.sources))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, SpecError) as e:
        raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e}); the artifact is damaged.") from None
    names = [contents.program_file, *([contents.prep_file] if contents.prep_file else []),
             *(w["file"] for w in contents.weights),
             *(e["file"] for e in [*contents.executables, *([contents.prep_executable] if contents.prep_executable else [])]
               if executables),
             *(f for fs in bound_files.values() for f in fs)]
    contents.files = artifact.read(path, names, [], m)[1]
    return contents


def _cannot_load(entry: dict[str, Any], client: Any = None) -> str | None:
    if entry.get("format") == "iree-vmfb":
        from ..runtime import iree as iree_backend

        return iree_backend.incompatibility(entry.get("depends_on", {}))
    if entry.get("format") != host.FORMAT:
        return f"unknown executable format {entry.get('format')!r}"
    if entry.get("platform") != "cpu":
        import jax

        try:
            jax.devices(entry.get("platform"))
        except RuntimeError:
            return f"no {entry.get('platform')} device on this host"
    return host.incompatibility(entry.get("depends_on", {}), client if entry.get("platform") == "cpu" else None)


# --- loading as an Executable (jax) --------------------------------------------------------------

def load(path: str | os.PathLike, warmup: str = "background", trust_executables: bool = True) -> Any:
    """Load an artifact written by ``save`` or the build command, without compiling (``tripy_build.load``)."""
    if warmup not in WARMUPS:
        raise SpecError(f"load(warmup={warmup!r}): must be one of {', '.join(map(repr, WARMUPS))}.")
    import jax

    from ..runtime import iree as iree_backend
    from ..runtime import xla as xla_executable
    from ..core.dispatch import Dispatcher, output_axes
    from ..runtime.executable import Executable, Precompiled
    from ..compiler.export import Program
    from ..compiler.weights import Source, Weight

    c = read(path, executables=trust_executables)
    c.check_platform(jax.default_backend())
    client = jax.devices()[0].client

    def program(file: str) -> jax.export.Exported:
        try:
            exported = jax.export.deserialize(bytearray(c.files[file]))
        except Exception as e:  # noqa: BLE001 - any failure here means the program file is unusable
            raise ArtifactError(f"{c.where(file)}: cannot deserialize the exported program ({e}).") from None
        lo = jax.export.minimum_supported_calling_convention_version
        hi = jax.export.maximum_supported_calling_convention_version
        if not lo <= exported.calling_convention_version <= hi:
            raise ArtifactError(
                f"{c.where(file)}: exported with calling convention version {exported.calling_convention_version}, "
                f"but this jax ({jax.__version__}) runs versions {lo}..{hi}: the program is too "
                f"{'new' if exported.calling_convention_version > hi else 'old'} for it. Rebuild the artifact with "
                f"this jax, or install the jax it was built with ({c.manifest.get('toolchain', {}).get('jax', '?')}).")
        return exported

    main = program(c.program_file)
    crosscheck.check(c.where(), c.manifest, main.in_avals[len(c.sources):], main.out_avals, c.files[c.program_file],
                     main.mlir_module)
    prep = program(c.prep_file) if c.prep_file else None
    weights = [Weight(w["path"], w["argument"], jax.device_put(c.weight(w))) for w in c.weights]

    compiled_here: list[Any] = []  # the Executable, once made: untrusted profiles compile through it

    def precompiled(entry: dict[str, Any], exported: jax.export.Exported, label: str) -> Precompiled | None:
        if not trust_executables:
            if exported is not main or entry.get("dynamic") or entry.get("platform") != jax.default_backend():
                return None  # the prep program runs through jax; IREE's dynamic module has no portable twin
            target = tuple(int(n) for n in entry.get("target", []))
            return Precompiled(target, b"", {"platform": jax.default_backend(), "compiled_here": True},
                               loader=lambda: compiled_here[0]._compile(target))
        if entry.get("platform") != jax.default_backend() or not c.usable(entry, client):
            return None
        pre = Precompiled(tuple(int(n) for n in entry.get("target", [])), c.files[entry["file"]], entry)
        if entry.get("format") == iree_backend.FORMAT:
            pre.loader = iree_backend.loader(pre.blob, entry, exported.out_tree, len(c.sources), c.where(entry["file"]))
            return pre

        def loader() -> Any:
            try:
                return xla_executable.load(pre.blob, entry, exported.out_tree, label, entry["platform"])
            except Exception as e:  # noqa: BLE001 - XLA's own errors for a blob that is not an executable
                raise ArtifactError(f"{c.where(entry['file'])}: cannot deserialize the executable "
                                    f"({type(e).__name__}: {str(e)[:200]}).") from None
        pre.loader = loader
        return pre

    profiles = [p for p in (precompiled(e, main, c.name) for e in c.executables) if p is not None]
    universal = next((p for p in profiles if p.meta.get("dynamic")), None)
    profiles = [p for p in profiles if p is not universal]
    prep_exe = precompiled(c.prep_executable, prep, f"{c.name}_prep") if c.prep_executable and prep else None
    try:
        dispatcher = Dispatcher(c.dims, [info.shape_bounds.opt for _, info in c.leaves], [s.name for _, s in c.sizes],
                                output_axes(main.out_avals, c.dims), [p.target for p in profiles])
    except (SpecError, KeyError) as e:
        raise ArtifactError(f"{c.where()}: the dims do not match the exported program ({e}).") from None
    exe = Executable(
        program=Program(main, prep, weights, [Source(k, i) for k, i in c.sources], []), program_bytes=c.files[c.program_file],
        prep_bytes=c.files.get(c.prep_file) if c.prep_file else None, name=c.name, parameters=c.parameters,
        leaves=c.leaves, sizes=c.sizes, outputs=c.outputs, dims=c.dims, dispatcher=dispatcher,
        optimization_level=c.optimization_level, platforms=c.platforms, precompiled=profiles, prep_exe=prep_exe,
        metadata=c.manifest.get("metadata", {}), origin=(c.path, c.manifest.get("selftest", [])),
    )
    compiled_here.append(exe)
    exe.compiler = dict(c.manifest.get("compiler") or {"name": "xla"})
    if universal is not None:
        exe.set_universal(universal)
    if c.bound:
        exe = exe._with_bound(c.bound_values(), c.bound)
    if warmup != "none":
        exe.warm_up(background=warmup == "background")
    return exe