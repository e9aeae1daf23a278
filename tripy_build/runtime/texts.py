"""A text model run over texts from Python (``entities()``, ``classify()`` on both loaders): the texts (or text
pairs: a cross-encoder's query and passage, an NLI model's premise and hypothesis) tokenized by the tokenizer the
artifact stores and run in calls of at most the build's batch, each call padded as transformers pads a batch; a text
longer than the build's ``seq`` refused naming both lengths, never cut."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import CallError


def pair_of(item: Any, pairs: bool) -> tuple[str, str | None] | None:
    """A text as ``(text, None)``, or where ``pairs`` a pair given as transformers' pipeline takes one
    (``{"text": ..., "text_pair": ...}``) or as sentence-transformers' cross-encoder does (``(text, pair)``);
    None for anything else."""
    if isinstance(item, str):
        return item, None
    if pairs and isinstance(item, dict) and set(item) == {"text", "text_pair"}:
        item = (item["text"], item["text_pair"])
    if pairs and isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, str) for t in item):
        return item[0], item[1]
    return None


def run(model: Any, texts: Any, output: str, pairs: bool = False,
        named: Callable[[int], str] = "text {}".format) -> tuple[list[str], list[Any], list[np.ndarray]]:
    """``texts`` (a list of texts, or where ``pairs`` of text pairs too) checked, their tokens (``Tokenizer.spans``)
    and each one's row of the model's output ``output`` (its padding included: the row runs to the longest text of
    its call). ``named``: how an error names the text at an index."""
    read = [pair_of(t, pairs) for t in texts] if isinstance(texts, (list, tuple)) else []
    if not read or None in read:
        kinds = "texts (strings) or text pairs ((text, text_pair) or {'text', 'text_pair'})" if pairs else "texts (strings)"
        raise CallError(f"{model.model_name}: texts must be a text or a non-empty list of {kinds}, got {texts!r:.80}.")
    tokenizer = model.tokenizer
    spans = [tokenizer.spans(t, p) for t, p in read]
    calls = padded_calls(tokenizer, [s.ids for s in spans], [s.type_ids for s in spans],
                         model.input_infos["input_ids"].shape_bounds, lambda i: f"{model.model_name}: {named(i)}",
                         "the model")
    takes = set(model.input_infos)
    rows: list[np.ndarray] = []
    for given in calls:
        rows += list(np.asarray(model(**{k: v for k, v in given.items() if k in takes})[output]))
    return [t for t, _ in read], spans, rows


def padded_calls(tokenizer: Any, rows: list[list[int]], types: list[list[int]] | None, bounds: Any,
                 named: Callable[[int], str], who: str) -> list[dict[str, np.ndarray]]:
    """Token-id rows (and their token types, or None) as the inputs of calls of at most the batch dim's size
    (``bounds``: ``input_ids``' shape bounds), each padded by ``Tokenizer.pad``; a row longer than the seq dim's
    largest size is refused, ``named(i)`` naming it and ``who`` the model that takes it."""
    most, longest = bounds.max[0], bounds.max[1]
    over = next((i for i, row in enumerate(rows) if len(row) > longest), None)
    if over is not None:
        raise CallError(f"{named(over)} is {len(rows[over])} tokens, but {who} takes at most {longest} (the build's seq "
                        "range): send shorter texts, or build with a longer shapes.dims.seq.")
    return [tokenizer.pad(rows[start:start + most], None if types is None else types[start:start + most])
            for start in range(0, len(rows), most)]


def one_or_many(call: Any, texts: Any) -> Any:
    """``call`` over a list of texts, or over one text (or pair) alone, answered with its own result, as a pipeline
    does."""
    return call(texts) if isinstance(texts, list) else call([texts])[0]
