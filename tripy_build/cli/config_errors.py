"""Hydra's composition errors as one line each: the key or option given, what it accepts, the closest
valid name.

Hydra reports a misspelt key, an unknown group option or a wrong type with several lines, exit status
1 and, for a misspelt key, a hint to add it with ``+`` that the build then refuses. The command runs
Hydra with ``HYDRA_FULL_ERROR=1`` so that the exception reaches ``explain`` instead; a user who sets
``HYDRA_FULL_ERROR=1`` gets Hydra's traceback as before.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Iterable

from ..errors import ConfigError

# Dicts keyed by dim names: a name that is not there yet is added with ``+`` (and checked against the
# model's dims when the build starts).
DIM_DICTS = ("shapes.dims", "shapes.buckets", "model.padding")
# A model's dicts keyed by its input names (or call arguments), and those dicts themselves: a user's model config
# may add them with ``+`` (the build checks every name against the model's inputs and its call).
INPUT_DICTS = ("model.inputs", "model.input_dtypes", "model.input_values", "model.call")


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``word`` (a typo's likely meaning), or None when none is close."""
    found = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(prefix: str, word: str, candidates: Iterable[str], suffix: str = "") -> str:
    best = closest(word, candidates)
    return f" Did you mean `{prefix}{best}{suffix}`?" if best else ""


def _first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def key_help(full_key: str) -> str:
    """The schema's one-line meaning of a build config key (``precision.dtype``), or ``""``."""
    from .config import BuildConfig

    schema: Any = BuildConfig
    parts = full_key.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(schema):
            return ""
        found = {f.name: f for f in dataclasses.fields(schema)}.get(part)
        if found is None:
            return ""
        if i == len(parts) - 1:
            return found.metadata.get("help", "")
        schema = typing.get_type_hints(schema).get(part)
    return ""


def explain(err: BaseException, overrides: list[str]) -> ConfigError | None:
    """Our one-line ``ConfigError`` for an error Hydra raised while composing the config from
    ``overrides`` (the command line's), or None when ``err`` is not a configuration error."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    if isinstance(err, MissingConfigException) and getattr(err, "options", None) is not None:
        group, _, option = str(err.missing_cfg_file or "").rpartition("/")
        if group:
            return ConfigError(
                f"{group}={option}: no such option in config group '{group}' (options: {', '.join(err.options)})."
                + _did_you_mean(f"{group}=", option, err.options))
    if isinstance(err, OverrideParseException):
        return ConfigError(f"{err.override}: cannot parse it: {_first_line(err)} (an override is key=value; a list "
                           "[a,b]; a sweep key=a,b; quote values with spaces or special characters).")
    cause = err.__cause__
    if not isinstance(err, ConfigCompositionException):
        return None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        return _unknown_key(str(cause.full_key), str(cause.key), cause.parent_node, overrides)
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        full_key = str(cause.full_key)
        given = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+~").split("=", 1)[0] == full_key),
                     repr(cause.value))
        reason = _first_line(cause.msg)
        choices = reason.partition("expected one of [")[2].rstrip("]").split(", ") if "expected one of" in reason else []
        meaning = key_help(full_key)
        return ConfigError(f"{full_key}={given}: {reason}."
                           + _did_you_mean(f"{full_key}=", str(cause.value), [c for c in choices if c])
                           + (f" {full_key}: {meaning}." if meaning else ""))
    first = _first_line(err)
    return ConfigError(f"{first}{': ' + _first_line(cause) if cause is not None else ''}")


def _unknown_key(full_key: str, key: str, parent: Any, overrides: list[str]) -> ConfigError:
    """A key the composed config does not have: the keys beside it, the closest one, or ``+`` for a new dim."""
    from omegaconf import DictConfig

    where, _, _ = full_key.rpartition(".")
    siblings = [str(k) for k in parent.keys() if str(k) != "hydra"] if isinstance(parent, DictConfig) else []
    given = next((o for o in overrides if o.split("=", 1)[0] == full_key), full_key)
    value = given.split("=", 1)[1] if "=" in given else "..."
    if where in DIM_DICTS:
        return ConfigError(
            f"{full_key}: no dim '{key}' in {where} ({', '.join(siblings) or 'none yet'})."
            + _did_you_mean(f"{where}.", key, siblings)
            + f" A dim the config does not list yet is added with a plus: `+{full_key}={value}`.")
    place = f"in {where}" if where else "at the top level"
    return ConfigError(
        f"{full_key}: no such key {place} (keys: {', '.join(siblings)}); `python -m tripy_build --help` lists "
        "every key." + _did_you_mean(f"{where}." if where else "", key, siblings))
