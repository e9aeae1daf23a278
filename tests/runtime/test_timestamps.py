"""Whisper's timestamp rule and segments (``runtime/timestamps.py``) against transformers' own:
``WhisperTimeStampLogitsProcessor`` over random logits after replies of every form (none yet, a lone timestamp, a
pair, text, a timestamp after text), with and without ``max_initial_timestamp_index``; and
``WhisperGenerationMixin._retrieve_segment`` over replies that end in a lone timestamp, mid-segment, or hold no pair.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor  # noqa: E402
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin  # noqa: E402

from tripy_build.runtime.timestamps import PRECISION, Stamps, split  # noqa: E402

EOS, NO_TIMESTAMPS, VOCAB = 50, 60, 200
BEGIN = NO_TIMESTAMPS + 1
T = [BEGIN + i for i in (0, 5, 9, 30, 31)]  # timestamps
REPLIES = [[], [T[1]], [T[1], 3], [T[1], 3, 4, T[2]], [T[1], 3, T[2], T[2]], [T[1], 3, T[3], T[3], 7],
           [T[0], 2, T[0]], [T[1], T[1]], [9, 9]]


@pytest.mark.parametrize("max_initial", [None, 3])
def test_the_rule_equals_transformers_processor(max_initial):
    config = transformers.GenerationConfig(no_timestamps_token_id=NO_TIMESTAMPS, eos_token_id=EOS,
                                           max_initial_timestamp_index=max_initial)
    stamps = Stamps(BEGIN, EOS, max_initial)
    rng = np.random.default_rng(0)
    opening = [1, 2, 3]
    for length in sorted({len(r) for r in REPLIES}):
        replies = [r for r in REPLIES if len(r) == length]
        for scale in (0.5, 4.0):  # text most likely; timestamps together most likely
            logits = (rng.standard_normal((len(replies), VOCAB)) * scale).astype(np.float32)
            logits[:, BEGIN:] += 2.0 if scale > 1 else 0.0
            processor = WhisperTimeStampLogitsProcessor(config, begin_index=len(opening))
            want = processor(torch.tensor([opening + r for r in replies]), torch.tensor(logits)).numpy()
            got = stamps(logits, replies)
            np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
            np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)])
    assert stamps(logits[0], replies[:1]).shape == (VOCAB,)  # one row's logits alone


@pytest.mark.parametrize("reply", [[T[1], 3, 4, T[2], T[2], 5, T[3]], [T[1], 3, T[2], T[2], 5, 6],
                                   [T[1], 3, T[2], T[2], 5, T[3], T[3]], [T[1], 3, 4, 5], [T[1], 3, T[2]], [T[0], 3],
                                   [T[1]], []],
                         ids=["lone-end", "mid-segment", "pair-end", "no-pair", "one-segment", "at-zero", "one-stamp",
                              "empty"])
def test_segments_equal_transformers(reply):
    seek, frames, stride, frame_seconds = 4200, 2300, 2, 0.01
    offset = torch.tensor([seek], dtype=torch.float64) * PRECISION / stride
    want, advance = WhisperGenerationMixin._retrieve_segment(
        torch.tensor(reply, dtype=torch.long), [{}], offset, BEGIN, torch.tensor([frames]), PRECISION, frame_seconds,
        stride, 0, 0, False, torch.zeros((1, 4)))
    got, moved = split(reply, BEGIN, seek * PRECISION / stride, frames, stride, frame_seconds)
    assert moved == int(advance)
    assert [(s.start, s.end, list(s.tokens)) for s in got] == \
           [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in want]
