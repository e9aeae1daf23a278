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
longer than 30 s is refused rather than truncated where one window's features are asked for (``LogMel.__call__``);
``LogMel.long`` takes audio of any length, padded to the longest of its batch, as transformers' extractor does for
long-form transcription (``runtime/longform.py``). Dither (random noise) is refused to keep features deterministic.

``wav`` reads a WAV (RIFF/WAVE) file's bytes with numpy, for the server's audio routes and the CLI's ``--audio``: PCM
integers (8-bit unsigned; 16, 24, 32-bit signed) or IEEE floats (32, 64-bit), plain or as ``WAVE_FORMAT_EXTENSIBLE``,
its channels averaged to mono (ffmpeg's ``-ac 1``). It must be at the model's sampling rate (16000 Hz) and at most its
window (30 s): nothing is resampled or cut, so a file that is not what the model hears is refused with the ffmpeg
command that makes one that is, rather than transcribed wrong. Other formats (MP3, FLAC, Ogg, ...) are refused the
same way, naming what the file is.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct
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
        """The STFT frames transformers keeps of a window (``_frames``)."""
        return self._frames(self.n_samples)

    def _frames(self, samples: int) -> int:
        """The STFT frames transformers keeps of ``samples`` (all but the last): ``samples // hop_length`` for an even
        n_fft."""
        return (samples + 2 * (self.n_fft // 2) - self.n_fft) // self.hop_length

    def __call__(self, audio, sampling_rate: int | None = None) -> np.ndarray:
        """``[batch, feature_size, frames]`` float32 for one mono waveform (batch 1), a list of them or a 2-D array,
        each at most ``chunk_length`` seconds (padded to it)."""
        return self._features(self.waveforms(audio, sampling_rate, longer=False), self.n_samples)

    def long(self, audio, sampling_rate: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Features of waveforms of any length, as transformers' extractor gives them for long-form transcription
        (``truncation=False, padding="longest", return_attention_mask=True``): ``[batch, feature_size, frames]`` over
        the waveforms padded to the longest (to ``chunk_length`` seconds at least), and each one's frames ``[batch]``
        (what its attention mask marks)."""
        waves = self.waveforms(audio, sampling_rate, longer=True)
        samples = max(self.n_samples, max(w.size for w in waves))
        features = self._features(waves, samples)
        frames = np.array([min(-(-w.size // self.hop_length), features.shape[-1]) for w in waves], np.int64)
        return features, frames

    def waveforms(self, audio, sampling_rate: int | None, longer: bool) -> list[np.ndarray]:
        """``audio``'s mono waveforms, checked; over ``chunk_length`` seconds only where ``longer``."""
        if sampling_rate is not None and sampling_rate != self.sampling_rate:
            raise CallError(f"audio sampled at {sampling_rate} Hz; this model's features expect {self.sampling_rate} "
                            f"Hz. Resample the audio to {self.sampling_rate} Hz first.")
        waves = [self._waveform(i, w, longer) for i, w in enumerate(_batch(audio))]
        if not waves:
            raise CallError("no audio given (an empty batch); expected a waveform or a list of waveforms.")
        return waves

    def _features(self, waves: list[np.ndarray], samples: int) -> np.ndarray:
        """The features of ``waves`` padded to ``samples``, a window's frames at a time (an hour of audio holds
        360,000 frames: their float64 spectra at once would take gigabytes)."""
        fill = np.float32(self.padding_value)
        padded = np.stack([np.pad(w, (0, samples - w.size), constant_values=fill) for w in waves])
        padded = np.pad(padded, ((0, 0), (self.n_fft // 2, self.n_fft // 2)), mode="reflect")
        framed = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft, axis=1)[:, :: self.hop_length]
        frames = self._frames(samples)
        window = np.hanning(self.n_fft + 1)[:-1]
        filters = _mel_filters(self.feature_size, self.sampling_rate, self.n_fft).T
        logs = np.empty((len(waves), self.feature_size, frames), np.float32)
        for start in range(0, frames, self.frames):
            end = min(start + self.frames, frames)
            spectrum = np.fft.rfft(framed[:, start:end] * window, axis=-1).astype(np.complex64)
            mel = filters @ (np.abs(spectrum, dtype=np.float64) ** 2).transpose(0, 2, 1)
            logs[:, :, start:end] = np.log10(np.maximum(1e-10, mel))
        logs = np.maximum(logs, logs.max(axis=(1, 2), keepdims=True) - np.float32(8.0))
        return (logs + np.float32(4.0)) / np.float32(4.0)

    def _waveform(self, index: int, wave, longer: bool) -> np.ndarray:
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
        if array.size > self.n_samples and not longer:
            raise CallError(f"waveform {index} has {array.size} samples ({array.size / self.sampling_rate:.10g} s at "
                            f"{self.sampling_rate} Hz); one window's features hold at most {self.n_samples} samples "
                            f"({self.chunk_length} s). For longer audio take LogMel.long's features, which "
                            "generate(input_features=...) transcribes window by window (as transcribe(audio) does).")
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


_EXTENSIBLE = 0xFFFE
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_* after its tag
_PCM, _FLOAT = 1, 3
_TAGS = {2: "Microsoft ADPCM", 6: "A-law", 7: "mu-law", 0x11: "IMA ADPCM", 0x31: "GSM 6.10", 0x50: "MPEG",
         0x55: "MP3", 0xFF: "AAC", 0x1610: "AAC"}
# what a file that is not WAV begins with: (its first bytes, where they are, what the file is, an extension)
_MAGIC = ((b"ID3", 0, "MP3 (an ID3 tag)", "mp3"), (b"fLaC", 0, "FLAC", "flac"), (b"OggS", 0, "Ogg (Vorbis or Opus)", "ogg"),
          (b"ftyp", 4, "MP4/M4A", "m4a"), (b"\x1aE\xdf\xa3", 0, "WebM/Matroska", "webm"), (b"#!AMR", 0, "AMR", "amr"),
          (b"FORM", 0, "AIFF", "aiff"), (b"RIFX", 0, "a big-endian RIFF (RIFX) file", "wav"),
          (b"RF64", 0, "RF64 (a WAV over 4 GiB)", "wav"), (b"caff", 0, "Core Audio (CAF)", "caf"))


def wav(data: bytes, rate: int, seconds: float | None = None, filename: str | None = None) -> np.ndarray:
    """A WAV file's samples as a mono float32 waveform in [-1, 1] (its channels averaged); a ``CallError`` naming what
    the file is, or what is wrong with it, and the ffmpeg command that makes one at ``rate`` Hz this reads, where it
    is not such a file, is at another rate or is over ``seconds`` long (None: any length)."""
    fix = _fix(data, rate, filename)
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise CallError(f"the audio file is {_found(data)}, not WAV; WAV (RIFF/WAVE) files of PCM "
                        f"integers or floats are taken. Convert it: {fix}")
    fmt, samples, at = None, None, 12
    while at + 8 <= len(data):
        chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        body = data[at + 8:at + 8 + size]
        if chunk == b"data" and size == 0xFFFFFFFF:  # a stream's (ffmpeg's to a pipe): its length left unknown
            body = data[at + 8:]
        elif len(body) < size:
            raise CallError(f"the WAV file is truncated: its {chunk.decode('latin-1')!r} chunk declares {size} bytes "
                            f"and {len(body)} follow. Send the whole file, or make one again: {fix}")
        if chunk == b"fmt ":
            fmt = _format(body, fix)
        elif chunk == b"data" and samples is None:
            samples = body
        at += 8 + len(body) + (len(body) & 1)
    if fmt is None or samples is None:
        raise CallError(f"the WAV file has no {'fmt ' if fmt is None else 'data'!r} chunk (is it truncated?). Make "
                        f"one again: {fix}")
    kind, channels, file_rate = fmt
    if file_rate != rate:
        raise CallError(f"the WAV file is sampled at {file_rate} Hz; this model hears {rate} Hz audio, and nothing "
                        f"is resampled. Resample it: {fix}")
    frame = int(kind[-1]) * channels
    if len(samples) % frame:
        raise CallError(f"the WAV file's data ({len(samples)} bytes) is not a whole number of {frame}-byte frames (is it "
                        f"truncated?). Make it again: {fix}")
    frames = len(samples) // frame
    if not frames:
        raise CallError("the WAV file holds no samples (its data chunk is empty).")
    if seconds is not None and frames > rate * seconds:
        raise CallError(f"the audio is {frames / rate:.10g} s long ({frames} samples at {rate} Hz); this model hears "
                        f"at most {seconds} s: split it into pieces of at most {seconds} s and send each.")
    return _mono(_decode(samples, kind), channels)


def _format(body: bytes, fix: str) -> tuple[str, int, int]:
    """A ``fmt `` chunk's sample type (a numpy dtype's name; ``i3``: 24-bit integers), channels and sampling rate."""
    if len(body) < 16:
        raise CallError(f"the WAV file's fmt chunk is {len(body)} bytes, too short to say its format. Make it again: "
                        f"{fix}")
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", body)
    if tag == _EXTENSIBLE:
        if len(body) < 40 or body[26:40] != _GUID_TAIL:
            raise CallError(f"the WAV file is WAVE_FORMAT_EXTENSIBLE without a sub-format read here (PCM or "
                            f"IEEE float). Convert it: {fix}")
        tag = struct.unpack_from("<H", body, 24)[0]
    kinds = {(_PCM, 8): "u1", (_PCM, 16): "<i2", (_PCM, 24): "i3", (_PCM, 32): "<i4", (_FLOAT, 32): "<f4",
             (_FLOAT, 64): "<f8"}
    if (tag, bits) not in kinds:
        what = (f"{bits}-bit PCM" if tag == _PCM else f"{bits}-bit IEEE float" if tag == _FLOAT else
                f"format tag {tag:#x} ({_TAGS.get(tag, 'a compressed or unknown encoding')})")
        raise CallError(f"the WAV file holds {what} samples; read are PCM integers (8-bit unsigned; 16, 24, "
                        f"32-bit) and IEEE floats (32, 64-bit). Convert it: {fix}")
    if not channels or align != channels * bits // 8:
        raise CallError(f"the WAV file's fmt chunk is inconsistent: {channels} channels of {bits} bits with frames of "
                        f"{align} bytes. Make it again: {fix}")
    return kinds[tag, bits], channels, rate


def _decode(data: bytes, kind: str) -> np.ndarray:
    """Samples of ``kind`` (``_format``'s) as float32 in [-1, 1] (floats as they are)."""
    if kind == "i3":
        b = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8  # sign-extended from the top byte
        return (ints / np.float32(1 << 23)).astype(np.float32)
    dtype = np.dtype(kind)
    x = np.frombuffer(data, dtype)
    if dtype.kind == "f":
        return x.astype(np.float32)
    if dtype.kind == "u":  # 8-bit PCM is unsigned, silence at 128
        return ((x.astype(np.float32) - 128) / np.float32(128)).astype(np.float32)
    return (x / np.float32(2.0 ** (8 * dtype.itemsize - 1))).astype(np.float32)


def _mono(x: np.ndarray, channels: int) -> np.ndarray:
    return x if channels == 1 else x.reshape(-1, channels).mean(axis=1, dtype=np.float32)


def _found(data: bytes) -> str:
    """What a file that is not WAV looks like, by its first bytes."""
    for magic, at, what, _ in _MAGIC:
        if data[at:at + len(magic)] == magic:
            return what
    if data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2", b"\xff\xfa"):
        return "MP3 (an MPEG audio frame)"
    if data[:2] in (b"\xff\xf1", b"\xff\xf9"):
        return "AAC (ADTS)"
    if data[:4] == b"RIFF":
        return f"a RIFF file of type {data[8:12].decode('latin-1')!r}"
    if not data:
        return "empty (0 bytes)"
    return f"of a format not known here (its first bytes: {data[:8]!r})"


def _fix(data: bytes, rate: int, filename: str | None) -> str:
    """The ffmpeg command that makes of the file given a WAV read here."""
    ext = next((e for magic, at, _, e in _MAGIC if data[at:at + len(magic)] == magic), None)
    name = filename if filename and re.fullmatch(r"[\w.+-]{1,80}", filename) else f"in.{ext or 'mp3'}"
    out = "out.wav" if name != "out.wav" else "out16k.wav"
    return f"ffmpeg -i {name} -ar {rate} -ac 1 {out}"
