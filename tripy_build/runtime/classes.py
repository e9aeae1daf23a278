"""A classifier's classes with their scores: what transformers' text-classification (and image-classification)
pipeline answers, from an artifact's ``logits [batch, num_labels]`` and its class names (``id2label``); numpy only.

A row's logits become scores by ``function_to_apply``: ``softmax`` (one class of many), ``sigmoid`` (each class on
its own: a multi-label classifier, or a single class such as a cross-encoder's relevance) or ``none`` (a
regression's values as they are). Without it, the build's choice (``metadata.scores``, by the pipelines' rule from
``config.json``'s ``problem_type`` and ``num_labels``). The ``top_k`` highest come first, a tie in class order.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import CallError

FUNCTIONS = ("softmax", "sigmoid", "none")
LOGITS = "logits"  # the output whose classes are a row's: [batch, num_labels]


def default_function(num_labels: int) -> str:
    """The scores' function of an artifact that did not record one (built before ``metadata.scores``): the pipelines'
    rule without a ``problem_type``."""
    return "sigmoid" if num_labels == 1 else "softmax"


def labels_of(model: Any, rank: int, needs: str) -> list[str]:
    """The class names of the model's ``logits`` (``metadata.labels``) where that output has ``rank`` dims; a
    ``CallError`` saying what it ``needs`` where the model is no such classifier."""
    names = model.output_names
    labels = model.labels.get(LOGITS)
    if labels is None or LOGITS not in names or model.output_infos[names.index(LOGITS)].rank != rank:
        raise CallError(f"{model.model_name}: {needs} and their class names); this model's outputs are "
                        f"{', '.join(names)}.")
    return labels


def class_labels(model: Any) -> tuple[list[str], str]:
    """A classifier's class names and its scores' function; a ``CallError`` naming what the model is instead."""
    labels = labels_of(model, 2, "classes need a sequence or image classifier (a *ForSequenceClassification or "
                                 "*ForImageClassification checkpoint: logits [batch, num_labels]")
    return labels, model.scores.get(LOGITS) or default_function(len(labels))


def check(top_k: Any, function_to_apply: Any, classes: int) -> None:
    """``top_k`` an integer in [1, ``classes``], ``function_to_apply`` one of ``FUNCTIONS`` or None."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= classes:
        raise CallError(f"top_k is how many classes to answer with, an integer in [1, {classes}], got {top_k!r}.")
    if function_to_apply is not None and function_to_apply not in FUNCTIONS:
        raise CallError(f"function_to_apply {function_to_apply!r} is not one of {', '.join(FUNCTIONS)} (transformers' "
                        "text-classification pipeline's).")


def apply(logits: Any, function: str, whose: str = "the model's logits") -> np.ndarray:
    """``function`` (``FUNCTIONS``) of float32 logits along their last axis, what every pipeline here scores with;
    logits that hold NaN or infinity are refused (``whose`` names them), never scored."""
    x = np.asarray(logits, np.float32)
    if not np.isfinite(x).all():
        raise CallError(f"{whose} hold NaN or infinity: nothing can be scored from them (a bfloat16 or float16 build "
                        "overflowing? build it in float32).")
    if function == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return 1.0 / (1.0 + np.exp(-x)) if function == "sigmoid" else x


def top(logits: np.ndarray, labels: Sequence[str], k: int, function: str) -> list[dict[str, Any]]:
    """One row's ``k`` best classes, ``{"label", "score"}``, highest score first."""
    x = apply(logits, function)
    order = np.argsort(-x, kind="stable")[:k]
    return [{"label": labels[int(i)], "score": float(x[i])} for i in order]


def of_texts(model: Any, texts: Any, top_k: int, function_to_apply: str | None) -> list[list[dict[str, Any]]]:
    """Each text's classes (``MultiEntry.classify``): the texts run as ``texts.run`` runs them, each row scored."""
    from .texts import run

    labels, function = class_labels(model)
    check(top_k, function_to_apply, len(labels))
    texts, _, rows = run(model, texts, LOGITS, pairs=True)
    return [top(row, labels, top_k, function_to_apply or function) for row in rows]
