"""``runtime/audio``: Whisper's log-mel features equal transformers' ``WhisperFeatureExtractor`` (its default torch
path and its numpy path) for 80 and 128 mel bins, single waveforms and batches; what it refuses, it names."""

from __future__ import annotations

import numpy as np
import pytest

from tripy_build.errors import CallError
from tripy_build.runtime.audio import FEATURES_FILE, LogMel

RATE = 16000
WHISPER_TINY = {  # openai/whisper-tiny's preprocessor_config.json
    "chunk_length": 30, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
    "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
    "padding_value": 0.0, "processor_class": "WhisperProcessor", "return_attention_mask": False,
    "sampling_rate": 16000,
}


def hugging_face(audio, numpy_path: bool, monkeypatch, **config) -> np.ndarray:
    """``input_features`` of transformers' extractor; ``numpy_path`` as it computes them without torch."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.whisper import feature_extraction_whisper

    with monkeypatch.context() as patch:
        if numpy_path:
            patch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)
        return WhisperFeatureExtractor(**config)(audio, sampling_rate=RATE, return_tensors="np").input_features


def waves(*seconds: float, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.8, 0.8, round(s * RATE)).astype(np.float32) for s in seconds]


CASES = {  # name: (audio, batch)
    "1 s": (waves(1.0)[0], 1),
    "7.3 s float64": (waves(7.3)[0].astype(np.float64), 1),
    "exactly 30 s": (waves(30.0)[0], 1),
    "a batch of 2 s and 12.5 s": (waves(2.0, 12.5), 2),
    "a [3, samples] array": (np.stack(waves(4.0, 4.0, 4.0)), 3),
    "a list of floats": ([float(x) for x in waves(0.5)[0]], 1),
    "silence": (np.zeros(RATE, np.float32), 1),
}


@pytest.mark.parametrize("feature_size", [80, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_features_equal_transformers(case, feature_size, monkeypatch):
    audio, batch = CASES[case]
    ours = LogMel(feature_size=feature_size)(audio, sampling_rate=RATE)
    assert ours.dtype == np.float32 and ours.shape == (batch, feature_size, 3000)
    for numpy_path, tolerance in ((True, 1e-6), (False, 5e-5)):
        theirs = hugging_face(audio, numpy_path, monkeypatch, feature_size=feature_size)
        assert theirs.shape == ours.shape
        assert np.abs(ours - theirs).max() <= tolerance, (numpy_path, np.abs(ours - theirs).max())


def test_from_config_reads_whisper_tiny_and_ignores_the_other_keys(monkeypatch):
    extractor = LogMel.from_config(WHISPER_TINY)
    assert extractor == LogMel() and extractor.n_samples == 480000 and extractor.frames == 3000
    large = LogMel.from_config({**WHISPER_TINY, "feature_size": 128})
    audio = waves(3.0, seed=1)[0]
    theirs = hugging_face(audio, True, monkeypatch, **{**WHISPER_TINY, "feature_size": 128})
    assert np.abs(large(audio) - theirs).max() <= 1e-6
    assert FEATURES_FILE == "preprocessor_config.json"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"feature_size": "80"}, r"feature_size is '80' \(str\); expected a positive integer"),
        ({"hop_length": 0}, "hop_length is 0.*positive integer"),
        ({"sampling_rate": True}, "sampling_rate is True"),
        ({"n_fft": 10**9}, "n_fft.*at most n_samples"),
        ({"padding_value": float("nan")}, "padding_value.*finite"),
        ({"dither": 1e-4}, "dither is 0.0001.*random noise.*set it to 0"),
        ({"padding_side": "left"}, "padding_side is 'left'.*right"),
    ],
)
def test_from_config_refuses_a_wrong_value_naming_the_key(change, match):
    with pytest.raises(CallError, match=match):
        LogMel.from_config({**WHISPER_TINY, **change})


@pytest.mark.parametrize(
    ("audio", "sampling_rate", "match"),
    [
        (waves(1.0)[0], 44100, "sampled at 44100 Hz.*expect 16000 Hz.*Resample the audio to 16000 Hz"),
        (np.zeros(480001, np.float32), None,
         r"waveform 0 has 480001 samples \(30.0000625 s at 16000 Hz\); one window's features hold at most 480000 "
         r"samples \(30 s\). For longer audio take LogMel.long's features"),
        ([waves(1.0)[0], np.zeros(31 * RATE)], None, r"waveform 1 has 496000 samples \(31 s"),
        (np.zeros((RATE, 2), np.float32), None, r"shape \(16000, 2\).*\[samples, channels\].*[Aa]verage the channels"),
        ([np.zeros((2, RATE), np.float32)], None, r"waveform 0 has shape \(2, 16000\); expected a 1-D mono.*average"),
        (np.zeros((1, 2, RATE), np.float32), None, "waveform 0 has shape.*mono"),
        (np.float32(0.5), None, r"waveform 0 has shape \(\).*1-D"),
        ([], None, "waveform 0 is empty"),
        ([waves(1.0)[0], np.zeros(0, np.float32)], None, "waveform 1 is empty"),
        ([waves(1.0)[0], np.array([0.0, np.nan])], None, "waveform 1 holds NaN or infinite"),
        (np.array([0.0, np.inf]), None, "waveform 0 holds NaN or infinite"),
        (np.zeros(10, np.complex64), None, "waveform 0 has dtype complex64; expected real numbers"),
        ([np.zeros(10), np.array(["a", "b"])], None, "waveform 1 has dtype <U1"),
        (np.zeros((0, 10), np.float32), None, "no audio given"),
    ],
)
def test_refusals_name_what_was_given_and_the_fix(audio, sampling_rate, match):
    with pytest.raises(CallError, match=match):
        LogMel()(audio, sampling_rate=sampling_rate)


def test_exactly_30_seconds_and_a_2d_batch_are_accepted():
    assert LogMel()(np.zeros(480000, np.float32)).shape == (1, 80, 3000)
    assert LogMel()(np.zeros((2, 100), np.float32)).shape == (2, 80, 3000)


def test_long_features_equal_transformers_long_form_extraction(monkeypatch):
    """``LogMel.long``: waveforms of 75 s and 40.005 s (not a whole number of hops) padded to the longest, computed a
    window at a time, equal transformers' extractor with ``truncation=False, padding="longest"`` on both its paths, and
    each one's frames its attention mask's; audio within one window is padded to it."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.whisper import feature_extraction_whisper

    audio = waves(75.0, 40.005)
    ours, frames = LogMel().long(audio, sampling_rate=RATE)
    assert ours.shape == (2, 80, 7500) and frames.tolist() == [7500, 4001]
    for numpy_path, tolerance in ((True, 1e-6), (False, 5e-5)):
        with monkeypatch.context() as patch:
            if numpy_path:
                patch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)
            theirs = WhisperFeatureExtractor()(audio, sampling_rate=RATE, truncation=False, padding="longest",
                                               return_attention_mask=True, return_tensors="np")
        assert np.abs(ours - theirs.input_features).max() <= tolerance
        assert theirs.attention_mask.sum(-1).tolist() == frames.tolist()
    short, frames = LogMel().long(waves(3.0))
    assert short.shape == (1, 80, 3000) and frames.tolist() == [300]
    np.testing.assert_array_equal(short, LogMel()(waves(3.0)))
