"""A text model run over texts from Python (``entities()``, ``classify()`` on both loaders): the texts tokenized by
the tokenizer the artifact stores and run in calls of at most the build's batch, each call padded as transformers
pads a batch; a text longer than the build's ``seq`` refused naming both lengths, never cut."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CallError


def run(model: Any, texts: Any, output: str) -> tuple[list[str], list[Any], list[np.ndarray]]:
    """``texts`` (a list of strings) checked, their tokens (``Tokenizer.spans``) and each one's row of the model's
    output ``output`` (its padding included: the row runs to the longest text of its call)."""
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise CallError(f"{model.model_name}: texts must be a text or a non-empty list of texts (strings), got "
                        f"{texts!r:.80}.")
    tokenizer = model.tokenizer
    spans = [tokenizer.spans(t) for t in texts]
    bounds = model.input_infos["input_ids"].shape_bounds
    most, longest = bounds.max[0], bounds.max[1]
    for i, s in enumerate(spans):
        if len(s.ids) > longest:
            raise CallError(f"{model.model_name}: text {i} is {len(s.ids)} tokens, but the model takes at most {longest} "
                            "(the build's seq range): send shorter texts, or build with a longer shapes.dims.seq.")
    takes = set(model.input_infos)
    rows: list[np.ndarray] = []
    for start in range(0, len(texts), most):
        ids, mask = tokenizer.pad([s.ids for s in spans[start:start + most]])
        rows += list(np.asarray(model(**{k: v for k, v in (("input_ids", ids), ("attention_mask", mask))
                                         if k in takes})[output]))
    return list(texts), spans, rows


def one_or_many(call: Any, texts: Any) -> Any:
    """``call`` over a list of texts, or over one text alone, answered with its own result, as a pipeline does."""
    return call([texts])[0] if isinstance(texts, str) else call(texts)
