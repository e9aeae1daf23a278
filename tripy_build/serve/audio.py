"""OpenAI's audio API over the speech models (Whisper's, built with ``task=generate``) that store a tokenizer: the
requests and answers of ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``, without the transport
(``app.py`` runs them on ``generation.Generator``, beside other requests' decode steps).

A request is ``multipart/form-data`` (RFC 7578), as OpenAI's clients and ``curl -F`` send it::

    curl URL/v1/audio/transcriptions -F file=@speech.wav -F model=whisper -F language=fr -F response_format=srt

Its fields: ``file`` (the audio), ``model`` (a served speech model's name), ``language`` (transcriptions only: a code
such as ``fr``; left out, a multilingual model detects it in the first 30 s), ``response_format``, ``temperature`` (0:
greedy, the default where the checkpoint does not sample), ``prompt`` (a text the decoder reads before each reply:
a previous transcript, or the names and terms the audio holds; ``<|startofprev|>`` and its tokens, as transformers'
``prompt_ids``) and ``timestamp_granularities[]`` (``segment``, the only one built). A translation is to English
(``<|translate|>``), its language detected. The formats, as OpenAI's:

- ``json`` (the default): ``{"text": ...}``; ``text``: the text alone, as ``text/plain``;
- ``verbose_json``: ``{"task", "language" (its name: "english"), "duration" (seconds), "text", "segments": [{"id",
  "seek" (the window's first feature frame), "start", "end" (seconds), "text", "tokens", "temperature",
  "avg_logprob", "compression_ratio", "no_speech_prob"}]}``;
- ``srt`` and ``vtt``: the segments as subtitles (SubRip's numbered cues at ``HH:MM:SS,mmm``; WebVTT's at
  ``HH:MM:SS.mmm``), as ``text/plain``.

Audio of at most 30 s (one window) in ``json`` or ``text`` is one reply without timestamps, as ``transcribe`` gives
it. Longer audio, and the formats with segments, are transcribed window by window with timestamps
(``runtime/longform.Windows``, as ``transcribe`` does): each window is a request of its own to the running batch,
the next one starting where the last whole segment ended, in the language the first was detected in; each segment
carries its window's scores (``longform.scores``). What is not built is refused by name rather than ignored: word
timestamps (``timestamp_granularities[]=word``: cross-attention alignment), any other field; and the long-form
fallbacks (temperature fallback, no-speech detection, conditioning on the previous window) are not run, as
transformers leaves them off by default.

The file is WAV, read by ``runtime/audio.wav`` (PCM or float samples, channels averaged to mono; at the model's
sampling rate, of any length within the server's ``--max-body-bytes``, else refused with the ffmpeg command that
makes one that is).
"""

from __future__ import annotations

import email.policy
from typing import Any, NamedTuple

import numpy as np

from ..errors import CallError
from ..runtime.audio import wav
from ..runtime.transcription import CODES, Opening, prompt_ids, room

ROUTES = {"transcriptions": "transcribe", "translations": "translate"}  # /v1/audio/<route>: its task
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")  # response_format
SEGMENTED = ("verbose_json", "srt", "vtt")  # the formats of segments: transcribed with timestamps
GRANULARITIES = "timestamp_granularities[]"  # an array field: OpenAI's clients send one part per value
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", GRANULARITIES)
MAX_PARTS = 32  # a form's parts: OpenAI's clients send at most seven
NAMES = {code: name for name, code in reversed(CODES.items())}  # a language's name (OpenAI's) by code: the first


class Part(NamedTuple):
    """One field of a form: its content, and the file name it came with (None: a plain field)."""

    content: bytes
    filename: str | None


def form(body: bytes, content_type: bytes) -> dict[str, list[Part]]:
    """A ``multipart/form-data`` body's fields by name, each its parts (RFC 7578: parts between ``--BOUNDARY`` lines,
    each with a ``Content-Disposition: form-data; name=...`` header; only an array's name, ``name[]``, repeats); a
    ``CallError`` saying what is malformed."""
    header = email.policy.HTTP.header_factory("content-type", content_type.decode("latin-1"))
    boundary = header.params.get("boundary")
    if not boundary or len(boundary) > 70:
        raise CallError("the multipart/form-data body's Content-Type has no boundary (of 1 to 70 characters); send "
                        "the form as OpenAI's clients or curl -F do.")
    delimiter = b"--" + boundary.encode("latin-1")
    at = body.find(delimiter)
    if at < 0 or (at and body[at - 2:at] != b"\r\n"):
        raise CallError(f"the multipart/form-data body has no part: its boundary {boundary[:70]!r} is not in it.")
    fields: dict[str, list[Part]] = {}
    parts = 0
    at += len(delimiter)
    while body[at:at + 2] != b"--":  # the closing delimiter
        line = body.find(b"\r\n", at)
        head = body.find(b"\r\n\r\n", line)  # the part's headers end (at line itself where it has none)
        if line < 0 or head < 0 or body[at:line].strip(b" \t"):
            raise CallError("the multipart/form-data body is malformed: after each boundary line, a part's headers and "
                            "a blank line are expected.")
        end = body.find(b"\r\n" + delimiter, head + 4)
        if end < 0:
            raise CallError("the multipart/form-data body ends before its closing boundary (was it cut short?).")
        name, filename = _disposition(body[line + 2:head])
        if name in fields and not name.endswith("[]"):
            raise CallError(f"the form gives the field {name[:60]!r} twice; give it once (only an array field, "
                            "named with [], repeats).")
        if parts == MAX_PARTS:
            raise CallError(f"the form has over {MAX_PARTS} parts.")
        parts += 1
        fields.setdefault(name, []).append(Part(body[head + 4:end], filename))
        at = end + 2 + len(delimiter)
    return fields


def _disposition(head: bytes) -> tuple[str, str | None]:
    """A part's field name and file name, from its headers."""
    for line in head.decode("utf-8", errors="replace").split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            header = email.policy.HTTP.header_factory("content-disposition", value.strip())
            if header.content_disposition == "form-data" and header.params.get("name"):
                return header.params["name"], header.params.get("filename")
    raise CallError("a part of the multipart/form-data body has no 'Content-Disposition: form-data; name=...' header.")


class Request:
    """A transcription or translation request (``route``: a key of ``ROUTES``), its form read and checked; the
    audio is decoded by ``features``, where the model is known."""

    def __init__(self, route: str, body: bytes, content_type: bytes):
        self.route, self.task = route, ROUTES[route]
        self.duration, self.windowed = 0.0, False  # set by features
        fields = form(body, content_type)
        known = [f for f in FIELDS if route == "transcriptions" or f != "language"]
        for name in fields:
            if name not in known:
                why = (" (a translation is to English, and the spoken language is detected)"
                       if name == "language" else "")
                raise CallError(f"{name[:60]!r} is not a field of /v1/audio/{route}{why}; it takes "
                                f"{', '.join(known)}.")
        if "file" not in fields:
            raise CallError("the form has no 'file' field: send the audio, as curl -F file=@speech.wav does (a WAV "
                            "file at the model's sampling rate).")
        self.file = fields["file"][0]
        self.model = self._text(fields, "model")
        if not self.model:
            raise CallError("the form's 'model' field must name a served speech model (GET /v1/models lists them).")
        self.language = self._text(fields, "language") or None
        self.prompt = self._text(fields, "prompt") or None
        self.format = self._text(fields, "response_format") or "json"
        if self.format not in FORMATS:
            raise CallError(f"response_format={self.format[:40]!r} is not one OpenAI's audio API has; it takes "
                            f"{', '.join(FORMATS[:-1])} or {FORMATS[-1]}.")
        for given in [self._text({GRANULARITIES: [p]}, GRANULARITIES) for p in fields.get(GRANULARITIES, ())]:
            if given == "word":
                raise CallError(f"{GRANULARITIES}=word: word timestamps (aligned by cross-attention) are not built "
                                "here; ask for segment (in verbose_json), or leave it out.")
            if given != "segment":
                raise CallError(f"{GRANULARITIES}={given[:40]!r}: it takes segment (word timestamps are not built).")
        self.temperature = None
        if (given := self._text(fields, "temperature")) is not None:
            try:
                self.temperature = float(given)
            except ValueError:
                self.temperature = None
            if self.temperature is None or not 0 <= self.temperature <= 1:
                raise CallError(f"temperature={given[:40]!r}: a number in [0, 1] (0: greedy).")

    @staticmethod
    def _text(fields: dict[str, list[Part]], name: str) -> str | None:
        if name not in fields:
            return None
        try:
            return fields[name][0].content.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CallError(f"the form's {name!r} field is not UTF-8 text.") from None

    def features(self, spec: Any, tokenizer: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """The audio's log-mel features ``[mel, frames]`` for the model of generation ``spec``
        (``runtime/audio.LogMel``), and the options its generation is submitted with: its language and task, its
        ``prompt`` as ids (``transcription.prompt_ids``, with the model's ``tokenizer``), and as many new tokens as
        the decoder has room for after them. Sets ``duration`` (the audio's seconds) and
        ``windowed``: whether it is transcribed window by window with timestamps (``longform.Windows``: its features
        all its frames, of a window at least, as ``LogMel.long`` gives them), else one window's, its reply without."""
        from ..runtime.audio import LogMel

        mel = LogMel(**spec.audio)
        waveform = wav(self.file.content, mel.sampling_rate, None, self.file.filename)
        self.duration = waveform.size / mel.sampling_rate
        self.windowed = self.format in SEGMENTED or waveform.size > mel.n_samples
        opening = Opening.of(spec.opening)
        task = self.task
        try:
            if task == "transcribe" and not _translates(opening, self.language):
                task = None  # the checkpoint's opening, which transcribes (an English-only model takes no task)
            tokens = opening.tokens(self.language, task, self.windowed)
        except CallError as e:
            raise CallError(str(e).removeprefix("generate(): ")) from None
        before = [] if self.prompt is None else prompt_ids(tokenizer, spec, self.prompt)
        options = {"max_new_tokens": room(spec, before, tokens), "language": self.language, "task": task}
        if before:
            options["prompt_ids"] = before
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.windowed:
            return mel.long([waveform])[0][0], {**options, "timestamps": True}
        return mel(waveform, mel.sampling_rate)[0], options

    def answer(self, text: str, segments: list[dict[str, Any]] | None = None, language: str | None = None
               ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The answer's body and its Content-Type header: of the reply's ``text``, and where the format has them its
        ``segments`` (``decoded``) and ``language`` (its name, ``spoken``)."""
        plain = [(b"content-type", b"text/plain; charset=utf-8")]
        if self.format == "text":
            return text.encode(), plain
        if self.format in ("srt", "vtt"):
            return subtitles(segments or [], self.format).encode(), plain
        import orjson

        if self.format == "verbose_json":
            return orjson.dumps({"task": self.task, "language": language, "duration": self.duration, "text": text,
                                 "segments": segments}), [(b"content-type", b"application/json")]
        return orjson.dumps({"text": text}), [(b"content-type", b"application/json")]


def decoded(windows: Any, decode: Any) -> tuple[str, list[dict[str, Any]]]:
    """The text of a request's segments (``runtime/longform.Windows``; ``decode``: the tokenizer's, of their tokens
    without timestamps, all at once as ``transcribe`` decodes them) and each segment as ``verbose_json`` has it, its
    times to the hundredth."""
    def text(tokens: Any) -> str:
        return decode([t for t in tokens if t < windows.begin])
    return text([t for _, s in windows.segments for t in s.tokens]), [
        {"id": i, "seek": seek, "start": round(s.start, 2), "end": round(s.end, 2), "text": text(s.tokens),
         "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
         "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
        for i, (seek, s) in enumerate(windows.segments)]


def subtitles(segments: list[dict[str, Any]], kind: str) -> str:
    """The segments as a SubRip (``srt``) or WebVTT (``vtt``) file: a cue each, its text stripped (and ``-->``, which
    would end its timing line's meaning, written ``->``, as OpenAI's whisper writes them)."""
    comma = "," if kind == "srt" else "."

    def at(seconds: float) -> str:
        ms = round(seconds * 1000)
        return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{comma}{ms % 1000:03d}"
    cues = [f"{at(s['start'])} --> {at(s['end'])}\n{s['text'].strip().replace('-->', '->')}\n" for s in segments]
    if kind == "srt":
        return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(cues, 1))
    return "WEBVTT\n\n" + "\n".join(cues)


def spoken(spec: Any, token: int | None) -> str | None:
    """A reply's language as OpenAI names it (``english``), from its language token (None: the model has none, an
    English-only one); its code where it has no name."""
    opening = Opening.of(spec.opening)
    code = next((k.strip("<|>") for k, v in (opening.languages or {}).items() if v == token), None)
    if code is None:
        return "english" if token is None else None
    return NAMES.get(code, code)


def _translates(opening: Any, language: str | None) -> bool:
    """Whether the checkpoint's own opening (no task given) would translate."""
    try:
        tokens = opening.tokens(language, None)
    except CallError:
        return False
    return bool(opening.tasks) and opening.tasks.get("translate") in tokens
