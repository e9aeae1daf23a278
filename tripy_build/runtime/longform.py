"""Whisper's replies with timestamps, and audio of any length, in windows of 30 seconds (numpy only): transformers'
sequential long-form transcription (``WhisperGenerationMixin.generate`` with ``return_timestamps=True``).

Whisper's encoder hears 30 s (3000 feature frames) at a time. A source's features, of any number of frames, are
transcribed window by window from its start: each window (the frames from ``seek``, 30 s of them or what is left,
padded with zeros) is encoded and its reply generated with timestamps (``runtime/timestamps.Stamps``) by the same
decoding as any reply (greedy, sampled or beams: ``generate.in_groups``, ``beams.searched``); the reply is cut into
segments (``timestamps.split``), and the next window starts where its last whole segment ended, so that a sentence
the window cut is heard again whole. The sources of a call run together, each window a batch of those not done.

A multilingual model whose language is left open detects it in each source's first window and keeps it for the
others, as transformers detects it once (``seq2seq.Session``'s ``languages``).

Each window's reply is scored (``scores``: its mean log probability per token, its compression ratio, its no-speech
probability), and where a call asks (``Fallback``) a reply that repeats itself or is unlikely is generated again at
the next temperature, and a window that is unlikely and silent skipped, as transformers' ``generate_with_fallback``
does. Not built: conditioning a window on the one before (``condition_on_prev_tokens``, off by default in
transformers too).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import CallError
from .beams import Beams, searched
from .generate import Spec, Steps, before_stop, in_groups
from .timestamps import PRECISION, Segment, Stamps, split
from .transcription import DETECT


def sources(spec: Spec, features: Any, attention_mask: Any) -> tuple[list[np.ndarray], list[int]]:
    """A call's ``input_features`` of any number of frames (``[batch, num_mel_bins, frames]``, one source ``[num_mel_bins,
    frames]``, or a list of sources of their own lengths) as float32 arrays, and each source's frames: all of its
    array, or those ``attention_mask [batch, frames]`` marks (transformers' extractor's, with ``padding="longest"``);
    a ``CallError`` naming the source, the shape or the mask that is not so."""
    mel = spec.source_shape[0]
    if isinstance(features, (list, tuple)) and features and all(np.ndim(f) == 2 for f in features):
        arrays = [np.asarray(f) for f in features]
    else:
        x = np.asarray(features)
        arrays = list(x[None] if x.ndim == 2 else x) if x.ndim in (2, 3) else [x]
    for i, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[0] != mel or not a.shape[1] or not np.issubdtype(a.dtype, np.floating):
            raise CallError(f"generate(): input_features[{i}] has shape {tuple(a.shape)} and dtype {a.dtype}; this "
                            f"model takes float features [batch, {mel}, frames] (the log-mel features of the audio: "
                            "transcribe(audio) makes them, or transformers' WhisperFeatureExtractor).")
        if not np.isfinite(a).all():
            raise CallError(f"generate(): input_features[{i}] holds a value that is not finite (NaN or inf).")
    frames = [a.shape[1] for a in arrays]
    if attention_mask is not None:
        mask = np.asarray(attention_mask)
        width = max(frames)
        if mask.shape != (len(arrays), width) or not np.isin(mask, (0, 1)).all():
            raise CallError(f"generate(): attention_mask has shape {mask.shape}; with input_features of "
                            f"{len(arrays)} sources of {width} frames it is 0/1 [{len(arrays)}, {width}], 1 on each "
                            "source's frames (the feature extractor's, with return_attention_mask=True).")
        if width <= spec.source_shape[-1]:
            raise CallError(f"generate(): attention_mask marks the frames of features longer than one window; these "
                            f"are {width} frames, at most the {spec.source_shape[-1]} of one, and are used whole. "
                            "Leave attention_mask out.")
        frames = [int(n) for n in mask.sum(axis=1)]
        for i, (row, n) in enumerate(zip(mask, frames)):
            if not n or row[:n].min() == 0:
                raise CallError(f"generate(): attention_mask[{i}] is not 1 on a source's first frames and 0 after "
                                "them (the padding is on the right, as the feature extractor pads).")
    elif len(arrays) > 1 and len({a.shape[1] for a in arrays}) == 1 and frames[0] > spec.source_shape[-1]:
        raise CallError(f"generate(): {len(arrays)} sources of {frames[0]} frames (over one window of "
                        f"{spec.source_shape[-1]}) and no attention_mask: give the feature extractor's attention_mask "
                        "(return_attention_mask=True), which says how many frames of each are audio, not padding; or "
                        "pass the sources as a list of arrays of their own lengths.")
    return [a.astype(np.float32) for a in arrays], frames


@dataclass(frozen=True)
class Fallback:
    """When a window's reply is generated again at a higher temperature, or the window skipped as silence
    (transformers' long-form ``temperature`` tuple and thresholds; OpenAI's Whisper's decoding fallback)."""

    # each attempt's, in turn: 0 greedy (or the call's beams), above: sampled; None: one, at the call's temperature
    temperatures: tuple[float, ...] | None = None
    compression_ratio_threshold: float | None = None  # a reply compressing better than this repeats itself: again
    logprob_threshold: float | None = None  # a reply whose mean log probability per token is lower: again
    # with logprob_threshold: a window whose reply is that unlikely and whose <|nospeech|> probability after the
    # start token is above this is silence: skipped, no segment
    no_speech_threshold: float | None = None

    def __post_init__(self) -> None:
        temps = self.temperatures
        def number(t: Any) -> bool:
            return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
        if temps is not None and (not temps or not all(map(number, temps))):
            raise CallError(f"generate(): temperature={temps!r}: the temperatures of a window's attempts in turn are "
                            "numbers of at least 0, e.g. (0.0, 0.2, 0.4, 0.6, 0.8, 1.0).")
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise CallError(f"generate(): {name}={value!r}: it is a number (or None: not checked).")
        if self.no_speech_threshold is not None and self.logprob_threshold is None:
            raise CallError(f"generate(): no_speech_threshold={self.no_speech_threshold!r} needs logprob_threshold: a "
                            "window is skipped as silence where its reply's mean log probability is below "
                            "logprob_threshold and its no-speech probability above no_speech_threshold (-1.0 and 0.6 "
                            "are transformers' suggestion).")

    @classmethod
    def of(cls, temperature: Any = None, compression_ratio_threshold: float | None = None,
           logprob_threshold: float | None = None, no_speech_threshold: float | None = None) -> "Fallback | None":
        """A call's fallback: a tuple of temperatures, or any threshold, asks for one; None where it asks none."""
        temperatures = tuple(temperature) if isinstance(temperature, (list, tuple)) else None
        thresholds = (compression_ratio_threshold, logprob_threshold, no_speech_threshold)
        if temperatures is None and all(x is None for x in thresholds):
            return None
        return cls(temperatures, *thresholds)

    @property
    def checks(self) -> bool:
        return len(self.temperatures or ()) > 1 or any(
            x is not None for x in (self.compression_ratio_threshold, self.logprob_threshold, self.no_speech_threshold))


class Windows:
    """One source's audio window by window: ``next`` gives each window's features (the frames from ``seek``, a window
    of them or what is left, padded with zeros), ``take`` its reply (its end id left out), cut into segments
    (``timestamps.split``) that carry the reply's ``scores``, or ``skip`` it (silence); the next window starts where
    the reply's last whole segment ended. ``transcribed`` runs a call's sources' in step; the server runs each
    request's (``serve/audio.py``)."""

    def __init__(self, spec: Spec, features: np.ndarray, frames: int | None = None):
        self.window = spec.source_shape[-1]
        self.stride = self.window // spec.encoded_length  # feature frames per encoder position, and per timestamp
        self.frame_seconds = spec.audio["hop_length"] / spec.audio["sampling_rate"]
        self.begin = int(spec.opening["no_timestamps"]) + 1
        self.features = features
        self.frames = features.shape[-1] if frames is None else frames  # the source's frames (the rest padding)
        self.seek = self.held = 0
        self.segments: list[tuple[int, Segment]] = []  # each with its window's seek

    @property
    def done(self) -> bool:
        return self.seek >= self.frames

    def next(self) -> np.ndarray:
        """The next window's features ``[mel, window]`` (while not ``done``)."""
        self.held = min(self.frames - self.seek, self.window)
        return np.pad(self.features[:, self.seek:self.seek + self.held], ((0, 0), (0, self.window - self.held)))

    def take(self, reply: Sequence[int], scored: Segment) -> None:
        segments, advance = split(reply, self.begin, self.seek * PRECISION / self.stride, self.held, self.stride,
                                  self.frame_seconds)
        self.segments += [(self.seek, dataclasses.replace(scored, start=s.start, end=s.end, tokens=s.tokens))
                          for s in segments]
        self.seek += advance if advance > 0 else self.held  # a reply that moves nowhere (none can: a timestamp first)

    def skip(self) -> None:
        self.seek += self.held


def transcribed(steps: Steps, spec: Spec, features: Sequence[np.ndarray], frames: Sequence[int], opening: Sequence[int],
                max_new_tokens: int, seed: int | None, eos_token_id: Any, pad_token_id: int | None, constraints: Any,
                beams: Beams | None, sampling: dict[str, Any], process: Any, sessions: Any,
                fallback: Fallback = Fallback(), prompt: Sequence[int] = ()) -> list[list[Segment]]:
    """Each source's segments, window after window (``opening``: the tokens each window's reply opens with, without
    ``<|notimestamps|>``; ``max_new_tokens``: a window's most; ``process``: the checkpoint's other processors,
    ``seq2seq.forced``; ``sessions``: ``seq2seq.Sessions``, which runs them; ``prompt``: what each window's decoder
    reads before its start token, ``<|startofprev|>`` and a text); the options as ``generate`` takes them, a sampled
    call's seed moved on per attempt; each window's reply generated again hotter, or the window skipped, as
    ``fallback`` says."""
    eos = spec.stops(eos_token_id)
    if not eos:
        raise CallError("generate(): eos_token_id=[]: a reply with timestamps ends at the end of its window's "
                        "speech, at the model's end id; leave eos_token_id out.")
    if beams is not None and fallback.checks:
        raise CallError("generate(): num_beams with a temperature fallback or thresholds is not built here (a beam "
                        "search's replies are not scored per token); give one or the other.")
    stamps = Stamps.of(spec, eos)

    def stamped(spec: Spec, logits: np.ndarray, step: int, n: int, replies: Any, eos: Any) -> np.ndarray:
        return stamps(process(spec, logits, step, n, replies, eos), replies)

    tracks = [Windows(spec, f, n) for f, n in zip(features, frames)]
    found = _detected(steps, spec, features, frames, sessions, bool(prompt)) if DETECT in opening else {}
    round_ = 0
    while active := [i for i, t in enumerate(tracks) if not t.done]:
        windows = [tracks[i].next() for i in active]
        known = {id(w): found[i] for i, w in zip(active, windows) if i in found}
        draws = None if seed is None else seed + round_ * len(fallback.temperatures or (None,))
        replies = _attempts(steps, spec, windows, sessions, opening, known, max_new_tokens, draws, eos_token_id,
                            pad_token_id, constraints, beams, sampling, stamped, fallback, stamps.begin - 2, prompt)
        for i, w, (reply, meta) in zip(active, windows, replies):
            if id(w) in known:  # given, or detected in this window
                found[i] = known[id(w)]
            if meta is None:
                tracks[i].skip()
            else:
                tracks[i].take(reply, meta)
        round_ += 1
    return [[s for _, s in t.segments] for t in tracks]


def _attempts(steps: Steps, spec: Spec, windows: list[np.ndarray], sessions: Any, opening: Sequence[int],
              known: dict[int, int], max_new_tokens: int, seed: int | None, eos_token_id: Any,
              pad_token_id: int | None, constraints: Any, beams: Beams | None, sampling: dict[str, Any],
              process: Any, fallback: Fallback, no_speech: int, prompt: Sequence[int]
              ) -> list[tuple[list[int], Segment | None]]:
    """One round's windows' replies (their end ids left out) and scores, each attempt at the next temperature for
    the windows whose reply failed a threshold at the one before; None in place of the scores of a window skipped
    as silence. ``sessions``: ``seq2seq.Sessions``; ``known``: the languages already found, by window (those found
    here are added)."""
    eos = spec.stops(eos_token_id)
    replies: list[tuple[list[int], Segment | None]] = [([], None)] * len(windows)
    pending = list(range(len(windows)))
    attempts = fallback.temperatures or (None,)
    for attempt, temperature in enumerate(attempts):
        options = sampling if temperature is None else {**sampling, "temperature": temperature}
        rows = [windows[j] for j in pending]
        made = sessions(opening, known, {}, prompt)
        picked: list[list[float]] = [[] for _ in rows]  # each row's tokens' log probabilities as they were picked

        def observe(at: Sequence[int], logits: np.ndarray, tokens: np.ndarray, picked: list = picked) -> None:
            x = np.asarray(logits, np.float64)
            top = x.max(axis=-1)
            lse = top + np.log(np.exp(x - top[:, None]).sum(axis=-1))
            for k, row in enumerate(at):
                picked[row].append(float(x[k, tokens[k]] - lse[k]))
        if beams is not None:
            ids = searched(steps, spec, made, rows, max_new_tokens, beams, eos_token_id, pad_token_id, process)
        else:
            start = [np.array([spec.decoder_start_token_id], np.int32)] * len(rows)
            ids = in_groups(steps, spec, made, rows, start, max_new_tokens, None if seed is None else seed + attempt,
                            eos_token_id, pad_token_id, constraints, options, process, observe)
        again = []
        for k, j in enumerate(pending):
            reply = before_stop(ids[k], eos)
            meta = scores(ids[k][:len(reply) + 1], picked[k], made.firsts[id(rows[k])], spec.vocab_size, no_speech,
                          spec.options(**options).temperature)
            unlikely = fallback.logprob_threshold is not None and meta.avg_logprob < fallback.logprob_threshold
            silent = fallback.no_speech_threshold is not None and meta.no_speech_prob > fallback.no_speech_threshold
            repeats = (fallback.compression_ratio_threshold is not None
                       and meta.compression_ratio > fallback.compression_ratio_threshold)
            replies[j] = (reply, None if unlikely and silent else meta)
            if (repeats or unlikely) and not (unlikely and silent):
                again.append(j)
        pending = again
        if not pending:
            break
    return replies


def scores(tokens: Sequence[int], logprobs: Sequence[float], first: np.ndarray, vocab: int, no_speech: int,
           temperature: float) -> Segment:
    """A window's reply's scores (a ``Segment`` of them alone), as transformers' fallback computes them: ``tokens``
    the reply with its end, ``logprobs`` the log probability of each token as it was picked (the processed logits'
    at temperature 1, in float64, where transformers takes float32; more than ``tokens`` where its batch ran on;
    none: a beam search's, not scored), ``first``
    the logits after the start token, whose softmax at ``no_speech`` (``<|nospeech|>``) is the window's no-speech
    probability."""
    tokens = [int(t) for t in tokens]
    logprob = float(np.sum(logprobs[:len(tokens)]) / len(tokens)) if len(logprobs) else None
    x = np.asarray(first, np.float32)
    silence = float(np.exp(x[no_speech] - x.max()) / np.exp(x - x.max()).sum())
    return Segment(0.0, 0.0, (), float(temperature), logprob, _compression(tokens, vocab), silence)


def _compression(tokens: Sequence[int], vocab: int) -> float:
    """Transformers' compression ratio of a reply: its tokens as bytes (as few a token as the vocabulary needs) over
    those bytes zlib-compressed."""
    data = b"".join(t.to_bytes(int(math.log2(vocab) / 8) + 1, "little") for t in tokens)
    return len(data) / len(zlib.compress(data))


def _detected(steps: Steps, spec: Spec, features: Sequence[np.ndarray], frames: Sequence[int], sessions: Any,
              prompt: bool) -> dict[int, int]:
    """The language tokens of the sources whose first window, as transcribed, is not what their language is detected
    from, as transformers detects it (``detect_language`` over the features' first 3000 frames, the start token
    alone): every source where a ``prompt`` comes before the start token; else a source shorter than a window in a
    batch of longer ones, transcribed from its frames padded with zeros and detected from its first window's frames as
    the batch's features have them (the extractor's padding after its audio). {} where there are none: the others'
    language is read from their first window's run."""
    window = spec.source_shape[-1]
    odd = [i for i, (f, n) in enumerate(zip(features, frames)) if prompt or n < window and f.shape[1] > n]
    heads = [np.pad(features[i][:, :window], ((0, 0), (0, max(0, window - features[i].shape[1])))) for i in odd]
    return dict(zip(odd, sessions.detect(steps, spec, heads))) if odd else {}


def sequences(segments: Sequence[Sequence[Segment]], pad: int | None) -> np.ndarray:
    """Each source's segments' tokens one after another (their timestamps among them), int32 ``[batch, n]``, the
    shorter filled with ``pad`` (transformers' ``generate`` output with timestamps)."""
    rows = [[t for s in source for t in s.tokens] for source in segments]
    out = np.full((len(rows), max(map(len, rows), default=0)), 0 if pad is None else pad, np.int32)
    for r, row in enumerate(rows):
        out[r, :len(row)] = row
    return out
