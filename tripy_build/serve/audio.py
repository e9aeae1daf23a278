"""OpenAI's audio API over the speech models (Whisper's, built with ``task=generate``) that store a tokenizer: the
requests and answers of ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``, without the transport
(``app.py`` runs them on ``generation.Generator``, beside other requests' decode steps).

A request is ``multipart/form-data`` (RFC 7578), as OpenAI's clients and ``curl -F`` send it::

    curl URL/v1/audio/transcriptions -F file=@speech.wav -F model=whisper -F language=fr

Its fields: ``file`` (the audio), ``model`` (a served speech model's name), ``language`` (transcriptions only: a code
such as ``fr``; left out, a multilingual model detects it), ``response_format`` (``json``: ``{"text": ...}``, the
default; ``text``: the text alone, as ``text/plain``), ``temperature`` (0: greedy, the default where the checkpoint
does not sample). A translation is to English (``<|translate|>``), its language detected. What is not built is
refused by name rather than ignored: ``prompt`` (conditioning on a previous text), the other response formats
(``srt``, ``vtt``, ``verbose_json``: timestamps), any other field.

The file is WAV, read by ``runtime/audio.wav`` (PCM or float samples, channels averaged to mono; at the model's
sampling rate and at most 30 s, else refused with the ffmpeg command that makes one that is).
"""

from __future__ import annotations

import email.policy
from typing import Any, NamedTuple

import numpy as np

from ..errors import CallError
from ..runtime.audio import wav

ROUTES = {"transcriptions": "transcribe", "translations": "translate"}  # /v1/audio/<route>: its task
FORMATS = ("json", "text")  # response_format
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature")
MAX_PARTS = 32  # a form's parts: OpenAI's clients send at most seven
class Part(NamedTuple):
    """One field of a form: its content, and the file name it came with (None: a plain field)."""

    content: bytes
    filename: str | None


def form(body: bytes, content_type: bytes) -> dict[str, Part]:
    """A ``multipart/form-data`` body's fields by name (RFC 7578: parts between ``--BOUNDARY`` lines, each with a
    ``Content-Disposition: form-data; name=...`` header); a ``CallError`` saying what is malformed."""
    header = email.policy.HTTP.header_factory("content-type", content_type.decode("latin-1"))
    boundary = header.params.get("boundary")
    if not boundary or len(boundary) > 70:
        raise CallError("the multipart/form-data body's Content-Type has no boundary (of 1 to 70 characters); send "
                        "the form as OpenAI's clients or curl -F do.")
    delimiter = b"--" + boundary.encode("latin-1")
    at = body.find(delimiter)
    if at < 0 or (at and body[at - 2:at] != b"\r\n"):
        raise CallError(f"the multipart/form-data body has no part: its boundary {boundary[:70]!r} is not in it.")
    fields: dict[str, Part] = {}
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
        if name in fields:
            raise CallError(f"the form gives the field {name!r} twice.")
        if len(fields) == MAX_PARTS:
            raise CallError(f"the form has over {MAX_PARTS} fields.")
        fields[name] = Part(body[head + 4:end], filename)
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
        fields = form(body, content_type)
        known = [f for f in FIELDS if route == "transcriptions" or f != "language"]
        for name in fields:
            if name not in known:
                why = (" (a translation is to English, and the spoken language is detected)"
                       if name == "language" else "")
                raise CallError(f"{name[:60]!r} is not a field of /v1/audio/{route}{why}; it takes "
                                f"{', '.join(f for f in known if f != 'prompt')}.")
        if "prompt" in fields:
            raise CallError("prompt: conditioning the reply on a previous text is not built here; leave it out.")
        if "file" not in fields:
            raise CallError("the form has no 'file' field: send the audio, as curl -F file=@speech.wav does (a WAV "
                            "file at the model's sampling rate).")
        self.file = fields["file"]
        self.model = self._text(fields, "model")
        if not self.model:
            raise CallError("the form's 'model' field must name a served speech model (GET /v1/models lists them).")
        self.language = self._text(fields, "language") or None
        self.format = self._text(fields, "response_format") or "json"
        if self.format not in FORMATS:
            raise CallError(f"response_format={self.format[:40]!r} is not served here; it takes {' or '.join(FORMATS)} "
                            "(srt, vtt and verbose_json need timestamps, which are not built).")
        self.temperature = None
        if (given := self._text(fields, "temperature")) is not None:
            try:
                self.temperature = float(given)
            except ValueError:
                self.temperature = None
            if self.temperature is None or not 0 <= self.temperature <= 1:
                raise CallError(f"temperature={given[:40]!r}: a number in [0, 1] (0: greedy).")

    @staticmethod
    def _text(fields: dict[str, Part], name: str) -> str | None:
        if name not in fields:
            return None
        try:
            return fields[name].content.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CallError(f"the form's {name!r} field is not UTF-8 text.") from None

    def features(self, spec: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """The audio's log-mel features ``[mel, frames]`` for the model of generation ``spec``
        (``runtime/audio.LogMel``), and the options its generation is submitted with: its language and task, and as
        many new tokens as the decoder has room for after its opening."""
        from ..runtime.audio import LogMel
        from ..runtime.transcription import Opening

        mel = LogMel(**spec.audio)
        waveform = wav(self.file.content, mel.sampling_rate, mel.chunk_length, self.file.filename)
        opening = Opening.of(spec.opening)
        task = self.task
        try:
            if task == "transcribe" and not _translates(opening, self.language):
                task = None  # the checkpoint's opening, which transcribes (an English-only model takes no task)
            tokens = opening.tokens(self.language, task)
        except CallError as e:
            raise CallError(str(e).removeprefix("generate(): ")) from None
        options = {"max_new_tokens": spec.room(0, len(tokens)), "language": self.language, "task": task}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        return mel(waveform, mel.sampling_rate)[0], options

    def answer(self, text: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The answer's body and its Content-Type header."""
        if self.format == "text":
            return text.encode(), [(b"content-type", b"text/plain; charset=utf-8")]
        import orjson

        return orjson.dumps({"text": text}), [(b"content-type", b"application/json")]


def _translates(opening: Any, language: str | None) -> bool:
    """Whether the checkpoint's own opening (no task given) would translate."""
    try:
        tokens = opening.tokens(language, None)
    except CallError:
        return False
    return bool(opening.tasks) and opening.tasks.get("translate") in tokens
