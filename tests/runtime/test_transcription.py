"""``runtime/transcription.Opening``: what a Whisper reply opens with for a call's language and task, as transformers'
``WhisperGenerationMixin._retrieve_init_tokens`` sets it, for openai/whisper-tiny's and whisper-tiny.en's generation
configs (their settings, the ids as the Hub's files hold them); and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tripy_build.errors import CallError
from tripy_build.runtime.transcription import DETECT, Opening

EN, FR, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS = 50259, 50265, 50359, 50358, 50363
MULTILINGUAL = {"forced_decoder_ids": [[1, None], [2, TRANSCRIBE]], "is_multilingual": True,
                "lang_to_id": {"<|en|>": EN, "<|zh|>": 50260, "<|fr|>": FR},
                "task_to_id": {"transcribe": TRANSCRIBE, "translate": TRANSLATE}, "no_timestamps_token_id": NO_TIMESTAMPS}
ENGLISH = {"forced_decoder_ids": [[1, 50362]], "is_multilingual": False, "no_timestamps_token_id": 50362}


def opening(config: dict) -> Opening:
    return Opening.of(Opening.from_generation_config(config, 51865).recorded())  # as the artifact records it


@pytest.mark.parametrize("language, task, want", [
    (None, None, [DETECT, TRANSCRIBE, NO_TIMESTAMPS]),  # the checkpoint's: detect, then <|transcribe|>
    ("fr", None, [FR, TRANSCRIBE, NO_TIMESTAMPS]),
    ("<|fr|>", None, [FR, TRANSCRIBE, NO_TIMESTAMPS]),
    ("FR", "translate", [FR, TRANSLATE, NO_TIMESTAMPS]),
    ("French", None, [FR, TRANSCRIBE, NO_TIMESTAMPS]),  # by name, as transformers' TO_LANGUAGE_CODE
    ("mandarin", None, [50260, TRANSCRIBE, NO_TIMESTAMPS]),
    (None, "translate", [DETECT, TRANSLATE, NO_TIMESTAMPS]),
])
def test_a_multilingual_opening(language, task, want):
    assert opening(MULTILINGUAL).tokens(language, task) == want


def test_an_english_only_opening_takes_no_language_or_task():
    o = opening(ENGLISH)
    assert o.tokens() == [50362]  # <|notimestamps|> forced at position 1, not added twice
    for kw in ({"language": "en"}, {"task": "transcribe"}):
        with pytest.raises(CallError, match="English-only"):
            o.tokens(**kw)


def test_a_config_without_whisper_settings_opens_with_nothing():
    assert opening({}).tokens() == []
    with pytest.raises(CallError, match="has no lang_to_id"):
        opening({}).tokens(language="en")


def test_the_language_detected_is_the_likeliest_language_token():
    logits = np.zeros((2, 51865), np.float32)
    logits[0, FR], logits[1, EN], logits[1, 100] = 3.0, 2.0, 9.0  # a non-language token is never picked
    assert opening(MULTILINGUAL).detected(logits).tolist() == [FR, EN]


@pytest.mark.parametrize("config, match", [
    ({"forced_decoder_ids": [[2, TRANSCRIBE]]}, "does not force positions 1, 2"),
    ({"lang_to_id": {"<|en|>": 99999}}, r"lang_to_id\['<\|en\|>'\]: 99999 is not a token id in \[0, 51865\)"),
    ({"task_to_id": ["transcribe"]}, "expected an object of token ids"),
    ({"no_timestamps_token_id": "x"}, "no_timestamps_token_id: 'x' is not a token id"),
    ({"language": ["en", "fr"]}, "language: .* is not a string"),
    ({**MULTILINGUAL, "language": "klingon"}, "language='klingon' is not one of this model's languages"),
])
def test_a_malformed_generation_config_is_refused_naming_the_key(config, match):
    with pytest.raises(CallError, match=match):
        Opening.from_generation_config(config, 51865)


def test_unknown_languages_and_tasks_are_refused_naming_the_model_s():
    o = opening(MULTILINGUAL)
    with pytest.raises(CallError, match=r"give a code \(or its name: french for fr\) among: en, zh, fr"):
        o.tokens(language="german")  # a language Whisper has, but this model's config does not
    with pytest.raises(CallError, match="this model's tasks are 'transcribe', 'translate'"):
        o.tokens(task="summarize")
