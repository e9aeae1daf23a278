"""Beam search over a decoder alone (``runtime/beams.py`` with ``runtime/generate.Session``): a tiny GPT-2 whose
``generation_config.json`` asks for 4 beams, ``length_penalty`` 2 and ``early_stopping`` (``generate.beams=auto``
records them, and the build gets the ``reorder`` entry), against transformers' ``generate`` with the same settings.

The end id is a token the model makes often, so that beams end at different steps and the candidates' scores,
the length penalty and each stopping rule decide; prompts of different lengths run side by side (left-padded for
transformers), the prompt's cache rows copied to its beams and reordered after each step, and the rows' held
tokens with them (a later prompt's prefix reuse reads them).
"""

from __future__ import annotations

import http.client
import json

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402

from conftest import run_cli  # noqa: E402

VOCAB, MAX_LENGTH, NEW = 96, 24, 10
PROMPTS = [[5, 17, 33, 2, 9], [7, 8], [11, 12, 13, 14, 15, 16, 17]]
BEAMS = {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True}


def hf_generate(model, prompts, n, **kw):
    """transformers' new tokens for prompts of any lengths (left-padded), the fill after an end cut."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, **kw)
    return [cut(r, kw.get("eos_token_id")) for r in out[:, longest:].tolist()]


def cut(row, eos) -> list[int]:
    row = [int(t) for t in row]
    return row[:row.index(eos) + 1] if eos in row else row


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(transformers' model, the end id, the artifact) of a tiny GPT-2 asking for bart-large-cnn's search."""
    root = tmp_path_factory.mktemp("beams")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    plain = hf_generate(model, PROMPTS, NEW, num_beams=1, eos_token_id=None, pad_token_id=0)
    eos = plain[0][4]  # a token greedy makes mid-reply: the beams end at different steps
    model.generation_config.update(eos_token_id=eos, pad_token_id=0, **BEAMS)
    model.save_pretrained(root / "ckpt")
    r = run_cli("model=hf", "task=generate", f"params.checkpoint={root / 'ckpt'}", f"generate.max_length={MAX_LENGTH}",
                "shapes.dims.batch=[1,4,8]", "shapes.buckets.batch=[4,8]", "shapes.dims.seq=[1,4,8]",
                "shapes.buckets.seq=[1,8]", f"artifacts_dir={root / 'arts'}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "generate.beams: num_beams=4 length_penalty=2.0 early_stopping=True from the checkpoint" in r.stdout + r.stderr
    return model, eos, next((root / "arts" / "gpt2").iterdir())


def test_the_build_records_the_search_and_its_reorder_entry(built):
    m = json.loads((built[2] / "manifest.json").read_text())
    assert (m["metadata"]["generate"]["reorder"], m["metadata"]["generate"]["beams"]) == ("reorder", BEAMS)
    assert sorted(e["name"] for e in m["entries"]) == ["decode", "reorder"]


@pytest.mark.parametrize("load", [tb.load, runtime.load], ids=["load", "runtime"])
def test_beam_search_equals_transformers_and_each_setting_acts(built, load):
    model, eos, art = built
    exe = load(art)
    got = {}
    for kw in ({}, {"early_stopping": False}, {"early_stopping": "never"}, {"length_penalty": 0.5}, {"num_beams": 2},
               {"num_beams": 1}):
        want = hf_generate(model, PROMPTS, NEW, eos_token_id=eos, **{**BEAMS, **kw})
        got[str(kw)] = [cut(r, eos) for r in exe.generate(PROMPTS, max_new_tokens=NEW, **kw).tolist()]
        assert got[str(kw)] == want, kw
    assert len({str(v) for v in got.values()}) >= 4, got  # the settings act
    # each row's held tokens followed its cache row when the beams were reordered: a prompt of the tokens a row of
    # the cache the search left holds (the loader's spare) takes them from that row, and still gets transformers' reply
    exe.generate(PROMPTS[2:], max_new_tokens=NEW, eos_token_id=[])  # a search that reorders at every step
    steps = exe.generation_steps()
    spec = steps.spec()
    held = steps.spares.free[(tuple(4 if n == -1 else n for n in spec.cache_shape), spec.cache_dtype)]  # its 4 rows
    beams = [held.tokens[row, :held.valid[row]].tolist() for row in range(4)]
    assert all(len(b) == len(PROMPTS[2]) + NEW - 1 for b in beams) and len({str(b) for b in beams}) > 1
    for again in beams:  # each in turn: the row holding it is the spare's again after each call
        assert [cut(r, eos) for r in exe.generate([again], max_new_tokens=4, num_beams=1).tolist()] == \
            hf_generate(model, [again], 4, eos_token_id=eos, num_beams=1), again


def test_the_server_searches_by_default_and_samples_when_asked(built):
    from tripy_build.serve.http import Server

    model, eos, art = built
    with Server([art], port=0).start() as srv:
        host, port = srv.url.split("//")[1].split(":")

        def post(body: dict) -> dict:
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request("POST", "/v2/models/gpt2/generate", body=json.dumps(body),
                         headers={"content-type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            return answer
        for prompt in PROMPTS:
            body = post({"input_ids": prompt, "max_new_tokens": NEW})
            assert cut(body["output_ids"], eos) == hf_generate(model, [prompt], NEW, eos_token_id=eos, **BEAMS)[0]
        # one beam, sampled: the checkpoint's beams are for the replies picked by score
        sampled = post({"input_ids": PROMPTS[0], "max_new_tokens": NEW, "temperature": 1.0, "seed": 3})
        drawn = runtime.load(art).generate([PROMPTS[0]], max_new_tokens=NEW, temperature=1.0, seed=3).tolist()[0]
        assert cut(sampled["output_ids"], eos) == cut(drawn, eos)
