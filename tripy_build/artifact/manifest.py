"""``Manifest``: what an artifact holds, as one typed record with a documented field each.

``manifest.json`` is this record as canonical JSON (``to_json``). It is made in one place
(``runtime/save.py``, from an ``Executable``), written in one place (``write.write``, which adds the
file table) and parsed in one place (``read.read_manifest`` -> ``Manifest.from_json``); every other
module reads the typed fields. A field that cannot be parsed makes the artifact damaged, with the
field named, before anything is deserialized. See docs/artifact.md for the format as a whole.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..core.profiles import DimPlan
from ..core.signature import Parameter
from ..core.spec import DimSize, InputInfo, to_dtype
from ..errors import ArtifactError, SpecError
from .digest import ALGORITHM, ALGORITHMS, recorded

SCHEMA_VERSION = 5
# 4 added prep chunks stored prepared (``PrepChunkEntry.at_rest``); 5 records files by BLAKE3 (``digest.py``)
READABLE_VERSIONS = (3, 4, 5)
KIND = "tripy_build.artifact"

# The build settings a recorded config (``key_parts["config"]``: builder/key.recorded_config, every field of the
# BuildRequest) may lack, and what such a build was made with: an artifact built before the setting was recorded,
# or saved from the API (which records no config). Readers take them from ``Manifest.build_config``, never from
# literals of their own. Today's defaults equal these (tests/cli/test_listing.py checks it) but for weights: builds
# stored them as given ("raw") before they stored them prepared by default (runtime/save.DEFAULT_WEIGHTS).
RECORDED_CONFIG_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "compiler": "xla", "precision": "float32", "target_cpu": "host", "target_gpu": "host", "weights": "raw"})


@dataclass(frozen=True)
class FileEntry:
    """A file the manifest vouches for."""

    size: int  # bytes
    digest: str  # hex digest of its bytes, by ``algorithm``
    algorithm: str = ALGORITHM  # ``digest.ALGORITHM`` (schema 5 on), or sha256 (an older artifact)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, self.algorithm: self.digest}

    @classmethod
    def from_json(cls, e: Mapping[str, Any]) -> "FileEntry":
        algorithm, digest = recorded(e)
        if digest is None:
            raise ValueError(f"a file entry without a digest ({', '.join(ALGORITHMS)}): {dict(e)}")
        return cls(int(e["size"]), str(digest), algorithm)


@dataclass(frozen=True)
class ProgramFile:
    """An exported program (``jax.export``'s serialization)."""

    file: str  # path inside the artifact
    format: str  # "jax.export"
    calling_convention_version: int | None = None  # jax.export's, checked against this jax before loading


@dataclass(frozen=True)
class ExecutableEntry:
    """One precompiled executable: a profile of the main program, or the prep program's."""

    file: str  # path inside the artifact
    format: str  # "pjrt-executable-v1" (XLA's own bytes) or "iree-vmfb"
    platform: str  # the XLA platform it runs on: cpu, cuda
    target: tuple[int, ...] = ()  # the size of each dynamic dim, in ``Manifest.dims`` order (empty: prep, dynamic)
    profile: dict[str, int] = field(default_factory=dict)  # the same sizes by dim name, for people
    depends_on: dict[str, Any] = field(default_factory=dict)  # what a host must have: jaxlib, machine, CPU features
    dynamic: bool = False  # one IREE module serving every in-range shape as given
    compiler_options: dict[str, Any] = field(default_factory=dict)  # the XLA options it was compiled with
    flags: tuple[str, ...] = ()  # IREE's compile flags
    input_shapes: tuple[tuple[int, ...], ...] = ()  # XLA: every program input's shape ...
    input_dtypes: tuple[str, ...] = ()  # ... and dtype
    output_shapes: tuple[tuple[int, ...], ...] = ()  # XLA: every output's shape ...
    output_dtypes: tuple[str, ...] = ()  # ... and dtype
    kept_inputs: tuple[int, ...] = ()  # XLA: the inputs the executable still takes (others were pruned)

    @property
    def is_xla(self) -> bool:
        return self.format == XLA_FORMAT

    @property
    def is_iree(self) -> bool:
        return self.format == IREE_FORMAT

    def to_json(self) -> dict[str, Any]:
        """Its JSON; fields that do not apply to its format (at their defaults) are left out."""
        out = _plain(self)
        optional = ["dynamic", "flags", "compiler_options"]
        if not self.is_xla:  # XLA's calling facts
            optional += ["input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "kept_inputs"]
        for k in optional:
            if out[k] in (False, [], {}):
                out.pop(k)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ExecutableEntry":
        return cls(
            file=str(data["file"]), format=str(data["format"]), platform=str(data["platform"]),
            target=tuple(int(n) for n in data.get("target", ())), profile={str(k): int(v) for k, v in
                                                                          (data.get("profile") or {}).items()},
            depends_on=dict(data.get("depends_on") or {}), dynamic=bool(data.get("dynamic", False)),
            compiler_options=dict(data.get("compiler_options") or {}), flags=tuple(data.get("flags") or ()),
            input_shapes=tuple(tuple(int(n) for n in s) for s in data.get("input_shapes", ())),
            input_dtypes=tuple(str(d) for d in data.get("input_dtypes", ())),
            output_shapes=tuple(tuple(int(n) for n in s) for s in data.get("output_shapes", ())),
            output_dtypes=tuple(str(d) for d in data.get("output_dtypes", ())),
            kept_inputs=tuple(int(i) for i in data.get("kept_inputs", ())),
        )


XLA_FORMAT = "pjrt-executable-v1"
IREE_FORMAT = "iree-vmfb"


@dataclass(frozen=True)
class PrepChunkEntry:
    """A piece of the prep program, precompiled: it reads only ``weights`` and makes only ``outputs``."""

    weights: tuple[int, ...]  # indices into ``Manifest.weights``
    outputs: tuple[int, ...]  # indices of the prep program's outputs (``Manifest.sources``' "prep" entries)
    executable: ExecutableEntry  # precompiled for the build host's platform
    # its outputs as the build made them, one per ``outputs`` (saved with weights="prepared"): a loader places
    # these instead of running the chunk, and ``weights``' entries have no file (``WeightEntry.stored``)
    at_rest: tuple["WeightEntry", ...] = ()


@dataclass(frozen=True)
class PrepEntry:
    """The prep program: the weight-only work of the function, run once at load."""

    file: str  # its exported program (whole: run through jax where the chunks cannot run)
    format: str  # "jax.export"
    # precompiled in pieces that share no weight, run one after another (compiler/weights.py); empty:
    # none for this platform. A schema-3 manifest's single "executable" reads as one chunk.
    chunks: tuple[PrepChunkEntry, ...] = ()


@dataclass(frozen=True)
class WeightEntry:
    """One weight: an array the program takes as a leading argument, stored once as ``.npy``."""

    file: str  # path inside the artifact; "" where only what prep makes of it is stored (``PrepChunkEntry.at_rest``)
    path: str  # where it came from in the function's arguments: ``params['proj']['weight']``
    argument: str | None  # the constant argument it belongs to (``bind`` swaps by it); None: closed over
    dtype: str  # numpy dtype name (bfloat16 included)
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * to_dtype(self.dtype).itemsize

    @property
    def stored(self) -> bool:
        return bool(self.file)


@dataclass(frozen=True)
class Compiler:
    """Which compiler made the executables, and how."""

    name: str = "xla"  # xla or iree
    mode: str | None = None  # iree: "dynamic" (one module) or "profiles" (one per profile)
    why: str | None = None  # iree "profiles": IREE's reason for refusing the dynamic program
    flags: tuple[str, ...] = ()  # iree: its compile flags


@dataclass(frozen=True)
class Manifest:
    """Everything an artifact holds, in the order a loader needs it."""

    function: str  # the compiled function's name: the artifact's name in messages
    parameters: tuple[Parameter, ...]  # the runtime arguments, in call order: name, kind, structure
    leaves: tuple[tuple[str, InputInfo], ...]  # every flat input (path, spec), in program order
    sizes: tuple[tuple[str, DimSize], ...]  # ``DimSize`` arguments (path, dim): filled in by the runtime
    outputs: tuple[InputInfo, ...]  # every flat output's spec, ranges resolved
    output_structure: Any  # how the flat outputs nest (``core.spec.rebuild``'s template), or None: a list
    optimization_level: int  # 0..5, as compiled
    compiler_options: dict[str, dict[str, Any]]  # platform -> the XLA options it resolved to: run-time compiles use them
    platforms: tuple[str, ...]  # platforms the program was exported for
    program: ProgramFile  # the main program
    prep: PrepEntry | None  # the prep program, or None when the function has no weight-only work
    weights: tuple[WeightEntry, ...]  # the weights, stored once
    sources: tuple[tuple[str, int], ...]  # per leading argument of main: ("weight" | "prep", index)
    dims: tuple[DimPlan, ...]  # every dynamic dim: range, buckets, padding, where inputs use it
    compiler: Compiler  # which compiler made the executables
    executables: tuple[ExecutableEntry, ...]  # one per precompiled profile (or one dynamic module)
    toolchain: dict[str, str]  # python, jax, jaxlib, tripy_build and XLA_FLAGS at build time
    bound_inputs: dict[str, str]  # runtime inputs fixed by ``bind``: name -> the folder of their ``.npy`` leaves
    metadata: dict[str, Any]  # what the layer that made it adds (the build: build_key, build_key_parts, model,
    #                           params; a reduced precision: precision); read through the properties below
    selftest: tuple[dict[str, Any], ...]  # self-test cases, in ``artifact/selftest.py``'s format
    files: dict[str, FileEntry] = field(default_factory=dict)  # every reproducible file (``write`` fills it)
    index: dict[str, Any] = field(default_factory=dict)  # the sidecar index: {"file", "covers"} (``write``)
    # runtime input leaves (paths) whose buffers a call consumes: an output of the same shape reuses their
    # memory (a KV cache updated in place); a caller must not use a device buffer it passed there again
    donated: tuple[str, ...] = ()
    # A multi-entry artifact: this record is its main entry (what calling the artifact runs), named
    # ``entry``; ``entries`` holds every other entry by name, each a ``Manifest`` of its own inputs,
    # outputs, profiles and executables (files under ``entries/<name>/``) over the same weight files.
    # The file table, the index and the toolchain are the main record's. Empty for a single function.
    entry: str = ""
    entries: tuple[tuple[str, "Manifest"], ...] = ()
    schema_version: int = SCHEMA_VERSION  # the version it was read as (``to_json`` writes ``SCHEMA_VERSION``)

    # --- what the build recorded ---------------------------------------------------------------
    @property
    def build_key(self) -> str | None:
        return self.metadata.get("build_key")

    @property
    def key_parts(self) -> dict[str, Any]:
        """The build key's named parts (config, model code, params, toolchain, target, options); {} from the API."""
        return dict(self.metadata.get("build_key_parts") or {})

    @property
    def build_config(self) -> dict[str, Any]:
        """The config the build recorded (``key_parts["config"]``), with the settings it does not record filled in
        from ``RECORDED_CONFIG_DEFAULTS``; those alone for an artifact saved from the API."""
        config = self.key_parts.get("config")
        return {**RECORDED_CONFIG_DEFAULTS, **(config if isinstance(config, dict) else {})}

    @property
    def model(self) -> str:
        return str(self.metadata.get("model") or self.function)

    @property
    def precision(self) -> dict[str, Any] | None:
        """A reduced-precision build's measured error against float32 (dtype, max_rel_error, max_abs_error)."""
        return self.metadata.get("precision")

    # --- derived ---------------------------------------------------------------------------------
    @property
    def leaf_paths(self) -> list[str]:
        return [p for p, _ in self.leaves]

    def strategy(self, dim: DimPlan) -> str:
        """How ``dim`` is served: ``dynamic`` under IREE's one module, else the plan's own strategy."""
        return "dynamic" if self.compiler.mode == "dynamic" else dim.strategy

    def weight_file(self, path: str) -> WeightEntry | None:
        return next((w for w in self.weights if w.path == path), None)

    @property
    def entry_names(self) -> list[str]:
        """Every entry's name, the main one first; ``[]`` for a single-function artifact."""
        return [self.entry, *(name for name, _ in self.entries)] if self.entry else []

    def entry_manifest(self, name: str) -> "Manifest":
        """The record of the entry called ``name`` (the main one is this record)."""
        if name == self.entry:
            return self
        for other, m in self.entries:
            if other == name:
                return m
        raise ArtifactError(f"{self.function}: no entry {name!r}; this artifact's entries: "
                            f"{', '.join(self.entry_names) or 'none (a single function)'}.")

    def all_entries(self) -> list[tuple[str, "Manifest"]]:
        """(name, record) of every entry, the main one first; one unnamed record for a single function."""
        return [(self.entry, self), *self.entries]

    # --- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        paths = self.leaf_paths
        return {
            "schema_version": SCHEMA_VERSION, "kind": KIND,
            "function": self.function,
            "inputs": [p.to_json() for p in self.parameters],
            "input_specs": [dict(info.to_json(), path=path) for path, info in self.leaves],
            "sizes": [{"path": path, "dim": size.name} for path, size in self.sizes],
            "outputs": [info.to_json() for info in self.outputs],
            "output_structure": self.output_structure,
            "optimization_level": self.optimization_level,
            "compiler_options": self.compiler_options,
            "platforms": list(self.platforms),
            "program": _plain(self.program),
            "prep": None if self.prep is None else {
                "file": self.prep.file, "format": self.prep.format,
                "chunks": [{"weights": list(c.weights), "outputs": list(c.outputs), "executable": c.executable.to_json(),
                            **({"at_rest": [_plain(w) for w in c.at_rest]} if c.at_rest else {})}
                           for c in self.prep.chunks]},
            "weights": [_plain(w) for w in self.weights],
            "leading": [{kind: i} for kind, i in self.sources],
            "dims": [dict(d.to_json(paths), strategy=self.strategy(d)) for d in self.dims],
            "compiler": {k: v for k, v in _plain(self.compiler).items() if v not in (None, [])},
            "executables": [e.to_json() for e in self.executables],
            "toolchain": self.toolchain,
            "bound_inputs": self.bound_inputs,
            "metadata": self.metadata,
            "selftest": list(self.selftest),
            "files": {rel: e.to_json() for rel, e in sorted(self.files.items())},
            "index": self.index,
            **({"donated": list(self.donated)} if self.donated else {}),
            **({"entry": self.entry, "entries": [dict(_entry_json(m), name=name) for name, m in self.entries]}
               if self.entry else {}),
        }

    @classmethod
    def from_json(cls, m: Mapping[str, Any], where: str) -> "Manifest":
        """Parse a manifest's JSON (``where`` names it in errors); a field that does not parse is damage."""
        try:
            leaves = tuple((str(s["path"]), InputInfo.from_json(s)) for s in m["input_specs"])
            paths = [p for p, _ in leaves]
            prep = m.get("prep")
            compiler = dict(m.get("compiler") or {"name": "xla"})
            return cls(
                function=str(m["function"]),
                parameters=tuple(Parameter(str(p["name"]), str(p["kind"]), p["structure"]) for p in m["inputs"]),
                leaves=leaves,
                sizes=tuple((str(s["path"]), DimSize(str(s["dim"]))) for s in m["sizes"]),
                outputs=tuple(InputInfo.from_json(o) for o in m["outputs"]),
                output_structure=m.get("output_structure"),
                optimization_level=int(m["optimization_level"]),
                compiler_options={str(k): dict(v) for k, v in (m.get("compiler_options") or {}).items()},
                platforms=tuple(str(p) for p in m["platforms"]),
                program=ProgramFile(str(m["program"]["file"]), str(m["program"]["format"]),
                                    m["program"].get("calling_convention_version")),
                prep=None if not prep else PrepEntry(str(prep["file"]), str(prep["format"]), _prep_chunks(m)),
                weights=tuple(_weight(w) for w in m["weights"]),
                sources=tuple((str(k), int(i)) for entry in m["leading"] for k, i in entry.items()),
                dims=tuple(DimPlan.from_json(d, paths) for d in m["dims"]),
                compiler=Compiler(str(compiler.get("name", "xla")), compiler.get("mode"), compiler.get("why"),
                                  tuple(compiler.get("flags") or ())),
                executables=tuple(ExecutableEntry.from_json(e) for e in m["executables"]),
                toolchain=dict(m.get("toolchain") or {}),
                bound_inputs={str(k): str(v) for k, v in (m.get("bound_inputs") or {}).items()},
                metadata=dict(m.get("metadata") or {}),
                selftest=tuple(m.get("selftest") or ()),
                files={str(rel): FileEntry.from_json(e) for rel, e in (m.get("files") or {}).items()},
                index=dict(m.get("index") or {}),
                donated=tuple(str(p) for p in m.get("donated") or ()),
                entry=str(m.get("entry") or ""),
                schema_version=int(m.get("schema_version") or SCHEMA_VERSION),
                entries=tuple((str(e["name"]), cls.from_json(
                    {**e, "files": m.get("files"), "index": m.get("index"), "toolchain": m.get("toolchain"),
                     "entry": None, "entries": None}, f"{where} (entry {e.get('name')!r})"))
                    for e in m.get("entries") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, SpecError) as e:
            raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e}); the artifact is "
                                "damaged.") from None


_SHARED_KEYS = ("schema_version", "kind", "files", "index", "toolchain")


def _entry_json(m: Manifest) -> dict[str, Any]:
    """An entry's JSON inside its artifact's manifest: what the main record holds for all is left out."""
    return {k: v for k, v in m.to_json().items() if k not in _SHARED_KEYS}


def _prep_chunks(m: Mapping[str, Any]) -> tuple[PrepChunkEntry, ...]:
    prep = m["prep"]
    if prep.get("executable"):  # before chunks: one executable for all of prep
        outputs = sorted({int(i) for entry in m["leading"] for k, i in entry.items() if k == "prep"})
        return (PrepChunkEntry(tuple(range(len(m["weights"]))), tuple(outputs),
                               ExecutableEntry.from_json(prep["executable"])),)
    return tuple(PrepChunkEntry(tuple(int(i) for i in c["weights"]), tuple(int(k) for k in c["outputs"]),
                                ExecutableEntry.from_json(c["executable"]), tuple(_weight(w) for w in c.get("at_rest") or ()))
                 for c in prep.get("chunks") or ())


def _weight(w: Mapping[str, Any]) -> WeightEntry:
    return WeightEntry(str(w["file"]), str(w["path"]), w["argument"], str(w["dtype"]), tuple(int(n) for n in w["shape"]))


def _plain(record: Any) -> dict[str, Any]:
    """A record's fields as JSON values (tuples as lists, nested records as dicts)."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(record)
