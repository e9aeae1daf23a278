"""A text model run over texts from Python (``entities()``, ``classify()`` on both loaders): the texts (or text
pairs: a cross-encoder's query and passage, an NLI model's premise and hypothesis) tokenized by the tokenizer the
artifact stores and run in calls of at most the build's batch, each call padded as transformers pads a batch; a text
longer than the build's ``seq`` refused naming both lengths, never cut, unless the caller asks for overlapping windows
of it (``run_windows``: a token classifier's ``stride``, as transformers' pipeline runs long texts)."""

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


LONGER = "send shorter texts, or build with a longer shapes.dims.seq"


def run(model: Any, texts: Any, output: str, pairs: bool = False, named: Callable[[int], str] = "text {}".format,
        fix: str = LONGER) -> tuple[list[str], list[Any], list[np.ndarray]]:
    """``texts`` (a list of texts, or where ``pairs`` of text pairs too) checked, their tokens (``Tokenizer.spans``)
    and each one's row of the model's output ``output`` (its padding included: the row runs to the longest text of
    its call). ``named``: how an error names the text at an index; ``fix``: what it says to do with a long one."""
    read = _read(model, texts, pairs)
    spans = [model.tokenizer.spans(t, p) for t, p in read]
    return [t for t, _ in read], spans, _rows(model, spans, output, named, fix)


def run_windows(model: Any, texts: Any, output: str, stride: int) -> tuple[list[str], list[list[Any]], list[list[Any]]]:
    """``run`` for texts of any length: each text's tokens in windows of at most the build's ``seq``, overlapping by
    ``stride`` tokens (``Tokenizer.windows``), every window a row of the calls; per text, its windows and their rows."""
    read = _read(model, texts, False)
    longest = model.input_infos["input_ids"].shape_bounds.max[1]
    windows = [model.tokenizer.windows(t, longest, stride) for t, _ in read]
    rows = iter(_rows(model, [w for ws in windows for w in ws], output, "window {}".format))
    return [t for t, _ in read], windows, [[next(rows) for _ in ws] for ws in windows]


def _read(model: Any, texts: Any, pairs: bool) -> list[tuple[str, str | None]]:
    read = [pair_of(t, pairs) for t in texts] if isinstance(texts, (list, tuple)) else []
    if not read or None in read:
        kinds = "texts (strings) or text pairs ((text, text_pair) or {'text', 'text_pair'})" if pairs else "texts (strings)"
        raise CallError(f"{model.model_name}: texts must be a text or a non-empty list of {kinds}, got {texts!r:.80}.")
    return read


def _rows(model: Any, spans: list[Any], output: str, named: Callable[[int], str], fix: str = LONGER) -> list[np.ndarray]:
    """Each of ``spans``' row of the model's output ``output``, run in padded calls of the build's batch."""
    calls = padded_calls(model.tokenizer, [s.ids for s in spans], [s.type_ids for s in spans],
                         model.input_infos["input_ids"].shape_bounds, lambda i: f"{model.model_name}: {named(i)}",
                         "the model", fix)
    takes = set(model.input_infos)
    rows: list[np.ndarray] = []
    for given in calls:
        rows += list(np.asarray(model(**{k: v for k, v in given.items() if k in takes})[output]))
    return rows


def padded_calls(tokenizer: Any, rows: list[list[int]], types: list[list[int]] | None, bounds: Any,
                 named: Callable[[int], str], who: str, fix: str = LONGER) -> list[dict[str, np.ndarray]]:
    """Token-id rows (and their token types, or None) as the inputs of calls of at most the batch dim's size
    (``bounds``: ``input_ids``' shape bounds), each padded by ``Tokenizer.pad`` to its longest row, or to the text
    width where the build fixes one (a static seq, SigLIP's 64: ``padding="max_length"``, as its processor pads); a row
    longer than the seq dim's largest size is refused, ``named(i)`` naming it, ``who`` the model that takes it and
    ``fix`` what to do."""
    most, longest = bounds.max[0], bounds.max[1]
    over = next((i for i, row in enumerate(rows) if len(row) > longest), None)
    if over is not None:
        raise CallError(f"{named(over)} is {len(rows[over])} tokens, but {who} takes at most {longest} (the build's seq "
                        f"range): {fix}.")
    fixed = longest if bounds.min[1] == longest else None
    return [tokenizer.pad(rows[start:start + most], None if types is None else types[start:start + most], fixed)
            for start in range(0, len(rows), most)]


def one_or_many(call: Any, texts: Any) -> Any:
    """``call`` over a list of texts, or over one text (or pair) alone, answered with its own result, as a pipeline
    does."""
    return call(texts) if isinstance(texts, list) else call([texts])[0]
