"""Whisper (``models/whisper.py``): its logits against transformers', and ``task=generate`` (``runtime/seq2seq.py``
with ``runtime/transcription.py``'s opening) against transformers' ``WhisperForConditionalGeneration.generate``.

A tiny Whisper with Whisper's kind of tokenizer, generation config and feature extractor
(``examples/speech_checkpoint.py``: four languages, the language detected, then ``<|transcribe|>``) is built through
the command line (``model=hf``) at batch buckets 1, 2 and 4. Its replies to random features, greedy and by beam search,
with the language detected or given and either task, must equal transformers' with both loaders, and its transcripts
of waveforms (``transcribe``) the text transformers' feature extractor, ``generate`` and ``batch_decode`` give.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import jax  # noqa: E402
import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.speech_checkpoint import TINY  # noqa: E402
from examples.speech_checkpoint import checkpoint as speech  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.models import hf  # noqa: E402
from tripy_build.models.whisper import Whisper  # noqa: E402
from tripy_build.runtime.audio import LogMel  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

MAX_LENGTH = 20
BUILD = ["model=hf", "task=generate", f"generate.max_length={MAX_LENGTH}", "shapes.dims.batch=[1,1,4]",
         "shapes.buckets.batch=[1,2,4]"]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(transformers' model, its tokenizer, the checkpoint, the artifact) of a tiny Whisper built with task=generate."""
    root = tmp_path_factory.mktemp("whisper")
    model, tok = speech(root / "ckpt")
    r = run_cli(*BUILD, f"params.checkpoint={root / 'ckpt'}", f"artifacts_dir={root / 'arts'}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return model, tok, root / "ckpt", next((root / "arts" / "whisper").iterdir())


def features(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 80, 3000)).astype(np.float32)


def hf_generate(model, feats: np.ndarray, n: int, **kw) -> list[list[int]]:
    """transformers' replies without timestamps: one window each (``force_unique_generate_call``: else a reply of this
    random model holding two timestamp tokens in a row is cut there and the window run again from that time, as its
    long-form loop runs every call), the opening left out."""
    with torch.no_grad():
        out = model.generate(torch.tensor(feats), max_new_tokens=n, force_unique_generate_call=True, **kw)
    stamp = model.generation_config.no_timestamps_token_id
    return [cut(r[r.index(stamp) + 1:], model.config.eos_token_id) for r in out.tolist()]


def cut(row, eos: int) -> list[int]:
    """A reply up to its first end, the end kept."""
    row = [int(t) for t in row]
    return row[:row.index(eos) + 1] if eos in row else row


def test_logits_and_states_equal_transformers(whisper):
    """Both heads from the checkpoint: the LM head's logits over a decoder text, and the bare model's decoder and
    encoder states, equal PyTorch's."""
    model, _, ckpt, _ = whisper
    feats, ids = features(2), np.random.default_rng(1).integers(0, model.config.vocab_size, (2, 5)).astype(np.int32)
    zoo, params = hf.load_pretrained(Whisper, ckpt)
    assert zoo.task == "conditional_generation" and zoo.d_model == TINY["d_model"]
    with torch.no_grad():
        want = model(input_features=torch.tensor(feats), decoder_input_ids=torch.tensor(ids).long())
        states = model.model(torch.tensor(feats), decoder_input_ids=torch.tensor(ids).long()).last_hidden_state
    got = jax.jit(zoo.apply)(params, feats, ids)
    np.testing.assert_allclose(np.asarray(got["logits"]), want.logits.numpy(), rtol=1e-4, atol=1e-4)
    bare, params = hf.load_pretrained(Whisper, ckpt, {"head": "none"})
    got = jax.jit(bare.apply)(params, feats, ids)
    np.testing.assert_allclose(np.asarray(got["last_hidden_state"]), states.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got["encoder_last_hidden_state"]),
                               want.encoder_last_hidden_state.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [{}, {"language": "fr"}, {"task": "translate"}, {"language": "de", "task": "translate"},
                                {"num_beams": 2}], ids=["detected", "fr", "translate", "de-translate", "beams"])
def test_replies_equal_transformers(whisper, kw):
    """Three sources at batch bucket 4 (one row padded): the language detected per source (transformers' detect_language)
    or given, the task, and beam search, with both loaders."""
    model, _, _, art = whisper
    feats = features(3)
    want = hf_generate(model, feats, 10, **kw)
    for loaded in (tb.load(art), runtime.load(art)):
        got = loaded.generate(input_features=feats, max_new_tokens=10, **kw)
        assert [cut(r, model.config.eos_token_id) for r in got.tolist()] == want


def test_the_language_is_detected_per_source(whisper):
    """The sources' detected languages differ (so detection is exercised), and each source's reply is the one the
    language detected for it gives when the call names it."""
    model, tok, _, art = whisper
    feats = np.stack([np.full((80, 3000), v, np.float32) for v in (-3.0, 0.0, 2.0, 3.0)])  # two languages here
    with torch.no_grad():
        detected = model.detect_language(torch.tensor(feats)).tolist()
    assert len(set(detected)) > 1, detected
    loaded = runtime.load(art)
    auto = loaded.generate(input_features=feats, max_new_tokens=8)
    for i, lang in enumerate(detected):
        code = tok.convert_ids_to_tokens(lang)[2:-2]
        named = loaded.generate(input_features=feats[i], max_new_tokens=8, language=code)
        assert named[0].tolist() == auto[i, :named.shape[1]].tolist()


def test_transcribe_gives_transformers_text(whisper):
    """Waveforms of 1.5 s and 4 s: the text transformers' feature extractor, generate and batch_decode give."""
    model, tok, ckpt, art = whisper
    rng = np.random.default_rng(7)
    audio = [rng.uniform(-0.5, 0.5, 24000).astype(np.float32), rng.uniform(-0.5, 0.5, 64000).astype(np.float32)]
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(ckpt)
    feats = extractor(audio, sampling_rate=16000, return_tensors="np").input_features
    with torch.no_grad():
        ids = model.generate(torch.tensor(feats), max_new_tokens=MAX_LENGTH - 3, language="en",
                             force_unique_generate_call=True)
    want = tok.batch_decode(ids, skip_special_tokens=True)
    got = runtime.load(art).transcribe(audio, sampling_rate=16000, language="en")
    assert got == want and any(got)


def test_bad_calls_are_refused_naming_the_fix(whisper):
    _, _, _, art = whisper
    loaded = runtime.load(art)
    cases = [
        (dict(input_ids=[[1, 2]], max_new_tokens=4), "speech model: give input_features"),
        (dict(input_features=np.zeros((1, 80, 2999), np.float32), max_new_tokens=4), r"\[batch, 80, 3000\]"),
        (dict(input_features=np.full((1, 80, 3000), np.nan, np.float32), max_new_tokens=4), r"input_features\[0\]"),
        (dict(input_features=features(1), max_new_tokens=4, language="xx"), r"among: de, en, es, fr"),
        (dict(input_features=features(1), max_new_tokens=4, task="summarize"), "this model's tasks are"),
        (dict(input_features=features(1), max_new_tokens=MAX_LENGTH), f"at most {MAX_LENGTH - 3}"),
    ]
    for kw, match in cases:
        with pytest.raises(CallError, match=match):
            loaded.generate(**kw)
    with pytest.raises(CallError, match="Resample the audio to 16000 Hz"):
        loaded.transcribe(np.zeros(8000, np.float32), sampling_rate=8000)
    with pytest.raises(CallError, match="For longer audio take LogMel.long's features"):
        LogMel(**loaded.metadata["generate"]["audio"])(np.zeros(16000 * 31, np.float32))
    long = features(2)[:, :, :2000].repeat(2, axis=-1)  # 4000 frames each
    timestamped = [
        (dict(input_features=long, max_new_tokens=4, return_timestamps=False), "return_timestamps=False with features "
                                                                               "over one window of 3000 frames"),
        (dict(input_features=long, max_new_tokens=4), "2 sources of 4000 frames .* and no attention_mask"),
        (dict(input_features=long, attention_mask=np.ones((2, 3000), np.int32), max_new_tokens=4),
         r"attention_mask has shape \(2, 3000\); .* 0/1 \[2, 4000\]"),
        (dict(input_features=long, attention_mask=np.tile(np.arange(4000) % 2, (2, 1)), max_new_tokens=4),
         r"attention_mask\[0\] is not 1 on a source's first frames"),
        (dict(input_features=features(2), attention_mask=np.ones((2, 3000), np.int32), max_new_tokens=4,
              return_timestamps=True), "are used whole. Leave attention_mask out"),
        (dict(input_features=long[0], max_new_tokens=4, eos_token_id=[]), "eos_token_id=\\[\\]: a reply with timestamps"),
        (dict(input_features=[long[0, :40]], max_new_tokens=4), r"input_features\[0\] has shape \(40, 4000\)"),
    ]
    for kw, match in timestamped:
        with pytest.raises(CallError, match=match):
            loaded.generate(**kw)


def waveforms(*seconds: float) -> list[np.ndarray]:
    """Tones that glide, with noise, of these lengths at 16 kHz."""
    out = []
    for i, length in enumerate(seconds):
        t = np.arange(int(length * 16000)) / 16000
        noise = np.random.default_rng(i).standard_normal(t.size)
        out.append((0.3 * np.sin(2 * np.pi * (300 + 100 * i) * t * (1 + 0.1 * np.sin(t))) + 0.05 * noise)
                   .astype(np.float32))
    return out


@pytest.mark.parametrize("kw", [{}, {"language": "fr"}, {"num_beams": 2}], ids=["detected", "fr", "beams"])
def test_long_audio_equals_transformers_long_form(whisper, kw):
    """Audio of 65 s, 47.3 s and 20 s in one batch: the features (``LogMel.long``) are transformers' extractor's with
    ``truncation=False, padding="longest"``, its attention mask's frames each source's; the replies, window after
    window, and their segments' tokens and times equal transformers' long-form ``generate(return_timestamps=True,
    return_segments=True)`` (the language detected once per source, from the batch's features as transformers
    detects it; given; beams); some windows end mid-window and the next starts at their last segment's end."""
    model, _, ckpt, art = whisper
    waves = waveforms(65, 47.3, 20)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(ckpt)
    theirs = extractor(waves, sampling_rate=16000, truncation=False, padding="longest", return_attention_mask=True,
                       return_tensors="np")
    feats, frames = LogMel.from_config(extractor.to_dict()).long(waves)
    np.testing.assert_allclose(feats, theirs["input_features"], atol=1e-4)
    assert frames.tolist() == theirs["attention_mask"].sum(-1).tolist() == [6500, 4730, 2000]
    mask = (np.arange(feats.shape[-1]) < frames[:, None]).astype(np.int32)
    with torch.no_grad():
        want = model.generate(torch.tensor(feats), attention_mask=torch.tensor(mask), max_new_tokens=16,
                              return_timestamps=True, return_segments=True, **kw)
    loaded = tb.load(art) if kw.get("num_beams") else runtime.load(art)
    steps = loaded.generation_steps()
    windows, run = [], steps.outputs
    steps.outputs = lambda entry, profile, leaves, names: (windows.append(profile) if entry == "encode" else None,
                                                           run(entry, profile, leaves, names))[1]
    got = loaded.generate(input_features=feats, attention_mask=mask, max_new_tokens=16, return_timestamps=True,
                          return_segments=True, **kw)
    assert got["sequences"].tolist() == want["sequences"].tolist()
    for ours, theirs in zip(got["segments"], want["segments"]):
        assert [(s["start"], s["end"], s["tokens"].tolist()) for s in ours] == \
               [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in theirs]
    assert got["segments"][0][-1]["start"] > 30
    assert len(windows) >= 3  # 6500 frames of source 0: three windows at least


def test_timestamps_of_one_window_equal_transformers(whisper):
    """Features of 30 s with ``return_timestamps=True`` (transcribe and translate): transformers' replies, each run
    on from its last segment's end where it ended mid-segment, with both loaders; ``transcribe`` of long audio gives
    transformers' text (its ``batch_decode``), and with ``return_timestamps`` its segments' times and texts."""
    model, tok, _, art = whisper
    feats = features(2, seed=5)
    for kw in ({}, {"task": "translate"}):
        with torch.no_grad():
            want = model.generate(torch.tensor(feats), max_new_tokens=12, return_timestamps=True, **kw).tolist()
        for loaded in (tb.load(art), runtime.load(art)):
            assert loaded.generate(input_features=feats, max_new_tokens=12, return_timestamps=True, **kw).tolist() == want
    waves = waveforms(65, 20)
    feats, frames = LogMel(**loaded.metadata["generate"]["audio"]).long(waves)
    mask = (np.arange(feats.shape[-1]) < frames[:, None]).astype(np.int32)
    with torch.no_grad():
        want = model.generate(torch.tensor(feats), attention_mask=torch.tensor(mask), max_new_tokens=16,
                              return_timestamps=True, return_segments=True)
    got = loaded.transcribe(waves, max_new_tokens=16, return_timestamps=True)
    assert [g["text"] for g in got] == tok.batch_decode(want["sequences"], skip_special_tokens=True)
    assert loaded.transcribe(waves, max_new_tokens=16) == [g["text"] for g in got]
    for ours, theirs in zip(got, want["segments"]):
        assert [(s["start"], s["end"], s["text"]) for s in ours["segments"]] == \
               [(round(float(s["start"]), 2), round(float(s["end"]), 2), tok.decode(s["tokens"], skip_special_tokens=True))
                for s in theirs]


def test_a_reply_past_the_decoder_positions_is_refused_at_build(whisper, tmp_path):
    """generate.max_length beyond max_target_positions would read positions the table lacks: refused naming both."""
    _, _, ckpt, _ = whisper
    r = run_cli("model=whisper", "task=generate", f"params.checkpoint={ckpt}", "generate.max_length=64",
                f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert r.returncode != 0
    assert "generate.max_length=64: Whisper's decoder position table holds 48 positions" in r.stderr
    assert not (tmp_path / "arts").exists() or not any((tmp_path / "arts").rglob("manifest.json"))


def test_the_cli_transcribes_wav_files(whisper, tmp_path):
    """``tripy-build generate ART --audio FILE.wav``: a 16-bit stereo file's text (its channels averaged) equals
    ``transcribe`` of the mono float waveform; a file of 65 s with ``--timestamps`` prints ``transcribe``'s segments
    with their times; a file that is not WAV is refused naming the ffmpeg fix."""
    import wave

    _, _, ckpt, art = whisper
    rng = np.random.default_rng(5)
    pcm = (rng.uniform(-0.4, 0.4, (24000, 2)) * 32767).astype("<i2")
    with wave.open(str(tmp_path / "stereo.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    want = runtime.load(art).transcribe((pcm.astype(np.float64) / 32768).mean(axis=1), language="de")
    r = run_cli("generate", str(art), "--audio", str(tmp_path / "stereo.wav"), "--language", "de", "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(line)["text"] for line in r.stdout.splitlines()] == want
    prompted = runtime.load(art).transcribe((pcm.astype(np.float64) / 32768).mean(axis=1), language="de",
                                            prompt="hello world")
    r = run_cli("generate", str(art), "--audio", str(tmp_path / "stereo.wav"), "--language", "de", "--initial-prompt",
                "hello world", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines() == prompted != want, r.stderr[-2000:]
    r = run_cli("inspect", str(art), cwd=tmp_path)
    assert "speech: sources are 80 x 3000 log-mel features of 30 s of 16000 Hz audio; replies open with the language " \
           "(detected per source among de, en, es, fr)" in r.stdout
    long = (waveforms(65)[0] * 32767).astype("<i2")
    with wave.open(str(tmp_path / "long.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(long.tobytes())
    want = runtime.load(art).transcribe(long / 32768, max_new_tokens=12, return_timestamps=True)[0]
    r = run_cli("generate", str(art), "--audio", str(tmp_path / "long.wav"), "--timestamps", "--max-new-tokens", "12",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [f"[{s['start']:.2f} --> {s['end']:.2f}]{s['text']}" for s in want["segments"]]
    assert len(want["segments"]) > 2 and want["segments"][-1]["end"] > 30
    (tmp_path / "song.mp3").write_bytes(b"ID3\x04" + bytes(64))
    r = run_cli("generate", str(art), "--audio", str(tmp_path / "song.mp3"), cwd=tmp_path)
    assert r.returncode != 0 and "MP3 (an ID3 tag), not WAV" in r.stderr
    assert "ffmpeg -i song.mp3 -ar 16000 -ac 1 out.wav" in r.stderr


def test_a_sources_beams_share_one_run_of_the_encoder(whisper):
    """Beam search over 2 beams of 2 sources (4 decoder rows): the encoder runs once at batch 2, and the ``expand``
    entry gathers its rows into the 4 beams' (the answers equal transformers', which expands its encoder outputs
    alike); a batch of 2 distinct sources greedy runs no gather."""
    model, _, _, art = whisper
    loaded = runtime.load(art)
    assert "expand" in loaded.entries and loaded.metadata["generate"]["expand"] == "expand"
    steps = loaded.generation_steps()
    calls, run = [], steps.outputs
    steps.outputs = lambda entry, profile, leaves, names: calls.append((entry, dict(profile))) or run(
        entry, profile, leaves, names)
    feats = features(2, seed=9)
    got = loaded.generate(input_features=feats, max_new_tokens=6, num_beams=2)
    assert [cut(r, model.config.eos_token_id) for r in got.tolist()] == hf_generate(model, feats, 6, num_beams=2)
    assert [c for c in calls if c[0] in ("encode", "expand")] == [("encode", {"batch": 2}),
                                                                  ("expand", {"sources": 2, "batch": 4})]
    calls.clear()
    loaded.generate(input_features=feats, max_new_tokens=2)
    assert [c for c in calls if c[0] in ("encode", "expand")] == [("encode", {"batch": 2})]


@pytest.mark.parametrize("config", [{}, {"language": "french"}, {"language": "de", "task": "translate"},
                                    {"task": "translate"}, {"language": "fr", "forced_decoder_ids": None}],
                         ids=["checkpoint", "fine-tune-fr", "fine-tune-de-translate", "translate", "no-forced-ids"])
def test_the_opening_is_transformers_for_each_config_and_call(whisper, config):
    """A fine-tune's generation_config.json that sets ``language`` and ``task`` (as transformers' fine-tuning guides
    do, ``forced_decoder_ids`` null) and calls that name their own: the opening equals transformers'
    ``_retrieve_init_tokens`` (the language detected as its ``detect_language`` detects it)."""
    import copy

    from tripy_build.runtime.transcription import DETECT, Opening

    model, _, _, _ = whisper
    feats = torch.tensor(features(1, seed=2))
    with torch.no_grad():
        detected = model.detect_language(feats).tolist()[0]
    given = copy.deepcopy(model.generation_config)
    for key, value in config.items():
        setattr(given, key, value)
    recorded = {k: getattr(given, k) for k in ("forced_decoder_ids", "lang_to_id", "task_to_id", "no_timestamps_token_id",
                                               "is_multilingual", "language", "task") if hasattr(given, k)}
    opening = Opening.from_generation_config(recorded, model.config.vocab_size)
    for call in ({}, {"language": "es"}, {"task": "transcribe"}, {"task": "translate"}):
        theirs = copy.deepcopy(given)
        model._set_language_and_task(language=call.get("language"), task=call.get("task"), is_multilingual=None,
                                     generation_config=theirs)
        want = model._retrieve_init_tokens(feats, batch_size=1, generation_config=theirs, config=model.config,
                                           num_segment_frames=3000, kwargs={})[0].tolist()[1:]
        got = [detected if t == DETECT else t for t in opening.tokens(call.get("language"), call.get("task"))]
        assert got == want, call


def test_the_fallback_and_its_thresholds(whisper):
    """Each window's reply is scored: a window whose reply's mean log probability is below ``logprob_threshold`` and
    whose no-speech probability is above ``no_speech_threshold`` is skipped, as transformers skips it (the same
    replies and segments, the threshold set between the windows' own scores); a reply that compresses past
    ``compression_ratio_threshold`` is generated again at the next temperature, sampled with the call's seed (the
    same seed, the same replies), and its segments say at which temperature; bad settings are refused."""
    model, _, _, art = whisper
    waves = waveforms(65, 47.3, 20)
    feats, frames = LogMel(**tb.load(art).metadata["generate"]["audio"]).long(waves)
    mask = (np.arange(feats.shape[-1]) < frames[:, None]).astype(np.int32)
    loaded = runtime.load(art)

    def run(**kw):
        return loaded.generate(input_features=feats, attention_mask=mask, max_new_tokens=16, return_segments=True, **kw)
    plain = run()
    scores = sorted({s["avg_logprob"] for source in plain["segments"] for s in source})
    assert all(s["temperature"] == 0.0 and 0 < s["no_speech_prob"] < 1 for s in plain["segments"][0])
    skips = dict(logprob_threshold=scores[len(scores) // 2], no_speech_threshold=0.0, temperature=0.0)
    with torch.no_grad():
        want = model.generate(torch.tensor(feats), attention_mask=torch.tensor(mask), max_new_tokens=16,
                              return_timestamps=True, return_segments=True, **skips)
    got = run(**skips)
    assert got["sequences"].tolist() == want["sequences"].tolist() != plain["sequences"].tolist()
    for ours, theirs in zip(got["segments"], want["segments"]):
        assert [(s["start"], s["end"]) for s in ours] == [(float(s["start"]), float(s["end"])) for s in theirs]
    hotter = dict(temperature=(0.0, 1.0), compression_ratio_threshold=0.85, seed=3)
    got = run(**hotter)
    segments = [s for source in got["segments"] for s in source]
    assert {s["temperature"] for s in segments} == {0.0, 1.0}
    assert all(s["compression_ratio"] <= 0.85 for s in segments if s["temperature"] == 0.0)
    assert run(**hotter)["sequences"].tolist() == got["sequences"].tolist()
    sampled = run(temperature=0.7, seed=1)  # one temperature, no fallback: every window sampled at it
    assert {s["temperature"] for source in sampled["segments"] for s in source} == {0.7}
    assert sampled["sequences"].tolist() != plain["sequences"].tolist()
    for kw, match in [
        (dict(num_beams=2, logprob_threshold=-1.0), "num_beams with a temperature fallback or thresholds is not built"),
        (dict(logprob_threshold=None, no_speech_threshold=0.6), "no_speech_threshold=0.6 needs logprob_threshold"),
        (dict(temperature=(0.0, -1.0)), r"temperature=\(0.0, -1.0\): the temperatures of a window's attempts"),
        (dict(logprob_threshold="low"), "logprob_threshold='low': it is a number"),
    ]:
        with pytest.raises(CallError, match=match):
            run(**kw)
    with pytest.raises(CallError, match="give return_timestamps=True"):
        loaded.generate(input_features=features(1), max_new_tokens=4, temperature=(0.0, 0.5))


def test_a_prompt_steers_as_transformers_prompt_ids(whisper):
    """``prompt_ids`` (``<|startofprev|>`` and a text's tokens, read before the start token): transformers' replies
    with the language detected (without the prompt, as transformers detects it), given, and with beams; each window's
    of long audio; ``transcribe(prompt=text)`` makes transformers' ``get_prompt_ids`` ids; a prompt's special token
    and ids outside the vocabulary are refused."""
    model, tok, _, art = whisper
    ids = tok("<|startofprev|>", " hello world", add_special_tokens=False)["input_ids"]
    feats = features(2, seed=5)
    stamp = model.generation_config.no_timestamps_token_id
    loaded = runtime.load(art)
    for kw in ({}, {"language": "fr"}, {"num_beams": 2}):
        with torch.no_grad():
            want = model.generate(torch.tensor(feats), prompt_ids=torch.tensor(ids), max_new_tokens=8,
                                  force_unique_generate_call=True, **kw).tolist()
        want = [cut(r[r.index(stamp) + 1:], model.config.eos_token_id) for r in want]
        got = loaded.generate(input_features=feats, prompt_ids=ids, max_new_tokens=8, **kw)
        assert [cut(r, model.config.eos_token_id) for r in got.tolist()] == want
    assert want != hf_generate(model, feats, 8, num_beams=2)  # the prompt changed the replies
    waves = waveforms(65, 20)
    long, frames = LogMel(**loaded.metadata["generate"]["audio"]).long(waves)
    mask = (np.arange(long.shape[-1]) < frames[:, None]).astype(np.int32)
    with torch.no_grad():
        want = model.generate(torch.tensor(long), attention_mask=torch.tensor(mask), prompt_ids=torch.tensor(ids),
                              max_new_tokens=12, return_timestamps=True)
    got = loaded.generate(input_features=long, attention_mask=mask, prompt_ids=ids, max_new_tokens=12)
    assert got.tolist() == want.tolist()
    assert loaded.transcribe(waves, prompt="hello world", max_new_tokens=12) == \
        tok.batch_decode(want, skip_special_tokens=True)
    with pytest.raises(CallError, match=r"prompt='hello <\|en\|>' holds special tokens"):
        loaded.transcribe(waves[1], prompt="hello <|en|>")
    with pytest.raises(CallError, match=r"prompt: its \d+ tokens and the 3 of the reply's opening leave no room"):
        loaded.transcribe(waves[1], prompt="hello world " * 12)
    with pytest.raises(CallError, match=r"prompt_ids=\[-1, 5\]: a list of token ids in \[0, "):
        loaded.generate(input_features=feats, prompt_ids=[-1, 5], max_new_tokens=4)
