"""Whisper's log-mel input features from raw audio, in numpy: what ``WhisperFeatureExtractor`` computes.

A Whisper artifact's encoder takes a log-mel spectrogram, not a waveform. Serving raw 16 kHz audio from the
runtime, which has neither ``transformers`` nor ``torch``, needs the same features computed here, from the
checkpoint's ``preprocessor_config.json``. For a mono waveform ``x`` of at most ``n_samples`` (30 s):

- ``x`` is padded on the right with ``padding_value`` to ``n_samples`` and reflect-padded by ``n_fft // 2`` at each end;
- ``P[t, k] = |rfft(hann(n_fft) * x[t*hop : t*hop + n_fft])[k]|**2``, the periodic Hann window, the last frame dropped;
- ``M = max(1e-10, W @ P.T)``, ``W`` Slaney's mel filters (Slaney mel scale, area-normalised) from 0 to 8000 Hz;
- ``L = log10(M)``, ``L = max(L, L.max() - 8)``, features ``(L + 4) / 4`` (the maximum is the waveform's own).

As in ``transformers``' numpy path the spectrum is taken in float64 and stored in complex64, the logarithm cast to
float32; samples are used as given (an int16 PCM array is not scaled: pass floats in [-1, 1]). Unlike it, audio
longer than 30 s is refused rather than truncated, and dither (random noise) is refused to keep features deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..errors import CallError

FEATURES_FILE = "preprocessor_config.json"


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    """Slaney's mel scale, inverted: linear below 1000 Hz (mel 15), logarithmic above."""
    return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), 200.0 * mel / 3.0)


@functools.lru_cache(maxsize=8)
def _mel_filters(feature_size: int, sampling_rate: int, n_fft: int) -> np.ndarray:
    """``[n_fft // 2 + 1, feature_size]`` float64; transformers fixes the top at 8000 Hz whatever the sampling rate."""
    hz = _slaney_hz(np.linspace(0.0, 15.0 + np.log(8000.0 / 1000.0) * (27.0 / np.log(6.4)), feature_size + 2))
    slopes = hz[None, :] - np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)[:, None]
    down, up = -slopes[:, :-2] / np.diff(hz)[:-1], slopes[:, 2:] / np.diff(hz)[1:]
    filters = np.maximum(0.0, np.minimum(down, up)) * (2.0 / (hz[2:] - hz[:-2]))
    filters.setflags(write=False)
    return filters


def _check(name: str, value, ok: bool, expected: str) -> None:
    if not ok:
        raise CallError(f"LogMel {name} is {value!r} ({type(value).__name__}); expected {expected}. "
                        f"Fix {name} (the key of that name in {FEATURES_FILE}).")


@dataclass(frozen=True)
class LogMel:
    """Whisper's feature extractor: ``LogMel.from_config(json)(audio)`` is ``input_features``."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0
    dither: float = 0.0

    def __post_init__(self):
        for name in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft"):
            value = getattr(self, name)
            positive = isinstance(value, int) and not isinstance(value, bool) and value > 0
            _check(name, value, positive, "a positive integer")
        _check("n_fft", self.n_fft, self.n_fft <= self.n_samples, f"at most n_samples ({self.n_samples})")
        pad = self.padding_value
        _check("padding_value", pad, isinstance(pad, (int, float)) and not isinstance(pad, bool) and np.isfinite(pad),
               "a finite number")
        _check("dither", self.dither, isinstance(self.dither, (int, float)) and self.dither == 0,
               "0.0: dither adds random noise to the audio; set it to 0 for deterministic features")

    @classmethod
    def from_config(cls, config: dict) -> LogMel:
        """From a ``preprocessor_config.json`` dict: this class's keys are read, the others ignored."""
        side = config.get("padding_side", "right")
        _check("padding_side", side, side == "right", '"right" (Whisper pads audio with silence on the right)')
        return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls) if f.name in config})

    @property
    def n_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    @property
    def frames(self) -> int:
        """The STFT frames transformers keeps (all but the last): ``n_samples // hop_length`` for an even n_fft."""
        return (self.n_samples + 2 * (self.n_fft // 2) - self.n_fft) // self.hop_length

    def __call__(self, audio, sampling_rate: int | None = None) -> np.ndarray:
        """``[batch, feature_size, frames]`` float32 for one mono waveform (batch 1), a list of them or a 2-D array."""
        if sampling_rate is not None and sampling_rate != self.sampling_rate:
            raise CallError(f"audio sampled at {sampling_rate} Hz; this model's features expect {self.sampling_rate} "
                            f"Hz. Resample the audio to {self.sampling_rate} Hz first.")
        waves = [self._waveform(i, w) for i, w in enumerate(_batch(audio))]
        if not waves:
            raise CallError("no audio given (an empty batch); expected a waveform or a list of waveforms.")
        fill = np.float32(self.padding_value)
        padded = np.stack([np.pad(w, (0, self.n_samples - w.size), constant_values=fill) for w in waves])
        padded = np.pad(padded, ((0, 0), (self.n_fft // 2, self.n_fft // 2)), mode="reflect").astype(np.float64)
        framed = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft, axis=1)[:, :: self.hop_length]
        framed = framed[:, : self.frames]
        window = np.hanning(self.n_fft + 1)[:-1]
        power = np.abs(np.fft.rfft(framed * window, axis=-1).astype(np.complex64), dtype=np.float64) ** 2
        mel = _mel_filters(self.feature_size, self.sampling_rate, self.n_fft).T @ power.transpose(0, 2, 1)
        logs = np.log10(np.maximum(1e-10, mel)).astype(np.float32)
        logs = np.maximum(logs, logs.max(axis=(1, 2), keepdims=True) - np.float32(8.0))
        return (logs + np.float32(4.0)) / np.float32(4.0)

    def _waveform(self, index: int, wave) -> np.ndarray:
        try:
            array = np.asarray(wave)
        except (ValueError, TypeError) as e:
            message = f"waveform {index} is not an array of numbers ({e}); expected a 1-D float waveform."
            raise CallError(message) from None
        if array.ndim != 1:
            raise CallError(f"waveform {index} has shape {array.shape}; expected a 1-D mono waveform. For stereo or "
                            "multi-channel audio pass mono: average the channels (e.g. audio.mean(axis=channel_axis)).")
        if array.dtype.kind not in "iuf":
            raise CallError(f"waveform {index} has dtype {array.dtype}; expected real numbers (float samples in "
                            "[-1, 1]). Convert it: np.asarray(audio, dtype=np.float32).")
        if array.size == 0:
            raise CallError(f"waveform {index} is empty; expected at least one sample.")
        array = array.astype(np.float32)
        if not np.isfinite(array).all():
            raise CallError(f"waveform {index} holds NaN or infinite samples; expected finite samples. "
                            "Replace them (e.g. np.nan_to_num) or fix the audio's source.")
        if array.size > self.n_samples:
            raise CallError(f"waveform {index} has {array.size} samples ({array.size / self.sampling_rate:.10g} s at "
                            f"{self.sampling_rate} Hz); the limit is {self.n_samples} samples ({self.chunk_length} s). "
                            f"Split the audio into windows of at most {self.chunk_length} s and pass each.")
        return array


def _batch(audio) -> list:
    """The waveforms of ``audio``: a 2-D array's rows, a list's items when they are sequences, else ``audio`` alone."""
    if isinstance(audio, np.ndarray) and audio.ndim == 2:
        if audio.shape[1] <= 8 < audio.shape[0]:
            raise CallError(f"audio has shape {audio.shape}, which looks like [samples, channels]; expected mono "
                            "(1-D) or a batch [batch, samples]. Average the channels: audio.mean(axis=1).")
        return list(audio)
    if isinstance(audio, (list, tuple)) and audio and isinstance(audio[0], (list, tuple, np.ndarray)):
        return list(audio)
    return [audio]


WAV_FIX = "convert it with: ffmpeg -i INPUT -ar 16000 -ac 1 OUTPUT.wav"
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def read_wav(data: bytes, where: str = "the audio") -> tuple[np.ndarray, int]:
    """``(samples, sampling_rate)`` of a WAV file's bytes: mono float32 in [-1, 1] (several channels averaged, as
    ffmpeg's ``-ac 1`` downmixes them), from PCM integers of 8 (unsigned), 16, 24 or 32 bits or IEEE floats of 32
    or 64 (plain or ``WAVE_FORMAT_EXTENSIBLE``). Anything else is a ``CallError`` naming what was found and the fix."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise CallError(f"{where} is not a WAV file (it starts {data[:12]!r}); WAV audio is taken: {WAV_FIX}.")
    at, fmt, samples = 12, None, None
    while at + 8 <= len(data):
        kind, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        body = data[at + 8:at + 8 + size]
        if kind == b"fmt ":
            if len(body) < 16:
                raise CallError(f"{where}: its WAV format chunk is {len(body)} bytes, under 16: the file is damaged.")
            tag, channels, rate = (int.from_bytes(body[i:i + n], "little") for i, n in ((0, 2), (2, 2), (4, 4)))
            bits = int.from_bytes(body[14:16], "little")
            if tag == _EXTENSIBLE and len(body) >= 26:
                tag = int.from_bytes(body[24:26], "little")
            fmt = (tag, channels, rate, bits)
        elif kind == b"data":
            samples = body
            break
        at += 8 + size + (size & 1)
    if fmt is None or samples is None:
        raise CallError(f"{where}: a WAV file without its {'format' if fmt is None else 'data'} chunk: the file is "
                        "damaged or cut short.")
    tag, channels, rate, bits = fmt
    kinds = {(_PCM, 8): np.uint8, (_PCM, 16): "<i2", (_PCM, 32): "<i4", (_FLOAT, 32): "<f4", (_FLOAT, 64): "<f8"}
    if (tag, bits) == (_PCM, 24):
        raw = np.frombuffer(samples[:len(samples) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((raw[:, 0] | raw[:, 1] << 8 | raw[:, 2] << 16) << 8 >> 8) / float(1 << 23)
    elif (tag, bits) in kinds:
        dtype = np.dtype(kinds[tag, bits])
        x = np.frombuffer(samples[:len(samples) // dtype.itemsize * dtype.itemsize], dtype).astype(np.float64)
        if tag == _PCM:
            x = (x - 128.0) / 128.0 if bits == 8 else x / float(1 << (bits - 1))
    else:
        what = "PCM" if tag == _PCM else "IEEE float" if tag == _FLOAT else f"format tag {tag:#x} (compressed)"
        raise CallError(f"{where}: a WAV file of {what} samples of {bits} bits; taken are PCM of 8, 16, 24 or 32 bits "
                        f"and floats of 32 or 64: {WAV_FIX}.")
    if channels < 1 or len(x) % channels:
        raise CallError(f"{where}: {len(x)} samples do not split into {channels} channels: the file is damaged.")
    return x.reshape(-1, channels).mean(axis=1).astype(np.float32), rate
