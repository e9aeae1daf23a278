"""A token classifier's entities in a text (named entities, parts of speech): what transformers' token-classification
pipeline (``pipeline("ner")``) answers, from an artifact's ``logits [batch, seq, num_labels]``, its class names
(``id2label``) and the tokenizer it stores; numpy only.

Each token's scores are the softmax of its logits; the tokens the tokenizer added (``[CLS]``, ``<s>``) are left out.
Then, by ``aggregation_strategy`` (transformers' names and rules):

- ``none``: every token: its most likely label (``entity``), that label's score, its position (``index``), its
  vocabulary string (``word``: ``##ing``, ``Ġfox``) and its characters;
- ``simple``: adjacent tokens of one tag joined into an entity: ``entity_group`` is the tag without its ``B-`` or
  ``I-`` (a ``B-`` starts a new entity), ``score`` the mean of the tokens', ``word`` their text;
- ``first``, ``average``, ``max``: the tokens of one word first made to agree (on its first token's label, on the
  label of its averaged scores, on its most confident token's label), then joined as ``simple`` joins them. A
  word's later pieces are known from a WordPiece vocabulary's ``##``; with other tokenizers (byte-level BPE) by
  transformers' rule of thumb: a token that starts right after a character other than a space continues a word.

Entities whose label is one of ``ignore_labels`` (``O``: outside any entity) are left out. ``start`` and ``end`` index
the text's characters: ``text[start:end]`` is what the entity covers.

A text longer than the build's ``seq`` is refused, unless a ``stride`` is given: then, as the pipeline's ``stride``
does, the text runs in windows of ``seq`` tokens, each repeating the last ``stride`` tokens of the one before; each
window's entities are found alone, and where two overlap the longer one stays (of two as long, the likelier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..errors import CallError
from .classes import LOGITS, apply, labels_of

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass(frozen=True)
class Grouping:
    """How a text's tokens become entities (transformers' pipeline arguments of the same names)."""

    aggregation_strategy: str = "simple"  # one of STRATEGIES (the pipeline's default is none; its hosted API's simple)
    ignore_labels: tuple[str, ...] = ("O",)  # labels whose tokens or entities are left out of the answer

    def __post_init__(self) -> None:
        if self.aggregation_strategy not in STRATEGIES:
            raise CallError(f"aggregation_strategy {self.aggregation_strategy!r} is not one of "
                            f"{', '.join(STRATEGIES)} (transformers' token-classification pipeline's).")
        ignore = self.ignore_labels
        if not isinstance(ignore, (list, tuple)) or not all(isinstance(x, str) for x in ignore):
            raise CallError(f"ignore_labels must be a list of class names (['O']), got {ignore!r}.")
        object.__setattr__(self, "ignore_labels", tuple(ignore))


class _Token(NamedTuple):
    word: str
    scores: np.ndarray
    start: int
    end: int
    index: int
    continues: bool  # a later piece of the word before it


def token_labels(model: Any) -> list[str]:
    """The class names of a token classifier's ``logits`` (``metadata.labels``); a ``CallError`` naming what the
    model is instead."""
    return labels_of(model, 3, "finding entities needs a token classifier (a *ForTokenClassification checkpoint: "
                               "per-token logits [batch, seq, num_labels]")


def find(tokenizer: Any, text: str, spans: Any, logits: np.ndarray, labels: Sequence[str],
         grouping: Grouping) -> list[dict[str, Any]]:
    """The entities of one text, from its ``spans`` (``Tokenizer.spans``) and its row of logits ``[seq, num_labels]``
    (the row may run past the text's tokens: padding, not read)."""
    scores = apply(logits[:len(spans.ids)], "softmax", f"the model's logits for the text {text[:40]!r}")
    tokens = _tokens(tokenizer, text, spans, scores)
    strategy = grouping.aggregation_strategy
    if strategy in ("none", "simple"):
        found = [{"entity": labels[int(t.scores.argmax())], "score": float(t.scores.max()), "index": t.index,
                  "word": t.word, "start": t.start, "end": t.end} for t in tokens]
    else:
        found = [_word(tokenizer, group, labels, strategy) for group in _words(tokens)]
    if strategy != "none":
        found = [_entity(tokenizer, run) for run in _runs(found)]
    return [e for e in found if e.get("entity", e.get("entity_group")) not in grouping.ignore_labels]


def _tokens(tokenizer: Any, text: str, spans: Any, scores: np.ndarray) -> list[_Token]:
    """The text's own tokens (the added ones left out), each with whether it continues a word."""
    marks, unk = tokenizer.marks_subwords, tokenizer.unk_token_id
    out = []
    for i, (token, word, (start, end), added) in enumerate(zip(spans.ids, spans.tokens, spans.offsets, spans.special)):
        if added:
            continue
        covered = text[start:end]
        continues = len(word) != len(covered) if marks else start > 0 and " " not in text[start - 1:start + 1]
        if token == unk:  # [UNK] stands for the text it covers, a word of its own
            word, continues = covered, False
        out.append(_Token(word, scores[i], start, end, i, continues))
    return out


def _words(tokens: list[_Token]) -> list[list[_Token]]:
    """Tokens in words: a token that continues a word joins the one before it."""
    words: list[list[_Token]] = []
    for t in tokens:
        if words and t.continues:
            words[-1].append(t)
        else:
            words.append([t])
    return words


def _word(tokenizer: Any, pieces: list[_Token], labels: Sequence[str], strategy: str) -> dict[str, Any]:
    """One word's label and score from its pieces' (``first``, ``max`` or ``average``)."""
    if strategy == "first":
        scores = pieces[0].scores
    elif strategy == "max":
        scores = max(pieces, key=lambda t: t.scores.max()).scores
    else:
        scores = np.nanmean(np.stack([t.scores for t in pieces]), axis=0)
    best = int(scores.argmax())
    return {"entity": labels[best], "score": float(scores[best]),
            "word": tokenizer.tokens_to_string([t.word for t in pieces]), "start": pieces[0].start, "end": pieces[-1].end}


def _tag(label: str) -> tuple[str, str]:
    """A label's (B or I, tag): ``B-PER`` -> (B, PER); a label without the prefix continues (I, label)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _runs(found: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Adjacent tokens (or words) of one tag, a ``B-`` starting a new run."""
    runs: list[list[dict[str, Any]]] = []
    for e in found:
        bi, tag = _tag(e["entity"])
        if runs and bi != "B" and _tag(runs[-1][-1]["entity"])[1] == tag:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


def _entity(tokenizer: Any, run: list[dict[str, Any]]) -> dict[str, Any]:
    """A run of tokens as one entity: its tag, their mean score, their text and characters."""
    return {"entity_group": run[0]["entity"].split("-", 1)[-1], "score": float(np.nanmean([e["score"] for e in run])),
            "word": tokenizer.tokens_to_string([e["word"] for e in run]), "start": run[0]["start"],
            "end": run[-1]["end"]}


def of_texts(model: Any, texts: Any, grouping: Grouping, stride: int | None = None) -> list[list[dict[str, Any]]]:
    """Each text's entities (``MultiEntry.entities``): the texts run as ``texts.run`` runs them, each row's logits
    grouped by ``find``; with a ``stride``, in windows (``texts.run_windows``), their entities joined by ``overlaid``."""
    from .texts import run, run_windows

    labels = token_labels(model)
    if stride is None:
        texts, spans, rows = run(model, texts, LOGITS, fix="send shorter texts, pass stride=N to find entities in "
                                                           "windows of it, or build with a longer shapes.dims.seq")
        return [find(model.tokenizer, t, s, row, labels, grouping) for t, s, row in zip(texts, spans, rows)]
    check_windowed(grouping)
    texts, windows, rows = run_windows(model, texts, LOGITS, stride)
    return [in_windows(model.tokenizer, t, ws, rs, labels, grouping) for t, ws, rs in zip(texts, windows, rows)]


def check_windowed(grouping: Grouping) -> None:
    """A ``CallError`` where ``grouping`` cannot join the entities of overlapping windows (``none`` groups nothing)."""
    if grouping.aggregation_strategy == "none":
        raise CallError("stride needs an aggregation_strategy that groups tokens (simple, first, average or max): "
                        "the windows' overlapping tokens are joined as entities, as transformers' pipeline joins them.")


def in_windows(tokenizer: Any, text: str, windows: Sequence[Any], rows: Sequence[np.ndarray], labels: Sequence[str],
               grouping: Grouping) -> list[dict[str, Any]]:
    """The entities of one text run in ``windows`` (``Tokenizer.windows``), from each window's row of logits: each
    window's found by ``find``, then joined by ``overlaid``."""
    return overlaid([e for s, row in zip(windows, rows) for e in find(tokenizer, text, s, row, labels, grouping)])


def overlaid(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entities of overlapping windows in order of their start, one kept of any that overlap: the longer, or of two
    as long, the likelier (the pipeline's ``aggregate_overlapping_entities``)."""
    kept: list[dict[str, Any]] = []
    for e in sorted(entities, key=lambda e: e["start"]):
        last = kept[-1] if kept else None
        if last is None or not last["start"] <= e["start"] < last["end"]:
            kept.append(e)
        elif (e["end"] - e["start"], e["score"]) > (last["end"] - last["start"], last["score"]):
            kept[-1] = e
    return kept
