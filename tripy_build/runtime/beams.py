"""Beam search over a generating artifact (``num_beams`` above 1: BART's summarizers, Marian's translators; a decoder
built with ``generate.beams``), numpy only, as transformers' ``generate`` runs it.

Each source (a decoder's prompt) is decoded as ``num_beams`` rows of one batch (``seq2seq.Session``, the source
encoded once per row; a decoder's ``generate.Session``, the prompt prefilled into each row).
At each step every row's log probabilities, as the checkpoint's processors leave them (``seq2seq.forced``), are
added to its beam's score, and of all continuations of a source's beams the best ``2 * num_beams`` are kept
(more where there are several end ids, so that ``num_beams`` of them do not end). Those among the first
``num_beams`` that end (an end id, or the last of ``max_new_tokens``) become candidate answers, scored by their
sum over their length to the ``length_penalty``, and the best ``num_beams`` candidates are kept; the best
``num_beams`` that do not end run on, the decoder's cache rows reordered to them on the device (the artifact's
``reorder`` entry, a gather where the cache lives: nothing is copied to the host). A source's search ends as
``early_stopping`` says: ``True``, once it holds ``num_beams`` candidates; ``False``, once no running beam could
beat its worst candidate at the current length (``"never"``: at the longest length, where the penalty favours
length). The answer is its best candidate.

This is transformers 5's ``_beam_search`` (vectorized over sources and beams; its ``-1e9`` marks and float32
scores), so that a reply is theirs wherever the logits agree: tested against ``generate(num_beams=4)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import CallError

EARLY_STOPPING = (True, False, "never")
NO = np.float32(-1e9)  # transformers' mark of a beam or candidate that must not be picked


@dataclass(frozen=True)
class Beams:
    """How many beams a source is searched with and how its answers are scored; one beam: no search (the tokens
    are picked by ``sampling.Options``)."""

    num_beams: int = 1
    length_penalty: float = 1.0  # a candidate's score: its log probability over its length to this power
    early_stopping: bool | str = False  # True: stop at num_beams candidates; False: a heuristic; "never": the longest

    def __post_init__(self) -> None:
        n = self.num_beams
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise CallError(f"num_beams={n!r}: it is a positive integer (1: no beam search).")
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, (int, float, np.number)) or not math.isfinite(lp):
            raise CallError(f"length_penalty={lp!r}: it is a number (1: a candidate's mean log probability; above 1 "
                            "favours longer answers, below 1 shorter).")
        if not any(self.early_stopping is e or self.early_stopping == e and isinstance(e, str) for e in EARLY_STOPPING):
            raise CallError(f"early_stopping={self.early_stopping!r}: it is true, false or \"never\".")
        object.__setattr__(self, "num_beams", int(n))
        object.__setattr__(self, "length_penalty", float(lp))

    @classmethod
    def of(cls, defaults: dict[str, Any] | None = None, **given: Any) -> "Beams":
        """A call's beams: those it gives (None: not given) over the artifact's ``defaults``."""
        return cls(**{**(defaults or {}), **{k: v for k, v in given.items() if v is not None}})

    def recorded(self) -> dict[str, Any]:
        """As an artifact records its defaults: nothing for one beam."""
        return asdict(self) if self.num_beams > 1 else {}


def chosen(spec: Any, batches: Sequence[int], options: Any, constraints: Any, num_beams: int | None = None,
           length_penalty: float | None = None, early_stopping: bool | str | None = None) -> Beams | None:
    """The beam search a call runs (None: none, its tokens picked by ``options``): the ``num_beams`` it gives, else
    the artifact's (``Spec.beams``, its checkpoint's) where the call picks tokens by score; a call that samples,
    penalizes or follows a grammar without giving ``num_beams`` runs one beam. Checked (``check``)."""
    beams = Beams.of(spec.beams, num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    if beams.num_beams == 1 or num_beams is None and not _by_score(options, constraints):
        return None
    check(spec, beams, batches, options, constraints)
    return beams


def _by_score(options: Any, constraints: Any) -> bool:
    return not (options.temperature or options.needs_history() or constraints is not None)


def check(spec: Any, beams: Beams, batches: Sequence[int], options: Any, constraints: Any) -> None:
    """``beams`` can run on this artifact with these options: built with the ``reorder`` entry (every
    encoder-decoder's; a decoder's where ``generate.beams`` asked for beams), with a batch bucket of ``num_beams``
    rows, tokens picked by score (no sampling, penalties or grammar)."""
    n = beams.num_beams
    if spec.reorder is None and spec.kind != "seq2seq":
        raise CallError(f"num_beams={n}: this decoder's artifact was built without beam search (its reorder entry); "
                        f"build it with generate.beams={{num_beams: {n}}}, or pass num_beams=1.")
    if spec.reorder is None:
        raise CallError(f"num_beams={n}: this artifact was built before beam search (it has no reorder entry); "
                        "rebuild it with this tripy_build, or pass num_beams=1.")
    if n > batches[-1]:
        raise CallError(f"num_beams={n}: a source's beams are rows of one batch, and this artifact's largest batch is "
                        f"{batches[-1]} rows; pass num_beams<={batches[-1]}, or build with shapes.dims.batch up to "
                        f"{n} or more.")
    if not _by_score(options, constraints):
        raise CallError(f"num_beams={n}: beam search keeps the most likely continuations; it does not sample, "
                        f"penalize or follow a grammar ({options.described()}"
                        f"{', json_schema' if constraints is not None else ''} asked): pass num_beams=1 for those.")


def searched(steps: Any, spec: Any, session_cls: Any, sources: list[np.ndarray], max_new_tokens: int, beams: Beams,
             eos_token_id: Any, pad_token_id: int | None, process: Any = None) -> np.ndarray:
    """Each source's (or prompt's) best answer by beam search (``beams``: checked, ``chosen``), int32 ``[batch, n]``
    (``n``: the longest answer; the shorter filled as ``Spec.fill`` says), in groups of as many sources as the
    largest batch holds ``num_beams`` rows of, each group a ``session_cls`` (``seq2seq.Session``, or a decoder's
    ``generate.Session``); ``process``: as ``search`` takes it."""
    batches = sorted({p["batch"] for p in steps.profiles(spec.decode)})
    eos = spec.stops(eos_token_id)
    pad = spec.fill(pad_token_id, eos)
    per = batches[-1] // beams.num_beams
    answers: list[np.ndarray] = []
    for start in range(0, len(sources), per):
        rows = [s for s in sources[start:start + per] for _ in range(beams.num_beams)]
        session = session_cls(steps, spec, session_cls.batch_for(steps, spec, rows))
        answers += search(session, sources[start:start + per], max_new_tokens, beams, eos, process)
        session.close()
    n = max(len(a) for a in answers)
    return np.stack([np.pad(a, (0, n - len(a)), constant_values=pad if pad is not None else 0) for a in answers])


def search(session: Any, sources: Sequence[np.ndarray], max_new_tokens: int, beams: Beams, eos: tuple[int, ...],
           process: Any = None) -> list[np.ndarray]:
    """Each source's best answer (its new tokens, the end id included where it ended), searched in ``session``
    (empty, of at least ``len(sources) * num_beams`` rows: ``seq2seq.Session``, or a decoder's ``generate.Session``,
    its prompts the sources); ``process(spec, log_probs, step, max_new_tokens, replies, eos)``: the checkpoint's
    processors (an encoder-decoder's ``seq2seq.forced``; None: none)."""
    spec, k, n = session.spec, beams.num_beams, len(sources)
    at, logits = session.admit_all([s for s in sources for _ in range(k)])  # the row of each beam
    at = np.asarray(at)
    vocab = logits.shape[-1]
    keep = max(2, 1 + len(eos)) * k
    lp, early = beams.length_penalty, beams.early_stopping
    running = np.zeros((n, k, max_new_tokens), np.int32)  # each running beam's tokens so far
    running_scores = np.zeros((n, k), np.float32)
    running_scores[:, 1:] = NO  # the beams of a source start alike: only the first is continued
    answers = np.zeros((n, k, max_new_tokens), np.int32)  # the candidates, best first, their scores and lengths
    scores = np.full((n, k), NO, np.float32)
    lengths = np.zeros((n, k), np.int32)
    ended = np.zeros((n, k), bool)  # which of the candidate places hold one
    improvable = np.ones((n, 1), bool)  # whether a running beam could still beat a source's candidates
    first = np.arange(keep) < k
    for step in range(max_new_tokens):
        logp = _log_softmax(logits)
        if process is not None:
            logp = process(spec, logp, step, max_new_tokens, running.reshape(n * k, -1)[:, :step].tolist(), eos)
        total = (logp.reshape(n, k, vocab) + running_scores[:, :, None]).reshape(n, k * vocab)
        best = _top(total, keep)
        top = np.take_along_axis(total, best, 1)
        parent, token = best // vocab, (best % vocab).astype(np.int32)
        continued = np.take_along_axis(running, parent[:, :, None], 1)
        continued[:, :, step] = token
        ends = np.isin(token, eos) | (step + 1 == max_new_tokens)
        live = top + ends * NO
        on = _top(live, k)
        running = np.take_along_axis(continued, on[:, :, None], 1)
        running_scores = np.take_along_axis(live, on, 1)
        rows = np.take_along_axis(parent, on, 1) + np.arange(n)[:, None] * k
        # the candidates: those of the first k that end, scored over their length, while the source can take them
        done = ends & first
        final = top / np.float32((step + 1) ** lp)
        final = final + (ended.all(-1, keepdims=True) & (early is True)) * NO + ~improvable * NO + ~done * NO
        merged = np.concatenate([scores, final], 1)
        pick = _top(merged, k)
        answers = np.take_along_axis(np.concatenate([answers, continued], 1), pick[:, :, None], 1)
        scores = np.take_along_axis(merged, pick, 1)
        lengths = np.take_along_axis(np.concatenate([lengths, np.full((n, keep), step + 1, np.int32)], 1), pick, 1)
        ended = np.take_along_axis(np.concatenate([ended, done], 1), pick, 1)
        longest = max_new_tokens if early == "never" and lp > 0 else step + 1
        possible = running_scores[:, :1] / np.float32(longest ** lp)
        worst = np.where(ended, scores.min(1, keepdims=True), NO)
        improvable &= (possible > worst).any(-1, keepdims=True)
        if not improvable.any() or (ended.all() and early is True) or ends.all():
            break
        session.reorder(dict(zip(at.tolist(), at[rows.reshape(-1)].tolist())))
        logits = session.step(dict(zip(at.tolist(), running[:, :, step].reshape(-1).tolist())))[at]
    return [answers[i, 0, :lengths[i, 0]] for i in range(n)]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's ``k`` largest values, largest first (equal values: the lower index first)."""
    part = np.argpartition(-x, k - 1, axis=1)[:, :k] if k < x.shape[1] else np.broadcast_to(np.arange(x.shape[1]),
                                                                                            x.shape)
    order = np.lexsort((part, -np.take_along_axis(x, part, 1)), axis=1)
    return np.take_along_axis(part, order, 1)
