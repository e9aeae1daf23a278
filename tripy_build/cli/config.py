"""The build configuration: dataclass schemas in Hydra's ConfigStore, and their validation.

Hydra checks types and typo'd keys against these schemas while composing. ``validate`` adds what a
schema cannot say (ranges, positive model dims, keys smuggled in with ``+``) and turns the composed
config into plain typed values before anything is traced.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..builder.request import BuildRequest
from ..runtime.save import DEFAULT_WEIGHTS
from ..compiler.gpu import GPUS, HOST as GPU_HOST, spec as gpu_spec
from ..compiler.optimization import DEFAULT_LEVEL, check_level
from ..errors import ConfigError, SpecError
from ..core.profiles import DEFAULT_MAX_PROFILES, PADDING_KINDS, MaskInput, resolve_buckets
from ..core.spec import NamedDimension


PLATFORMS = ("cpu", "cuda")
COMPILERS = ("iree",)  # backends that name a compiler other than XLA (for the CPU)


def setting(default: Any = MISSING, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    """A schema field with its one-line meaning (``--help`` prints it)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TargetConfig:
    cpu: str = setting("host", "host: this CPU, every feature it has; portable: a baseline every recent server has "
                               "(x86-64-v3: AVX2, FMA, BMI2; NEON on arm64), whatever CPU builds it; or a level: "
                               "x86-64-v2, x86-64-v3, x86-64-v4 (AVX-512)")
    gpu: str = setting("host", "with backend cuda: host (this machine's GPU, autotuned on it) or the GPU to compile for "
                               "without it: " + ", ".join(GPUS) + " (needs jax's CUDA plugin: '.[cuda13]' or "
                               "'.[cuda-deviceless]')")


class Precision(enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class PrecisionConfig:
    dtype: Precision = setting(Precision.float32, "weights stored and compute done in this dtype; inputs and "
                                                  "outputs keep theirs")
    max_error: Optional[float] = setting(None, "the largest error against float32 allowed, relative to each "
                                               "output's scale (null: no budget); over it the build fails")


@dataclass
class ParamsConfig:
    seed: int = setting(0, "random init from this seed, unless checkpoint is set")
    checkpoint: Optional[str] = setting(None, "the model's params: a Hugging Face save_pretrained directory "
                                              "(config.json + model.safetensors: any architecture the zoo builds, "
                                              "model=hf), an orbax StandardCheckpointer directory (checked leaf by "
                                              "leaf) or a built artifact")
    checkpoint_key: Optional[str] = setting(None, "where the params are in a checkpoint that saved more: model for "
                                                  "{model: ..., optimizer: ...}, 0 for nnx.state((model, optimizer)); "
                                                  "a dotted path")


@dataclass
class ShapesConfig:
    name: str = setting(MISSING, "the shapes config's name, recorded in the manifest")
    dims: dict[str, Any] = setting(help="dim name -> size (static) or [min, opt, max] (dynamic)", factory=dict)
    buckets: dict[str, Any] = setting(help="dim name -> pow2 (default), pow2:N, fine (powers of two and 3 x 2^k: at "
                                           "most 1.5x padding), fine:N, none or a list of sizes: the sizes precompiled "
                                           "along that dim", factory=dict)
    max_profiles: int = setting(DEFAULT_MAX_PROFILES, "the most executables one build may precompile (profiles are "
                                                      "the product of the dims' buckets); more is refused")


@dataclass
class CacheConfig:
    max_bytes: Optional[str] = setting(None, "after each build, remove the least recently used artifacts in artifacts_dir "
                                             "beyond this size (500MB, 2G); never one being loaded")
    max_age_days: Optional[float] = setting(None, "after each build, remove artifacts not used for this many days")
    remote: Optional[str] = setting(None, "an fsspec URL shared by builders (file:///shared/cache, s3://bucket/x): "
                                          "looked up before building (downloads verified), uploaded to after")


@dataclass
class GenerateConfig:
    max_length: int = setting(256, "task=generate: the key/value cache's positions; the longest prompt plus the new "
                                   "tokens must fit")
    eos_token_id: Any = setting("auto", "the token ids a generated row stops at, by default: auto: the checkpoint's "
                                       "(generation_config.json, else config.json; none without a checkpoint); an id "
                                       "or a list [128001,128009]; null or []: rows run to max_new_tokens")
    sampling: Any = setting("auto", "how calls that leave them out pick tokens: auto: the checkpoint's "
                                    "generation_config.json as transformers' generate reads it (greedy without one); "
                                    "null: greedy; or {temperature: 0.7, top_k: 20, top_p: 0.8, min_p: 0.05, "
                                    "repetition_penalty: 1.05} (any of these)")
    beams: Any = setting("auto", "beam search for calls that leave it out and pick tokens by score: auto: the "
                                 "checkpoint's num_beams, length_penalty and early_stopping (generation_config.json; "
                                 "one beam without); null: one beam; or {num_beams: 4, length_penalty: 2.0, "
                                 "early_stopping: true}")


TASKS = ("forward", "generate")
LEAST = {"type_vocab_size": 0, "max_window_layers": 0, "conv_kernel_size": 0, "position_buckets": -1,
         "max_relative_positions": -1}  # model settings whose smallest value is not 1


@dataclass
class BuildConfig:
    model: Any = setting(MISSING, "the model: a config group option, or your own (see model.* below)")
    shapes: ShapesConfig = setting(help="input shapes", factory=ShapesConfig)
    backend: Any = setting("cpu", "cpu, cuda, or several: [cpu,cuda] (executables for the build host's, the portable "
                                  "program for the rest); iree: the CPU program compiled by IREE (pip install -e '.[iree]')")
    target: TargetConfig = setting(help="the machine the executables are for", factory=TargetConfig)
    optimization_level: int = setting(DEFAULT_LEVEL, "0..5: 0..2 lower XLA's LLVM backend level (faster builds, slower code), "
                                         "3 XLA's default; 4 and 5 equal 3 on the CPU")
    precision: PrecisionConfig = setting(help="compute precision", factory=PrecisionConfig)
    params: ParamsConfig = setting(help="where the weights come from", factory=ParamsConfig)
    artifacts_dir: str = setting("artifacts", "where artifacts go: <artifacts_dir>/<model name>/<build key>/")
    force: bool = setting(False, "rebuild even when the artifact for this build key exists and verifies")
    cache: CacheConfig = setting(help="a budget for artifacts_dir (also: tripy-build gc)", factory=CacheConfig)
    task: str = setting("forward", "forward: the model's apply as one entry; generate: prefill and decode entries over "
                                   "a key/value cache (models with extend: gpt2)")
    generate: GenerateConfig = setting(help="task=generate's settings", factory=GenerateConfig)
    weights: str = setting(DEFAULT_WEIGHTS, "prepared: weights stored as the prep program makes them (transposed, fused, "
                                       "BatchNorm folded), placed at load without running it, but not readable back raw "
                                       "(Executable.weights, params.checkpoint=<artifact>); raw: stored as given")
    bench: bool = setting(False, "after building, measure the artifact in a fresh process (tripy_build bench): "
                                 "latency columns in a sweep's summary, the Pareto front marked")


@functools.lru_cache(maxsize=None)
def model_schema(model_cls: type) -> type:
    """A schema for one zoo model: ``_target_``, ``name`` and the model dataclass's own fields."""
    fields = [("_target_", str, setting(f"{model_cls.__module__}.{model_cls.__qualname__}",
                                        "the model: a class (zoo-style, Flax NNX, Linen, Equinox) or a function")),
              ("name", str, setting(model_cls.name, "the artifact folder's name: <artifacts_dir>/<name>/<key>")),
              ("padding", dict[str, Any], setting(help="dim name -> rows | mask | none | {mask_input: INPUT}: which "
                                                       "dims may be padded up to a bucket (proven at build); the "
                                                       "model's own by default",
                                                  factory=lambda: dict(getattr(model_cls, "padding", {}))))]
    hints = typing.get_type_hints(model_cls)
    for f in dataclasses.fields(model_cls):
        default = f.default if f.default is not dataclasses.MISSING else MISSING
        if isinstance(default, tuple):
            item = type(default[0]) if default else Any
            fields.append((f.name, list[item], field(default_factory=lambda d=default: list(d))))
        else:
            kind = hints.get(f.name, Any)
            fields.append((f.name, kind if kind in (int, float, str, bool) else Any, field(default=default)))
    return dataclasses.make_dataclass(f"{model_cls.__name__}Config", fields)


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (idempotent)."""
    from ..models import MODELS

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=BuildConfig)
    cs.store(group="schema", name="shapes", node=ShapesConfig)
    cs.store(group="schema", name="precision", node=PrecisionConfig)
    for name, cls in MODELS.items():
        cs.store(group="schema/model", name=name, node=model_schema(cls))


def _one_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _dim(key: str, value: Any) -> int | NamedDimension:
    name = key.rsplit(".", 1)[-1]
    try:
        if isinstance(value, (list, tuple, ListConfig)):
            if len(value) != 3:
                raise SpecError(f"a dynamic dim is [min, opt, max], got {list(value)} with {len(value)} entries")
            return NamedDimension(name, *value)
        NamedDimension(name, value, value, value)
        return int(value)
    except SpecError as e:
        raise ConfigError(f"{key}: {e}") from None


def validate(cfg: DictConfig) -> BuildRequest:
    """Check a composed config; raise ``ConfigError`` naming the key and what is allowed."""
    body = {k: v for k, v in cfg.items() if k != "hydra"} if isinstance(cfg, DictConfig) else cfg
    try:
        typed = OmegaConf.merge(OmegaConf.structured(BuildConfig), OmegaConf.create(body))
        plain = OmegaConf.to_container(typed, resolve=True, throw_on_missing=True, enum_to_str=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"invalid config{f' at {key!r}' if key else ''}: {_one_line(e)}") from None
    if not isinstance(plain["model"], dict) or not plain["model"].get("_target_"):
        raise ConfigError("model: needs a _target_ (the model class to build), e.g. model=geglu.")
    zoo = _zoo_class(plain["model"]["_target_"])
    if zoo is not None:
        allowed = {"_target_", "name", "padding", *(f.name for f in dataclasses.fields(zoo))}
        unknown = sorted(set(plain["model"]) - allowed)
        if unknown:
            raise ConfigError(
                f"model.{unknown[0]}: {zoo.__name__} has no such setting; allowed: {', '.join(sorted(allowed))}."
            )
    level = plain["optimization_level"]
    try:
        check_level(level)
    except SpecError as e:
        raise ConfigError(str(e)) from None
    for key, value in plain["model"].items():
        if key == "padding":
            continue
        # ids, DistilBERT's no token types, a window from the first layer on (Mistral's max_window_layers), DeBERTa's
        # no convolution, and its -1 for "none" (position_buckets) and "max_position_embeddings" (max_relative_positions)
        least = 0 if key.endswith("_id") else LEAST.get(key, 1)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool) and v < least:
                raise ConfigError(f"model.{key}: must be at least {least}, got {value}.")
    padding = plain["model"].get("padding") or {}
    if not isinstance(padding, dict):
        raise ConfigError(f"model.padding: must map dim names to 'rows', 'mask' or 'none', got {padding!r}.")
    for dim, kind in padding.items():
        if isinstance(kind, dict):
            try:
                MaskInput.parse(kind, f"model.padding.{dim}")
            except SpecError as e:
                raise ConfigError(str(e)) from None
        elif kind not in (*PADDING_KINDS, "none"):
            raise ConfigError(f"model.padding.{dim}: must be one of {', '.join((*PADDING_KINDS, 'none'))} or "
                              f"{{mask_input: INPUT}} (the model ignores positions where that input is 0), got {kind!r}.")
    dims = {name: _dim(f"shapes.dims.{name}", v) for name, v in plain["shapes"]["dims"].items()}
    buckets = plain["shapes"]["buckets"]
    for name, spec in buckets.items():
        key = f"shapes.buckets.{name}"
        if name not in dims:
            raise ConfigError(f"{key}: no dim {name!r} in shapes.dims (dims: {', '.join(dims)}).")
        if isinstance(dims[name], int):
            raise ConfigError(f"{key}: dim {name!r} is static ({dims[name]}); only [min, opt, max] dims take buckets.")
        try:
            resolve_buckets(spec, dims[name].bounds, key)
        except SpecError as e:
            raise ConfigError(str(e)) from None
    max_error = plain["precision"]["max_error"]
    if max_error is not None and max_error <= 0:
        raise ConfigError(f"precision.max_error: must be a positive number (error relative to the output's scale), "
                          f"got {max_error}.")
    if plain["params"]["checkpoint_key"] is not None and plain["params"]["checkpoint"] is None:
        raise ConfigError(f"params.checkpoint_key={plain['params']['checkpoint_key']}: selects the params in a "
                          "checkpoint, but params.checkpoint is not set; set it, or remove checkpoint_key.")
    age = plain["cache"]["max_age_days"]
    if age is not None and age <= 0:
        raise ConfigError(f"cache.max_age_days: must be a positive number of days, got {age}.")
    if plain["shapes"]["max_profiles"] < 1:
        raise ConfigError(f"shapes.max_profiles: must be at least 1, got {plain['shapes']['max_profiles']}.")
    backend = plain["backend"]
    compiler = "xla"
    if backend in COMPILERS:
        from ..runtime import iree as iree_backend

        try:
            iree_backend.require()
        except SpecError as e:
            raise ConfigError(f"backend: {backend}: {e}") from None
        compiler, backend = backend, "cpu"
    platforms = [backend] if isinstance(backend, str) else backend
    if not isinstance(platforms, list) or not platforms or any(p not in PLATFORMS for p in platforms):
        raise ConfigError(f"backend: {backend!r}: must be one of {', '.join(PLATFORMS + COMPILERS)} or a list of "
                          f"{' and '.join(PLATFORMS)}, e.g. backend=[cpu,cuda].")
    generate = _generate(plain, dims)
    from ..runtime.save import WEIGHT_FORMS

    if plain["weights"] not in WEIGHT_FORMS:
        raise ConfigError(f"weights: {plain['weights']!r} is not a way to store weights; use one of "
                          f"{', '.join(WEIGHT_FORMS)}.")
    from ..artifact.store import parse_size
    from ..compiler.target import cpu_baseline

    cpu_baseline(plain["target"]["cpu"])  # refuses a CPU not described for this machine
    if compiler != "xla" and plain["target"]["cpu"] != "host":
        raise ConfigError(f"target.cpu={plain['target']['cpu']}: backend={compiler} compiles for this host's CPU only "
                          "(--iree-llvmcpu-target-cpu=host); use backend=cpu for a CPU baseline, or target.cpu=host.")
    gpu_spec(plain["target"]["gpu"])  # refuses a GPU not described
    if plain["target"]["gpu"] != GPU_HOST and "cuda" not in platforms:
        raise ConfigError(f"target.gpu={plain['target']['gpu']}: names the GPU that cuda executables are for, and "
                          f"backend={plain['backend']} builds none; add cuda (backend=cuda, or backend=[cpu,cuda]) or remove "
                          "target.gpu.")
    return BuildRequest(
        model=plain["model"], shapes=dims, shapes_name=plain["shapes"]["name"], buckets=buckets,
        max_profiles=plain["shapes"]["max_profiles"], platforms=list(dict.fromkeys(platforms)), compiler=compiler,
        target_cpu=plain["target"]["cpu"], target_gpu=plain["target"]["gpu"], optimization_level=level,
        derivable=derivable(plain),
        precision=plain["precision"]["dtype"], max_error=plain["precision"]["max_error"],
        params_seed=plain["params"]["seed"],
        params_checkpoint=plain["params"]["checkpoint"], params_checkpoint_key=plain["params"]["checkpoint_key"],
        artifacts_dir=plain["artifacts_dir"], force=plain["force"],
        cache_max_bytes=parse_size(plain["cache"]["max_bytes"]) if plain["cache"]["max_bytes"] is not None else None,
        cache_max_age_days=plain["cache"]["max_age_days"], cache_remote=plain["cache"]["remote"], generate=generate,
        weights=plain["weights"],
    )


def _generate(plain: dict[str, Any], dims: dict[str, Any]) -> dict[str, Any] | None:
    """task=generate's settings (None for task=forward); the seq dim is checked against them at build
    (``builder/generate.check_shapes``), where the model says what it is (a prompt's chunks, or a source)."""
    task = plain["task"]
    if task not in TASKS:
        raise ConfigError(f"task: {task!r} is not a task; tasks: {', '.join(TASKS)}.")
    if task == "forward":
        return None
    max_length = plain["generate"]["max_length"]
    if max_length < 2:
        raise ConfigError(f"generate.max_length: must be at least 2 (a prompt token and a new one), got {max_length}.")
    for name in ("batch", "seq"):
        if name not in dims:
            raise ConfigError(f"shapes.dims.{name}: task=generate needs a {name} dim (batch: rows per call; seq: "
                              f"prompt chunk lengths, or an encoder-decoder's source lengths); add it, e.g. "
                              f"shapes.dims.{name}=[1,8,8].")
    eos = plain["generate"]["eos_token_id"]
    eos = [] if eos is None else [eos] if isinstance(eos, int) and not isinstance(eos, bool) else eos
    if eos != "auto" and not (isinstance(eos, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                            for t in eos)):
        raise ConfigError(f"generate.eos_token_id: {eos!r} is not a token id; give auto (the checkpoint's), an id, a "
                          "list of ids ([128001,128009]) or null (none).")
    return {"max_length": max_length, "eos_token_id": eos, "sampling": plain["generate"]["sampling"],
            "beams": plain["generate"]["beams"]}


def derivable(plain: dict[str, Any]) -> tuple[str, ...]:
    """The settings of ``request.DERIVABLE`` the command line leaves at their defaults: the build derives them
    from the model where they would contradict it (none where there is no command line: the Python API)."""
    from ..builder.request import DERIVABLE

    if not HydraConfig.initialized():
        return ()
    given = {o.lstrip("+~").split("=", 1)[0] for o in HydraConfig.get().overrides.task}
    return tuple(k for k in DERIVABLE if not any(k == g or k.startswith(g + ".") for g in given))


def _zoo_class(target: str) -> type | None:
    from ..models import MODELS

    return next((c for c in MODELS.values() if target == f"{c.__module__}.{c.__qualname__}"), None)
