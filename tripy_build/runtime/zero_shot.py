"""Zero-shot classification by an NLI model (a sequence classifier of entailment, neutral and contradiction:
roberta-large-mnli, MoritzLaurer's DeBERTa-v3 zero-shot models): how well each candidate label a caller names fits
a text, as transformers' zero-shot-classification pipeline answers; and of images by CLIP (``of_images``), as its
zero-shot-image-classification pipeline answers; numpy only.

Each text is paired with one hypothesis per candidate label (``hypothesis_template`` with the label in its ``{}``:
"This example is sports.") and the pairs run as a cross-encoder's do (``texts.run``). The entailment class is the
first whose name starts with "entail" (the last class where none does, as the pipeline falls back). Scores: a softmax
of the entailment logits over the candidates (they compete: one label fits); with ``multi_label`` (or a single
candidate) each candidate's softmax of its contradiction and entailment logits on its own (any number fit).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import CallError
from .classes import LOGITS, apply, labels_of

TEMPLATE = "This example is {}."  # the pipeline's default hypothesis
IMAGE_TEMPLATE = "This is a photo of {}."  # the zero-shot-image-classification pipeline's


def candidates(given: Any, template: Any) -> list[str]:
    """The candidate labels (a list of names, or one string of comma-separated names, as the pipeline takes them),
    checked with the hypothesis template they fill."""
    labels = [x.strip() for x in given.split(",") if x.strip()] if isinstance(given, str) else given
    if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(x, str) and x for x in labels):
        raise CallError(f"candidate_labels must be a non-empty list of label names (or one comma-separated string), "
                        f"got {given!r:.80}.")
    if not isinstance(template, str) or template.format(labels[0]) == template:
        raise CallError(f"hypothesis_template {template!r:.80} has no {{}} for the label to go in: give one such as "
                        f"{TEMPLATE!r}.")
    return list(labels)


def entailment(classes: Sequence[str]) -> int:
    """The index of the entailment class: the first whose name starts with "entail", else the last (the pipeline's)."""
    return next((i for i, c in enumerate(classes) if c.lower().startswith("entail")), -1)


def scored(logits: np.ndarray, labels: Sequence[str], entail: int, multi_label: bool) -> tuple[list[str], list[float]]:
    """One text's candidates by score, highest first, from their pairs' logits ``[candidates, classes]``."""
    x = apply(logits, "none")  # checked, as float32
    if multi_label or len(labels) == 1:
        scores = apply(x[:, [-1 if entail == 0 else 0, entail]], "softmax")[:, 1]
    else:
        scores = apply(x[:, entail], "softmax")
    order = list(reversed(scores.argsort()))
    return [labels[i] for i in order], [float(scores[i]) for i in order]


def of_texts(model: Any, texts: Any, candidate_labels: Any, hypothesis_template: str,
             multi_label: bool) -> list[dict[str, Any]]:
    """Each text's candidate labels by score (``MultiEntry.zero_shot``): ``{"sequence", "labels", "scores"}``."""
    from .texts import run

    classes = labels_of(model, 2, "zero-shot classification needs an NLI model (a *ForSequenceClassification "
                                  "checkpoint of entailment, neutral and contradiction: logits [batch, num_labels]")
    if len(classes) < 2:
        raise CallError(f"{model.model_name}: zero-shot classification needs an NLI model's classes (entailment and "
                        f"contradiction at least), and this model has {len(classes)}: {classes}.")
    if not isinstance(multi_label, bool):
        raise CallError(f"multi_label must be true or false, got {multi_label!r:.40}.")
    labels = candidates(candidate_labels, hypothesis_template)
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise CallError(f"{model.model_name}: texts must be a text or a non-empty list of texts (strings), got "
                        f"{texts!r:.80}.")
    pairs, named = hypotheses(texts, labels, hypothesis_template)
    _, _, rows = run(model, pairs, LOGITS, pairs=True, named=named)
    return answers(texts, rows, labels, entailment(classes), multi_label)


def hypotheses(texts: Sequence[str], labels: Sequence[str],
               template: str) -> tuple[list[tuple[str, str]], Callable[[int], str]]:
    """Each text paired with each label's hypothesis, text by text; and how an error names the pair at an index."""
    pairs = [(t, template.format(label)) for t in texts for label in labels]
    return pairs, lambda i: f"text {i // len(labels)} with the hypothesis {pairs[i][1]!r}"


def answers(texts: Sequence[str], rows: Sequence[np.ndarray], labels: Sequence[str], entail: int,
            multi_label: bool) -> list[dict[str, Any]]:
    """Each text's ``{"sequence", "labels", "scores"}`` from its pairs' rows of logits (``hypotheses``' order)."""
    n, out = len(labels), []
    for i, text in enumerate(texts):
        ranked, scores = scored(np.stack(rows[i * n:(i + 1) * n]), labels, entail, multi_label)
        out.append({"sequence": text, "labels": ranked, "scores": scores})
    return out


def of_images(model: Any, images: Any, candidate_labels: Any, hypothesis_template: str) -> list[list[dict[str, Any]]]:
    """Each image's candidate labels by score, highest first, ``[{"score", "label"}, ...]``, by a CLIP or SigLIP model
    (``model=clip``, ``model=siglip``, its tokenizer stored): each label put in ``hypothesis_template``, the texts
    tokenized and padded as the pipeline pads them (to the longest; SigLIP's to its fixed width), each image's
    ``logits_per_image`` scored as the build recorded (``metadata.scores``: CLIP's softmax over the labels, SigLIP's
    sigmoid of each) (``MultiEntry.zero_shot_image``). Labels past the build's ``texts`` and images past its ``batch``
    run in more calls: an image's logit for a label depends on that image and that text alone."""
    from .texts import padded_calls

    if not {"input_ids", "pixel_values"} <= set(model.input_infos) or "logits_per_image" not in model.output_names:
        raise CallError(f"{model.model_name}: zero-shot image classification needs a CLIP or SigLIP model (model=clip, "
                        f"model=siglip: texts and images in, logits_per_image out); this model's outputs are "
                        f"{', '.join(model.output_names)}.")
    labels = candidates(candidate_labels, hypothesis_template)
    pixels = np.asarray(images)
    pixels = pixels[None] if pixels.ndim == 3 else pixels
    expected = model.input_infos["pixel_values"].shape_bounds.max[1:]
    if pixels.ndim != 4 or pixels.dtype.kind != "f" or tuple(pixels.shape[1:]) != tuple(expected) or not len(pixels):
        raise CallError(f"{model.model_name}: images must be pixel values, floats [images, {', '.join(map(str, expected))}] "
                        f"(or one image [{', '.join(map(str, expected))}]) as the model's image processor makes them, "
                        f"got {pixels.dtype} {list(pixels.shape)}.")
    texts = [hypothesis_template.format(label) for label in labels]
    bounds = model.input_infos["input_ids"].shape_bounds
    calls = padded_calls(model.tokenizer, [model.tokenizer.encode(t) for t in texts], None, bounds,
                         lambda i: f"{model.model_name}: the label {labels[i]!r} in its template ({texts[i]!r})",
                         "the model", "use shorter labels or template")
    takes, most = set(model.input_infos), model.input_infos["pixel_values"].shape_bounds.max[0]
    inputs = [{k: v for k, v in call.items() if k in takes} for call in calls]

    def logits_of(images: np.ndarray) -> np.ndarray:  # [images, labels]: the labels' calls side by side
        return np.concatenate([np.asarray(model(**t, pixel_values=images)["logits_per_image"]) for t in inputs], axis=1)
    logits = np.concatenate([logits_of(pixels[at:at + most].astype(np.float32)) for at in range(0, len(pixels), most)])
    probs = apply(logits, model.scores.get("logits_per_image") or "softmax")
    return [[{"score": float(row[i]), "label": labels[i]} for i in np.argsort(-row, kind="stable")] for row in probs]
