"""``generate.beams``: what the build records of a checkpoint's beam search (``builder/generate.resolved``), and what
it refuses; and the runtime's refusals of a search an artifact cannot run (``runtime/beams.check``). The searches
themselves are tested against transformers in tests/models/test_seq2seq.py, test_marian.py, test_t5_generation.py."""

from __future__ import annotations

import json
import logging

import pytest

from tripy_build.builder.generate import resolved
from tripy_build.errors import CallError, ConfigError
from tripy_build.models import MODELS
from tripy_build.runtime.beams import Beams, chosen
from tripy_build.runtime.generate import Spec
from tripy_build.runtime.sampling import Options

BART = MODELS["bart"](vocab_size=300, head="conditional_generation")
GPT2 = MODELS["gpt2"]()
CNN = {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True}  # bart-large-cnn's


def checkpoint(tmp_path, **config) -> str:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, **config}))
    return str(tmp_path)


def beams(tmp_path, model=BART, rows=8, given="auto", **config) -> dict:
    return resolved({"max_length": 16, "beams": given}, model, checkpoint(tmp_path, **config), rows)["beams"]


@pytest.mark.parametrize("model", [BART, GPT2])
def test_the_checkpoint_s_search_is_recorded(model, tmp_path, caplog):
    """An encoder-decoder's or a decoder's alike (a decoder's build then has the reorder entry)."""
    with caplog.at_level(logging.INFO):
        assert beams(tmp_path, model, **CNN) == CNN
    assert "generate.beams: num_beams=4 length_penalty=2.0 early_stopping=True from the checkpoint" in caplog.text
    assert "does not apply" not in caplog.text
    assert beams(tmp_path, num_beams=6) == {"num_beams": 6, "length_penalty": 1.0, "early_stopping": False}
    assert beams(tmp_path, num_beams=1) == {} and beams(tmp_path) == {}
    assert beams(tmp_path, given=None, **CNN) == {}  # null: one beam
    assert beams(tmp_path, given={"num_beams": 2}, **CNN) == {"num_beams": 2, "length_penalty": 1.0,
                                                             "early_stopping": False}


@pytest.mark.parametrize("model, config", [(GPT2, {**CNN, "do_sample": True}), (BART, {**CNN, "do_sample": True}),
                                           (BART, {**CNN, "repetition_penalty": 1.2})])
def test_a_search_not_built_is_said_unapplied(model, config, tmp_path, caplog):
    """Beam sampling and penalized beams: not recorded, and named in the build's log."""
    with caplog.at_level(logging.WARNING):
        assert beams(tmp_path, model, **config) == {}
    assert "num_beams=4, which tripy_build's does not apply" in caplog.text


def test_beams_a_batch_cannot_hold(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert beams(tmp_path, rows=2, **CNN) == {}
    assert ("the checkpoint's num_beams=4 is not applied (calls run one beam): a source's beams are rows of one batch, "
            "and shapes.dims.batch holds at most 2; build with shapes.dims.batch up to 4 or more") in caplog.text
    assert "does not apply" not in caplog.text  # said once
    with pytest.raises(ConfigError, match=r"generate.beams: num_beams=4: a source's beams are rows of one batch"):
        beams(tmp_path, rows=2, given={"num_beams": 4})


@pytest.mark.parametrize("model, given, message", [
    (BART, {"beams": 4}, "generate.beams: 'beams' is not a beam search setting; they are num_beams, length_penalty, "
                         "early_stopping."),
    (BART, {"num_beams": 0}, "generate.beams: num_beams=0: it is a positive integer"),
    (BART, {"num_beams": 2, "early_stopping": "soon"}, "generate.beams: early_stopping='soon': it is true, false or"),
    (BART, {"length_penalty": float("nan")}, "generate.beams: length_penalty=nan: it is a number"),
    (BART, 4, "generate.beams: '4': give auto (the checkpoint's), null (one beam) or {num_beams: 4"),
])
def test_bad_settings_are_refused_naming_the_fix(model, given, message, tmp_path):
    with pytest.raises(ConfigError) as e:
        beams(tmp_path, model, given=given)
    assert message in str(e.value)


def spec(**kw) -> Spec:
    return Spec("encode", "decode", 16, (2, 2, -1, 2, 16, 8), "float32", 300, **kw)


def test_a_call_s_search_where_the_artifact_can_run_it():
    seq2seq = spec(kind="seq2seq", reorder="reorder", beams=CNN)
    greedy = Options()
    assert chosen(seq2seq, [1, 4, 8], greedy, None) == Beams(**CNN)
    assert chosen(seq2seq, [1, 4, 8], greedy, None, num_beams=2) == Beams(2, 2.0, True)
    assert chosen(seq2seq, [1, 4, 8], greedy, None, num_beams=1) is None
    assert chosen(seq2seq, [1, 4, 8], Options(temperature=0.7), None) is None  # the artifact's: for picks by score
    refusals = [
        (spec(kind="seq2seq"), {"num_beams": 2}, "num_beams=2: this artifact was built before beam search (it has no "
                                                 "reorder entry); rebuild it"),
        (spec(), {"num_beams": 2}, "num_beams=2: this decoder's artifact was built without beam search (its reorder "
                                   "entry); build it with generate.beams={num_beams: 2}, or pass num_beams=1."),
        (seq2seq, {"num_beams": 16}, "largest batch is 8 rows; pass num_beams<=8, or build with shapes.dims.batch up "
                                     "to 16 or more"),
        (seq2seq, {"num_beams": 2, "options": Options(repetition_penalty=1.2)},
         "it does not sample, penalize or follow a grammar (greedy repetition_penalty=1.2 asked)"),
        (seq2seq, {"num_beams": 2, "constraints": object()}, "follow a grammar (greedy, json_schema asked)"),
    ]
    for artifact, call, message in refusals:
        options, constraints = call.pop("options", greedy), call.pop("constraints", None)
        with pytest.raises(CallError) as e:
            chosen(artifact, [1, 4, 8], options, constraints, **call)
        assert message in str(e.value)
