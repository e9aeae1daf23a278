"""An ``Executable`` to and from an artifact directory (``artifact`` does the files; this says what is in them).

Saving writes the exported programs, the weights once (``.npy``, no pickle), one executable per
profile, the self-test and a manifest that describes all of it (docs/artifact.md). Loading checks
every file it will use against its digest first, then deserializes the programs, puts the weights on
the device and runs the prep program once. Precompiled executables are deserialized on first use,
so a process that serves a few shapes pays only for those; one built for another host is skipped
with a ``CompatibilityWarning`` and its shapes compile from the exported program instead.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from . import artifact, xla_executable
from .dispatch import Dispatcher, output_axes
from .errors import ArtifactError, SpecError
from .executable import Executable, Parameter, Precompiled
from .export import Program
from .profiles import DimPlan
from .spec import DimSize, InputInfo, count_leaves, flatten_like, rebuild
from .weights import Source, Weight

PROGRAM_FILE = "program.jaxexport"
PREP_FILE = "prep.jaxexport"


class CompatibilityWarning(UserWarning):
    """A precompiled executable in an artifact cannot run on this host and was skipped."""


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


def npy(array: Any) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(np.asarray(array)), allow_pickle=False)
    return buf.getvalue()


def from_npy(data: bytes, where: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise ArtifactError(f"{where}: not a readable .npy array ({e}).") from None


PREP_EXECUTABLE = "executables/prep.xla"


def manifest(exe: Executable) -> dict[str, Any]:
    """Everything the artifact's manifest says about ``exe`` (``artifact.write`` adds the file table)."""
    program = exe._program
    leaf_paths = [p for p, _ in exe._leaves]
    executables = [dict(p.meta, file=f"executables/{i}.xla", target=list(p.target)) for i, p in enumerate(exe._precompiled)]
    prep = None
    if program.prep is not None:
        prep = {"file": PREP_FILE, "format": "jax.export",
                "executable": None if exe._prep_exe is None else dict(exe._prep_exe.meta, file=PREP_EXECUTABLE)}
    return {
        "function": exe._name,
        "inputs": [p.to_json() for p in exe._parameters],
        "input_specs": [dict(info.to_json(), path=path) for path, info in exe._leaves],
        "sizes": [{"path": path, "dim": size.name} for path, size in exe._sizes],
        "outputs": [info.to_json() for info in exe._outputs],
        "optimization_level": exe.optimization_level,
        "platforms": list(exe.platforms),
        "program": {"file": PROGRAM_FILE, "format": "jax.export",
                    "calling_convention_version": program.main.calling_convention_version},
        "prep": prep,
        "weights": [{"file": f"weights/{i}.npy", "path": w.path, "argument": w.argument,
                     "dtype": np.dtype(w.value.dtype).name, "shape": list(w.value.shape)}
                    for i, w in enumerate(exe._weights)],
        "leading": [s.to_json() for s in program.sources],
        "dims": [d.to_json(leaf_paths) for d in exe.dims],
        "executables": executables,
        "toolchain": toolchain(),
        "bound_inputs": {name: d for name, (_, d) in exe._bound.items()},
        "metadata": exe.metadata,
    }


def save(exe: Executable, path: str | os.PathLike, replace: bool = True) -> Path:
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
    compiled = {f"executables/{i}.xla": p for i, p in enumerate(exe._precompiled)}
    if exe._prep_exe is not None:
        compiled[PREP_EXECUTABLE] = exe._prep_exe
    files.update({rel: p.blob for rel, p in compiled.items()})
    seconds = {rel: round(p.seconds, 4) for rel, p in compiled.items()}
    return artifact.write(path, dict(manifest(exe), selftest=entries), files, replace=replace,
                          index_extra={"compile_seconds": seconds})


WARMUPS = ("background", "now", "none")


def load(path: str | os.PathLike, warmup: str = "background") -> Executable:
    """Load an artifact written by ``save`` or the build command, without compiling (``tripy_build.load``)."""
    if warmup not in WARMUPS:
        raise SpecError(f"load(warmup={warmup!r}): must be one of {', '.join(map(repr, WARMUPS))}.")
    where = os.path.join(path, artifact.MANIFEST)
    m = artifact.read_manifest(path)
    try:
        name, level = str(m["function"]), int(m["optimization_level"])
        platforms = [str(p) for p in m["platforms"]]
        leaves = [(s["path"], InputInfo.from_json(s)) for s in m["input_specs"]]
        leaf_paths = [p for p, _ in leaves]
        sizes = [(str(s["path"]), DimSize(str(s["dim"]))) for s in m["sizes"]]
        parameters = [Parameter(p["name"], p["kind"], p["structure"]) for p in m["inputs"]]
        outputs = [InputInfo.from_json(o) for o in m["outputs"]]
        weight_entries = list(m["weights"])
        sources = [Source.from_json(s) for s in m["leading"]]
        dims = [DimPlan.from_json(d, leaf_paths) for d in m["dims"]]
        exe_entries = list(m["executables"])
        prep_entry = (m.get("prep") or {}).get("executable")
        bound = {str(k): str(v) for k, v in (m.get("bound_inputs") or {}).items()}
        program_file = m["program"]["file"]
        prep_file = m["prep"]["file"] if m.get("prep") else None
        bound_files = {}
        for pname, rel in bound.items():
            param = next((p for p in parameters if p.name == pname), None)
            if param is None:
                raise ArtifactError(f"{where}: bound input {pname!r} is not an input of {name}.")
            bound_files[pname] = [f"{rel}/{i}.npy" for i in range(count_leaves(param.template))]
        names = [program_file, *([prep_file] if prep_file else []), *(w["file"] for w in weight_entries),
                 *(e["file"] for e in [*exe_entries, *([prep_entry] if prep_entry else [])]),
                 *(f for fs in bound_files.values() for f in fs)]
    except (KeyError, TypeError, ValueError, AttributeError, SpecError) as e:
        raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e}); the artifact is damaged.") from None
    _, files = artifact.read(path, names, [], m)

    def program(file: str) -> jax.export.Exported:
        try:
            return jax.export.deserialize(bytearray(files[file]))
        except Exception as e:  # noqa: BLE001 - any failure here means the program file is unusable
            raise ArtifactError(f"{os.path.join(path, file)}: cannot deserialize the exported program ({e}).") from None

    main = program(program_file)
    prep = program(prep_file) if prep_file else None
    weights = [Weight(w["path"], w["argument"], jax.device_put(from_npy(files[w["file"]], os.path.join(path, w["file"]))))
               for w in weight_entries]
    def precompiled(entry: dict[str, Any], exported: jax.export.Exported, label: str) -> Precompiled | None:
        pre = Precompiled(tuple(int(n) for n in entry.get("target", [])), files[entry["file"]], entry)
        reason = _cannot_load(entry)
        if reason is not None:
            warnings.warn(f"{os.path.join(path, entry['file'])}: skipped ({reason}); the exported program will be "
                          "compiled for these shapes on first use instead.", CompatibilityWarning, stacklevel=3)
            return None
        def loader() -> Any:
            try:
                return xla_executable.load(pre.blob, entry, exported.out_tree, label, entry["platform"])
            except Exception as e:  # noqa: BLE001 - XLA's own errors for a blob that is not an executable
                raise ArtifactError(f"{os.path.join(path, entry['file'])}: cannot deserialize the executable "
                                    f"({type(e).__name__}: {str(e)[:200]}).") from None
        pre.loader = loader
        return pre

    profiles = [p for p in (precompiled(e, main, name) for e in exe_entries) if p is not None]
    prep_exe = precompiled(prep_entry, prep, f"{name}_prep") if prep_entry and prep is not None else None
    try:
        dispatcher = Dispatcher(dims, [info.shape_bounds.opt for _, info in leaves], [s.name for _, s in sizes],
                                output_axes(main.out_avals, dims), [p.target for p in profiles])
    except (SpecError, KeyError) as e:
        raise ArtifactError(f"{where}: the dims do not match the exported program ({e}).") from None
    exe = Executable(
        program=Program(main, prep, weights, sources, []), program_bytes=files[program_file],
        prep_bytes=files.get(prep_file) if prep_file else None, name=name, parameters=parameters, leaves=leaves,
        sizes=sizes, outputs=outputs, dims=dims, dispatcher=dispatcher, optimization_level=level,
        platforms=platforms, precompiled=profiles, prep_exe=prep_exe,
        metadata=m.get("metadata", {}), origin=(str(path), m.get("selftest", [])),
    )
    if bound:
        values = {pname: rebuild(next(p for p in parameters if p.name == pname).template,
                                 [from_npy(files[f], os.path.join(path, f)) for f in fs])
                  for pname, fs in bound_files.items()}
        exe = exe._with_bound(values, bound)
    if warmup != "none":
        exe.warm_up(background=warmup == "background")
    return exe


def _cannot_load(entry: dict[str, Any]) -> str | None:
    if entry.get("format") != xla_executable.FORMAT:
        return f"unknown executable format {entry.get('format')!r}"
    platform = entry.get("platform")
    try:
        jax.devices(platform)
    except RuntimeError:
        return f"no {platform} device on this host"
    return xla_executable.incompatibility(entry.get("depends_on", {}))
