"""OpenAI's audio API on the server (``serve/audio.py``): ``POST /v1/audio/transcriptions`` and ``/translations`` over a
speech model.

A tiny Whisper (``examples/speech_checkpoint.py``) is built with ``task=generate`` once and served. WAV files of seeded
random waveforms (1 to 4 s at 16 kHz; 16-bit PCM written by ``wave``, float32 and WAVE_FORMAT_EXTENSIBLE written by
hand) posted as forms must be answered with the text ``runtime.load(art).transcribe`` gives for the same waveform, and
that is transformers' (its feature extractor, ``generate`` and ``batch_decode``), the language given or detected;
translations as ``transcribe(task="translate")``; stereo averaged; requests at once each their own answer; and what the
routes cannot serve refused (400, 404, 415) naming what is wrong.

Audio over 30 s (a tone with noise, 65 s: three windows or more) and the formats with segments (``verbose_json``,
``srt``, ``vtt``) are transcribed window by window with timestamps: their text and segments must be
``transcribe(waveform, return_timestamps=True)``'s, and two such requests at once must be answered as one at a time.
"""

from __future__ import annotations

import http.client
import io
import json
import struct
import uuid
import wave
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import transformers  # noqa: E402

from examples.speech_checkpoint import checkpoint as speech  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

MAX_LENGTH = 20
ROOM = MAX_LENGTH - 3  # the decoder's positions after the start token and the opening (language, task, no timestamps)
RATE = 16000
TRANSCRIBE, TRANSLATE = "/v1/audio/transcriptions", "/v1/audio/translations"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(transformers' model, the checkpoint, the artifact loaded, a ``post`` to the server) of a tiny Whisper built
    with task=generate and served."""
    root = tmp_path_factory.mktemp("whisper")
    model, _ = speech(root / "ckpt")
    r = run_cli("model=hf", "task=generate", f"generate.max_length={MAX_LENGTH}", "shapes.dims.batch=[1,1,4]",
                "shapes.buckets.batch=[1,2,4]", f"params.checkpoint={root / 'ckpt'}", f"artifacts_dir={root / 'arts'}",
                cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    art = next((root / "arts" / "whisper").iterdir())
    with Server([art], port=0).start() as srv:
        host, port = srv.url.split("//")[1].split(":")

        def post(route: str, body: bytes | None, content_type: str | None, method: str = "POST"
                 ) -> tuple[int, str, bytes]:
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request(method, route, body=body, headers={"content-type": content_type} if content_type else {})
            response = conn.getresponse()
            answer = response.read()
            conn.close()
            return response.status, response.getheader("content-type"), answer
        post.generator = srv.endpoints["whisper"].generator  # its statistics: decode steps, and the rows they carried
        yield model, root / "ckpt", runtime.load(art), post


def waveform(seconds: float, seed: int, channels: int = 1) -> np.ndarray:
    """Seeded noise as 16-bit samples ``[samples, channels]`` (so the WAV holds it exactly)."""
    return np.random.default_rng(seed).integers(-16000, 16000, (int(seconds * RATE), channels)).astype(np.int16)


def pcm16(samples: np.ndarray, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def float32(samples: np.ndarray, extensible: bool = False) -> bytes:
    """A WAV of IEEE float samples, its fmt chunk plain (tag 3) or WAVE_FORMAT_EXTENSIBLE."""
    channels = samples.shape[1]
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else 3, channels, RATE, RATE * 4 * channels, 4 * channels, 32)
    if extensible:
        fmt += struct.pack("<HHI", 22, 32, 0) + b"\x03\x00\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    data = samples.astype("<f4").tobytes()
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def mono(samples: np.ndarray) -> np.ndarray:
    return samples.astype(np.float32).mean(axis=1) / 32768


def form(fields: dict[str, str], audio: bytes | None = None, filename: str = "speech.wav") -> tuple[bytes, str]:
    """A multipart/form-data body as OpenAI's client (httpx) sends it, and its Content-Type."""
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    if audio is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                     f"Content-Type: audio/wav\r\n\r\n".encode() + audio + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def ask(post, route: str, audio: bytes | None, **fields: str) -> tuple[int, str, bytes]:
    return post(route, *form({"model": "whisper", **fields}, audio))


def text_of(post, route: str, audio: bytes, **fields: str) -> str:
    status, _, body = ask(post, route, audio, **fields)
    assert status == 200, body
    return json.loads(body)["text"]


def hf_text(model, ckpt, audio: list[np.ndarray], **kw) -> list[str]:
    """transformers' text of one window each (``force_unique_generate_call``: else a reply of this random model holding
    two timestamp tokens in a row is cut there and the window run again from that time, as its long-form loop runs
    every call)."""
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(ckpt)
    feats = extractor(audio, sampling_rate=RATE, return_tensors="np").input_features
    with torch.no_grad():
        ids = model.generate(torch.tensor(feats), max_new_tokens=ROOM, force_unique_generate_call=True, **kw)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    return tok.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("width", [1, 3, 4])
def test_pcm_of_each_width_is_read_as_ffmpeg_reads_it(width):
    """8-bit (unsigned), 24 and 32-bit PCM, two channels: each sample over 2^(bits-1) (8-bit less 128), averaged."""
    from tripy_build.serve.audio import wav

    bits = 8 * width
    ints = np.random.default_rng(width).integers(-(1 << bits - 1), 1 << bits - 1, (500, 2), dtype=np.int64)
    stored = ints + 128 if width == 1 else ints
    raw = np.stack([(stored >> (8 * i)) & 255 for i in range(width)], axis=-1).astype(np.uint8).tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(width)
        w.setframerate(RATE)
        w.writeframes(raw)
    want = (ints / float(1 << bits - 1)).mean(axis=1)
    np.testing.assert_allclose(wav(out.getvalue(), RATE, 30), want, rtol=0, atol=1e-7)


def test_transcriptions_are_transcribe_and_transformers_text(served):
    """16-bit PCM and float32 WAVs (plain and extensible), the language given or detected, JSON or text: the text
    ``transcribe`` and transformers give for the waveform."""
    model, ckpt, loaded, post = served
    samples = [waveform(1.5, 1), waveform(4, 2)]
    waves = [mono(s) for s in samples]
    for language in ("en", None):
        kw = {} if language is None else {"language": language}
        want = hf_text(model, ckpt, waves, **kw)
        assert loaded.transcribe(waves, sampling_rate=RATE, **kw) == want and any(want)
        assert [text_of(post, TRANSCRIBE, pcm16(s), **kw) for s in samples] == want
    assert text_of(post, TRANSCRIBE, float32(waves[0][:, None]), language="en") == \
        loaded.transcribe(waves[0], language="en")[0]
    assert text_of(post, TRANSCRIBE, float32(waves[1][:, None], extensible=True)) == loaded.transcribe(waves[1])[0]
    status, content_type, body = ask(post, TRANSCRIBE, pcm16(samples[1]), language="en", response_format="text",
                                     temperature="0")
    assert (status, content_type) == (200, "text/plain; charset=utf-8")
    assert body.decode() == loaded.transcribe(waves[1], language="en")[0]


def test_translations_stereo_and_requests_at_once(served):
    _, _, loaded, post = served
    samples = [waveform(s, 10 + s) for s in (1, 2, 3)]
    waves = [mono(s) for s in samples]
    assert text_of(post, TRANSLATE, pcm16(samples[0])) == loaded.transcribe(waves[0], task="translate")[0]
    # stereo: the channels averaged (x + d and x - d: their mean is x, exactly)
    x, d = samples[1].astype(np.int32) // 2 * 2, np.random.default_rng(5).integers(-2000, 2000, samples[1].shape) * 2
    assert text_of(post, TRANSCRIBE, pcm16(np.concatenate([x + d, x - d], axis=1)), language="en") == \
        loaded.transcribe(x[:, 0].astype(np.float32) / 32768, language="en")[0]
    want = [loaded.transcribe(w, language="en")[0] for w in waves]
    assert len(set(want)) > 1, want
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda s: text_of(post, TRANSCRIBE, pcm16(s), language="en"), samples))
    assert got == want


def test_what_the_routes_cannot_serve_is_refused_by_name(served):
    _, _, _, post = served
    good = pcm16(waveform(1, 3))
    cases = [
        (TRANSCRIBE, b"ID3\x04\x00" + bytes(200), {}, 400, "is MP3 (an ID3 tag), not WAV"),
        (TRANSCRIBE, b"\xff\xfb\x90\x00" + bytes(200), {}, 400, "ffmpeg -i speech.wav -ar 16000 -ac 1 out.wav"),
        (TRANSCRIBE, good[:30], {}, 400, "truncated"),
        (TRANSCRIBE, pcm16(waveform(1, 3), rate=8000), {}, 400, "sampled at 8000 Hz; this model hears 16000 Hz"),
        (TRANSCRIBE, good, {"response_format": "csv"}, 400, "it takes json, text, verbose_json, srt or vtt"),
        (TRANSCRIBE, good, {"timestamp_granularities[]": "word"}, 400, "timestamp_granularities[]=word: word "
         "timestamps (aligned by cross-attention) are not built"),
        (TRANSCRIBE, good, {"prompt": "a <|en|> token"}, 400, "prompt='a <|en|> token' holds special tokens"),
        (TRANSCRIBE, good, {"stream": "true"}, 400, "'stream' is not a field of /v1/audio/transcriptions; it takes file"),
        (TRANSCRIBE, good, {"language": "xx"}, 400, "language='xx' is not one of this model's languages"),
        (TRANSCRIBE, good, {"temperature": "hot"}, 400, "a number in [0, 1]"),
        (TRANSLATE, good, {"language": "fr"}, 400, "'language' is not a field of /v1/audio/translations"),
        (TRANSCRIBE, None, {}, 400, "the form has no 'file' field"),
        (TRANSCRIBE, good, {"model": "gpt"}, 404, "model 'gpt': it is not served here; the speech models here: whisper"),
    ]
    for route, audio, fields, status, fragment in cases:
        got, _, body = post(route, *form({"model": "whisper", **fields}, audio, "speech.wav"))
        error = json.loads(body)["error"]
        assert (got, error["type"]) == (status, "invalid_request_error") and fragment in error["message"], \
            (fragment, error)
    # an array field repeats (OpenAI's clients send a part per value), a plain one does not
    for name, value, fragment in (("timestamp_granularities[]", "word", "timestamp_granularities[]=word"),
                                  ("model", "whisper", "the form gives the field 'model' twice")):
        body, content_type = form({"model": "whisper", "timestamp_granularities[]": "segment"}, good)
        boundary = content_type.split("=")[1]
        part = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        got, _, answer = post(TRANSCRIBE, part + body, content_type)
        assert got == 400 and fragment in json.loads(answer)["error"]["message"], answer
    got, _, body = post(TRANSCRIBE, json.dumps({"model": "whisper"}).encode(), "application/json")
    assert got == 415 and "send multipart/form-data" in json.loads(body)["error"]["message"]
    # the speech model elsewhere: named where it is served, and listed
    speech_model = "it is a speech model: it takes audio, on OpenAI's POST /v1/audio/transcriptions"
    got, _, body = post("/v1/chat/completions", json.dumps({"model": "whisper", "messages": [
        {"role": "user", "content": "hi"}]}).encode(), "application/json")
    assert got == 404 and speech_model in json.loads(body)["error"]["message"]
    got, _, body = post("/v2/models/whisper/generate", json.dumps({"input_ids": [1, 2]}).encode(), "application/json")
    assert got == 404 and speech_model in json.loads(body)["error"]
    got, _, body = post("/v1/models", None, None, "GET")
    assert got == 200 and [m["id"] for m in json.loads(body)["data"]] == ["whisper"]
    # a form anywhere else is still refused
    got, _, body = post("/v1/completions", *form({"model": "whisper", "prompt": "hi"}))
    assert got == 415 and "a web form's type" in json.loads(body)["error"]["message"]


def tone(seconds: float, seed: int, hz: float = 440) -> np.ndarray:
    """A tone with seeded noise as 16-bit samples ``[samples, 1]``."""
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * hz * t) + np.random.default_rng(seed).normal(0, 0.05, t.size)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)[:, None]


@pytest.fixture(scope="module")
def long_audio(served):
    """Two long WAVs (65 s and 40 s) and what ``transcribe`` gives each with its segments."""
    _, _, loaded, _ = served
    samples = [tone(65, 7), tone(40, 8, hz=300)]
    return [(pcm16(s), loaded.transcribe(mono(s), return_timestamps=True)[0]) for s in samples]


def subtitle(segments: list[dict], kind: str) -> str:
    def at(seconds: float) -> str:
        ms = round(seconds * 1000)
        h, m, s = ms // 3600000, ms // 60000 % 60, ms // 1000 % 60
        return f"{h:02d}:{m:02d}:{s:02d}{',' if kind == 'srt' else '.'}{ms % 1000:03d}"
    cues = [f"{at(s['start'])} --> {at(s['end'])}\n{s['text'].strip().replace('-->', '->')}\n" for s in segments]
    return "\n".join(f"{i}\n{c}" for i, c in enumerate(cues, 1)) if kind == "srt" else "WEBVTT\n\n" + "\n".join(cues)


def same_segments(got: list[dict], want: list[dict]) -> bool:
    """The segments' times and texts equal; their windows' scores too, to float32's rounding (a window's logits
    differ in their last bits with the batch it ran in)."""
    keys = ("temperature", "avg_logprob", "compression_ratio", "no_speech_prob")
    assert [{k: s[k] for k in ("start", "end", "text")} for s in got] == \
           [{k: s[k] for k in ("start", "end", "text")} for s in want]
    assert all(s["temperature"] == 0.0 and s["avg_logprob"] < 0 and 0 < s["no_speech_prob"] < 1 for s in got)
    return [s[k] for s in got for k in keys] == pytest.approx([s[k] for s in want for k in keys], rel=1e-5)


def test_long_audio_is_transcribed_as_transcribe_does(served, long_audio):
    """Over 30 s in json: the runtime's long-form text; in verbose_json: its segments, with the task, the language
    detected (by name) and the duration."""
    _, _, loaded, post = served
    audio, want = long_audio[0]
    assert len(want["segments"]) > 1 and want["segments"][-1]["end"] > 30, want
    assert want["text"] == loaded.transcribe(mono(tone(65, 7)))[0]
    assert text_of(post, TRANSCRIBE, audio) == want["text"]
    status, content_type, body = ask(post, TRANSCRIBE, audio, response_format="verbose_json",
                                     **{"timestamp_granularities[]": "segment"})
    assert (status, content_type) == (200, "application/json"), body
    got = json.loads(body)
    assert (got["task"], got["duration"], got["text"]) == ("transcribe", 65.0, want["text"])
    assert got["language"] in ("english", "french", "german", "spanish")
    assert same_segments(got["segments"], want["segments"])
    assert [s["id"] for s in got["segments"]] == list(range(len(want["segments"])))
    seeks = [s["seek"] for s in got["segments"]]
    assert seeks[0] == 0 and seeks == sorted(seeks) and seeks[-1] > 0
    assert all(s["tokens"] and s["start"] >= s["seek"] / 100 for s in got["segments"])


def test_segments_as_subtitles(served, long_audio):
    """srt and vtt of the long audio's segments; a short one's verbose_json, with timestamps all the same."""
    _, _, loaded, post = served
    audio, want = long_audio[0]
    for kind in ("srt", "vtt"):
        status, content_type, body = ask(post, TRANSCRIBE, audio, response_format=kind)
        assert (status, content_type) == (200, "text/plain; charset=utf-8")
        assert body.decode() == subtitle(want["segments"], kind)
    assert subtitle([{"start": 3725.5, "end": 3726.004, "text": " a --> b "}], "srt") == \
        "1\n01:02:05,500 --> 01:02:06,004\na -> b\n"
    short = waveform(2, 4)
    want = loaded.transcribe(mono(short), language="en", return_timestamps=True)[0]
    status, _, body = ask(post, TRANSCRIBE, pcm16(short), language="en", response_format="verbose_json")
    got = json.loads(body)
    assert (status, got["language"], got["duration"], got["text"]) == (200, "english", 2.0, want["text"])
    assert same_segments(got["segments"], want["segments"])


def test_a_prompt_is_transcribe_prompt(served, long_audio):
    """The form's ``prompt``: the text ``transcribe(prompt=...)`` gives, short and long (each window read after it),
    and not the text without it."""
    _, _, loaded, post = served
    short = waveform(2, 4)
    for audio, samples in ((pcm16(short), mono(short)), (long_audio[0][0], mono(tone(65, 7)))):
        want = loaded.transcribe(samples, prompt="hello world")[0]
        assert text_of(post, TRANSCRIBE, audio, prompt="hello world") == want
    assert want != long_audio[0][1]["text"]


def test_long_requests_at_once(served, long_audio):
    """Two long requests at once answered as each alone, their windows in shared batches."""
    _, _, _, post = served
    alone = [ask(post, TRANSCRIBE, audio, response_format="verbose_json") for audio, _ in long_audio]
    assert [json.loads(b)["text"] for _, _, b in alone] == [want["text"] for _, want in long_audio]
    generator = post.generator
    steps, rows = generator.steps_run, generator.rows_run
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda a: ask(post, TRANSCRIBE, a[0], response_format="verbose_json"), long_audio))
    for (status, kind, body), (status_alone, kind_alone, body_alone) in zip(together, alone):
        got, want = json.loads(body), json.loads(body_alone)
        assert (status, kind, got["text"], got["language"]) == (status_alone, kind_alone, want["text"], want["language"])
        assert same_segments(got["segments"], want["segments"])
    # their windows shared decode steps (a window waiting for the running batch starts the next with the other's)
    assert generator.rows_run - rows > generator.steps_run - steps
