"""``build``: a validated config -> model, params, input specs -> compile -> artifact on disk.

The artifact directory is named by the build key, a sha256 over everything that can change the
output; a build whose key already exists and verifies is a cache hit that neither traces nor
compiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifact import layout as artifact
from ..artifact import store as gc
from . import model as model_io
from ..errors import ArtifactError, raised_in_user_code
from ..core.profiles import first_use_compiles
from ..core.spec import DimSize, NamedDimension

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
    cache_max_bytes: int | None = None  # after building, keep artifacts_dir within this (gc.py)
    cache_max_age_days: float | None = None
    cache_remote: str | None = None  # an fsspec URL shared by builders (remote.py)
    # a directory where builds in several processes share a model's random init (``_initial_params``);
    # a sweep's jobs use their sweep directory's
    shared_init_dir: str | None = None
    params_checkpoint_key: str | None = None  # the params' sub-tree in a checkpoint that saved more


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
    remote: str = ""  # the remote cache it was downloaded from, for a remote cache hit

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def summary(self) -> str:
        hit = f"  (cache hit, downloaded from {self.remote})" if self.remote else "  (cache hit)" if self.cache_hit else ""
        lines = [f"artifact: {self.path}{hit}"]
        lines += [f"  input {name}: {desc}" for name, desc in self.inputs.items()]
        lines += [f"  dim {d}" for d in self.dims]
        if self.profiles:
            lines.append(f"  profiles: {self.profiles}")
        if self.precision:
            lines.append(f"  precision: {self.precision}")
        if self.timings:
            lines.append("  stages: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.timings.items()))
        lines.append(f"  files ({artifact.human_size(self.size)}): " + ", ".join(f"{k} {artifact.human_size(v)}" for k, v in sorted(self.files.items())))
        return "\n".join(lines)


def package_digest() -> str:
    """sha256 over tripy_build's own sources: a code change without a version bump still rebuilds."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def key_parts(vb: BuildRequest, sources: list[tuple[str, str, str]], params_identity: dict[str, Any],
              frameworks: dict[str, str] | None = None) -> dict[str, Any]:
    from ..host import host_features
    from ..compiler.optimization import compiler_options
    from ..artifact.serialization import toolchain

    host = host_features()
    return {
        "config": recorded_config(vb),
        "model_code": {name: digest for name, _, digest in sources},
        "params": params_identity,
        "toolchain": dict(toolchain(), tripy_build_source=package_digest(), **(frameworks or {})),
        "target": {"platforms": vb.platforms, "cpu": vb.target_cpu, "machine": host["machine"],
                   "system": host["system"], "cpu_features": host["cpu_features"]},
        "compiler_options": ({p: compiler_options(vb.optimization_level, p) for p in vb.platforms}
                             if vb.compiler == "xla" else {"iree": iree_options()}),
    }


_NOT_IN_KEY = ("artifacts_dir", "force", "params_checkpoint", "params_checkpoint_key", "params_seed", "cache_max_bytes",
               "cache_max_age_days", "cache_remote", "shared_init_dir")  # locations; params go by identity


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
    from ..runtime import iree as iree_backend

    return {"flags": list(iree_backend.FLAGS), **iree_backend.versions()}


def build_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def build(vb: BuildRequest) -> BuildResult:
    """Build (or find in the cache) the artifact that ``vb`` describes."""
    from . import params as params_io

    from ..host import apply_cpu_target
    from ..runtime.xla import backend_started

    apply_cpu_target(vb.target_cpu, backend_started())
    timings: dict[str, float] = {}
    model = model_io.load(vb.model, vb.shapes)
    model_name = vb.model.get("name") or getattr(model, "source", type(model)).__name__.lower()
    infos = model_io.input_infos(model, vb.shapes)

    t0 = time.perf_counter()
    params = None
    if vb.params_checkpoint is None:
        identity: dict[str, Any] = {"init": "random", "seed": vb.params_seed}
    else:
        import jax

        like = _user_init(lambda: jax.eval_shape(model.init, jax.random.PRNGKey(0)))
        params = params_io.restore(vb.params_checkpoint, like, key=vb.params_checkpoint_key)
        identity = {"init": "checkpoint", "sha256": params_io.digest(params)}
        timings["restore params"] = time.perf_counter() - t0
    sources = model_io.sources(model)
    parts = key_parts(vb, sources, identity, model_io.framework_versions(model))
    key = build_key(parts)
    target = Path(vb.artifacts_dir) / model_name / key[:KEY_LENGTH]
    inputs = {path: digest for _, path, digest in sources}
    if vb.params_checkpoint is not None:
        ckpt = Path(vb.params_checkpoint).resolve()
        inputs.update({str(ckpt / rel): e["sha256"] for rel, e in artifact.list_files(ckpt).items()})

    if target.parent.is_dir():
        artifact.remove_stale_temporaries(target.parent)  # what killed builds left, before the cache is asked
    replace = vb.force
    store = None
    if vb.cache_remote:
        from .remote import Store

        store = Store(vb.cache_remote)

    def upload(path: Path) -> None:
        if store is not None and store.put(path, model_name, key[:KEY_LENGTH]):
            log.info("uploaded to the remote cache %s", vb.cache_remote)
    if not vb.force and artifact.is_artifact(target):
        try:
            manifest = artifact.verify_files(target)
            gc.touch(target / artifact.MANIFEST)
            log.info("cache hit: %s (build key %s)", target, key[:KEY_LENGTH])
            upload(target)
            return result_from_manifest(target, key, model_name, True, timings, manifest, inputs)
        except ArtifactError as e:
            log.warning("existing artifact is not intact, rebuilding and replacing it: %s", e)
            replace = True
    if store is not None and not vb.force and not artifact.is_artifact(target):
        t0 = time.perf_counter()
        if store.fetch(model_name, key[:KEY_LENGTH], target):
            timings["download"] = time.perf_counter() - t0
            log.info("remote cache hit: %s from %s (build key %s)", target, vb.cache_remote, key[:KEY_LENGTH])
            result = result_from_manifest(target, key, model_name, True, timings, artifact.read_manifest(target), inputs)
            result.remote = vb.cache_remote
            return result

    result = result_from_manifest(*_build(vb, model, model_name, infos, params, parts, key, target, timings, replace),
                                  inputs)
    upload(result.path)
    if vb.cache_max_bytes is not None or vb.cache_max_age_days is not None:
        collected = gc.collect(vb.artifacts_dir, vb.cache_max_bytes, vb.cache_max_age_days, keep=[result.path])
        if collected.removed:
            log.info("cache budget: %s", collected.summary().splitlines()[0])
    return result


def _user_init(init: Any) -> Any:
    """Run the model's init; an exception from its code becomes our error naming its line."""
    try:
        return init()
    except Exception as err:  # noqa: BLE001 - the model's own init failing is the user's to fix
        user = raised_in_user_code(err, "the model's init")
        if user is None:
            raise
        raise user from err


# Params a model's init made in this process, by what determines them: a sweep's jobs that differ only
# in how they compile (optimization level, precision, shapes, target platforms) share one init. Init
# was 20-25% of a small model's build (a jit compile and the random weights). Only for models whose
# init has no other effect (``model.pure_init``). Bounded by bytes; the arrays are made read-only, and
# each build gets its own containers.
_INIT_MEMO: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (params, bytes)
INIT_MEMO_MAX_BYTES = 256 << 20
_INIT_LOCK = threading.Lock()  # builds may run in threads


def _initial_params(vb: BuildRequest, model: Any, parts: dict[str, Any]) -> Any:
    """The model's init at the config's seed: from ``_INIT_MEMO`` when this process made it already, else
    from ``vb.shared_init_dir`` when another process did (and shared there when none had)."""
    import jax
    import numpy as np

    from ..compiler.selftest import run_once

    def init() -> Any:
        return jax.device_get(_user_init(lambda: run_once(model.init, jax.random.PRNGKey(vb.params_seed))))

    if not model_io.pure_init(model):
        return init()
    key = json.dumps([parts["config"]["model"], parts["model_code"], parts["params"], parts["toolchain"],
                      parts["target"]["cpu"]], sort_keys=True)
    with _INIT_LOCK:
        kept = _INIT_MEMO.get(key)
        if kept is not None:
            _INIT_MEMO.move_to_end(key)
    if kept is not None:
        params = kept[0]
    else:
        shared = Path(vb.shared_init_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz" \
            if vb.shared_init_dir else None
        params = _read_shared_init(shared, model, vb.params_seed) if shared is not None else None
        if params is None:
            params = init()
            if shared is not None:
                _share_init(shared, params)
        leaves = [x for x in jax.tree_util.tree_leaves(params) if isinstance(x, np.ndarray)]
        for leaf in leaves:
            leaf.flags.writeable = False
        size = sum(x.nbytes for x in leaves)
        with _INIT_LOCK:
            if size <= INIT_MEMO_MAX_BYTES:
                _INIT_MEMO[key] = (params, size)
                while sum(n for _, n in _INIT_MEMO.values()) > INIT_MEMO_MAX_BYTES:
                    _INIT_MEMO.popitem(last=False)  # the least recently used; never the one just added
    return jax.tree_util.tree_map(lambda leaf: leaf, params)


def _read_shared_init(path: Path, model: Any, seed: int) -> Any:
    """The init another process shared at ``path``, or None: none there, unreadable, or not this model's
    tree of shapes and dtypes (the structure comes from tracing the init, which runs nothing)."""
    import jax
    import numpy as np

    from ..artifact.serialization import as_dtype

    if not path.is_file():
        return None
    like, treedef = jax.tree_util.tree_flatten(_user_init(lambda: jax.eval_shape(model.init, jax.random.PRNGKey(seed))))
    try:
        with np.load(path, allow_pickle=False) as stored:
            if len(stored.files) != len(like):
                return None
            leaves = [stored[f"arr_{i}"] for i in range(len(like))]
    except (OSError, ValueError, KeyError) as e:
        log.warning("shared init %s is unreadable, initializing instead: %s", path, e)
        return None
    leaves = [as_dtype(got, want.dtype) if got.shape == tuple(want.shape) else None for got, want in zip(leaves, like)]
    if any(leaf is None for leaf in leaves):
        return None
    log.info("init params shared by another process: %s", path.name)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _share_init(path: Path, params: Any) -> None:
    """Write ``params`` for other processes at ``path`` (atomically, replacing a file there that did not
    match), within the memo's size bound; a failure to write costs them an init, not the build."""
    import tempfile

    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves(params)
    if sum(np.asarray(x).nbytes for x in leaves) > INIT_MEMO_MAX_BYTES:
        return
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as f:
            temporary = f.name
            np.savez(f, *leaves)
        os.replace(temporary, path)
    except OSError as e:
        log.warning("could not share the init params at %s: %s", path, e)
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _build(vb, model, model_name, infos, params, parts, key, target, timings, replace) -> tuple:
    from . import params as params_io
    from ..compiler.pipeline import build_executable
    from ..artifact.serialization import save

    started = time.perf_counter()

    def stage(name: str, seconds: float) -> None:
        """One line per finished stage (and per compiled profile, indented), with the build's elapsed time."""
        if not name.startswith(" "):  # indented lines (one per profile) are details for the log only
            timings[name] = seconds
        log.info("[%6.1f s] %-36s %8.1f ms", time.perf_counter() - started, name, seconds * 1e3)

    if params is None:
        t0 = time.perf_counter()
        params = _initial_params(vb, model, parts)
        stage("init params", time.perf_counter() - t0)
    padding = model_io.padding(model, vb.model, vb.shapes)
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
    exe.selftest_cases()  # reference outputs at min, opt, max (jax.jit of the source); kept for save
    stage("self-test reference", time.perf_counter() - t0)
    t0 = time.perf_counter()
    path = save(exe, target, replace=replace)
    stage("write", time.perf_counter() - t0)
    manifest = artifact.read_manifest(path)
    warn_first_use_compiles(manifest, artifact.read_index(path, manifest, "compile_seconds"))
    return path, key, model_name, False, timings, manifest


def warn_first_use_compiles(manifest: dict[str, Any], seconds: dict[str, float]) -> None:
    """One warning for a build whose artifact compiles some in-range shapes on first use: which sizes of
    which dims, what such a compile costs (the profiles' mean compile time), and the fix."""
    gaps = [(d["name"] or d["symbol"], text) for d in manifest.get("dims", []) if (text := first_use_compiles(d))]
    if not gaps:
        return
    mean = sum(seconds.values()) / len(seconds) if seconds else 0.0
    log.warning(
        "not every in-range shape is precompiled: %s compile on first use (~%.1f s each, the profiles' mean "
        "compile time; once per process, then kept in the compile cache). Declare how a dim may be padded "
        "(model.padding.<dim>=rows|mask, proven at build) to serve it from the buckets instead, or list the "
        "sizes you need in shapes.buckets.<dim>.",
        "; ".join(f"dim {name}: {text}" for name, text in gaps), mean)


def result_from_manifest(path, key, model_name, cache_hit, timings, manifest, sources) -> BuildResult:
    """The `BuildResult` of the artifact at `path`, described from its manifest and index."""
    inputs = {}
    for spec in manifest.get("input_specs", []):
        inputs[spec["path"]] = artifact.spec_text(spec)
    strategies = {"padded": "padded ({padding})", "buckets": "not padded", "compile": "not padded, opt only",
                  "dynamic": "dynamic"}
    dims = [f"{d['name'] or d['symbol']} [{d['min']}..{d['max']}]: {strategies[d['strategy']].format(**d)}"
            + (f", buckets {' '.join(map(str, d['buckets']))}" if d["buckets"] and d["strategy"] != "dynamic" else "")
            + (f"; {first_use} compile on first use" if (first_use := first_use_compiles(d)) else "")
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
    if compiler.get("mode") == "dynamic":
        by += ("; the weights are stored twice: packed into the module as constants (IREE repacks weights passed "
               "as arguments on every call, 2.5-5x slower) and as weights/ (verify, rebuilds, checkpoints)")
    profiles = (f"{len(executables)} precompiled{by}, {artifact.human_size(sum(index.get(e['file'], {}).get('size', 0) for e in executables))}, "
                f"{sum(seconds.get(e['file'], 0) for e in executables):.1f} s of compile time") if executables else ""
    p = (manifest.get("metadata") or {}).get("precision")
    precision = (f"{p['dtype']}, error against float32 {p['max_rel_error']:.3%} of the output scale (max abs "
                 f"{p['max_abs_error']:.3g})" + (f", budget {p['max_error']:.2%}" if p.get("max_error") else "")) if p else ""
    return BuildResult(Path(path).absolute(), key, model_name, cache_hit, timings, inputs, dims, profiles, precision,
                       files, sources)
