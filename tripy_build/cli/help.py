"""``python -m tripy_build --help``: the commands, the config groups and every key, from the schemas.

Hydra's own help page lists the internal ``schema/*`` groups and no keys; this one is generated from
the dataclass schemas in ``config`` (each field's ``help``), the zoo's model classes and the options
in the packaged ``conf/`` groups, so it cannot drift from what the build accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from importlib import resources
from typing import Any

from omegaconf import MISSING

from ..artifact.describe import table
from .commands import COMMANDS

LAUNCHERS = ("basic (default: one job after another), tripy_local (a pool of workers, one per core), "
             "submitit_local, submitit_slurm, slurm_cpu (Slurm CPU nodes; pip install -e '.[submitit]'), "
             "ray_local (pip install -e '.[ray]')")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(args[0])} or null" if len(args) == 1 else " | ".join(map(_type_name, args))
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "|".join(m.value for m in tp)
    return getattr(tp, "__name__", str(tp)).replace("Any", "any")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return ""
    if value is MISSING or value == "???":
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def keys(schema: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every leaf key of a dataclass schema."""
    hints = typing.get_type_hints(schema)
    rows = []
    for f in dataclasses.fields(schema):
        tp = hints.get(f.name, Any)
        name = prefix + f.name
        if dataclasses.is_dataclass(tp):
            rows += keys(tp, name + ".")
        elif f.name != "model":
            rows.append((name, _type_name(tp), _default(f), f.metadata.get("help", "")))
    return rows


def group_options(group: str) -> list[tuple[str, str]]:
    """(option, its first comment line) for each YAML of a packaged config group."""
    folder = resources.files("tripy_build.conf").joinpath(group)
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            comment = []
            for ln in entry.read_text().splitlines():
                if not ln.startswith("#"):
                    break
                comment.append(ln.lstrip("# ").strip())
            first = " ".join(comment).split(". ")[0].rstrip(".")
            out.append((entry.name[:-5], first))
    return out


def text() -> str:
    from . import config
    from ..models import MODELS

    lines = ["tripy_build: build a JAX model into a deployable artifact (python -m tripy_build, or tripy-build).",
             "", "Commands:"]
    commands = [("[KEY=VALUE ...]", "build one artifact from the default config plus overrides (model=mlp shapes=static ...)"),
                ("-m KEY=A,B ...", "a sweep: build every combination, then a summary table; exits 1 if a job failed"),
                *((f"{name} {usage.split(': ', 1)[0]}", usage.split(": ", 1)[1]) for name, (_, usage) in COMMANDS.items())]
    lines += table(None, [("python -m tripy_build " + c, m) for c, m in commands])
    lines += ["", "Config groups (group=option):"]
    for group in ("model", "shapes", "precision"):
        lines.append(f"  {group}:")
        lines += table(None, [(name, meaning) for name, meaning in group_options(group)], indent="    ")
    lines += [f"  hydra/launcher: {LAUNCHERS}", "",
              "Keys (KEY=VALUE; type, default, meaning):"]
    lines += table(None, [(k, t, d, m) for k, t, d, m in keys(config.BuildConfig)])
    lines += ["", "Model keys (model.KEY=VALUE):"]
    lines += table(None, [(k, t, d, m) for k, t, d, m in keys(config.model_schema(next(iter(MODELS.values()))), "model.")
                     if k in ("model._target_", "model.name", "model.padding")])
    for name, cls in MODELS.items():
        settings = [(k.split(".", 1)[1], d) for k, _, d, _ in keys(config.model_schema(cls), "model.")
                    if k not in ("model._target_", "model.name", "model.padding")]
        lines.append(f"  {name}: " + ", ".join(f"{k}={d}" for k, d in settings))
    lines += ["", "Hugging Face checkpoints (model=hf params.checkpoint=DIR: the architecture its config.json names):"]
    lines += table(None, architecture_rows(), indent="  ")
    lines += [
        "",
        "  your own model: model._target_ may name a Flax NNX, Flax Linen or Equinox module class, or a function",
        "    with model.init; its config declares model.inputs ({x: [batch, 64]}, passed to the call by name),",
        "    optionally model.input_dtypes, model.call (constant call arguments: {train: false}) and (Equinox)",
        "    model.vmap; other keys are constructor arguments. See examples/conf and docs/own-model.md.",
        "",
        "Hydra's flags still work: --cfg job (the composed config), --config-dir DIR (your configs), "
        "--hydra-help, --multirun (-m).",
    ]
    return "\n".join(lines)


def architecture_rows() -> list[tuple[str, str, str]]:
    """One row per zoo model that reads Hugging Face checkpoints: its architectures, its heads, its tasks."""
    from ..models import MODELS
    from ..models.hf import NAMES

    rows = []
    for name, arch in NAMES.items():
        classes = ", ".join(arch.classes + suffix for suffix, _ in arch.suffixes)
        heads = ", ".join(dict.fromkeys(head for _, head in arch.suffixes))
        generates = callable(getattr(MODELS[name], "extend", None))  # a decoder: token generation with its LM head
        rows.append((f"model={name}", classes, f"heads: {heads}; task: forward" + (", generate (causal_lm)"
                                                                                    if generates else "")))
    return rows


def main() -> None:
    print(text())
