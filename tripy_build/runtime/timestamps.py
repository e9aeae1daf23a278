"""Whisper's timestamps, numpy only: the rule its reply's timestamp tokens follow, and the segments they cut a
window's reply into, as transformers' ``WhisperTimeStampLogitsProcessor`` and ``_retrieve_segment`` have them.

Whisper's vocabulary ends in timestamp tokens, ``<|0.00|>``, ``<|0.02|>``, ... ``<|30.00|>`` (the first right after
``<|notimestamps|>``): a reply with timestamps (its opening without ``<|notimestamps|>``) is a run of segments, each
its text between the timestamps of its start and end, ``<|0.00|> Hello.<|1.20|><|1.20|> How are you?<|2.64|>``.
``Stamps`` holds each step's logits to that form:

- ``<|notimestamps|>`` is never generated;
- the first token is a timestamp, at most ``max_initial_timestamp_index`` of them in (one second);
- timestamps come in pairs: after a lone timestamp (a segment's end) another (the next one's start) or the end of
  the reply; after a pair, text;
- timestamps do not go back: none below the last (nor the last again, but as a segment's end's pair);
- where the timestamps together are more likely than any one text token, a timestamp is taken.

``split`` cuts a window's reply at each pair into segments with their start and end in seconds of the whole audio.
A reply that ends in a lone timestamp had no more speech in its window: the next window starts after it. One that
ends mid-segment (the window cut a sentence) drops that segment: the next window starts at the last segment's end,
and hears it whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

PRECISION = 0.02  # seconds a timestamp token stands for (<|0.02|> is one past <|0.00|>)


@dataclass(frozen=True)
class Stamps:
    """The timestamp rule of a Whisper artifact's replies."""

    begin: int  # the first timestamp token, <|0.00|> (<|notimestamps|> + 1)
    eos: int  # the end of a reply: tokens below it are text
    max_initial: int | None = None  # the first timestamp at most <|0.00|> + this (None: any)

    @classmethod
    def of(cls, spec: Any, eos: Sequence[int]) -> "Stamps":
        """A Whisper artifact's (``Spec.opening``'s ``no_timestamps`` and ``max_initial``), its reply ending at the
        first of ``eos``."""
        opening = spec.opening
        return cls(int(opening["no_timestamps"]) + 1, int(eos[0]), opening.get("max_initial"))

    def __call__(self, logits: np.ndarray, replies: Sequence[Sequence[int]]) -> np.ndarray:
        """``logits [rows, vocab]`` (or one row's ``[vocab]``) of each row's next token, the other processors applied;
        ``replies``: what each row has generated so far. The logits this rule leaves, float32."""
        given = np.asarray(logits)
        out = np.array(given, np.float32).reshape(-1, given.shape[-1])
        out[:, self.begin - 1] = -np.inf
        for row, reply in zip(out, replies):
            last = len(reply) >= 1 and reply[-1] >= self.begin
            penultimate = len(reply) < 2 or reply[-2] >= self.begin
            if last:
                if penultimate:
                    row[self.begin:] = -np.inf
                else:
                    row[:self.eos] = -np.inf
            stamps = [t for t in reply if t >= self.begin]
            lowest = self.begin if not stamps else stamps[-1] if last and not penultimate else stamps[-1] + 1
            row[self.begin:lowest] = -np.inf
        if all(len(r) == 0 for r in replies):
            out[:, :self.begin] = -np.inf
            if self.max_initial is not None:
                out[:, self.begin + self.max_initial + 1:] = -np.inf
        with np.errstate(invalid="ignore", divide="ignore"):
            top = out.max(axis=-1, keepdims=True)
            logp = out - top - np.log(np.exp(out - top).sum(axis=-1, keepdims=True))
            stamp = logp[:, self.begin:]
            peak = stamp.max(axis=-1, keepdims=True)
            together = (peak + np.log(np.exp(stamp - peak).sum(axis=-1, keepdims=True)))[:, 0]
        out[together > logp[:, :self.begin].max(axis=-1), :self.begin] = -np.inf
        return out.reshape(given.shape)


@dataclass(frozen=True)
class Segment:
    """A stretch of speech and its reply's tokens (its timestamps among them), in seconds of the whole audio; and of
    the window's reply it is part of (``runtime/longform.py``; None where not known): the temperature it was
    generated at, its mean log probability per token (its end among them), its compression ratio (its tokens'
    bytes over their zlib-compressed bytes: a reply that repeats itself compresses well) and the probability of
    ``<|nospeech|>`` after the start token."""

    start: float
    end: float
    tokens: tuple[int, ...]
    temperature: float | None = None
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None


def split(reply: Sequence[int], begin: int, offset: float, frames: int, stride: int, frame_seconds: float
          ) -> tuple[list[Segment], int]:
    """A window's ``reply`` (its end id left out) cut into segments; and how many feature frames the next window
    starts after this one's start. ``offset``: the window's start in seconds; ``frames``: the frames of audio it
    held; ``stride``: feature frames per encoder position (a timestamp token is ``stride`` frames);
    ``frame_seconds``: a feature frame's seconds."""
    reply = [int(t) for t in reply]
    stamped = [t >= begin for t in reply]
    lone_end = stamped[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(reply) - 1) if stamped[i] and stamped[i + 1]]
    if not cuts:
        stamps = [t for t in reply if t >= begin]
        end = stamps[-1] - begin if stamps and stamps[-1] != begin else int(frames * frame_seconds / PRECISION)
        return [Segment(offset, offset + end * PRECISION, tuple(reply))], frames
    if lone_end:
        cuts.append(len(reply))
    else:
        cuts[-1] += 1  # the pair's second timestamp stays with its segment
    segments, at = [], 0
    for i, cut in enumerate(cuts):
        piece = reply[at:cut]
        end = piece[-1 if i < len(cuts) - 1 or lone_end else -2]
        segments.append(Segment(offset + (piece[0] - begin) * PRECISION, offset + (end - begin) * PRECISION,
                                tuple(piece)))
        at = cut
    return segments, frames if lone_end else (reply[at - 2] - begin) * stride
