"""What a request asks of each output, and the output in that form, for HTTP and gRPC alike: the tensor itself, its
top classes (Triton's classification extension: ``"parameters": {"classification": k}``), or a token classifier's
entities (``ENTITIES``: a BYTES output, one JSON list per text, the answer of transformers' token-classification
pipeline; ``runtime/entities.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import CallError
from ..runtime.entities import LOGITS, STRATEGIES, Grouping, find
from .codec import quote as _quote

ENTITIES = "entities"  # a token classifier's entities, asked for as an output of a request that sends texts
_GROUPING = ("aggregation_strategy", "ignore_labels")  # ENTITIES' parameters (Grouping's fields)


@dataclass(frozen=True)
class Wanted:
    """One output a request asks for, and in which form."""

    name: str  # one of the model's outputs, or ENTITIES
    binary: bool = False  # HTTP: sent as binary data after the JSON (gRPC's are always raw)
    top: int = 0  # the top classes as "score:index:label" strings; 0: the tensor itself
    grouping: Grouping | None = None  # ENTITIES: how each text's tokens become entities


def entities_info() -> dict[str, Any]:
    """The ``entities`` output as the model's metadata describes it."""
    return {"name": ENTITIES, "datatype": "BYTES", "shape": [-1], "from": LOGITS, "needs": "text",
            "parameters": {"aggregation_strategy": {"default": Grouping.aggregation_strategy, "one_of": list(STRATEGIES)},
                           "ignore_labels": {"default": list(Grouping.ignore_labels)}}}


def wanted(ep: Any, name: str, params: Mapping[str, Any], binary: bool, texts: Any) -> Wanted:
    """One requested output checked: ``name`` one of ``ep``'s outputs (or ``ENTITIES``, where it finds them and the
    request sent texts), ``params`` its parameters (``classification``; ``aggregation_strategy`` and
    ``ignore_labels`` for ``ENTITIES``), ``binary`` how HTTP sends it."""
    for key in params:
        if key.startswith("shared_memory"):
            raise CallError(f"output {name!r}: parameter {key!r} (Triton's shared memory extension) is not served "
                            "here; ask for the tensor itself.")
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
            return Wanted(name, binary, grouping=Grouping(**given))
        except CallError as e:
            raise CallError(f"output {ENTITIES!r}: {e}") from None
    if name not in ep.output_names:
        also = f" (and {ENTITIES!r}, with texts)" if ep.finds_entities else ""
        raise CallError(f"output {_quote(name)}: {ep.name} has no such output; it has {', '.join(ep.output_names)}"
                        f"{also}.")
    stray = [k for k in _GROUPING if k in params]
    if stray:
        which = "" if ep.finds_entities else f" (a token classifier's, with texts: {ep.name} is not one)"
        raise CallError(f"output {name!r}: parameter {stray[0]!r} groups entities, which output {ENTITIES!r} "
                        f"gives{which}.")
    top = 0
    if "classification" in params:
        info = ep.outputs[ep.output_names.index(name)]
        top = classification_count(params["classification"], name, info.shape_bounds.max[-1])
    return Wanted(name, binary, top)


def answer(ep: Any, w: Wanted, outs: Sequence[np.ndarray], texts: Any) -> np.ndarray:
    """The output ``w`` from the model's outputs ``outs``: the tensor itself, or BYTES as an object array of
    strings (its top classes; ``ENTITIES``: each text's entities as a JSON list, ``[n]``)."""
    if w.grouping is not None:
        logits = outs[ep.output_names.index(LOGITS)]
        labels = ep.labels[LOGITS]
        return np.asarray([json.dumps(find(ep.tokenizer, t, s, row, labels, w.grouping), ensure_ascii=False)
                           for t, s, row in zip(texts.texts, texts.spans, logits)], dtype=object)
    out = np.ascontiguousarray(outs[ep.output_names.index(w.name)])
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
