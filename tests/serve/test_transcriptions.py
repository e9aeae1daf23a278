"""OpenAI's audio API on the server (``serve/audio.py``): ``POST /v1/audio/transcriptions`` and ``/translations`` over a
speech model.

A tiny Whisper (``examples/speech_checkpoint.py``) is built with ``task=generate`` once and served. WAV files of seeded
random waveforms (1 to 4 s at 16 kHz; 16-bit PCM written by ``wave``, float32 and WAVE_FORMAT_EXTENSIBLE written by
hand) posted as forms must be answered with the text ``runtime.load(art).transcribe`` gives for the same waveform, and
that is transformers' (its feature extractor, ``generate`` and ``batch_decode``), the language given or detected;
translations as ``transcribe(task="translate")``; stereo averaged; requests at once each their own answer; and what the
routes cannot serve refused (400, 404, 415) naming what is wrong.
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
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(ckpt)
    feats = extractor(audio, sampling_rate=RATE, return_tensors="np").input_features
    with torch.no_grad():
        ids = model.generate(torch.tensor(feats), max_new_tokens=ROOM, **kw)
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
        (TRANSCRIBE, pcm16(np.zeros((31 * RATE, 1), np.int16)), {}, 400, "the audio is 31 s long"),
        (TRANSCRIBE, good, {"response_format": "srt"}, 400, "it takes json or text"),
        (TRANSCRIBE, good, {"prompt": "earlier words"}, 400, "prompt: conditioning"),
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
