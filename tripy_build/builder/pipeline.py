"""``build``: a validated request -> model, params, input specs -> compile -> artifact on disk.

The artifact directory is named by the build key (``key.py``), a sha256 over everything that can
change the output; a build whose key already exists and verifies is a cache hit that neither traces nor
compiles, and so is one another host uploaded to the shared cache (``remote.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from ..artifact import store
from ..artifact.layout import MANIFEST, is_artifact
from ..artifact.lock import touch
from ..artifact.read import read_index, read_manifest, verify_files
from ..artifact.write import remove_stale_temporaries
from ..core.spec import DimSize, NamedDimension, undeclared_values
from ..errors import ArtifactError, ConfigError
from . import model as model_io, tokenizer as tokenizer_io
from .init_cache import initial_params
from .key import KEY_LENGTH, build_key, checkpoint_record, key_parts
from .report import BuildResult, result_from_manifest, warn_first_use_compiles
from .request import BuildRequest

log = logging.getLogger(__name__)


def build(request: BuildRequest) -> BuildResult:
    """Build (or find in the cache) the artifact that ``request`` describes."""
    from . import params as params_io

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    params = None
    pretrained = request.params_checkpoint is not None and params_io.is_pretrained(request.params_checkpoint)
    if pretrained:
        # a Hugging Face save_pretrained directory: the model's settings come from its config.json
        model, params = params_io.load_pretrained(request.model, request.params_checkpoint)
        built = {"_target_": f"{type(model).__module__}.{type(model).__qualname__}", "name": type(model).name}
        named = request.model if request.model["_target_"] == built["_target_"] else built  # model=hf: the one built
        request = dataclasses.replace(request, model={**request.model, **model_io.settings(model),
                                                      "_target_": named["_target_"], "name": named["name"]})
        timings["read checkpoint"] = time.perf_counter() - t0
    else:
        model = model_io.instantiate(request.model, request.shapes)
    if request.generate is not None:
        from .generate import check_model

        check_model(model, request.model.get("name") or type(model).__name__.lower())
    request = within_limits(request, model)
    if request.generate is not None:
        from .generate import check_shapes, resolved

        check_shapes(model, request.shapes, request.buckets)
        batch = request.shapes.get("batch")
        request = dataclasses.replace(request, generate=resolved(
            request.generate, model, request.params_checkpoint if pretrained else None, getattr(batch, "max", batch)))
    tokenizer = tokenizer_io.files(request.params_checkpoint if pretrained else None)  # stored for text in and out
    model_name = request.model.get("name") or getattr(model, "source", type(model)).__name__.lower()
    infos = model_io.input_infos(model, request.shapes)
    undeclared = undeclared_values(list(infos.items()))
    if undeclared:
        log.warning("integer input(s) %s of %s have no declared values: an id outside what the model indexes (past "
                    "an embedding table's rows) gives NaN or another row's values without a word. Declare them, "
                    "`input_values: {%s}` in the model's config or %s on the command line (hi exclusive; token "
                    "ids: [0,vocab_size]), and every call is checked against them.",
                    ", ".join(map(repr, undeclared)), model_name, ", ".join(f"{n}: [lo, hi]" for n in undeclared),
                    " ".join(f"+model.input_values.{n}=[lo,hi]" for n in undeclared))

    if request.params_checkpoint is None:
        identity: dict[str, Any] = {"init": "random", "seed": request.params_seed}
    elif pretrained:
        identity = {"init": "checkpoint", "sha256": params_io.digest(params)}
    else:
        import jax

        like = model_io.run_init(lambda: jax.eval_shape(model.init, jax.random.PRNGKey(0)))
        params = params_io.restore(request.params_checkpoint, like, key=request.params_checkpoint_key)
        identity = {"init": "checkpoint", "sha256": params_io.digest(params)}
        timings["restore params"] = time.perf_counter() - t0
    sources = model_io.sources(model)
    parts = key_parts(request, sources, identity, model_io.framework_versions(model))
    if tokenizer:
        parts["tokenizer"] = tokenizer_io.key_part(tokenizer)
    key = build_key(parts)
    target = Path(request.artifacts_dir) / model_name / key[:KEY_LENGTH]
    inputs = {path: digest for _, path, digest in sources}
    checkpoint = checkpoint_record(request)  # every checkpoint file digested once: the inputs and the index
    if checkpoint:
        ckpt = Path(checkpoint["checkpoint"]["path"])
        inputs.update({str(ckpt / rel): digest for rel, digest in checkpoint["checkpoint"]["files"].items()})

    if target.parent.is_dir():
        remove_stale_temporaries(target.parent)  # what killed builds left, before the cache is asked
    replace = request.force
    shared = None
    if request.cache_remote:
        from .remote import Store

        shared = Store(request.cache_remote)

    def upload(path: Path) -> None:
        if shared is not None and shared.put(path, model_name, key[:KEY_LENGTH]):
            log.info("uploaded to the remote cache %s", request.cache_remote)
    if not request.force and is_artifact(target):
        try:
            manifest = verify_files(target)
            touch(target / MANIFEST)
            log.info("cache hit: %s (build key %s)", target, key[:KEY_LENGTH])
            upload(target)
            return result_from_manifest(target, key, model_name, True, timings, manifest, inputs)
        except ArtifactError as e:
            log.warning("existing artifact is not intact, rebuilding and replacing it: %s", e)
            replace = True
    if shared is not None and not request.force and not is_artifact(target):
        t0 = time.perf_counter()
        if shared.fetch(model_name, key[:KEY_LENGTH], target):
            timings["download"] = time.perf_counter() - t0
            log.info("remote cache hit: %s from %s (build key %s)", target, request.cache_remote, key[:KEY_LENGTH])
            result = result_from_manifest(target, key, model_name, True, timings, read_manifest(target), inputs)
            result.remote = request.cache_remote
            return result

    result = result_from_manifest(*_build(request, model, model_name, infos, params, parts, key, target, timings, replace,
                                          checkpoint, tokenizer),
                                  inputs)
    upload(result.path)
    if request.cache_max_bytes is not None or request.cache_max_age_days is not None:
        from .memo import prune

        collected = store.collect(request.artifacts_dir, request.cache_max_bytes, request.cache_max_age_days, keep=[result.path])
        if collected.removed:
            collected.memo_entries = prune()
            log.info("cache budget: %s", collected.summary().splitlines()[0])
    return result


def within_limits(request: BuildRequest, model: Any) -> BuildRequest:
    """``request`` checked against the model's limits (``max_positions``: its position table): a ``seq`` longer,
    or a ``generate.max_length`` longer, is refused in one line naming both numbers; one left at its default
    (``request.derivable``) is derived from the limit instead, and said: a prompt chunk then stays below
    ``max_length``."""
    from .generate import seq2seq

    limit = model.max_positions() if hasattr(model, "max_positions") else None
    table = next((f"{k}={getattr(model, k)}" for k in ("max_position_embeddings", "n_positions",
                                                      "text_max_position_embeddings") if hasattr(model, k)), "")
    what = (model.positions_limit() if hasattr(model, "positions_limit") else None) or \
        f"{type(model).__name__}'s position table holds {limit} positions ({table})"
    seq = request.shapes.get("seq")
    shapes, generate = dict(request.shapes), dict(request.generate) if request.generate else None
    # a decoder's prompt chunk shares the cache with the new tokens; an encoder-decoder's source is the encoder's
    chunked = generate is not None and not seq2seq(model)

    def derive(key: str, old: Any, top: int, new: Any, why: str) -> None:
        if key not in request.derivable:
            raise ConfigError(f"{key}={old}: {why}; set it to at most {top}"
                              + (" (or raise generate.max_length)" if key == "shapes.dims.seq" and chunked else "")
                              + ".")
        log.info("%s: %s -> %s (the default, derived: %s)", key, old, new, why)

    if generate is not None and limit is not None and generate["max_length"] > limit:
        derive("generate.max_length", generate["max_length"], limit, limit, what)
        generate["max_length"] = limit
    top = generate["max_length"] - 1 if chunked else limit
    if isinstance(seq, (int, NamedDimension)) and top is not None:
        hi = seq if isinstance(seq, int) else seq.max
        if hi > top:
            why = (f"a prompt chunk of {hi} tokens leaves no room for a new token in generate.max_length="
                   f"{generate['max_length']}") if chunked else what
            shapes["seq"] = top if isinstance(seq, int) else NamedDimension("seq", min(seq.min, top),
                                                                             min(seq.opt, top), top)
            derive("shapes.dims.seq", _dim_text(seq), top, _dim_text(shapes["seq"]), why)
    return dataclasses.replace(request, shapes=shapes, generate=generate)


def _dim_text(dim: Any) -> str:
    return str(dim) if isinstance(dim, int) else f"[{dim.min},{dim.opt},{dim.max}]"


def _build(request, model, model_name, infos, params, parts, key, target, timings, replace, checkpoint,
           tokenizer) -> tuple:
    from . import params as params_io
    from ..compiler.pipeline import build_executable
    from ..runtime.save import save

    started = time.perf_counter()

    def stage(name: str, seconds: float) -> None:
        """One line per finished stage (and per compiled profile, indented), with the build's elapsed time."""
        if not name.startswith(" "):  # indented lines (one per profile) are details for the log only
            timings[name] = seconds
        log.info("[%6.1f s] %-36s %8.1f ms", time.perf_counter() - started, name, seconds * 1e3)

    if params is None:
        t0 = time.perf_counter()
        params = initial_params(request, model, parts)
        stage("init params", time.perf_counter() - t0)
    padding = model_io.padding(model, request.model, request.shapes)
    mask_dims = {d: DimSize(d) for d, kind in padding.items() if kind == "mask"}
    used = {d for info in infos.values() for d in info.dimension_names.values()}
    labels = model.output_labels() if hasattr(model, "output_labels") else {}
    metadata: dict[str, Any] = {"labels": labels} if labels else {}  # a classifier's class names (config.json's id2label)
    scores = model.output_scores() if hasattr(model, "output_scores") else {}
    if scores:  # how its classes are scored: softmax, sigmoid or none (config.json's problem_type, num_labels)
        metadata["scores"] = scores
    if tokenizer:
        metadata["tokenizer"] = sorted(tokenizer)  # its files under tokenizer/ (runtime/tokenizer.py)
    metadata.update(
        build_key=key, build_key_parts=parts, model=model_name,
        params={"sha256": params_io.digest(params), **{k: v for k, v in parts["params"].items() if k != "sha256"}},
    )
    if request.generate is not None:
        from ..compiler.pipeline import build_entries
        from .generate import entries as generation_entries

        entries, spec = generation_entries(model, model_name, params, request.shapes, request.buckets,
                                           request.max_profiles, request.generate, request.precision or "float32")
        exe = build_entries(entries, request.optimization_level, platforms=request.platforms, name=model_name, log=stage,
                            precision=request.precision, max_error=request.max_error, backend=request.compiler,
                            keep_loaded=False, gpu=request.target_gpu, cpu=request.target_cpu, warn_values=False,
                            metadata={"generate": spec.to_metadata(), **metadata})
    else:
        exe = build_executable(
            model.apply, request.optimization_level, args=[params, *infos.values()],
            kwargs={"lengths": mask_dims} if mask_dims else None, platforms=request.platforms, name=model_name,
            log=stage, buckets={d: b for d, b in request.buckets.items() if d in used}, padding=padding,
            max_profiles=request.max_profiles, precision=request.precision, max_error=request.max_error,
            backend=request.compiler, keep_loaded=False, gpu=request.target_gpu, cpu=request.target_cpu,
            warn_values=False, metadata=metadata,
        )
    t0 = time.perf_counter()
    for e in (exe.entries or {"": exe}).values():
        e.selftest_cases()  # reference outputs at min, opt, max (jax.jit of the source); kept for save
    stage("self-test reference", time.perf_counter() - t0)
    t0 = time.perf_counter()
    from ..runtime.tokenizer import DIR

    path = save(exe.compiled_entries, target, replace=replace, weights=request.weights, index_extra=checkpoint,
                extra_files={DIR + name: data for name, data in tokenizer.items()})
    stage("write", time.perf_counter() - t0)
    manifest = read_manifest(path)
    warn_first_use_compiles(manifest, read_index(path, manifest, "compile_seconds"))
    return path, key, model_name, False, timings, manifest


