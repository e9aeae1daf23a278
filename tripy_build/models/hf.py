"""Read a Hugging Face ``save_pretrained`` directory into a zoo model and its parameter tree.

``load_pretrained(Bert, "path/to/dir", {"hidden_size": 768})`` reads ``config.json`` (its keys that
are the dataclass's fields become the model's settings) and ``model.safetensors`` (or the shards a
``model.safetensors.index.json`` lists), tensor by tensor with ``safetensors.safe_open(...,
framework="numpy")``: no torch. It returns ``(model, params)``.

Every zoo tree keeps the checkpoint's layouts (Linear ``[out, in]``, GPT-2 ``Conv1D`` ``[in, out]``,
conv kernels OIHW), so loading is a rename. Each architecture's names are a declarative table,
``NAMES``, of ``(checkpoint key, zoo path)`` templates: ``{i}``, ``{s}``, ``{l}``, ``{j}`` stand for
list indices (layer, stage, layer in stage, conv in layer). The keys are relative to the model's
prefix: none for the bare model (``BertModel.save_pretrained``), or the head model's
``base_model_prefix`` (``bert.``, ``transformer.``, ``vit.``, ``resnet.``), found from the file.

Old checkpoints' ``LayerNorm.gamma``/``LayerNorm.beta`` are read as ``LayerNorm.weight``/``.bias``
(``LEGACY_RENAMES``, as transformers does).

Checked, each failure one line naming the tensor (or key), what was expected and what was found:

- ``config.json``'s ``model_type`` is the zoo model's (``model=bert`` with a GPT-2 directory fails);
  settings the zoo model does not implement (e.g. BERT's ``is_decoder``) are refused;
- a setting the caller gives that the checkpoint also has must be equal (``hidden_size=512``
  against 768 fails);
- every zoo parameter has exactly one tensor, of its shape and of dtype F32;
- no tensor under the model's prefix is left over, except known buffers (``Architecture.ignored``: position-id
  buffers, BatchNorm's ``num_batches_tracked``, old GPT-2's ``attn.bias``/``attn.masked_bias``);
  outside the prefix, a head model's heads (``cls.*``, ``classifier.*``, the tied ``lm_head.weight``)
  are not part of the zoo model and are skipped.

Errors are ``CheckpointError``, a ``tripy_build.errors.ConfigError`` (and a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ..errors import ConfigError

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"


class CheckpointError(ConfigError, ValueError):
    """A Hugging Face checkpoint directory does not fit the zoo model."""


def _linear(hf: str, zoo: str, bias: bool = True) -> list[tuple[str, str]]:
    return [(f"{hf}.weight", f"{zoo}.weight")] + ([(f"{hf}.bias", f"{zoo}.bias")] if bias else [])


def _ln(hf: str, zoo: str) -> list[tuple[str, str]]:
    return [(f"{hf}.weight", f"{zoo}.scale"), (f"{hf}.bias", f"{zoo}.bias")]


def _conv_bn(hf: str, zoo: str) -> list[tuple[str, str]]:
    """A ``ResNetConvLayer`` / ``ResNetShortCut``: a bias-free conv and its BatchNorm."""
    return [(f"{hf}.convolution.weight", f"{zoo}.kernel"), (f"{hf}.normalization.weight", f"{zoo}.scale"),
            (f"{hf}.normalization.bias", f"{zoo}.bias"), (f"{hf}.normalization.running_mean", f"{zoo}.mean"),
            (f"{hf}.normalization.running_var", f"{zoo}.var")]


@dataclass(frozen=True)
class Architecture:
    """How one zoo model reads a Hugging Face checkpoint."""

    model_type: str                       # config.json's model_type
    prefixes: tuple[str, ...]             # where the model's tensors may sit: "" and the heads' base prefix
    names: tuple[tuple[str, str], ...]    # (checkpoint key template, zoo path template)
    ignored: tuple[str, ...] = ()         # regexes of known non-parameter tensors under the prefix
    unsupported: tuple[tuple[str, Any], ...] = ()  # (config key, the only value the zoo model implements)
    hints: tuple[tuple[str, str], ...] = ()        # (key prefix, why such a tensor may be missing)


_NO_POOLER = (("pooler.", "the checkpoint has no pooler: head models such as BertForMaskedLM and "
               "ViTForImageClassification save the model without one; this zoo model outputs pooler_output"),)


NAMES: dict[str, Architecture] = {
    "bert": Architecture(
        model_type="bert",
        prefixes=("", "bert."),
        names=tuple(
            [("embeddings.word_embeddings.weight", "embeddings.word"),
             ("embeddings.position_embeddings.weight", "embeddings.position"),
             ("embeddings.token_type_embeddings.weight", "embeddings.token_type"),
             *_ln("embeddings.LayerNorm", "embeddings.ln"),
             *_linear("encoder.layer.{i}.attention.self.query", "layers.{i}.query"),
             *_linear("encoder.layer.{i}.attention.self.key", "layers.{i}.key"),
             *_linear("encoder.layer.{i}.attention.self.value", "layers.{i}.value"),
             *_linear("encoder.layer.{i}.attention.output.dense", "layers.{i}.attn_out"),
             *_ln("encoder.layer.{i}.attention.output.LayerNorm", "layers.{i}.attn_ln"),
             *_linear("encoder.layer.{i}.intermediate.dense", "layers.{i}.intermediate"),
             *_linear("encoder.layer.{i}.output.dense", "layers.{i}.output"),
             *_ln("encoder.layer.{i}.output.LayerNorm", "layers.{i}.output_ln"),
             *_linear("pooler.dense", "pooler")]
        ),
        ignored=(r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
        unsupported=(("is_decoder", False), ("add_cross_attention", False),
                     ("position_embedding_type", "absolute")),
        hints=_NO_POOLER,
    ),
    "gpt2": Architecture(
        model_type="gpt2",
        prefixes=("", "transformer."),
        names=tuple(
            [("wte.weight", "wte"), ("wpe.weight", "wpe"),
             *_ln("h.{i}.ln_1", "h.{i}.ln_1"),
             *_linear("h.{i}.attn.c_attn", "h.{i}.c_attn"),
             *_linear("h.{i}.attn.c_proj", "h.{i}.c_proj"),
             *_ln("h.{i}.ln_2", "h.{i}.ln_2"),
             *_linear("h.{i}.mlp.c_fc", "h.{i}.c_fc"),
             *_linear("h.{i}.mlp.c_proj", "h.{i}.mlp_proj"),
             *_ln("ln_f", "ln_f")]
        ),
        ignored=(r"h\.\d+\.attn\.(bias|masked_bias)",),
        # The logits use wte: an untied lm_head.weight would be silently ignored.
        unsupported=(("add_cross_attention", False), ("tie_word_embeddings", True)),
    ),
    "vit": Architecture(
        model_type="vit",
        prefixes=("", "vit."),
        names=tuple(
            [("embeddings.cls_token", "embeddings.cls_token"),
             ("embeddings.position_embeddings", "embeddings.position"),
             *_linear("embeddings.patch_embeddings.projection", "embeddings.patch"),
             *_linear("encoder.layer.{i}.attention.attention.query", "layers.{i}.query"),
             *_linear("encoder.layer.{i}.attention.attention.key", "layers.{i}.key"),
             *_linear("encoder.layer.{i}.attention.attention.value", "layers.{i}.value"),
             *_linear("encoder.layer.{i}.attention.output.dense", "layers.{i}.attn_out"),
             *_ln("encoder.layer.{i}.layernorm_before", "layers.{i}.ln_before"),
             *_linear("encoder.layer.{i}.intermediate.dense", "layers.{i}.intermediate"),
             *_linear("encoder.layer.{i}.output.dense", "layers.{i}.output"),
             *_ln("encoder.layer.{i}.layernorm_after", "layers.{i}.ln_after"),
             *_ln("layernorm", "ln"),
             *_linear("pooler.dense", "pooler")]
        ),
        ignored=(r"embeddings\.mask_token",),  # ViTForMaskedImageModeling's; unused without bool_masked_pos
        hints=_NO_POOLER,
    ),
    "resnet50": Architecture(
        model_type="resnet",
        prefixes=("", "resnet."),
        names=tuple(
            [*_conv_bn("embedder.embedder", "embedder"),
             *_conv_bn("encoder.stages.{s}.layers.{l}.layer.{j}", "stages.{s}.{l}.convs.{j}"),
             *_conv_bn("encoder.stages.{s}.layers.{l}.shortcut", "stages.{s}.{l}.shortcut")]
        ),
        ignored=(r".*\.num_batches_tracked",),
    ),
}

# Old (TensorFlow-converted) checkpoints name LayerNorm parameters gamma/beta; transformers renames them
# on load for every model ("legacy" in its conversion_mapping.py), and so does this reader.
LEGACY_RENAMES: tuple[tuple[str, str], ...] = ((r"LayerNorm\.gamma\Z", "LayerNorm.weight"),
                                               (r"LayerNorm\.beta\Z", "LayerNorm.bias"))
_LEGACY = [(re.compile(rx), new) for rx, new in LEGACY_RENAMES]


def _modern(key: str) -> str:
    for rx, new in _LEGACY:
        key = rx.sub(new, key)
    return key


def architecture(model_class: type) -> Architecture:
    try:
        return NAMES[model_class.name]
    except (AttributeError, KeyError):
        raise CheckpointError(
            f"{getattr(model_class, '__name__', model_class)!s} has no Hugging Face name map "
            f"(models with one: {', '.join(sorted(NAMES))})."
        ) from None


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    out = []
    for n, part in enumerate(parts):
        out.append(f"(?P<{part}>\\d+)" if n % 2 else re.escape(part))
    return re.compile("".join(out) + r"\Z")


def _path_str(path: tuple) -> str:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(str(k.idx))
        else:  # pragma: no cover - the zoo's trees are dicts and lists
            out.append(str(k))
    return ".".join(out)


def checkpoint_names(model: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{checkpoint key (without prefix): (zoo path, shape)}`` for every leaf of ``model``'s param tree.

    Every leaf must match exactly one zoo template of the table (a gap in the table is a bug here).
    """
    arch = architecture(type(model))
    rules = [(_template_regex(zoo), hf) for hf, zoo in arch.names]
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        zoo = _path_str(path)
        hits = [(rx.match(zoo), hf) for rx, hf in rules]
        hits = [(m, hf) for m, hf in hits if m]
        if len(hits) != 1:
            raise AssertionError(f"{type(model).__name__} param {zoo}: {len(hits)} name-map rules match, expected 1.")
        m, hf = hits[0]
        out[hf.format(**m.groupdict())] = (zoo, tuple(leaf.shape))
    return out


# --- config.json ------------------------------------------------------------------------------------

def normalized(v: Any) -> Any:
    """Lists and tuples compare alike (config.json has lists, dataclasses tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(normalized(x) for x in v)
    return v


def read_config(model_class: type, checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` -> the dataclass's settings (only its fields), after the architecture checks."""
    arch = architecture(model_class)
    path = Path(checkpoint_dir) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{path} not found: a Hugging Face save_pretrained directory has a {CONFIG}.")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a {type(config).__name__}, expected a JSON object.")
    found = config.get("model_type")
    if found != arch.model_type:
        archs = config.get("architectures") or []
        what = f"{found!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
        raise CheckpointError(
            f"{checkpoint_dir} is a {what} checkpoint, not {arch.model_type!r}: model={model_class.name} "
            f"({model_class.__name__}) reads model_type {arch.model_type!r}."
        )
    for key, only in arch.unsupported:
        value = config.get(key, only)
        if value != only and not (value is None and only is False):
            raise CheckpointError(
                f"{path}: {key}={value!r}, but {model_class.__name__} implements only {key}={only!r}."
            )
    fields = {f.name for f in dataclasses.fields(model_class)}
    return {k: v for k, v in config.items() if k in fields}


def model_from_config(model_class: type, checkpoint_dir: str | os.PathLike,
                      given_settings: Mapping[str, Any] | None = None) -> Any:
    """The zoo model that ``config.json`` describes; ``given_settings`` fill in or must agree."""
    settings = read_config(model_class, checkpoint_dir)
    fields = {f.name for f in dataclasses.fields(model_class)}
    for key, value in (given_settings or {}).items():
        if key not in fields:
            raise CheckpointError(
                f"{model_class.__name__} has no setting {key!r} (settings: {', '.join(sorted(fields))})."
            )
        if key in settings and normalized(settings[key]) != normalized(value):
            raise CheckpointError(
                f"{key}={value!r} was given, but the checkpoint {Path(checkpoint_dir) / CONFIG} says "
                f"{key}={settings[key]!r}: drop the setting or use a matching checkpoint."
            )
    try:
        return model_class(**{**settings, **(given_settings or {})})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{Path(checkpoint_dir) / CONFIG}: {str(e).splitlines()[0]}") from None


# --- model.safetensors ------------------------------------------------------------------------------

def _weight_files(checkpoint_dir: Path) -> list[Path]:
    single, index = checkpoint_dir / WEIGHTS, checkpoint_dir / INDEX
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} has no readable weight_map: {e!s}") from None
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (checkpoint_dir / name).is_file():
                raise CheckpointError(f"{index} lists {name}, which is not in {checkpoint_dir}.")
        return [checkpoint_dir / n for n in files]
    others = sorted(p.name for p in checkpoint_dir.glob("*.bin")) if checkpoint_dir.is_dir() else []
    hint = f" (found {', '.join(others)}: save with safe_serialization=True)" if others else ""
    raise CheckpointError(f"{checkpoint_dir} has neither {WEIGHTS} nor {INDEX}{hint}.")


def _describe(model: Any) -> str:
    return type(model).__name__


def read_params(model: Any, checkpoint_dir: str | os.PathLike) -> Any:
    """The param tree of ``model`` from the checkpoint's safetensors, checked tensor by tensor.

    Each tensor's shape and dtype are checked from the file's header before it is read; tensors are
    read one at a time (``safe_open``, numpy), so at most one checkpoint tensor is in host memory
    besides the tree being built. Each through a handle of its own: ``safe_open`` maps the whole file, and
    the pages a read touches count in the process's resident set for as long as that mapping lives (reading
    BERT-base's 418 MB through one handle peaked at 1.0 GB over the process; a handle per tensor, 0.49 GB).
    """
    from safetensors import safe_open

    arch = architecture(type(model))
    checkpoint_dir = Path(checkpoint_dir)
    files = _weight_files(checkpoint_dir)
    expected = checkpoint_names(model)
    ignored = [re.compile(rx + r"\Z") for rx in arch.ignored]

    def opened(path: Path):
        try:
            return safe_open(str(path), framework="numpy")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError for a damaged file
            raise CheckpointError(f"{path} is not a readable safetensors file: {str(e).splitlines()[0]}") from None

    keys: set[str] = set()
    for path in files:
        with opened(path) as f:
            keys.update(f.keys())
    # The prefix under which the file holds the model: the one that holds most of its tensors.
    keys = {_modern(k) for k in keys}
    prefix = max(arch.prefixes, key=lambda p: sum(p + k in keys for k in expected))
    loaded: dict[str, jax.Array] = {}
    for path in files:
        with opened(path) as f:
            for key in f.keys():
                if not key.startswith(prefix):
                    continue  # a head model's heads (cls.*, classifier.*, lm_head.weight): not the model's
                rel = _modern(key[len(prefix):])
                if rel not in expected:
                    if any(rx.match(rel) for rx in ignored):
                        continue
                    raise CheckpointError(
                        f"unexpected tensor {key} in {path}: {_describe(model)} with these settings has no "
                        f"parameter of that name (a checkpoint of another configuration?)."
                    )
                zoo, shape = expected[rel]
                handle = f.get_slice(key)
                found_shape, found_dtype = tuple(handle.get_shape()), handle.get_dtype()
                if found_shape != shape:
                    raise CheckpointError(
                        f"tensor {key} in {path} has shape {list(found_shape)}, expected {list(shape)} (for {zoo})."
                    )
                if found_dtype != "F32":
                    raise CheckpointError(
                        f"tensor {key} in {path} has dtype {found_dtype}, expected F32 (for {zoo})."
                    )
                if zoo in loaded:
                    raise CheckpointError(
                        f"tensor {key} in {path} is a second tensor for {prefix}{rel} (for {zoo}): "
                        f"a checkpoint has either LayerNorm.gamma/beta or LayerNorm.weight/bias, not both."
                    )
                with opened(path) as one:  # its own mapping: see the docstring
                    loaded[zoo] = jnp.asarray(one.get_tensor(key))
    missing = [k for k, (zoo, _) in expected.items() if zoo not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        where = files[0] if len(files) == 1 else checkpoint_dir
        hint = next((f"; {text}" for start, text in arch.hints if missing[0].startswith(start)), "")
        raise CheckpointError(
            f"missing tensor {prefix}{missing[0]} in {where}{more}: {_describe(model)} needs it, "
            f"shape {list(expected[missing[0]][1])} (for {expected[missing[0]][0]}){hint}."
        )
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    return jax.tree_util.tree_unflatten(treedef, [loaded[_path_str(p)] for p, _ in leaves])


def load_pretrained(model_class: type, checkpoint_dir: str | os.PathLike,
                    given_settings: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """``(model, params)`` from a Hugging Face ``save_pretrained`` directory; see the module docstring."""
    model = model_from_config(model_class, checkpoint_dir, given_settings)
    return model, read_params(model, checkpoint_dir)


__all__ = ["CheckpointError", "NAMES", "Architecture", "checkpoint_names", "read_config", "model_from_config",
           "read_params", "load_pretrained"]
