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

Not built: conditioning a window on the one before (``condition_on_prev_tokens``), the temperature fallback
(``compression_ratio_threshold``, ``logprob_threshold``) and no-speech detection (``no_speech_threshold``), which
transformers leaves off by default too.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import CallError
from .beams import Beams, searched
from .generate import Spec, Steps, before_stop, in_groups
from .timestamps import PRECISION, Segment, Stamps, split
from .transcription import DETECT, Opening


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


def transcribed(steps: Steps, spec: Spec, features: Sequence[np.ndarray], frames: Sequence[int], opening: Sequence[int],
                max_new_tokens: int, seed: int | None, eos_token_id: Any, pad_token_id: int | None, constraints: Any,
                beams: Beams | None, sampling: dict[str, Any], process: Any) -> list[list[Segment]]:
    """Each source's segments, window after window (``opening``: the tokens each window's reply opens with, without
    ``<|notimestamps|>``; ``max_new_tokens``: a window's most; ``process``: the checkpoint's other processors,
    ``seq2seq.forced``); the options as ``generate`` takes them, a sampled call's seed moved on per window."""
    from .seq2seq import Sessions

    window = spec.source_shape[-1]
    stride = window // spec.encoded_length  # feature frames per encoder position, and per timestamp token
    frame_seconds = spec.audio["hop_length"] / spec.audio["sampling_rate"]
    eos = spec.stops(eos_token_id)
    if not eos:
        raise CallError("generate(): eos_token_id=[]: a reply with timestamps ends at the end of its window's "
                        "speech, at the model's end id; leave eos_token_id out.")
    stamps = Stamps.of(spec, eos)

    def stamped(spec: Spec, logits: np.ndarray, step: int, n: int, replies: Any, eos: Any) -> np.ndarray:
        return stamps(process(spec, logits, step, n, replies, eos), replies)

    seek = [0] * len(features)
    found = _detected(steps, spec, features, frames) if DETECT in opening else {}  # a source's language token
    out: list[list[Segment]] = [[] for _ in features]
    round_ = 0
    while active := [i for i, f in enumerate(frames) if seek[i] < f]:
        held = [min(frames[i] - seek[i], window) for i in active]
        windows = [np.pad(features[i][:, seek[i]:seek[i] + n], ((0, 0), (0, window - n))) for i, n in zip(active, held)]
        known = {id(w): found[i] for i, w in zip(active, windows) if i in found}
        sessions = Sessions(opening, known)
        if beams is not None:
            ids = searched(steps, spec, sessions, windows, max_new_tokens, beams, eos_token_id, pad_token_id, stamped)
        else:
            start = [np.array([spec.decoder_start_token_id], np.int32)] * len(windows)
            ids = in_groups(steps, spec, sessions, windows, start, max_new_tokens,
                            None if seed is None else seed + round_, eos_token_id, pad_token_id, constraints, sampling,
                            stamped)
        for row, (i, n, w) in enumerate(zip(active, held, windows)):
            if id(w) in sessions.languages:  # given, or detected in this window
                found[i] = sessions.languages[id(w)]
            segments, advance = split(before_stop(ids[row], eos), stamps.begin, seek[i] * PRECISION / stride, n,
                                      stride, frame_seconds)
            out[i] += segments
            seek[i] += advance if advance > 0 else n  # a reply that moves nowhere (none can: its first is a timestamp)
        round_ += 1
    return out


def _detected(steps: Steps, spec: Spec, features: Sequence[np.ndarray], frames: Sequence[int]) -> dict[int, int]:
    """The language tokens of the sources whose first window, as transcribed, is not what their language is detected
    from: a source shorter than a window in a batch of longer ones is transcribed from its frames padded with zeros,
    and its language detected from its first window's frames as the batch's features have them (the extractor's
    padding after its audio), as transformers detects it (``detect_language`` over the features' first 3000 frames);
    {} where there are none. An encoder run for those sources; the others' is their first window's."""
    from .seq2seq import Session

    window = spec.source_shape[-1]
    odd = [i for i, (f, n) in enumerate(zip(features, frames)) if n < window and f.shape[1] > n]
    found: dict[int, int] = {}
    most = max(p["batch"] for p in steps.profiles(spec.prefill))
    for at in range(0, len(odd), most):
        group = odd[at:at + most]
        heads = [np.pad(features[i][:, :window], ((0, 0), (0, max(0, window - features[i].shape[1])))) for i in group]
        session = Session(steps, spec, Session.batch_for(steps, spec, heads), ())
        _, logits = session.admit_all(heads)
        session.close()
        found.update(zip(group, map(int, Opening.of(spec.opening).detected(logits))))
    return found


def sequences(segments: Sequence[Sequence[Segment]], pad: int | None) -> np.ndarray:
    """Each source's segments' tokens one after another (their timestamps among them), int32 ``[batch, n]``, the
    shorter filled with ``pad`` (transformers' ``generate`` output with timestamps)."""
    rows = [[t for s in source for t in s.tokens] for source in segments]
    out = np.full((len(rows), max(map(len, rows), default=0)), 0 if pad is None else pad, np.int32)
    for r, row in enumerate(rows):
        out[r, :len(row)] = row
    return out
