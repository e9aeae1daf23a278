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
``base_model_prefix`` (``bert.``, ``deberta.``, ``model.``, ``transformer.``, ``vit.``, ``resnet.``), found from
the file.

Old checkpoints' ``LayerNorm.gamma``/``LayerNorm.beta`` are read as ``LayerNorm.weight``/``.bias``
(``LEGACY_RENAMES``, as transformers does).

A model of two parts (CLIP, SigLIP) holds each part's settings under its own key of ``config.json`` (``text_config``,
``vision_config``): they are the zoo model's ``text_*`` and ``vision_*`` settings (``Architecture.nested``). A part
built alone (a CLIP tower) reads a whole model's checkpoint too: its key's settings and its own tensors, the rest
skipped with one log line naming them (``Architecture.parts``).

A key ``config.json`` leaves out means Hugging Face's default (``Architecture.defaults``, where the zoo model's
differs: DeBERTa's are deberta-v3-base's, ``DebertaV2Config``'s deberta-v2-xlarge's; ModernBERT-base's
``classifier_pooling`` is mean, ``ModernBertConfig``'s cls).

Checked, each failure one line naming the tensor (or key), what was expected and what was found:

- ``config.json``'s ``model_type`` is the zoo model's (``model=bert`` with a GPT-2 directory fails);
  settings the zoo model does not implement (e.g. BERT's ``is_decoder``) are refused;
- a setting the caller gives that the checkpoint also has must be equal (``hidden_size=512``
  against 768 fails);
- every zoo parameter has exactly one tensor, of its shape and of dtype F32, BF16 or F16 (``FLOATS``: read as
  float32, exactly; the Hub's language models are stored in bfloat16), or an MXFP4 pair ``NAME_blocks`` and
  ``NAME_scales`` (gpt-oss's experts, ``models/mxfp4.py``), dequantized to float32 exactly; a checkpoint whose
  ``config.json`` has another ``quantization_config`` is refused;
- every tensor is read or refused, naming it: none under the model's prefix is left over, except known buffers
  (``Architecture.ignored``: position-id buffers, BatchNorm's ``num_batches_tracked``, old GPT-2's
  ``attn.bias``/``attn.masked_bias``) and decoders tied to the word embeddings (``Architecture.tied``); outside
  it, the head ``config.json``'s ``architectures`` names is built and read (``BertForSequenceClassification``:
  ``classifier.*``, ``models/heads.py``), and another head's tensors are refused, or, for the encoder built
  alone (``head=none``), skipped with one log line naming them.

Errors are ``CheckpointError``, a ``tripy_build.errors.ConfigError`` (and a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import mxfp4
from .heads import CLASSIFIERS, SCORED

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"  # a speech model's feature extractor's (runtime/audio.LogMel)


# The dtypes a checkpoint's tensors are read from, each widened to float32 exactly (the zoo computes in float32;
# precision=bfloat16 or float16 casts back to the checkpoint's own values): safetensors' name -> numpy's.
FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


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
    # (head, its (checkpoint key, zoo path)s); a model whose head a setting saves under other names reads the entry
    # its checkpoint_head names (DeBERTa's masked LM with legacy=false)
    heads: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    head_tensors: str = ""                # regex of every head's tensors (outside the prefix), pre-training's too
    tied: tuple[str, ...] = ()            # regexes of tensors tied to another (a decoder = the word embeddings)
    renames: tuple[tuple[str, str], ...] = ()  # (config.json key, the zoo model's field) where the names differ
    classes: str = ""                     # Hugging Face's class-name stem: BertForSequenceClassification -> Bert
    suffixes: tuple[tuple[str, str], ...] = ()  # (class-name suffix, the head it has): ForMaskedLM -> masked_lm
    defaults: tuple[tuple[str, Any], ...] = ()  # (config.json key, Hugging Face's value where config.json lacks it)
    # (config.json key holding a sub-config, the prefix its keys take among the zoo model's fields): CLIP's
    # text_config -> text_*
    nested: tuple[tuple[str, str], ...] = ()
    parts: tuple["Part", ...] = ()        # whole checkpoints this model is one part of (a CLIP tower of a CLIPModel)

    def head_names(self, head: str) -> tuple[tuple[str, str], ...]:
        """The (checkpoint key, zoo path) pairs of ``head``: keys absolute (outside the model's prefix)."""
        return dict(self.heads).get(head, ())


@dataclass(frozen=True)
class Part:
    """A whole checkpoint that holds this zoo model as one part: a CLIP tower in a ``CLIPModel`` checkpoint."""

    model_type: str                       # the whole's config.json model_type
    config: str                           # the key of the whole's config.json that holds the part's config
    head: str                             # the head the part is built with (a tower with the whole's projection)
    shared: tuple[str, ...]               # the whole's top-level keys that override the part's (projection_dim)
    others: str                           # regex of the whole's tensors that are not the part's: skipped, and said


_NO_POOLER = (("pooler.", "the checkpoint has no pooler: head models such as BertForMaskedLM and "
               "ViTForImageClassification save the model without one; this zoo model outputs pooler_output"),)


_BERT_BODY = (
    ("embeddings.word_embeddings.weight", "embeddings.word"),
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
    *_linear("pooler.dense", "pooler"),
)
_DISTILBERT_BODY = (
    ("embeddings.word_embeddings.weight", "embeddings.word"),
    ("embeddings.position_embeddings.weight", "embeddings.position"),
    *_ln("embeddings.LayerNorm", "embeddings.ln"),
    *_linear("transformer.layer.{i}.attention.q_lin", "layers.{i}.query"),
    *_linear("transformer.layer.{i}.attention.k_lin", "layers.{i}.key"),
    *_linear("transformer.layer.{i}.attention.v_lin", "layers.{i}.value"),
    *_linear("transformer.layer.{i}.attention.out_lin", "layers.{i}.attn_out"),
    *_ln("transformer.layer.{i}.sa_layer_norm", "layers.{i}.attn_ln"),
    *_linear("transformer.layer.{i}.ffn.lin1", "layers.{i}.intermediate"),
    *_linear("transformer.layer.{i}.ffn.lin2", "layers.{i}.output"),
    *_ln("transformer.layer.{i}.output_layer_norm", "layers.{i}.output_ln"),
)


def _encoder_heads(classifier: tuple[tuple[str, str], ...], mlm_dense: str, mlm_ln: str, mlm_bias: str
                   ) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """A BERT-like family's heads: the sequence classifier's own names, a token classifier and a QA head named
    alike by every family, and a masked-LM head (dense, LayerNorm, bias; its decoder tied to the embeddings)."""
    return (("sequence_classification", classifier),
            ("token_classification", tuple(_linear("classifier", "head.out"))),
            ("question_answering", tuple(_linear("qa_outputs", "head.out"))),
            ("masked_lm", (*_linear(mlm_dense, "head.dense"), *_ln(mlm_ln, "head.ln"), (mlm_bias, "head.bias"))))


_ENCODER_SUFFIXES = (("Model", "none"), ("ForSequenceClassification", "sequence_classification"),
                     ("ForTokenClassification", "token_classification"),
                     ("ForQuestionAnswering", "question_answering"), ("ForMaskedLM", "masked_lm"))
_IMAGE_SUFFIXES = (("Model", "none"), ("ForImageClassification", "image_classification"))

_ROBERTA = dict(
    prefixes=("", "roberta."), names=_BERT_BODY,
    ignored=(r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
    unsupported=(("is_decoder", False), ("add_cross_attention", False), ("position_embedding_type", "absolute"),
                 ("tie_word_embeddings", True)),
    heads=_encoder_heads((*_linear("classifier.dense", "head.dense"), *_linear("classifier.out_proj", "head.out")),
                         "lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    head_tensors=r"(classifier|qa_outputs|lm_head)\..*", tied=(r"lm_head\.decoder\.(weight|bias)",),
    suffixes=_ENCODER_SUFFIXES,
)


def _roberta_defaults(vocab_size: int) -> tuple[tuple[str, Any], ...]:
    """``RobertaConfig``'s (``XLMRobertaConfig``'s, ``CamembertConfig``'s) defaults where the zoo's (roberta-base's
    config.json) differ: a config.json that leaves a key out means these."""
    return (("vocab_size", vocab_size), ("max_position_embeddings", 512), ("type_vocab_size", 2),
            ("layer_norm_eps", 1e-12))


_MPNET_BODY = (
    ("embeddings.word_embeddings.weight", "embeddings.word"),
    ("embeddings.position_embeddings.weight", "embeddings.position"),
    *_ln("embeddings.LayerNorm", "embeddings.ln"),
    ("encoder.relative_attention_bias.weight", "relative_attention_bias"),  # one table, shared by every layer
    *_linear("encoder.layer.{i}.attention.attn.q", "layers.{i}.query"),
    *_linear("encoder.layer.{i}.attention.attn.k", "layers.{i}.key"),
    *_linear("encoder.layer.{i}.attention.attn.v", "layers.{i}.value"),
    *_linear("encoder.layer.{i}.attention.attn.o", "layers.{i}.attn_out"),
    *_ln("encoder.layer.{i}.attention.LayerNorm", "layers.{i}.attn_ln"),
    *_linear("encoder.layer.{i}.intermediate.dense", "layers.{i}.intermediate"),
    *_linear("encoder.layer.{i}.output.dense", "layers.{i}.output"),
    *_ln("encoder.layer.{i}.output.LayerNorm", "layers.{i}.output_ln"),
    *_linear("pooler.dense", "pooler"),
)


def _bart_side(side: str, cross: bool, embeddings: bool = True, key_bias: bool = True) -> tuple[tuple[str, str], ...]:
    """BART's encoder's (or, ``cross``, decoder's) tensors under ``side``: positions, the embeddings' LayerNorm (neither
    without ``embeddings``: Marian's, sinusoidal and none), and each layer's attention, its LayerNorm, the decoder's
    cross-attention, and the feed-forward; without ``key_bias`` the attention's key projections have none
    (Whisper's)."""
    layer = side + ".layers.{i}."
    attention = [("self_attn", "", "self_attn_layer_norm", "attn_ln")] + \
        ([("encoder_attn", "cross_", "encoder_attn_layer_norm", "cross_ln")] if cross else [])
    own = ((f"{side}.embed_positions.weight", f"{side}.position"),
           *_ln(f"{side}.layernorm_embedding", f"{side}.ln")) if embeddings else ()
    return (*own,
            *(pair for theirs, ours, ln, zoo_ln in attention for pair in (
                *(pair for p in ("q", "k", "v", "out")
                  for pair in _linear(f"{layer}{theirs}.{p}_proj", f"{layer}{ours}{p}", bias=key_bias or p != "k")),
                *_ln(layer + ln, layer + zoo_ln))),
            *_linear(layer + "fc1", layer + "fc1"), *_linear(layer + "fc2", layer + "fc2"),
            *_ln(layer + "final_layer_norm", layer + "final_ln"))


# DeBERTa's (v1) and DeBERTa-v2's: the embeddings, each layer's output half, and the heads (the masked LM's as
# legacy names it: cls.predictions, or lm_predictions)
_DEBERTA_EMBEDDINGS = (("embeddings.word_embeddings.weight", "embeddings.word"),
                       ("embeddings.position_embeddings.weight", "embeddings.position"),
                       ("embeddings.token_type_embeddings.weight", "embeddings.token_type"),
                       *_linear("embeddings.embed_proj", "embeddings.proj", bias=False),
                       *_ln("embeddings.LayerNorm", "embeddings.ln"), ("encoder.rel_embeddings.weight", "rel_embeddings"))
_DEBERTA_LAYER_OUT = (*_linear("encoder.layer.{i}.attention.output.dense", "layers.{i}.attn_out"),
                      *_ln("encoder.layer.{i}.attention.output.LayerNorm", "layers.{i}.attn_ln"),
                      *_linear("encoder.layer.{i}.intermediate.dense", "layers.{i}.intermediate"),
                      *_linear("encoder.layer.{i}.output.dense", "layers.{i}.output"),
                      *_ln("encoder.layer.{i}.output.LayerNorm", "layers.{i}.output_ln"))
_DEBERTA_HEADS = (*_encoder_heads((*_linear("pooler.dense", "head.dense"), *_linear("classifier", "head.out")),
                                  "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                  "cls.predictions.bias"),
                  ("masked_lm:lm_predictions", (*_linear("lm_predictions.lm_head.dense", "head.dense"),
                                                *_ln("lm_predictions.lm_head.LayerNorm", "head.ln"),
                                                ("lm_predictions.lm_head.bias", "head.bias"))))


def _clip_tower(first: tuple[tuple[str, str], ...], last: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """A CLIP tower's names (relative to its ``text_model.`` / ``vision_model.``): its embeddings, its pre-LN layers
    (``vit.init_layers``' names), what follows them."""
    return (*first, *(pair for hf, zoo in (("self_attn.q_proj", "query"), ("self_attn.k_proj", "key"),
                                           ("self_attn.v_proj", "value"), ("self_attn.out_proj", "attn_out"),
                                           ("mlp.fc1", "intermediate"), ("mlp.fc2", "output"))
                      for pair in _linear(f"encoder.layers.{{i}}.{hf}", f"layers.{{i}}.{zoo}")),
            *_ln("encoder.layers.{i}.layer_norm1", "layers.{i}.ln_before"),
            *_ln("encoder.layers.{i}.layer_norm2", "layers.{i}.ln_after"), *last)


_CLIP_TEXT = _clip_tower((("embeddings.token_embedding.weight", "embeddings.token"),
                          ("embeddings.position_embedding.weight", "embeddings.position")),
                         tuple(_ln("final_layer_norm", "final_ln")))
_CLIP_VISION = _clip_tower((("embeddings.class_embedding", "embeddings.cls"),
                            ("embeddings.patch_embedding.weight", "embeddings.patch"),
                            ("embeddings.position_embedding.weight", "embeddings.position"),
                            *_ln("pre_layrnorm", "pre_ln")), tuple(_ln("post_layernorm", "post_ln")))
_CLIP_IGNORED = (r"((text|vision)_model\.)?embeddings\.position_ids",)  # buffers older checkpoints saved


_SIGLIP_TEXT = _clip_tower(_CLIP_TEXT[:2], (*_ln("final_layer_norm", "final_ln"), *_linear("head", "head")))
_SIGLIP_VISION = _clip_tower(
    (*_linear("embeddings.patch_embedding", "embeddings.patch"),
     ("embeddings.position_embedding.weight", "embeddings.position")),
    (*_ln("post_layernorm", "post_ln"), ("head.probe", "head.probe"), ("head.attention.in_proj_weight", "head.in_proj.weight"),
     ("head.attention.in_proj_bias", "head.in_proj.bias"), *_linear("head.attention.out_proj", "head.out_proj"),
     *_ln("head.layernorm", "head.ln"), *_linear("head.mlp.fc1", "head.mlp.fc1"), *_linear("head.mlp.fc2", "head.mlp.fc2")))


def _tower_arch(family: str, side: str, names: tuple[tuple[str, str], ...], projection: str | None) -> Architecture:
    """A CLIP or SigLIP tower, from its own checkpoint (``CLIP{Text,Vision}Model[WithProjection]``,
    ``Siglip{Text,Vision}Model``) or a whole model's (``CLIPModel``, ``SiglipModel``): ``projection`` names the
    Linear of a ``*WithProjection`` model (CLIP's; SigLIP's towers pool through a head of their own)."""
    other = "vision" if side == "text" else "text"
    rest = {"clip": {"text": r"visual_projection\.weight|logit_scale", "vision": r"text_projection\.weight|logit_scale"},
            "siglip": dict.fromkeys(("text", "vision"), r"logit_scale|logit_bias")}[family][side]
    stem = {"clip": "CLIP", "siglip": "Siglip"}[family] + side.title()
    heads = {"heads": (("projection", ((f"{projection}.weight", "projection"),)),),
             "head_tensors": rf"{projection}\.weight"} if projection else {}
    return Architecture(
        model_type=f"{family}_{side}_model", prefixes=("", f"{side}_model."), names=names, ignored=_CLIP_IGNORED,
        classes=stem, suffixes=(("Model", "none"), *((("ModelWithProjection", "projection"),) if projection else ())),
        parts=(Part(family, f"{side}_config", "projection" if projection else "none",
                    ("projection_dim",) if projection else (), rf"({other}_model\..*|{rest})"),), **heads)


def _whole_arch(family: str, text: tuple[tuple[str, str], ...], vision: tuple[tuple[str, str], ...],
                own: tuple[tuple[str, str], ...]) -> Architecture:
    """``CLIPModel`` or ``SiglipModel``: both towers (config.json's ``text_config`` and ``vision_config`` the zoo model's
    ``text_*`` and ``vision_*`` settings) and the tensors of their similarity (``own``)."""
    return Architecture(
        model_type=family, prefixes=("",), ignored=_CLIP_IGNORED,
        names=(*((f"text_model.{hf}", f"text.{zoo}") for hf, zoo in text),
               *((f"vision_model.{hf}", f"vision.{zoo}") for hf, zoo in vision), *own),
        classes={"clip": "CLIP", "siglip": "Siglip"}[family], suffixes=(("Model", "none"),),
        nested=(("text_config", "text_"), ("vision_config", "vision_")))


def _t5(model_type: str, classes: str) -> Architecture:
    """T5's encoder (``T5EncoderModel``, mT5's, UMT5's: UMT5 with a relative-position table in every layer, T5 and mT5
    in the first, shared), and a ``*ForConditionalGeneration`` checkpoint: its decoder and LM head too (its head,
    ``conditional_generation``), or its encoder alone (``head=none``: the decoder's tensors skipped, and said)."""
    def bias(side: str, zoo: str) -> tuple[str, str]:
        return (f"{side}.block.{{i}}.layer.0.SelfAttention.relative_attention_bias.weight",
                f"{zoo}layers.{{i}}.relative_attention_bias") if model_type == "umt5" else \
            (f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", f"{zoo}relative_attention_bias")

    def ff(block: str, zoo: str) -> tuple[tuple[str, str], ...]:
        return tuple((f"{block}.DenseReluDense.{n}.weight", f"{zoo}.{n}") for n in ("wi", "wi_0", "wi_1", "wo"))
    layer = "decoder.block.{i}.layer."
    decoder = (bias("decoder", "decoder."), (layer + "0.layer_norm.weight", "decoder.layers.{i}.attn_norm"),
               *((f"{layer}0.SelfAttention.{n}.weight", f"decoder.layers.{{i}}.{n}") for n in "qkvo"),
               (layer + "1.layer_norm.weight", "decoder.layers.{i}.cross_norm"),
               *((f"{layer}1.EncDecAttention.{n}.weight", f"decoder.layers.{{i}}.cross_{n}") for n in "qkvo"),
               (layer + "2.layer_norm.weight", "decoder.layers.{i}.ff_norm"), *ff(layer + "2", "decoder.layers.{i}"),
               ("decoder.final_layer_norm.weight", "decoder.final_norm"), ("lm_head.weight", "lm_head"))
    return Architecture(
        model_type=model_type, prefixes=("",),
        names=(("shared.weight", "embed"), bias("encoder", ""),
               ("encoder.block.{i}.layer.0.layer_norm.weight", "layers.{i}.attn_norm"),
               *((f"encoder.block.{{i}}.layer.0.SelfAttention.{n}.weight", f"layers.{{i}}.{n}") for n in "qkvo"),
               ("encoder.block.{i}.layer.1.layer_norm.weight", "layers.{i}.ff_norm"),
               *ff("encoder.block.{i}.layer.1", "layers.{i}"),
               ("encoder.final_layer_norm.weight", "final_norm")),
        # a cross-attention's position table older checkpoints saved, which T5 never reads
        ignored=(r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",),
        hints=(("lm_head.", "an output not scaled (scale_decoder_outputs=false, tie_word_embeddings=false; mT5's) "
                            "goes through an LM head of its own, which this checkpoint does not hold (transformers 5 "
                            "ties a new model's to the shared table): save one, model.lm_head.weight = "
                            "torch.nn.Parameter(model.shared.weight.clone()), then model.save_pretrained(DIR)"),),
        heads=(("conditional_generation", decoder),),
        # the shared table under other names; the LM head where it is the shared table (t5-small's)
        tied=(r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
        # a *ForConditionalGeneration's decoder and LM head: skipped, and said, for its encoder alone (head=none)
        head_tensors=r"(decoder\..*|lm_head\.weight)",
        classes=classes, suffixes=(("EncoderModel", "none"), ("ForConditionalGeneration", "conditional_generation")))


_ATTENTION = (*_linear("layers.{i}.self_attn.q_proj", "layers.{i}.q"), *_linear("layers.{i}.self_attn.k_proj", "layers.{i}.k"),
              *_linear("layers.{i}.self_attn.v_proj", "layers.{i}.v"), *_linear("layers.{i}.self_attn.o_proj", "layers.{i}.o"),
              ("layers.{i}.self_attn.q_norm.weight", "layers.{i}.q_norm"),
              ("layers.{i}.self_attn.k_norm.weight", "layers.{i}.k_norm"))
_MLP = (*_linear("layers.{i}.mlp.gate_proj", "layers.{i}.gate"), *_linear("layers.{i}.mlp.up_proj", "layers.{i}.up"),
        *_linear("layers.{i}.mlp.down_proj", "layers.{i}.down"))


def _experts(block: str, gate: str, up: str, down: str) -> tuple[tuple[str, str], ...]:
    """A sparse layer's router and experts (``models/moe.py``), under ``block`` (``mlp``, Mixtral's
    ``block_sparse_moe``), each expert's projections named ``gate``, ``up`` and ``down`` in the checkpoint."""
    return ((f"layers.{{i}}.{block}.gate.weight", "layers.{i}.router.weight"),
            *((f"layers.{{i}}.{block}.experts.{{e}}.{theirs}.weight", f"layers.{{i}}.experts.{{e}}.{ours}.weight")
              for theirs, ours in ((gate, "gate"), (up, "up"), (down, "down"))))


_POST_NORM = (("layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_norm"),)
_OLMO_UNSUPPORTED = (("attention_bias", False),)  # OLMo's attention_bias puts a bias on the output projection too
_MOE_RENAMES = (("num_local_experts", "num_experts"),)  # transformers 5 saves Qwen3-MoE's and Mixtral's so


_DECODER_SUFFIXES = (("ForCausalLM", "causal_lm"), ("Model", "none"),
                     ("ForSequenceClassification", "sequence_classification"),
                     ("ForTokenClassification", "token_classification"))
# the families transformers has a question-answering head for
_QA_SUFFIXES = (*_DECODER_SUFFIXES, ("ForQuestionAnswering", "question_answering"))
_DECODER_HEADS = (("causal_lm", (("lm_head.weight", "lm_head"),)),
                  ("sequence_classification", (("score.weight", "score.weight"),)),
                  ("token_classification", tuple(_linear("score", "score"))),
                  ("question_answering", tuple(_linear("qa_outputs", "score"))))


def _decoder(name: str, classes: str, layer: tuple[tuple[str, str], ...],
             suffixes: tuple[tuple[str, str], ...] = _DECODER_SUFFIXES, **extra: Any) -> Architecture:
    """A decoder of the Llama family (``models/llama.py``): the embeddings, each layer's input norm and then
    ``layer``'s tensors, the final norm; under ``model.`` in a head model's checkpoint (``*ForCausalLM``,
    ``*ForSequenceClassification``; ``transformer.`` in some families' ``*ForQuestionAnswering``), at the top in the
    bare model's (``*Model``). The LM head is read unless it is tied to the embeddings, a classifier's ``score``
    Linear (a QA head's ``qa_outputs``) beside it."""
    return Architecture(**{"model_type": name, **extra}, prefixes=("", "model.", "transformer."),
                        names=(("embed_tokens.weight", "embed"),
                               ("layers.{i}.input_layernorm.weight", "layers.{i}.input_norm"), *layer,
                               ("norm.weight", "norm")),
                        ignored=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),  # a buffer older checkpoints saved
                        heads=_DECODER_HEADS, head_tensors=r"(lm_head|score|qa_outputs)\..*", tied=(r"lm_head\.weight",),
                        classes=classes, suffixes=suffixes)


NAMES: dict[str, Architecture] = {
    "bert": Architecture(
        model_type="bert",
        prefixes=("", "bert."),
        names=_BERT_BODY,
        ignored=(r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
        unsupported=(("is_decoder", False), ("add_cross_attention", False),
                     ("position_embedding_type", "absolute"), ("tie_word_embeddings", True)),
        hints=_NO_POOLER,
        heads=_encoder_heads(tuple(_linear("classifier", "head.out")), "cls.predictions.transform.dense",
                             "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
        head_tensors=r"(classifier|qa_outputs|cls)\..*", tied=(r"cls\.predictions\.decoder\.(weight|bias)",),
        classes="Bert", suffixes=(*_ENCODER_SUFFIXES, ("ForPreTraining", "none")),
    ),
    "roberta": Architecture(model_type="roberta", classes="Roberta", defaults=_roberta_defaults(50265), **_ROBERTA),
    "xlm-roberta": Architecture(model_type="xlm-roberta", classes="XLMRoberta", defaults=_roberta_defaults(30522),
                                **_ROBERTA),
    "camembert": Architecture(model_type="camembert", classes="Camembert", defaults=_roberta_defaults(30522),
                              **_ROBERTA),
    "distilbert": Architecture(
        model_type="distilbert",
        prefixes=("", "distilbert."),
        names=_DISTILBERT_BODY,
        ignored=(r"embeddings\.position_ids",),
        unsupported=(("sinusoidal_pos_embds", False), ("tie_word_embeddings", True)),
        heads=_encoder_heads((*_linear("pre_classifier", "head.dense"), *_linear("classifier", "head.out")),
                             "vocab_transform", "vocab_layer_norm", "vocab_projector.bias"),
        head_tensors=r"(pre_classifier|classifier|qa_outputs|vocab_transform|vocab_layer_norm|vocab_projector)\..*",
        tied=(r"vocab_projector\.weight",),
        renames=(("dim", "hidden_size"), ("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads"),
                 ("hidden_dim", "intermediate_size"), ("activation", "hidden_act")),
        classes="DistilBert", suffixes=_ENCODER_SUFFIXES,
    ),
    "albert": Architecture(
        model_type="albert",
        prefixes=("", "albert."),
        names=(*(pair for pair in _BERT_BODY if pair[0].startswith("embeddings.")),
               *_linear("encoder.embedding_hidden_mapping_in", "embeddings.proj"),
               *(pair for theirs, ours in (("attention.query", "query"), ("attention.key", "key"),
                                           ("attention.value", "value"), ("attention.dense", "attn_out"),
                                           ("ffn", "intermediate"), ("ffn_output", "output"))
                 for pair in _linear(f"encoder.albert_layer_groups.{{s}}.albert_layers.{{l}}.{theirs}",
                                     f"groups.{{s}}.{{l}}.{ours}")),
               *_ln("encoder.albert_layer_groups.{s}.albert_layers.{l}.attention.LayerNorm", "groups.{s}.{l}.attn_ln"),
               *_ln("encoder.albert_layer_groups.{s}.albert_layers.{l}.full_layer_layer_norm",
                    "groups.{s}.{l}.output_ln"),
               *_linear("pooler", "pooler")),
        ignored=(r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
        unsupported=(("tie_word_embeddings", True), ("position_embedding_type", "absolute")),
        hints=_NO_POOLER,
        heads=_encoder_heads(tuple(_linear("classifier", "head.out")), "predictions.dense", "predictions.LayerNorm",
                             "predictions.bias"),
        # sop_classifier: AlbertForPreTraining's sentence-order head, read as the encoder
        head_tensors=r"(classifier|qa_outputs|predictions|sop_classifier)\..*",
        tied=(r"predictions\.decoder\.(weight|bias)",),
        classes="Albert", suffixes=(*_ENCODER_SUFFIXES, ("ForPreTraining", "none")),
        # AlbertConfig's defaults (albert-xxlarge's) where the zoo's (albert-base-v2's) differ
        defaults=(("hidden_size", 4096), ("num_attention_heads", 64), ("intermediate_size", 16384)),
    ),
    "electra": Architecture(
        model_type="electra",
        prefixes=("", "electra."),
        names=(*(pair for pair in _BERT_BODY if not pair[0].startswith("pooler.")),
               *_linear("embeddings_project", "embeddings.proj")),
        ignored=(r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
        unsupported=(("is_decoder", False), ("add_cross_attention", False),
                     ("position_embedding_type", "absolute"), ("tie_word_embeddings", True)),
        # the masked LM is the generator's (generator_predictions, generator_lm_head tied to the embeddings)
        heads=_encoder_heads((*_linear("classifier.dense", "head.dense"), *_linear("classifier.out_proj", "head.out")),
                             "generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
        # discriminator_predictions: ElectraForPreTraining's (replaced token detection), read as the encoder
        head_tensors=r"(classifier|qa_outputs|generator_predictions|generator_lm_head|discriminator_predictions)\..*",
        tied=(r"generator_lm_head\.weight",),
        classes="Electra", suffixes=(*_ENCODER_SUFFIXES, ("ForPreTraining", "none")),
        # ElectraConfig's defaults (electra-small's) where the zoo's (electra-base-discriminator's) differ
        defaults=(("embedding_size", 128), ("hidden_size", 256), ("num_attention_heads", 4),
                  ("intermediate_size", 1024)),
    ),
    "mpnet": Architecture(
        model_type="mpnet",
        prefixes=("", "mpnet."),
        names=_MPNET_BODY,
        ignored=(r"embeddings\.position_ids",),  # a buffer older checkpoints saved
        # an untied decoder would be read as the embeddings; relative_attention_num_buckets below 32: models/mpnet.py
        unsupported=(("tie_word_embeddings", True),),
        hints=_NO_POOLER,
        heads=_encoder_heads((*_linear("classifier.dense", "head.dense"), *_linear("classifier.out_proj", "head.out")),
                             "lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        head_tensors=r"(classifier|qa_outputs|lm_head)\..*", tied=(r"lm_head\.decoder\.(weight|bias)",),
        classes="MPNet", suffixes=_ENCODER_SUFFIXES,
    ),
    "deberta": Architecture(
        model_type="deberta",
        prefixes=("", "deberta."),
        names=(
            *_DEBERTA_EMBEDDINGS,
            *_linear("encoder.layer.{i}.attention.self.in_proj", "layers.{i}.in_proj", bias=False),
            ("encoder.layer.{i}.attention.self.q_bias", "layers.{i}.q_bias"),
            ("encoder.layer.{i}.attention.self.v_bias", "layers.{i}.v_bias"),
            *_linear("encoder.layer.{i}.attention.self.pos_proj", "layers.{i}.pos_key", bias=False),
            *_linear("encoder.layer.{i}.attention.self.pos_q_proj", "layers.{i}.pos_query"),
            *_DEBERTA_LAYER_OUT,
        ),
        ignored=(r"embeddings\.position_ids",),
        unsupported=(("tie_word_embeddings", True), ("talking_head", False)),
        heads=_DEBERTA_HEADS,
        head_tensors=r"(pooler|classifier|qa_outputs|cls|lm_predictions)\..*",
        tied=(r"cls\.predictions\.decoder\.(weight|bias)",),
        classes="Deberta", suffixes=_ENCODER_SUFFIXES,
        # DebertaConfig's defaults where the zoo's (deberta-base's config.json) differ
        defaults=(("relative_attention", False), ("position_biased_input", True), ("pos_att_type", None)),
    ),
    "deberta-v2": Architecture(
        model_type="deberta-v2",
        prefixes=("", "deberta."),
        names=(
            *_DEBERTA_EMBEDDINGS,
            *_ln("encoder.LayerNorm", "rel_ln"),
            *_linear("encoder.layer.{i}.attention.self.query_proj", "layers.{i}.query"),
            *_linear("encoder.layer.{i}.attention.self.key_proj", "layers.{i}.key"),
            *_linear("encoder.layer.{i}.attention.self.value_proj", "layers.{i}.value"),
            *_linear("encoder.layer.{i}.attention.self.pos_key_proj", "layers.{i}.pos_key"),
            *_linear("encoder.layer.{i}.attention.self.pos_query_proj", "layers.{i}.pos_query"),
            *_DEBERTA_LAYER_OUT,
            *_linear("encoder.conv.conv", "conv"),
            *_ln("encoder.conv.LayerNorm", "conv_ln"),
        ),
        # position_embeddings: a checkpoint without position_biased_input may hold them; Hugging Face skips them
        ignored=(r"embeddings\.position_ids", r"embeddings\.position_embeddings\.weight"),
        unsupported=(("tie_word_embeddings", True),),
        heads=_DEBERTA_HEADS,
        # mask_predictions: DeBERTa-v3's pre-training (replaced token detection)
        head_tensors=r"(pooler|classifier|qa_outputs|cls|lm_predictions|mask_predictions)\..*",
        tied=(r"cls\.predictions\.decoder\.(weight|bias)",),
        classes="DebertaV2", suffixes=_ENCODER_SUFFIXES,
        # DebertaV2Config's defaults (deberta-v2-xlarge's, and what its modules read with getattr) where the zoo's
        # (deberta-v3-base's) differ: a config.json that leaves a key out means these
        defaults=(("hidden_size", 1536), ("num_hidden_layers", 24), ("num_attention_heads", 24),
                  ("intermediate_size", 6144), ("relative_attention", False), ("position_buckets", -1),
                  ("position_biased_input", True), ("pos_att_type", None), ("share_att_key", False),
                  ("norm_rel_ebd", "none")),
    ),
    "modernbert": Architecture(
        model_type="modernbert",
        prefixes=("", "model."),
        names=(
            ("embeddings.tok_embeddings.weight", "embeddings.word"),
            *_ln("embeddings.norm", "embeddings.ln"),
            *_ln("layers.{i}.attn_norm", "layers.{i}.attn_norm"),  # none in layer 0 (nn.Identity)
            *_linear("layers.{i}.attn.Wqkv", "layers.{i}.qkv"),
            *_linear("layers.{i}.attn.Wo", "layers.{i}.attn_out"),
            *_ln("layers.{i}.mlp_norm", "layers.{i}.mlp_norm"),
            *_linear("layers.{i}.mlp.Wi", "layers.{i}.wi"),
            *_linear("layers.{i}.mlp.Wo", "layers.{i}.wo"),
            *_ln("final_norm", "final_norm"),
        ),
        # an untied decoder would be read as the embeddings; rotary types and classifier_pooling: models/modernbert.py
        unsupported=(("tie_word_embeddings", True),),
        # every head through ModernBertPredictionHead (head.dense, head.norm); the classifiers' and QA's Linear is
        # classifier, the masked LM's decoder the embeddings (tied) with decoder.bias
        heads=tuple((head, (*_linear("head.dense", "head.dense"), *_ln("head.norm", "head.ln"),
                            *(_linear("classifier", "head.out") if head != "masked_lm" else
                              (("decoder.bias", "head.bias"),))))
                    for head in ("sequence_classification", "token_classification", "question_answering",
                                 "masked_lm")),
        head_tensors=r"(head|classifier|decoder)\..*", tied=(r"decoder\.weight",),
        classes="ModernBert", suffixes=_ENCODER_SUFFIXES,
        # ModernBertConfig's default where the zoo's (ModernBERT-base's config.json) differs
        defaults=(("classifier_pooling", "cls"),),
    ),
    "bart": Architecture(
        model_type="bart",
        prefixes=("", "model."),
        names=(("shared.weight", "shared"), *_bart_side("encoder", False), *_bart_side("decoder", True)),
        # the encoder's and decoder's embed_tokens are the shared table (BartModel ties them; older files save them),
        # and so is the LM head's weight
        tied=(r"(model\.)?(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
        unsupported=(("tie_word_embeddings", True),),
        heads=(("sequence_classification", (*_linear("classification_head.dense", "head.dense"),
                                            *_linear("classification_head.out_proj", "head.out"))),
               ("question_answering", tuple(_linear("qa_outputs", "head.out"))),
               ("conditional_generation", (("final_logits_bias", "head.final_logits_bias"),))),
        head_tensors=r"(classification_head\..*|qa_outputs\..*|final_logits_bias|lm_head\.weight)",
        classes="Bart", suffixes=(("Model", "none"), ("ForSequenceClassification", "sequence_classification"),
                                  ("ForQuestionAnswering", "question_answering"),
                                  ("ForConditionalGeneration", "conditional_generation")),
    ),
    "marian": Architecture(
        model_type="marian",
        prefixes=("", "model."),
        names=(("shared.weight", "shared"), *_bart_side("encoder", False, embeddings=False),
               *_bart_side("decoder", True, embeddings=False)),
        # the sinusoidal position tables (a constant here), which older checkpoints saved
        ignored=(r"(encoder|decoder)\.embed_positions\.weight",),
        tied=(r"(model\.)?(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
        # separate encoder and decoder tables (and a decoder vocabulary of its own), an LM head of its own: not read
        unsupported=(("share_encoder_decoder_embeddings", True), ("tie_word_embeddings", True)),
        heads=(("conditional_generation", (("final_logits_bias", "head.final_logits_bias"),)),),
        head_tensors=r"(final_logits_bias|lm_head\.weight)",
        classes="Marian", suffixes=(("Model", "none"), ("MTModel", "conditional_generation")),
        # MarianConfig's defaults where the zoo's (opus-mt-en-de's) differ
        defaults=(("d_model", 1024), ("encoder_layers", 12), ("decoder_layers", 12), ("encoder_attention_heads", 16),
                  ("decoder_attention_heads", 16), ("encoder_ffn_dim", 4096), ("decoder_ffn_dim", 4096),
                  ("activation_function", "gelu"), ("max_position_embeddings", 1024), ("scale_embedding", False)),
    ),
    "whisper": Architecture(
        model_type="whisper",
        prefixes=("", "model."),
        names=(*_linear("encoder.conv1", "encoder.conv1"), *_linear("encoder.conv2", "encoder.conv2"),
               ("encoder.embed_positions.weight", "encoder.position"), *_ln("encoder.layer_norm", "encoder.ln"),
               ("decoder.embed_tokens.weight", "decoder.embed"), ("decoder.embed_positions.weight", "decoder.position"),
               *_ln("decoder.layer_norm", "decoder.ln"), *_bart_side("encoder", False, False, key_bias=False),
               *_bart_side("decoder", True, False, key_bias=False)),
        tied=(r"proj_out\.weight",),  # the LM head is the decoder's embeddings
        unsupported=(("tie_word_embeddings", True), ("use_weighted_layer_sum", False)),
        heads=(("conditional_generation", ()),),
        head_tensors=r"proj_out\.weight",
        classes="Whisper", suffixes=(("Model", "none"), ("ForConditionalGeneration", "conditional_generation")),
        # WhisperConfig's default where the zoo's (whisper-tiny's config.json) differs
        defaults=(("decoder_start_token_id", 50257),),
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
        tied=(r"lm_head\.weight",),  # older checkpoints save the LM head, tied to wte
        heads=(("sequence_classification", (("score.weight", "score.weight"),)),
               ("token_classification", tuple(_linear("classifier", "score"))),
               ("question_answering", tuple(_linear("qa_outputs", "score")))),
        head_tensors=r"(lm_head|score|classifier|qa_outputs)\..*",
        # its LM head is GPT2LMHeadModel; its other classes are named as the Llama family's
        classes="GPT2", suffixes=(("LMHeadModel", "causal_lm"), *_QA_SUFFIXES[1:]),
        # The logits use wte: an untied lm_head.weight would be silently ignored.
        unsupported=(("add_cross_attention", False), ("tie_word_embeddings", True)),
    ),
    **{name: _decoder(name, classes, (*_ATTENTION, *norms, *_MLP), **extra) for name, classes, norms, extra in (
        *((n, c, _POST_NORM, {"suffixes": _DECODER_SUFFIXES if n == "gemma" else _QA_SUFFIXES})
          for n, c in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral"),
                       ("gemma", "Gemma"), ("smollm3", "SmolLM3"))),
        # Gemma's post_attention_layernorm is on the attention's output; the MLP's input norm is pre_feedforward
        *((n, c, (("layers.{i}.post_attention_layernorm.weight", "layers.{i}.attn_out_norm"),
                  ("layers.{i}.pre_feedforward_layernorm.weight", "layers.{i}.post_norm"),
                  ("layers.{i}.post_feedforward_layernorm.weight", "layers.{i}.mlp_out_norm")),
           dict(model_type=t, renames=(("hidden_activation", "hidden_act"),), suffixes=suffixes,
                unsupported=(("use_bidirectional_attention", False),)))
          for n, c, t, suffixes in (
              ("gemma2", "Gemma2", "gemma2", _DECODER_SUFFIXES),
              # Gemma3Model and Gemma3ForSequenceClassification are the multimodal model's (model_type gemma3)
              ("gemma3", "Gemma3", "gemma3_text", (("ForCausalLM", "causal_lm"), ("TextModel", "none"),
                                                   ("TextForSequenceClassification", "sequence_classification"))))))},
    # OLMo's norms on the attention's and the MLP's outputs (and none on a layer's input); no token classifier
    **{name: _decoder(name, classes, (*_ATTENTION, ("layers.{i}.post_attention_layernorm.weight", "layers.{i}.attn_out_norm"),
                                      ("layers.{i}.post_feedforward_layernorm.weight", "layers.{i}.mlp_out_norm"), *_MLP),
                      suffixes=_DECODER_SUFFIXES[:3], unsupported=_OLMO_UNSUPPORTED)
       for name, classes in (("olmo2", "Olmo2"), ("olmo3", "Olmo3"))},
    "olmoe": _decoder("olmoe", "Olmoe", (*_ATTENTION, *_POST_NORM, *_MLP, *_experts("mlp", "gate_proj", "up_proj", "down_proj")),
                      suffixes=_DECODER_SUFFIXES[:2], unsupported=(*_OLMO_UNSUPPORTED, ("clip_qkv", None))),
    # GraniteForCausalLM only (transformers has no other head for it)
    "granite": _decoder("granite", "Granite", (*_ATTENTION, *_POST_NORM, *_MLP),
                        suffixes=(("ForCausalLM", "causal_lm"), ("Model", "none"))),
    "granite_moe": _decoder("granite_moe", "GraniteMoe", (
        *_ATTENTION, *_POST_NORM, ("layers.{i}.block_sparse_moe.router.layer.weight", "layers.{i}.router.weight"),
        ("layers.{i}.block_sparse_moe.input_linear.weight", "layers.{i}.experts.gate_up"),
        ("layers.{i}.block_sparse_moe.output_linear.weight", "layers.{i}.experts.down")),
        model_type="granitemoe", suffixes=(("ForCausalLM", "causal_lm"), ("Model", "none")), renames=_MOE_RENAMES),
    "qwen3_moe": _decoder("qwen3_moe", "Qwen3Moe", (*_ATTENTION, *_POST_NORM, *_MLP,
                                                   *_experts("mlp", "gate_proj", "up_proj", "down_proj")),
                          suffixes=_QA_SUFFIXES, renames=_MOE_RENAMES),
    "qwen2_moe": _decoder("qwen2_moe", "Qwen2Moe", (
        *_ATTENTION, *_POST_NORM, *_MLP, *_experts("mlp", "gate_proj", "up_proj", "down_proj"),
        *((f"layers.{{i}}.mlp.shared_expert.{p}_proj.weight", f"layers.{{i}}.shared.{p}.weight")
          for p in ("gate", "up", "down")),
        ("layers.{i}.mlp.shared_expert_gate.weight", "layers.{i}.shared_gate.weight")),
        suffixes=_QA_SUFFIXES, renames=(("qkv_bias", "attention_bias"),)),  # transformers 5's name for Qwen2-MoE's
    "mixtral": _decoder("mixtral", "Mixtral", (*_ATTENTION, *_POST_NORM, *_experts("block_sparse_moe", "w1", "w3", "w2")),
                        suffixes=_QA_SUFFIXES, renames=_MOE_RENAMES),
    "gpt_oss": _decoder("gpt_oss", "GptOss", (
        *_ATTENTION, ("layers.{i}.self_attn.sinks", "layers.{i}.sinks"), *_POST_NORM,
        *_linear("layers.{i}.mlp.router", "layers.{i}.router"),
        *((f"layers.{{i}}.mlp.experts.{theirs}", f"layers.{{i}}.experts.{ours}") for theirs, ours in (
            ("gate_up_proj", "gate_up"), ("gate_up_proj_bias", "gate_up_bias"), ("down_proj", "down"),
            ("down_proj_bias", "down_bias")))), renames=_MOE_RENAMES),
    "phi3": _decoder("phi3", "Phi3", (  # the projections fused as the checkpoint holds them
        *_linear("layers.{i}.self_attn.qkv_proj", "layers.{i}.qkv", bias=False),
        *_linear("layers.{i}.self_attn.o_proj", "layers.{i}.o", bias=False),
        ("layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_norm"),
        *_linear("layers.{i}.mlp.gate_up_proj", "layers.{i}.gate_up", bias=False),
        *_linear("layers.{i}.mlp.down_proj", "layers.{i}.down", bias=False))),
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
        heads=(("image_classification", tuple(_linear("classifier", "head.out"))),),
        head_tensors=r"classifier\..*", classes="ViT", suffixes=_IMAGE_SUFFIXES,
    ),
    "clip": _whole_arch("clip", _CLIP_TEXT, _CLIP_VISION, (
        ("text_projection.weight", "text_projection"), ("visual_projection.weight", "visual_projection"),
        ("logit_scale", "logit_scale"))),
    "clip_text": _tower_arch("clip", "text", _CLIP_TEXT, "text_projection"),
    "clip_vision": _tower_arch("clip", "vision", _CLIP_VISION, "visual_projection"),
    "siglip": _whole_arch("siglip", _SIGLIP_TEXT, _SIGLIP_VISION, (("logit_scale", "logit_scale"),
                                                                    ("logit_bias", "logit_bias"))),
    "siglip_text": _tower_arch("siglip", "text", _SIGLIP_TEXT, None),
    "siglip_vision": _tower_arch("siglip", "vision", _SIGLIP_VISION, None),
    **{name: _t5(name, classes) for name, classes in (("t5", "T5"), ("mt5", "MT5"), ("umt5", "UMT5"))},
    "resnet50": Architecture(
        model_type="resnet",
        prefixes=("", "resnet."),
        names=tuple(
            [*_conv_bn("embedder.embedder", "embedder"),
             *_conv_bn("encoder.stages.{s}.layers.{l}.layer.{j}", "stages.{s}.{l}.convs.{j}"),
             *_conv_bn("encoder.stages.{s}.layers.{l}.shortcut", "stages.{s}.{l}.shortcut")]
        ),
        ignored=(r".*\.num_batches_tracked",),
        heads=(("image_classification", tuple(_linear("classifier.1", "head.out"))),),  # Sequential(Flatten, Linear)
        head_tensors=r"classifier\..*", classes="ResNet", suffixes=_IMAGE_SUFFIXES,
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
    """``{checkpoint key (without prefix): (zoo path, shape)}`` for every leaf of ``model``'s param tree; a head's
    keys, which sit outside the model's prefix (``classifier.weight`` beside ``bert.*``), start with ``/``.

    Every leaf must match exactly one zoo template of the table (a gap in the table is a bug here).
    """
    arch = architecture(type(model))
    rules = [(_template_regex(zoo), hf) for hf, zoo in arch.names]
    head = getattr(model, "checkpoint_head", getattr(model, "task", "none"))
    rules += [(_template_regex(zoo), "/" + hf) for hf, zoo in arch.head_names(head)]
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


def _json_object(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (``config.json``, ``generation_config.json``) as the object it must hold."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a {type(config).__name__}, expected a JSON object.")
    return config


def generation_defaults(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """The token ids generation stops at and fills stopped rows with, as Hugging Face's ``generate`` takes them:
    ``generation_config.json``'s, or where there is none, ``config.json``'s; and how it picks tokens. ``{"eos_token_id":
    [ids] (an instruct model has several: Llama 3's end of text and end of turn), "pad_token_id": id or None,
    "sampling": generation_config.json's object (runtime/sampling.from_generation_config reads it; {} without one),
    "source": the file read, "forced_bos_token_id", "forced_eos_token_id": the first and last tokens an
    encoder-decoder's reply is forced to (BART's, Marian's), or None}``."""
    root = Path(checkpoint_dir)
    path = root / GENERATION_CONFIG if (root / GENERATION_CONFIG).is_file() else root / CONFIG
    config = _json_object(path)
    sampling = config if path.name == GENERATION_CONFIG else {}
    eos, pad = config.get("eos_token_id"), config.get("pad_token_id")
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in [*eos, *([] if pad is None else [pad])]):
        raise CheckpointError(f"{path}: eos_token_id={config.get('eos_token_id')!r}, pad_token_id={pad!r}: token ids "
                              "must be integers (eos_token_id: one or a list).")
    forced = {k: config.get(k) for k in ("forced_bos_token_id", "forced_eos_token_id")}
    if not all(v is None or isinstance(v, int) and not isinstance(v, bool) for v in forced.values()):
        raise CheckpointError(f"{path}: {forced}: forced token ids must be integers (or null).")
    return {"eos_token_id": eos, "pad_token_id": pad, "sampling": sampling, "source": str(path), **forced}


def preprocessor_config(checkpoint_dir: str | os.PathLike) -> tuple[dict[str, Any] | None, Path]:
    """A speech checkpoint's ``preprocessor_config.json`` (its feature extractor's settings) and its path; None where
    the directory has none."""
    path = Path(checkpoint_dir) / PREPROCESSOR_CONFIG
    return (_json_object(path) if path.is_file() else None), path


def _sub_config(config: Mapping[str, Any], key: str) -> Any:
    """A part's settings in a whole model's ``config.json`` (``text_config``); CLIP's older configs
    (openai/clip-vit-large-patch14's) hold them in ``text_config_dict``, which transformers reads in its place."""
    legacy = config.get(f"{key}_dict")
    return legacy if isinstance(legacy, dict) else config.get(key)


def read_config(model_class: type, checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` -> the dataclass's settings (only its fields), after the architecture checks."""
    arch = architecture(model_class)
    path = Path(checkpoint_dir) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{path} not found: a Hugging Face save_pretrained directory has a {CONFIG}.")
    config = _json_object(path)
    found = config.get("model_type")
    part = next((p for p in arch.parts if p.model_type == found), None)
    if found != arch.model_type and part is None:
        archs = config.get("architectures") or []
        what = f"{found!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
        wholes = "".join(f" or {p.model_type!r}'s {p.config}" for p in arch.parts)
        raise CheckpointError(
            f"{checkpoint_dir} is a {what} checkpoint, not {arch.model_type!r}: model={model_class.name} "
            f"({model_class.__name__}) reads model_type {arch.model_type!r}{wholes}."
        )
    if part is not None:
        sub = _sub_config(config, part.config)
        if not isinstance(sub, dict):
            raise CheckpointError(f"{path}: {part.config}={sub!r}, expected the {arch.model_type} part's settings "
                                  f"(an object), as a {found} checkpoint holds them.")
        log.info("%s: the %s part of a %s checkpoint (%s, head %s); its other tensors are skipped", checkpoint_dir,
                 part.config, found, model_class.__name__, part.head)
        config = {**sub, **{k: config[k] for k in part.shared if k in config}}
    for key, prefix in arch.nested:
        sub = _sub_config(config, key) or {}
        if not isinstance(sub, dict):
            raise CheckpointError(f"{path}: {key}={sub!r}, expected an object (the settings of {prefix}*).")
        config = {**{k: v for k, v in config.items() if k not in (key, f"{key}_dict")},
                  **{prefix + k: v for k, v in sub.items()}}
    quantized = config.get("quantization_config")
    method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
    if quantized is not None and method != "mxfp4":
        raise CheckpointError(
            f"{path}: quantization_config.quant_method={method!r}: a quantized checkpoint is not read (but gpt-oss's "
            "MXFP4 experts, read as float32); use the model's unquantized checkpoint (float32, bfloat16 or "
            "float16), or save one: model.to(torch.bfloat16).save_pretrained(DIR).")
    for key, only in arch.unsupported:
        value = config.get(key, only)
        if value != only and not (value is None and only is False):
            raise CheckpointError(
                f"{path}: {key}={value!r}, but {model_class.__name__} implements only {key}={only!r}."
            )
    config = {dict(arch.renames).get(k, k): v for k, v in {**dict(arch.defaults), **config}.items()}
    fields = {f.name for f in dataclasses.fields(model_class)}
    settings = {k: v for k, v in config.items() if k in fields and k not in ("head", "num_labels", "labels",
                                                                             "problem_type")}
    if "head" in fields:
        settings["head"] = part.head if part is not None else head_of(config, arch, path)
        id2label = config.get("id2label") or {}
        if settings["head"] in CLASSIFIERS:
            try:
                labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
            except (TypeError, ValueError):
                raise CheckpointError(f"{path}: id2label={id2label!r} is not a map of class ids to names.") from None
            settings["num_labels"] = len(labels) or 2  # Hugging Face's default: two classes, LABEL_0 and LABEL_1
            settings["labels"] = tuple(labels)
        if settings["head"] in SCORED and config.get("problem_type") is not None:  # a token classifier's: unread
            settings["problem_type"] = config["problem_type"]
    return settings


class Pretrained:
    """``model=hf``: the zoo model that ``params.checkpoint``'s ``config.json`` names (``model_name``), built with
    its head. Not a model of its own: a build without a checkpoint has no architecture to build."""

    name = "hf"
    SETTINGS = {"head": "auto", "pooling": "none", "normalize": False}  # conf/model/hf.yaml's: none set by the user

    def __init__(self, **settings: Any) -> None:
        raise ConfigError("model=hf builds the architecture a Hugging Face checkpoint's config.json names: give "
                          "params.checkpoint=DIR (a save_pretrained directory), or name a zoo model (model=bert).")


def architectures() -> dict[str, tuple[str, str]]:
    """Hugging Face's architecture class names that a zoo model builds -> (zoo model, head): each family's stem and
    suffixes (``BertForSequenceClassification``; BERT's pre-training model as the bare encoder; GPT-2's LM head,
    which the zoo's GPT-2 always applies, tied to its embeddings)."""
    return {arch.classes + suffix: (name, head) for name, arch in NAMES.items() for suffix, head in arch.suffixes}


def head_of(config: Mapping[str, Any], arch: Architecture, path: Path) -> str:
    """The head ``config.json``'s ``architectures`` names (where it names none, the family's first: the bare
    encoder's, a decoder's LM head)."""
    named = (config.get("architectures") or [None])[0]
    if named is None:
        return arch.suffixes[0][1] if arch.suffixes else "none"
    found = architectures().get(named)
    if found is None or found[0] != next(n for n, a in NAMES.items() if a is arch):
        ours = sorted(k for k, (zoo, _) in architectures().items() if NAMES[zoo] is arch)
        raise CheckpointError(f"{path}: architectures names {named}, which this zoo model does not build; it builds "
                              f"{', '.join(ours)}.")
    return found[1]


def model_name(checkpoint_dir: str | os.PathLike) -> str:
    """The zoo model that builds the checkpoint's architecture (``model=hf``): from ``config.json``'s
    ``architectures``, else its ``model_type``."""
    path = Path(checkpoint_dir) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: model=hf reads the architecture from a save_pretrained directory's "
                              f"{CONFIG}, and it is not readable: {str(e).splitlines()[0]}") from None
    named = (config.get("architectures") or [None])[0] if isinstance(config, dict) else None
    table = architectures()
    if named in table:
        return table[named][0]
    by_type = [n for n, a in NAMES.items() if isinstance(config, dict) and a.model_type == config.get("model_type")]
    if named is None and by_type:
        return by_type[0]
    raise CheckpointError(
        f"{path}: {named or config.get('model_type')!r} is not an architecture the zoo builds; it builds "
        f"{', '.join(sorted(table))}. For another model, write it in JAX and name it with model._target_ "
        "(docs/own-model.md).")


def model_from_config(model_class: type, checkpoint_dir: str | os.PathLike,
                      given_settings: Mapping[str, Any] | None = None) -> Any:
    """The zoo model that ``config.json`` describes; ``given_settings`` fill in or must agree. A sentence embedding
    (``pooling``) with the head left to the checkpoint is the encoder alone (``head=none``): sentence-transformers
    reads the bare model whatever ``architectures`` names (all-mpnet-base-v2's names MPNetForMaskedLM beside the
    encoder's tensors alone)."""
    settings = read_config(model_class, checkpoint_dir)
    given_settings = dict(given_settings or {})
    if given_settings.get("pooling", "none") != "none" and "head" not in given_settings \
            and settings.get("head", "none") != "none":
        log.info("pooling=%s: the encoder alone (head=none), as sentence-transformers reads it; %s names the head %s",
                 given_settings["pooling"], Path(checkpoint_dir) / CONFIG, settings["head"])
        given_settings["head"] = "none"
    fields = {f.name for f in dataclasses.fields(model_class)}
    for key, value in given_settings.items():
        if key not in fields:
            raise CheckpointError(
                f"{model_class.__name__} has no setting {key!r} (settings: {', '.join(sorted(fields))})."
            )
        if key == "head" and value == "none":
            continue  # the encoder alone from a head model's checkpoint: the head's tensors are skipped, said once
        if key in settings and normalized(settings[key]) != normalized(value):
            raise CheckpointError(
                f"{key}={value!r} was given, but the checkpoint {Path(checkpoint_dir) / CONFIG} says "
                f"{key}={settings[key]!r}: drop the setting or use a matching checkpoint."
            )
    head = given_settings.get("head", settings.get("head"))
    if head not in SCORED:  # the checkpoint's head replaced (the encoder alone): its classes' settings go with it
        settings.pop("problem_type", None)
    if head not in CLASSIFIERS:
        settings.pop("num_labels", None)
        settings.pop("labels", None)
    try:
        return model_class(**{**settings, **given_settings})
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
    task = getattr(model, "task", "none")
    return type(model).__name__ + (f" (head {task})" if task != "none" else "")


def read_params(model: Any, checkpoint_dir: str | os.PathLike) -> Any:
    """The param tree of ``model`` from the checkpoint's safetensors, checked tensor by tensor.

    Each tensor's shape and dtype are checked from the file's header before it is read; tensors are
    read one at a time (``safe_open``, numpy), so at most one checkpoint tensor is in host memory
    besides the tree being built. Each through a handle of its own: ``safe_open`` maps the whole file, and
    the pages a read touches count in the process's resident set for as long as that mapping lives (reading
    BERT-base's 418 MB through one handle peaked at 1.0 GB over the process; a handle per tensor, 0.49 GB).
    """
    import ml_dtypes  # noqa: F401 - gives numpy bfloat16, which safetensors' numpy reader needs for a BF16 tensor
    from safetensors import safe_open

    arch = architecture(type(model))
    checkpoint_dir = Path(checkpoint_dir)
    files = _weight_files(checkpoint_dir)
    names = checkpoint_names(model)
    expected = {k: v for k, v in names.items() if not k.startswith("/")}
    absolute = {k[1:]: v for k, v in names.items() if k.startswith("/")}  # the head's, outside the prefix
    ignored = [re.compile(rx + r"\Z") for rx in arch.ignored]
    tied = [re.compile(rx + r"\Z") for rx in arch.tied]
    other_heads = re.compile(arch.head_tensors + r"\Z") if arch.head_tensors else None
    found = _json_object(checkpoint_dir / CONFIG).get("model_type") if arch.parts and (checkpoint_dir / CONFIG).is_file() \
        else None
    whole = next((p for p in arch.parts if p.model_type == found), None)  # the checkpoint is a whole this is part of
    other_parts = re.compile(whole.others + r"\Z") if whole is not None else None
    apart: list[str] = []  # a whole checkpoint's tensors that are not this part's
    task = getattr(model, "task", "none")
    skipped: list[str] = []
    widened: dict[str, int] = {}  # safetensors dtype -> the tensors of it widened to float32
    unpacked = 0  # MXFP4 tensors dequantized to float32

    def opened(path: Path):
        try:
            return safe_open(str(path), framework="numpy")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError for a damaged file
            raise CheckpointError(f"{path} is not a readable safetensors file: {str(e).splitlines()[0]}") from None

    keys: dict[str, Path] = {}  # every tensor's (modern) name -> its file
    for path in files:
        with opened(path) as f:
            keys.update({_modern(k): path for k in f.keys()})
    # The prefix under which the file holds the model: the one that holds most of its tensors.
    prefix = max(arch.prefixes, key=lambda p: sum(p + k in keys for k in expected))
    loaded: dict[str, jax.Array] = {}
    for path in files:
        with opened(path) as f:
            for key in f.keys():
                full = _modern(key)
                base = full.removesuffix(mxfp4.BLOCKS).removesuffix(mxfp4.SCALES)
                packed = base != full and {base + mxfp4.BLOCKS, base + mxfp4.SCALES} <= keys.keys()
                if packed and full.endswith(mxfp4.SCALES):
                    continue  # read with its blocks
                full = base if packed else full
                rel = full[len(prefix):] if full.startswith(prefix) else None
                if full in absolute:
                    zoo, shape = absolute[full]
                elif rel is not None and rel in expected:
                    zoo, shape = expected[rel]
                elif task == "none" and other_heads is not None and other_heads.match(full):
                    skipped.append(key)  # a head (or pre-training's) beside the model built alone: said once below
                    continue
                elif other_parts is not None and other_parts.match(full):
                    apart.append(key)  # the rest of a whole checkpoint (a CLIP tower's other tower): said below
                    continue
                elif rel is not None and any(rx.match(rel) for rx in ignored) or any(rx.match(full) for rx in tied):
                    continue  # a buffer, or a decoder tied to the word embeddings
                else:
                    what = (f"{_describe(model)} with head={task} does not read it" if other_heads is not None
                            and other_heads.match(full) else f"{_describe(model)} with these settings has no "
                            "parameter of that name (a checkpoint of another configuration?)")
                    raise CheckpointError(
                        f"unexpected tensor {key} in {path}: {what}. Every tensor of a checkpoint is read or "
                        "refused, so that no head is dropped without a word: model=hf builds the architecture "
                        f"{CONFIG} names, with its head.")
                handle = f.get_slice(key)
                found_shape, found_dtype = tuple(handle.get_shape()), handle.get_dtype()
                if packed:
                    found_shape, found_dtype = _packed(found_shape, found_dtype, key, path, keys)
                if found_shape != shape:
                    raise CheckpointError(
                        f"tensor {key} in {path} has shape {list(found_shape)}, expected {list(shape)} (for {zoo})."
                    )
                if found_dtype not in FLOATS and not packed:
                    raise CheckpointError(
                        f"tensor {key} in {path} has dtype {found_dtype}, expected one of {', '.join(FLOATS)} (for "
                        f"{zoo}): a quantized or float64 checkpoint is not read; save the model in float32, bfloat16 "
                        "or float16 (model.to(torch.float32).save_pretrained(DIR)).")
                widened[found_dtype] = widened.get(found_dtype, 0) + (found_dtype != "F32" and not packed)
                unpacked += packed
                if zoo in loaded:
                    raise CheckpointError(
                        f"tensor {key} in {path} is a second tensor for {full} (for {zoo}): "
                        f"a checkpoint has either LayerNorm.gamma/beta or LayerNorm.weight/bias, not both."
                    )
                with opened(path) as one:  # its own mapping: see the docstring
                    tensor = one.get_tensor(key)
                if packed:
                    with opened(keys[full + mxfp4.SCALES]) as one:
                        tensor = _unpacked(tensor, one.get_tensor(full + mxfp4.SCALES), key)
                loaded[zoo] = jnp.asarray(tensor, jnp.float32)
    if unpacked:
        log.info("%s: %d MXFP4 tensor(s) (name_blocks and name_scales) read as float32, exactly (4-bit floats times "
                 "powers of two: precision=bfloat16 keeps them exactly too); their float32 bytes are 8x the file's.",
                 checkpoint_dir, unpacked)
    if any(widened.values()):
        stored = max(widened, key=widened.__getitem__)
        log.info("%s: %s read as float32, exactly; precision=%s builds with the checkpoint's own values at half "
                 "the weight bytes.", checkpoint_dir,
                 ", ".join(f"{n} {FLOATS[d]} tensor(s)" for d, n in widened.items() if n), FLOATS[stored])
    if apart:
        log.info("%s: %d tensor(s) of the rest of the checkpoint skipped (%s is one part of it): %s", checkpoint_dir,
                 len(apart), type(model).__name__, ", ".join(sorted(apart)[:4]) + (" ..." if len(apart) > 4 else ""))
    if skipped:
        log.info("%s: %d tensor(s) of a head not built (head=none: the model alone) skipped: %s", checkpoint_dir,
                 len(skipped), ", ".join(sorted(skipped)[:6]) + (" ..." if len(skipped) > 6 else ""))
    wanted = {prefix + k: v for k, v in expected.items()} | absolute
    missing = [k for k, (zoo, _) in wanted.items() if zoo not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        where = files[0] if len(files) == 1 else checkpoint_dir
        hint = next((f"; {text}" for start, text in arch.hints if missing[0][len(prefix):].startswith(start)), "")
        raise CheckpointError(
            f"missing tensor {missing[0]} in {where}{more}: {_describe(model)} needs it, "
            f"shape {list(wanted[missing[0]][1])} (for {wanted[missing[0]][0]}){hint}."
        )
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    return jax.tree_util.tree_unflatten(treedef, [loaded[_path_str(p)] for p, _ in leaves])


def _packed(blocks_shape: tuple[int, ...], blocks_dtype: str, key: str, path: Path,
            keys: Mapping[str, Path]) -> tuple[tuple[int, ...], str]:
    """The shape and dtype an MXFP4 pair is read as (``mxfp4.shape``, F32); ``CheckpointError`` where its blocks or
    scales are not uint8, or the blocks not ``[..., out, groups, 16]``."""
    from safetensors import safe_open

    scales = key.removesuffix(mxfp4.BLOCKS) + mxfp4.SCALES
    with safe_open(str(keys[scales]), framework="numpy") as f:
        scales_dtype = f.get_slice(scales).get_dtype()
    if (blocks_dtype, scales_dtype) != ("U8", "U8") or len(blocks_shape) < 3:
        raise CheckpointError(f"tensors {key} ({blocks_dtype} {list(blocks_shape)}) and {scales} ({scales_dtype}) "
                              f"in {path}: an MXFP4 tensor's blocks are U8 [..., out, groups, {mxfp4.GROUP // 2}] "
                              "and its scales U8 [..., out, groups].")
    return mxfp4.shape(blocks_shape), "F32"


def _unpacked(blocks: Any, scales: Any, key: str) -> Any:
    """``mxfp4.dequantize`` of a pair whose shapes agree; ``CheckpointError`` naming them where they do not."""
    if tuple(scales.shape) != tuple(blocks.shape[:-1]) or blocks.shape[-1] != mxfp4.GROUP // 2:
        raise CheckpointError(f"tensor {key} has shape {list(blocks.shape)} and its scales {list(scales.shape)}: "
                              f"MXFP4 blocks are [..., groups, {mxfp4.GROUP // 2}] over scales [..., groups].")
    return mxfp4.dequantize(blocks, scales)


def load_pretrained(model_class: type, checkpoint_dir: str | os.PathLike,
                    given_settings: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """``(model, params)`` from a Hugging Face ``save_pretrained`` directory; see the module docstring."""
    model = model_from_config(model_class, checkpoint_dir, given_settings)
    return model, read_params(model, checkpoint_dir)


__all__ = ["CheckpointError", "NAMES", "Architecture", "checkpoint_names", "read_config", "model_from_config",
           "read_params", "load_pretrained"]
