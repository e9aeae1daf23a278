"""What a request asks of each output, and the output in that form, for HTTP and gRPC alike: the tensor itself, its
top classes (Triton's classification extension: ``"parameters": {"classification": k}``), a classifier's scored
classes (``CLASSES``: transformers' text-classification pipeline's answer; ``runtime/classes.py``) or a token
classifier's entities (``ENTITIES``: its token-classification pipeline's; ``runtime/entities.py``). Those two are
BYTES outputs ``[n]`` of one JSON list per row, as MLServer answers a pipeline's objects, asked for by name.
Two derived outputs change what a request's texts run as, so they are read before its texts are tokenized
(``stride_asked``, ``hypotheses_asked``) and a request asking for one is answered with it alone: ``ENTITIES`` with a
``stride`` runs each text in windows (``runtime/entities.py``); ``ZERO_SHOT`` (an NLI model's zero-shot
classification, ``runtime/zero_shot.py``) runs each text with one hypothesis per candidate label, and answers each
text's labels by score as its zero-shot-classification pipeline does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import CallError
from ..runtime import classes, zero_shot
from ..runtime.entities import LOGITS, STRATEGIES, Grouping, check_windowed, find, in_windows
from .codec import quote as _quote

ENTITIES = "entities"  # a token classifier's entities, asked for as an output of a request that sends texts
CLASSES = "classes"  # a sequence or image classifier's classes with their scores, each row's
_GROUPING = ("aggregation_strategy", "ignore_labels")  # ENTITIES' parameters (Grouping's fields)
STRIDE = "stride"  # and ENTITIES' windows over long texts: read before the texts are tokenized (``stride_asked``)
_SCORING = ("top_k", "function_to_apply")  # CLASSES' parameters
ZERO_SHOT = "zero_shot"  # an NLI model's candidate labels scored for each text
_HYPOTHESES = ("candidate_labels", "hypothesis_template", "multi_label")  # ZERO_SHOT's parameters (Hypotheses')


class Hypotheses(NamedTuple):
    """What a request's ``ZERO_SHOT`` output asks: the labels, the hypothesis each goes in, whether each is scored
    on its own."""

    labels: list[str]
    template: str
    multi_label: bool


@dataclass(frozen=True)
class Wanted:
    """One output a request asks for, and in which form."""

    name: str  # one of the model's outputs, or ENTITIES
    binary: bool = False  # HTTP: sent as binary data after the JSON (gRPC's are always raw)
    top: int = 0  # the top classes as "score:index:label" strings; 0: the tensor itself
    grouping: Grouping | None = None  # ENTITIES: how each text's tokens become entities
    scoring: tuple[int, str] | None = None  # CLASSES: how many classes, and the function that scores the logits
    zero_shot: bool = False  # ZERO_SHOT: each text's candidate labels by score (the request's Texts.hypotheses)


def entities_info() -> dict[str, Any]:
    """The ``entities`` output as the model's metadata describes it."""
    return {"name": ENTITIES, "datatype": "BYTES", "shape": [-1], "from": LOGITS, "needs": "text",
            "parameters": {"aggregation_strategy": {"default": Grouping.aggregation_strategy, "one_of": list(STRATEGIES)},
                           "ignore_labels": {"default": list(Grouping.ignore_labels)}, STRIDE: {"default": None}}}


def stride_asked(ep: Any, asked: Iterable[tuple[Any, Any]]) -> int | None:
    """The ``stride`` a request to ``ep`` asks of its ``ENTITIES`` output (``asked``: each requested output's name and
    parameters), or None: its texts then run one row each. Checked where it acts (``Tokenizer.windows``)."""
    if not ep.finds_entities:
        return None
    for name, params in asked:
        if name == ENTITIES and isinstance(params, Mapping) and params.get(STRIDE) is not None:
            return params[STRIDE]
    return None


def hypotheses_asked(ep: Any, asked: Iterable[tuple[Any, Any]]) -> Hypotheses | None:
    """What a request to ``ep`` asks of its ``ZERO_SHOT`` output (``asked``: each requested output's name and
    parameters), checked: the candidate labels (a list, or one comma-separated string), the template, multi_label;
    None where it does not ask for it."""
    if not ep.zero_shots:
        return None
    for name, params in asked:
        if name == ZERO_SHOT:
            params = params if isinstance(params, Mapping) else {}
            if "candidate_labels" not in params:
                raise CallError(f"output {ZERO_SHOT!r} scores candidate labels: give them as its parameter "
                                '"candidate_labels" (a list of names, or one comma-separated string).')
            template, multi = params.get("hypothesis_template", zero_shot.TEMPLATE), params.get("multi_label", False)
            try:
                labels = zero_shot.candidates(params["candidate_labels"], template)
            except CallError as e:
                raise CallError(f"output {ZERO_SHOT!r}: {e}") from None
            if not isinstance(multi, bool):
                raise CallError(f"output {ZERO_SHOT!r}: multi_label must be true or false, got {_quote(multi)}.")
            return Hypotheses(labels, template, multi)
    return None


def zero_shot_info() -> dict[str, Any]:
    """The ``zero_shot`` output as the model's metadata describes it."""
    return {"name": ZERO_SHOT, "datatype": "BYTES", "shape": [-1], "from": LOGITS, "needs": "text",
            "parameters": {"candidate_labels": {"required": True}, "hypothesis_template": {"default": zero_shot.TEMPLATE},
                           "multi_label": {"default": False}}}


def classes_info(function: str) -> dict[str, Any]:
    """The ``classes`` output as the model's metadata describes it (``function``: the build's scores' function)."""
    return {"name": CLASSES, "datatype": "BYTES", "shape": [-1], "from": LOGITS,
            "parameters": {"top_k": {"default": 1}, "function_to_apply": {"default": function,
                                                                          "one_of": list(classes.FUNCTIONS)}}}


def wanted(ep: Any, name: str, params: Mapping[str, Any], binary: bool, texts: Any) -> Wanted:
    """One requested output checked: ``name`` one of ``ep``'s outputs (or ``CLASSES`` of a sequence or image
    classifier, or ``ENTITIES`` of a token classifier where the request sent texts), ``params`` its parameters
    (``classification``; ``top_k`` and ``function_to_apply`` for ``CLASSES``; ``aggregation_strategy``,
    ``ignore_labels`` and ``stride`` for ``ENTITIES``), ``binary`` how HTTP sends it."""
    for key in params:
        if key.startswith("shared_memory"):
            raise CallError(f"output {name!r}: parameter {key!r} (Triton's shared memory extension) is not served "
                            "here; ask for the tensor itself.")
    if texts is not None and texts.stride is not None and name != ENTITIES:
        raise CallError(f"output {_quote(name)}: a request whose {ENTITIES!r} run in windows ({STRIDE} "
                        f"{texts.stride}) is answered with {ENTITIES!r} alone: ask for {_quote(name)} in a request "
                        "of its own.")
    if texts is not None and texts.hypotheses is not None and name != ZERO_SHOT:
        raise CallError(f"output {_quote(name)}: a request for {ZERO_SHOT!r} runs each text with every candidate "
                        f"label's hypothesis and is answered with {ZERO_SHOT!r} alone: ask for {_quote(name)} in a "
                        "request of its own.")
    if name == ZERO_SHOT and ep.zero_shots and ZERO_SHOT not in ep.output_names:
        if texts is None:
            raise CallError(f"output {ZERO_SHOT!r} scores texts: send the texts as the BYTES input 'text' instead of "
                            "token ids.")
        if "classification" in params:
            raise CallError(f"output {ZERO_SHOT!r} is scored labels already: remove its \"classification\" parameter.")
        return Wanted(name, binary, zero_shot=True)
    if name == ENTITIES and ep.finds_entities and ENTITIES not in ep.output_names:
        if texts is None:
            raise CallError(f"output {ENTITIES!r} is found in texts: send the texts as the BYTES input 'text' "
                            "instead of token ids.")
        given = {k: params[k] for k in _GROUPING if k in params}
        if isinstance(given.get("ignore_labels"), str):  # gRPC's parameters are scalars: a comma-separated list
            given["ignore_labels"] = [x.strip() for x in given["ignore_labels"].split(",") if x.strip()]
        if "classification" in params:
            raise CallError(f"output {ENTITIES!r} gives entities, not classes: remove its \"classification\" parameter.")
        try:
            grouping = Grouping(**given)
        except CallError as e:
            raise CallError(f"output {ENTITIES!r}: {e}") from None
        if texts.stride is not None:
            try:
                check_windowed(grouping)
            except CallError as e:
                raise CallError(f"output {ENTITIES!r}: {e}") from None
        return Wanted(name, binary, grouping=grouping)
    if name == CLASSES and ep.scores_classes and CLASSES not in ep.output_names:
        if "classification" in params:
            raise CallError(f"output {CLASSES!r} is scored classes already: ask for its top_k, not \"classification\".")
        top_k, function = params.get("top_k", 1), params.get("function_to_apply")
        try:
            classes.check(top_k, function, len(ep.labels[LOGITS]))
        except CallError as e:
            raise CallError(f"output {CLASSES!r}: {e}") from None
        return Wanted(name, binary, scoring=(top_k, function or ep.scores_classes))
    if name not in ep.output_names:
        also = ", ".join(f"{n!r}{w}" for n, w, on in ((CLASSES, "", ep.scores_classes),
                                                       (ENTITIES, " with texts", ep.finds_entities),
                                                       (ZERO_SHOT, " with texts", ep.zero_shots)) if on)
        raise CallError(f"output {_quote(name)}: {ep.name} has no such output; it has {', '.join(ep.output_names)}"
                        f"{f' (and {also})' if also else ''}.")
    for keys, output, what, on in (((*_GROUPING, STRIDE), ENTITIES, "groups entities", ep.finds_entities),
                                   (_SCORING, CLASSES, "scores classes", ep.scores_classes),
                                   (_HYPOTHESES, ZERO_SHOT, "scores candidate labels", ep.zero_shots)):
        stray = [k for k in keys if k in params]
        if stray:
            which = "" if on else f" ({ep.name}'s outputs do not include it)"
            raise CallError(f"output {name!r}: parameter {stray[0]!r} {what}, which output {output!r} gives{which}.")
    top = 0
    if "classification" in params:
        info = ep.outputs[ep.output_names.index(name)]
        top = classification_count(params["classification"], name, info.shape_bounds.max[-1])
    return Wanted(name, binary, top)


def answer(ep: Any, w: Wanted, outs: Sequence[Sequence[np.ndarray]], texts: Any) -> np.ndarray:
    """The output ``w`` from the model's outputs ``outs`` (each call's: one, but for texts run as windows or with
    hypotheses): the tensor itself, or BYTES as an object array of strings (its top classes; ``CLASSES``, ``ENTITIES``
    and ``ZERO_SHOT``: each row's, or each text's, as JSON, ``[n]``)."""
    if w.grouping is not None or w.scoring is not None or w.zero_shot:
        at, labels = ep.output_names.index(LOGITS), ep.labels[LOGITS]
        logits = [row for call in outs for row in call[at]]
        if w.zero_shot:
            h = texts.hypotheses
            rows = zero_shot.answers(texts.texts, logits, h.labels, zero_shot.entailment(labels), h.multi_label)
        elif w.grouping is None:
            rows = [classes.top(row, labels, *w.scoring) for row in logits]
        elif texts.stride is None:
            rows = [find(ep.tokenizer, t, s, row, labels, w.grouping) for t, s, row in zip(texts.texts, texts.spans, logits)]
        else:
            windows = iter(logits)
            rows = [in_windows(ep.tokenizer, t, ws, [next(windows) for _ in ws], labels, w.grouping)
                    for t, ws in zip(texts.texts, texts.spans)]
        return np.asarray([json.dumps(row, ensure_ascii=False) for row in rows], dtype=object)
    (call,) = outs  # a request whose rows are windows asks for ENTITIES alone (``wanted``)
    out = np.ascontiguousarray(call[ep.output_names.index(w.name)])
    return classify(out, w.top, ep.labels.get(w.name)) if w.top else out


def prefixed(strings: np.ndarray) -> bytes:
    """A BYTES tensor's binary form (Triton's: each element its 4-byte little-endian length, then its UTF-8)."""
    return b"".join(len(b).to_bytes(4, "little") + b for b in (str(t).encode() for t in strings.ravel()))


def classification_count(value: Any, name: str, classes: int) -> int:
    """Triton's classification extension: an output's ``classification`` parameter, the top-k classes to answer
    with, checked (an integer from 1 to the output's last dim)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= classes:
        raise CallError(f"output {name!r}: parameter \"classification\" is the number of top classes to return, "
                        f"an integer in [1, {classes}], got {_quote(value)}.")
    return value


def classify(out: np.ndarray, k: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: the top ``k`` classes along the last axis as ``"score:index:label"``
    strings (``"score:index"`` without labels), highest first: an output ``[..., classes]`` -> ``[..., k]``."""
    top = np.argsort(-out, axis=-1, kind="stable")[..., :k]
    scores = np.take_along_axis(out, top, axis=-1)
    text = [f"{float(v):g}:{int(i)}" + (f":{labels[int(i)]}" if labels else "")
            for v, i in zip(scores.ravel(), top.ravel())]
    return np.asarray(text, dtype=object).reshape(top.shape)
