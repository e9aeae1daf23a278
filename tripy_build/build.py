"""``build``: a validated config -> model, params, input specs -> compile -> artifact on disk.

The artifact directory is named by the build key, a sha256 over everything that can change the
output; a build whose key already exists and verifies is a cache hit that neither traces nor
compiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import artifact
from .errors import ArtifactError, ConfigError
from .spec import DimSize, InputInfo, NamedDimension

log = logging.getLogger("tripy_build.build")

KEY_LENGTH = 16  # hex digits of the build key used in directory names


@dataclass(frozen=True)
class BuildRequest:
    """What to build, validated, in plain Python values (``config.validate`` makes one from a Hydra config)."""

    model: dict[str, Any]  # with _target_ and name, and padding if the config overrides the model's
    shapes: dict[str, int | NamedDimension]
    shapes_name: str
    buckets: dict[str, Any]  # dim name -> "pow2" | "none" | [sizes]; unlisted dims get "pow2"
    max_profiles: int
    platforms: list[str]  # XLA platforms the program is exported for; executables for the build host's
    compiler: str  # xla, or iree (CPU only): which compiler makes the executables
    target_cpu: str  # host | portable | an instruction-set ceiling (--xla_cpu_max_isa)
    optimization_level: int
    precision: str  # the compute dtype: float32, bfloat16 or float16
    max_error: float | None  # the error budget against float32, relative to each output's scale
    params_seed: int
    params_checkpoint: str | None
    artifacts_dir: str
    force: bool


@dataclass
class BuildResult:
    path: Path
    key: str
    model: str
    cache_hit: bool
    timings: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    dims: list[str] = field(default_factory=list)  # per dynamic dim: its buckets and strategy
    profiles: str = ""
    precision: str = ""  # the measured error of a reduced-precision build
    files: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # input files (model code, checkpoint) -> sha256

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def summary(self) -> str:
        lines = [f"artifact: {self.path}" + ("  (cache hit)" if self.cache_hit else "")]
        lines += [f"  input {name}: {desc}" for name, desc in self.inputs.items()]
        lines += [f"  dim {d}" for d in self.dims]
        if self.profiles:
            lines.append(f"  profiles: {self.profiles}")
        if self.precision:
            lines.append(f"  precision: {self.precision}")
        if self.timings:
            lines.append("  stages: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.timings.items()))
        lines.append(f"  files ({_human(self.size)}): " + ", ".join(f"{k} {_human(v)}" for k, v in sorted(self.files.items())))
        return "\n".join(lines)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


MODEL_CONFIG_KEYS = ("_target_", "name", "padding")  # model config keys that are not constructor arguments


def model_padding(model: Any, model_cfg: dict[str, Any], dims: dict[str, Any]) -> dict[str, str]:
    """The padding declaration for the model's dynamic dims: the config's ``model.padding`` (for a zoo
    model it starts as the class's), else the class's ``padding``; ``none`` means not padded."""
    configured = model_cfg.get("padding")
    declared = dict(getattr(model, "padding", None) or {}) if configured is None else dict(configured)
    used = {d for shape in model.inputs().values() for d in shape if isinstance(d, str)}
    unknown = sorted(set(declared) - used)
    declared = {d: k for d, k in declared.items() if k != "none"}
    if unknown:
        raise ConfigError(f"model.padding: {', '.join(map(repr, unknown))} is not a dim of this model's inputs "
                          f"(its dims: {', '.join(map(repr, sorted(used))) or 'none'}).")
    return {d: k for d, k in declared.items() if isinstance(dims.get(d), NamedDimension)}


def instantiate_model(model_cfg: dict[str, Any]) -> Any:
    target = model_cfg["_target_"]
    module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"model._target_: cannot import {target!r} ({e}); give a module.Class path.") from None
    kwargs = {k: v for k, v in model_cfg.items() if k not in MODEL_CONFIG_KEYS}
    try:
        model = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()})
    except TypeError as e:
        raise ConfigError(f"model: {target} does not accept these settings ({e}).") from None
    for method in ("init", "apply", "inputs"):
        if not callable(getattr(model, method, None)):
            raise ConfigError(f"model: {target} has no {method}() method; a model needs init(key), apply(params, *inputs) and inputs().")
    return model


def input_infos(model: Any, dims: dict[str, int | NamedDimension], dtype: str) -> dict[str, InputInfo]:
    """The model's declared inputs with every named dim resolved from ``shapes.dims``."""
    infos = {}
    dtypes = model.input_dtypes() if hasattr(model, "input_dtypes") else {}
    for name, shape in model.inputs().items():
        resolved = []
        for i, d in enumerate(shape):
            if isinstance(d, str):
                if d not in dims:
                    raise ConfigError(
                        f"shapes.dims.{d}: the model's input {name!r} dim {i} is named {d!r}, but the shapes "
                        f"config does not define it; add shapes.dims.{d}=[min,opt,max] or ={'{size}'}."
                    )
                resolved.append(dims[d])
            else:
                resolved.append(d)
        infos[name] = InputInfo(resolved, dtypes.get(name, dtype))
    return infos


def model_sources(model: Any) -> list[tuple[str, str, str]]:
    """(module, file, sha256) of the model class's module and every module it uses from its own folder.

    Following the module's globals (imported modules, functions and classes) catches helpers such
    as a shared layers file, without hashing third-party libraries, which the toolchain covers.
    """
    import sys
    import types

    first = inspect.getmodule(type(model))
    root = Path(first.__file__).resolve().parent if getattr(first, "__file__", None) else None
    found: dict[str, tuple[str, str]] = {}
    todo = [first]
    while todo:
        module = todo.pop()
        path = getattr(module, "__file__", None)
        if module is None or module.__name__ in found or not path or not path.endswith(".py"):
            continue
        if root is None or root not in Path(path).resolve().parents:
            continue
        found[module.__name__] = (str(Path(path).resolve()), hashlib.sha256(Path(path).read_bytes()).hexdigest())
        for value in vars(module).values():
            used = value if isinstance(value, types.ModuleType) else sys.modules.get(getattr(value, "__module__", None) or "")
            if used is not None and used.__name__ not in found:
                todo.append(used)
    return [(name, path, digest) for name, (path, digest) in sorted(found.items())]


def package_digest() -> str:
    """sha256 over tripy_build's own sources: a code change without a version bump still rebuilds."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def key_parts(vb: BuildRequest, sources: list[tuple[str, str, str]], params_identity: dict[str, Any]) -> dict[str, Any]:
    from .host import host_features
    from .options import compiler_options
    from .serialization import toolchain

    host = host_features()
    return {
        "config": recorded_config(vb),
        "model_code": {name: digest for name, _, digest in sources},
        "params": params_identity,
        "toolchain": dict(toolchain(), tripy_build_source=package_digest()),
        "target": {"platforms": vb.platforms, "cpu": vb.target_cpu, "machine": host["machine"],
                   "system": host["system"], "cpu_features": host["cpu_features"]},
        "compiler_options": ({p: compiler_options(vb.optimization_level, p) for p in vb.platforms}
                             if vb.compiler == "xla" else {"iree": iree_options()}),
    }


_NOT_IN_KEY = ("artifacts_dir", "force", "params_checkpoint", "params_seed")  # locations; params go by identity


def recorded_config(vb: BuildRequest) -> dict[str, Any]:
    """The resolved config as the build key and the manifest record it (output locations left out)."""
    config = {k: v for k, v in dataclasses.asdict(vb).items() if k not in _NOT_IN_KEY}
    config["shapes"] = {k: list(v.bounds) if isinstance(v, NamedDimension) else v for k, v in vb.shapes.items()}
    return config


def request_from_record(manifest: dict[str, Any], artifact_path: Path, artifacts_dir: Path) -> BuildRequest:
    """The build request an artifact was made from, to rebuild it elsewhere (``verify --rebuild``)."""
    try:
        parts = manifest["metadata"]["build_key_parts"]
        config, identity = dict(parts["config"]), parts["params"]
    except (KeyError, TypeError):
        raise ArtifactError(
            f"{artifact_path}: records no build config (it was saved from the Python API, not built by "
            "`python -m tripy_build`), so it cannot be rebuilt."
        ) from None
    config["shapes"] = {k: NamedDimension(k, *v) if isinstance(v, list) else v for k, v in config["shapes"].items()}
    config.setdefault("compiler", "xla")
    checkpoint = None if identity.get("init") == "random" else str(artifact_path)  # its weights
    return BuildRequest(**config, params_seed=identity.get("seed", 0), params_checkpoint=checkpoint,
                        artifacts_dir=str(artifacts_dir), force=True)


def iree_options() -> dict[str, Any]:
    from . import iree_backend

    return {"flags": list(iree_backend.FLAGS), **iree_backend.versions()}


def build_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def build(vb: BuildRequest) -> BuildResult:
    """Build (or find in the cache) the artifact that ``vb`` describes."""
    from . import params as params_io

    from .host import apply_cpu_target
    from .xla_executable import backend_started

    apply_cpu_target(vb.target_cpu, backend_started())
    timings: dict[str, float] = {}
    model = instantiate_model(vb.model)
    model_name = vb.model.get("name") or type(model).__name__.lower()
    infos = input_infos(model, vb.shapes, "float32")

    t0 = time.perf_counter()
    params = None
    if vb.params_checkpoint is None:
        identity: dict[str, Any] = {"init": "random", "seed": vb.params_seed}
    else:
        import jax

        like = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        params = params_io.restore(vb.params_checkpoint, like)
        identity = {"init": "checkpoint", "sha256": params_io.digest(params)}
        timings["restore params"] = time.perf_counter() - t0
    sources = model_sources(model)
    parts = key_parts(vb, sources, identity)
    key = build_key(parts)
    target = Path(vb.artifacts_dir) / model_name / key[:KEY_LENGTH]
    inputs = {path: digest for _, path, digest in sources}
    if vb.params_checkpoint is not None:
        ckpt = Path(vb.params_checkpoint).resolve()
        inputs.update({str(ckpt / rel): e["sha256"] for rel, e in artifact.list_files(ckpt).items()})

    replace = vb.force
    if not vb.force and artifact.is_artifact(target):
        try:
            manifest = artifact.verify_files(target)
            log.info("cache hit: %s (build key %s)", target, key[:KEY_LENGTH])
            return result_from_manifest(target, key, model_name, True, timings, manifest, inputs)
        except ArtifactError as e:
            log.warning("existing artifact is not intact, rebuilding and replacing it: %s", e)
            replace = True

    return result_from_manifest(*_build(vb, model, model_name, infos, params, parts, key, target, timings, replace), inputs)


def _build(vb, model, model_name, infos, params, parts, key, target, timings, replace) -> tuple:
    import jax

    from . import params as params_io
    from .compiler import build_executable
    from .selftest import run_once
    from .serialization import save

    def stage(name: str, seconds: float) -> None:
        if not name.startswith(" "):  # indented lines (one per profile) are details for the log only
            timings[name] = seconds
        log.info("%-32s %8.1f ms", name, seconds * 1e3)

    if params is None:
        t0 = time.perf_counter()
        params = jax.device_get(run_once(model.init, jax.random.PRNGKey(vb.params_seed)))
        stage("init params", time.perf_counter() - t0)
    padding = model_padding(model, vb.model, vb.shapes)
    mask_dims = {d: DimSize(d) for d, kind in padding.items() if kind == "mask"}
    used = {d for info in infos.values() for d in info.dimension_names.values()}
    exe = build_executable(
        model.apply, vb.optimization_level, args=[params, *infos.values()],
        kwargs={"lengths": mask_dims} if mask_dims else None, platforms=vb.platforms, name=model_name,
        log=stage, buckets={d: b for d, b in vb.buckets.items() if d in used}, padding=padding,
        max_profiles=vb.max_profiles, precision=vb.precision, max_error=vb.max_error, backend=vb.compiler,
    )
    exe.metadata.update(
        build_key=key, build_key_parts=parts, model=model_name,
        params={"sha256": params_io.digest(params), **{k: v for k, v in parts["params"].items() if k != "sha256"}},
    )
    t0 = time.perf_counter()
    path = save(exe, target, replace=replace)
    stage("write", time.perf_counter() - t0)
    return path, key, model_name, False, timings, artifact.read_manifest(path)


def result_from_manifest(path, key, model_name, cache_hit, timings, manifest, sources) -> BuildResult:
    """The `BuildResult` of the artifact at `path`, described from its manifest and index."""
    inputs = {}
    for spec in manifest.get("input_specs", []):
        dims = []
        for lo, opt, hi, n in zip(spec["min"], spec["opt"], spec["max"], spec["dim_names"]):
            dims.append(str(lo) if lo == hi else f"{n + '=' if n else ''}[{lo}..{hi}, opt {opt}]")
        inputs[spec["path"]] = f"{spec['dtype']}[{', '.join(dims)}]"
    dims = [f"{d['name'] or d['symbol']} [{d['min']}..{d['max']}]: {d['strategy']}"
            + (f" ({d['padding']})" if d["strategy"] == "padded" else "")
            + (f", buckets {' '.join(map(str, d['buckets']))}" if d["buckets"] and d["strategy"] != "dynamic" else "")
            for d in manifest.get("dims", [])]
    files: dict[str, int] = {}
    index = artifact.read_index(Path(path), manifest)
    for rel, entry in {**manifest.get("files", {}), **index}.items():
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        files[top] = files.get(top, 0) + entry["size"]
    executables = manifest.get("executables", [])
    seconds = artifact.read_index(Path(path), manifest, "compile_seconds")
    compiler = manifest.get("compiler") or {"name": "xla"}
    by = f" by {compiler['name'].upper()}" + (f" ({compiler['mode']})" if compiler.get("mode") else "")
    if compiler.get("why"):
        by += f", as it cannot compile the dynamic program ({compiler['why']})"
    profiles = (f"{len(executables)} precompiled{by}, {_human(sum(index.get(e['file'], {}).get('size', 0) for e in executables))}, "
                f"{sum(seconds.get(e['file'], 0) for e in executables):.1f} s of compile time") if executables else ""
    p = (manifest.get("metadata") or {}).get("precision")
    precision = (f"{p['dtype']}, error against float32 {p['max_rel_error']:.3%} of the output scale (max abs "
                 f"{p['max_abs_error']:.3g})" + (f", budget {p['max_error']:.2%}" if p.get("max_error") else "")) if p else ""
    return BuildResult(Path(path).absolute(), key, model_name, cache_hit, timings, inputs, dims, profiles, precision,
                       files, sources)
