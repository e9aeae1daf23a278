"""task=generate of an encoder-decoder (``BartForConditionalGeneration``): ``encode`` and ``decode`` entries
(``models/_seq2seq.py``) driven by ``runtime/seq2seq.py``, against transformers' ``generate``.

A tiny BART with a byte-level BPE tokenizer (``examples/summarizer_checkpoint.py``) is saved with
``save_pretrained``, with the first and last tokens forced as BART's summarizers force them
(``forced_bos_token_id`` 0, ``forced_eos_token_id`` 2), a token never generated (``bad_words_ids``), no pair of
tokens twice (``no_repeat_ngram_size``) and no end before five tokens (``min_length``), and built
through the command line at batch buckets 1 and 4 and source buckets 8 and 16 (three sources run padded to 4 rows
and 16 positions). Its replies, greedy, must equal transformers' ``generate(num_beams=1, do_sample=False)`` with
both loaders, on the server's ``/generate``, OpenAI's ``/v1/completions`` and from the CLI; and by beam search (the
checkpoint's four beams, length_penalty 2 and early_stopping as bart-large-cnn's; ``runtime/beams.py``), its
``generate()`` with the same settings.
"""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.summarizer_checkpoint import checkpoint as summarizer  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.core.spec import output_names  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

MAX_LENGTH = 12
BUILD = ["model=hf", "task=generate", f"generate.max_length={MAX_LENGTH}", "shapes.dims.batch=[1,1,8]",
         "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[8,16]", "shapes.buckets.batch=[1,4,8]"]
TEXTS = ["the quick brown fox", "hello world, the fox jumps", "a dog"]  # 9 to 16 tokens: the 16 bucket


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """(transformers' model, its tokenizer, the artifact) of a tiny BART summarizer built with task=generate."""
    root = tmp_path_factory.mktemp("seq2seq")
    model, tok = summarizer(root / "ckpt")
    # bart-large-cnn's beam search (4 beams, length_penalty 2, early_stopping): the example's
    model.generation_config.bad_words_ids = [[100]]  # never generated (Marian's pad is): greedy's pick without it
    model.generation_config.no_repeat_ngram_size = 2  # bart-large-cnn's: 3, and min_length 56
    model.generation_config.min_length = 5
    model.save_pretrained(root / "ckpt")
    r = run_cli(*BUILD, f"params.checkpoint={root / 'ckpt'}", f"artifacts_dir={root / 'arts'}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "generate.beams: num_beams=4 length_penalty=2.0 early_stopping=True from the checkpoint" in r.stdout + r.stderr
    return model, tok, next((root / "arts" / "bart").iterdir())


def sources(tok, texts=TEXTS) -> list[list[int]]:
    return [tok(t)["input_ids"] for t in texts]


def hf_generate(model, rows: list[list[int]], n: int, **kw) -> list[list[int]]:
    """transformers' greedy replies (its start token left out; a finished row's padding cut)."""
    longest = max(map(len, rows))
    ids = torch.tensor([r + [1] * (longest - len(r)) for r in rows])
    kw = {"do_sample": False, "num_beams": 1, **kw}
    with torch.no_grad():
        out = model.generate(ids, attention_mask=(ids != 1).long(), max_new_tokens=n, **kw)
    return [cut(r) for r in out[:, 1:].tolist()]


def cut(row) -> list[int]:
    """A reply up to its first end (2), the end kept."""
    row = [int(t) for t in row]
    return row[:row.index(2) + 1] if 2 in row else row


@pytest.fixture(scope="module", params=["load", "runtime"])
def loaded(request, bart):
    return (tb.load if request.param == "load" else runtime.load)(bart[2])


def test_the_artifact_records_an_encoder_decoder(bart):
    meta = json.loads((bart[2] / "manifest.json").read_text())["metadata"]["generate"]
    assert {k: meta[k] for k in ("kind", "prefill", "decode", "decoder_start_token_id", "forced_bos_token_id",
                                 "forced_eos_token_id", "eos_token_id", "max_length")} == {
        "kind": "seq2seq", "prefill": "encode", "decode": "decode", "decoder_start_token_id": 2,
        "forced_bos_token_id": 0, "forced_eos_token_id": 2, "eos_token_id": [2], "max_length": MAX_LENGTH}
    assert (meta["suppressed"], meta["no_repeat_ngram_size"], meta["min_length"]) == ([100], 2, 5)
    assert (meta["reorder"], meta["beams"]) == ("reorder", {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True})


def test_the_caches_are_an_array_per_layer_and_kind_and_the_decoders_is_donated(bart):
    """Each decoder layer's keys and values are arrays of their own in every entry (a step reads them where they lie,
    not from a slice of one array, which XLA's CPU backend would copy out first), and the decoder's are donated."""
    m = json.loads((bart[2] / "manifest.json").read_text())
    entries = {m["entry"]: m, **{e["name"]: e for e in m["entries"]}}
    arrays = 2 * bart[0].config.decoder_layers
    names = {kind: [f"{kind}[{i}]" for i in range(arrays)] for kind in ("cross", "cache")}
    assert output_names(entries["encode"]["output_structure"], arrays) == names["cross"]
    inputs = [s["path"] for s in entries["decode"]["input_specs"]]
    assert inputs == ["input_ids", "cache_index", "encoder_mask", *names["cross"], *names["cache"]]
    assert entries["decode"]["donated"] == entries["reorder"]["donated"] == names["cache"]
    assert output_names(entries["decode"]["output_structure"], arrays + 1) == [*names["cache"], "logits"]
    shape = m["metadata"]["generate"]["cache_shape"]
    assert shape == [-1, bart[0].config.decoder_attention_heads, MAX_LENGTH,
                          bart[0].config.d_model // bart[0].config.decoder_attention_heads]
    assert [s["max"] for s in entries["decode"]["input_specs"] if s["path"] in names["cache"]] == [[8, *shape[1:]]] * arrays


@pytest.mark.parametrize("n", [1, 6, MAX_LENGTH])
def test_greedy_replies_equal_transformers_with_the_forced_first_and_last_tokens(bart, loaded, n):
    model, tok, _ = bart
    rows = sources(tok)
    want = hf_generate(model, rows, n)
    got = loaded.generate(rows, max_new_tokens=n, num_beams=1)
    assert [cut(r) for r in got] == want and 100 not in got
    for reply in want:  # no pair twice (the start among them); no end before the decoder holds 5 tokens
        pairs = list(zip([2, *reply], reply))
        assert len(pairs) == len(set(pairs)) and 2 not in reply[:min(4, n - 1)]
    # both forced; one new token is the end (transformers forces it after the first)
    assert all(r[0] == (0 if n > 1 else 2) for r in want) and all(r[-1] == 2 for r in want if len(r) == n)


def test_replies_run_to_max_new_tokens_without_an_end_and_sources_come_padded(bart, loaded):
    model, tok, _ = bart
    rows = sources(tok)
    want = hf_generate(model, rows, 8, eos_token_id=None)  # no row stops; the last token is still forced
    longest = max(map(len, rows))
    ids = np.array([[1] * (longest - len(r)) + r for r in rows])  # padded on the left this time
    got = loaded.generate(ids, attention_mask=(ids != 1).astype(np.int32), max_new_tokens=8, eos_token_id=[],
                          num_beams=1)
    assert got.shape == (3, 8) and got.tolist() == want and (got[:, -1] == 2).all()
    one = loaded.generate([rows[1]], max_new_tokens=8, eos_token_id=[], num_beams=1)  # batch 1, its own profile
    assert one.tolist() == [want[1]]


SEARCHES = [{}, {"early_stopping": False}, {"early_stopping": "never"}, {"length_penalty": 0.5}, {"num_beams": 2},
            {"num_beams": 8}]


def test_beam_search_equals_transformers_and_each_setting_acts(bart, loaded):
    """The checkpoint's search (4 beams, length_penalty 2, early_stopping), and each setting changed, equal
    transformers' ``generate`` with them: with 268 (a token the tiny model makes often) as the end, beams end at
    different steps, so the candidates' scores, the length penalty and the stopping rules all decide. Three
    sources of 4 beams run at batch 8 in two groups; 8 beams, one source a group."""
    model, tok, _ = bart
    rows = sources(tok)
    got = {}
    for kw in SEARCHES:
        want = hf_generate(model, rows, MAX_LENGTH, eos_token_id=[268], **{"num_beams": 4, **kw})
        got[str(kw)] = [cut(r) for r in loaded.generate(rows, max_new_tokens=MAX_LENGTH, eos_token_id=[268], **kw)]
        assert [r[:r.index(268) + 1] if 268 in r else r for r in got[str(kw)]] == \
            [r[:r.index(268) + 1] if 268 in r else r for r in want], kw
    greedy = loaded.generate(rows, max_new_tokens=MAX_LENGTH, eos_token_id=[268], num_beams=1).tolist()
    assert len({str(v) for v in [*got.values(), [cut(r) for r in greedy]]}) >= 5  # the settings act
    plain = loaded.generate(rows, max_new_tokens=MAX_LENGTH)  # the checkpoint's end (2): the reorder acts too
    assert [cut(r) for r in plain] == hf_generate(model, rows, MAX_LENGTH, num_beams=4)
    assert not np.array_equal(plain, loaded.generate(rows, max_new_tokens=MAX_LENGTH, num_beams=1))


def test_beam_search_refusals_name_the_fix(bart, loaded):
    _, tok, _ = bart
    rows = sources(tok)
    with pytest.raises(CallError, match=r"num_beams=16: a source's beams are rows of one batch, and this artifact's "
                                        r"largest batch is 8 rows; pass num_beams<=8"):
        loaded.generate(rows, max_new_tokens=4, num_beams=16)
    with pytest.raises(CallError, match=r"num_beams=4: beam search keeps the most likely continuations; it does not "
                                        r"sample, penalize or follow a grammar \(temperature=0.7"):
        loaded.generate(rows, max_new_tokens=4, num_beams=4, temperature=0.7)
    with pytest.raises(CallError, match=r"early_stopping='sometimes': it is true, false or \"never\""):
        loaded.generate(rows, max_new_tokens=4, early_stopping="sometimes")
    with pytest.raises(CallError, match=r"num_beams=0: it is a positive integer"):
        loaded.generate(rows, max_new_tokens=4, num_beams=0)
    # a call that samples without asking for beams runs one beam (the checkpoint's are for replies by score)
    assert loaded.generate(rows, max_new_tokens=4, temperature=0.7, seed=1).shape[0] == 3


def test_sampling_is_reproducible_for_a_seed(bart, loaded):
    _, tok, _ = bart
    rows = sources(tok)
    a = loaded.generate(rows, max_new_tokens=8, temperature=1.5, seed=7, eos_token_id=[])
    assert np.array_equal(a, loaded.generate(rows, max_new_tokens=8, temperature=1.5, seed=7, eos_token_id=[]))
    assert (a[:, 0] == 0).all()  # forced even when sampling


def test_bad_calls_are_one_line_errors(bart, loaded):
    _, tok, _ = bart
    with pytest.raises(CallError, match=r"input_ids\[0\] is a source of 20 tokens, over the 16 this artifact's "
                                        r"encoder was built for \(shapes.dims.seq\)"):
        loaded.generate([list(range(3, 23))], max_new_tokens=2)
    with pytest.raises(CallError, match=rf"max_new_tokens=13 is over this artifact's generate.max_length={MAX_LENGTH}"):
        loaded.generate(sources(tok), max_new_tokens=13)
    with pytest.raises(CallError, match=r"input_ids\[1\] holds token id 9999, outside \[0, "):
        loaded.generate([[0, 5, 2], [0, 9999, 2]], max_new_tokens=2)


def test_the_server_and_the_cli_answer_texts_as_transformers(bart, tmp_path):
    model, tok, art = bart
    want = hf_generate(model, sources(tok), 6, num_beams=4)  # the checkpoint's beams: requests that pick by score
    greedy = hf_generate(model, sources(tok), 6)
    with Server([art], port=0).start() as srv:
        host, port = srv.url.split("//")[1].split(":")

        def post(route: str, body: dict) -> dict:
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request("POST", route, body=json.dumps(body), headers={"content-type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            conn.close()
            assert response.status == 200, answer
            return answer
        for text, reply, one in zip(TEXTS, want, greedy):
            body = post("/v2/models/bart/generate", {"text_input": text, "parameters": {"max_new_tokens": 6}})
            assert cut(body["output_ids"]) == reply
            assert body["text_output"] == tok.decode(reply, skip_special_tokens=True)
            body = post("/v2/models/bart/generate", {"text_input": text, "max_new_tokens": 6, "num_beams": 1})
            assert cut(body["output_ids"]) == one
        # requests that arrive together search together (two sources' beams a batch of 8), each its own reply
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda t: post("/v2/models/bart/generate", {"text_input": t, "max_new_tokens": 6}),
                                    TEXTS))
        assert [cut(a["output_ids"]) for a in answers] == want
        conn = http.client.HTTPConnection(host, int(port), timeout=120)  # a searched reply streams at its end
        conn.request("POST", "/v2/models/bart/generate_stream", body=json.dumps({"text_input": TEXTS[2],
                                                                                "max_new_tokens": 6}))
        events = [json.loads(line[len(b"data: "):]) for line in conn.getresponse().read().split(b"\n\n") if line]
        assert cut([t for e in events for t in e["output_ids"]]) == want[2]
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", "/v2/models/bart")
        described = json.loads(conn.getresponse().read())["generate"]
        assert described["beams"] == {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True}
        assert "num_beams" in described["options"]
        body = post("/v1/completions", {"model": "bart", "prompt": TEXTS[1], "max_tokens": 6, "temperature": 0})
        assert body["choices"][0]["text"] == tok.decode(want[1], skip_special_tokens=True)
        body = post("/v1/completions", {"model": "bart", "prompt": TEXTS[1], "temperature": 0, "num_beams": 1})
        longest = hf_generate(model, sources(tok, TEXTS[1:2]), MAX_LENGTH)[0]  # as many as the decoder holds
        assert body["usage"]["completion_tokens"] == len(longest) and len(sources(tok)[1]) > 1
    shown = run_cli("inspect", str(art), cwd=tmp_path)
    assert "(by score: the best of 4 beams, length_penalty=2, early_stopping=True)" in shown.stdout, shown.stdout[-2000:]
    r = run_cli("generate", str(art), "--prompt", TEXTS[0], "--max-new-tokens", "6", "--num-beams", "1", "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = json.loads(r.stdout)  # the reply before its end
    assert printed["output_ids"] == greedy[0][:greedy[0].index(2)] and printed["text_output"] == tok.decode(
        greedy[0], skip_special_tokens=True)


def test_a_classifier_head_cannot_generate(tmp_path):
    r = run_cli("model=bart", *BUILD[1:], "model.head=sequence_classification", f"artifacts_dir={tmp_path / 'arts'}",
                cwd=tmp_path)
    assert r.returncode == 2 and "head=sequence_classification, which has no language model head to pick tokens from; " \
        "generate with head=conditional_generation (a *ForConditionalGeneration checkpoint)" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "arts").exists()


def test_in_bfloat16_both_caches_are_bfloat16_and_both_loaders_agree(bart, tmp_path):
    """The cross-attention's keys and values leave encode in the cache's dtype (a reduced precision casts outputs
    back to the float32 function's, which must therefore cast them itself)."""
    r = run_cli(*BUILD[:3], "shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,16,16]", "shapes.buckets.seq=[16]",
                "precision=bfloat16", f"params.checkpoint={bart[2].parent.parent.parent / 'ckpt'}",
                f"artifacts_dir={tmp_path}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    art = next((tmp_path / "bart").iterdir())
    assert json.loads((art / "manifest.json").read_text())["metadata"]["generate"]["cache_dtype"] == "bfloat16"
    rows = sources(bart[1])[:1]
    got = [load(art).generate(rows, max_new_tokens=6) for load in (runtime.load, tb.load)]
    assert got[0].shape[0] == 1 and got[0][0, 0] == 0 and np.array_equal(*got)


def test_the_banned_repeats_are_transformers_no_repeat_ngram_tokens():
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    from tripy_build.runtime.seq2seq import repeats

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4):
        for length in (1, 2, 5, 12):
            tokens = rng.integers(0, 4, length).tolist()  # a small vocabulary: n-grams repeat
            scores = NoRepeatNGramLogitsProcessor(n)(torch.tensor([tokens]), torch.zeros(1, 4))
            assert sorted(set(repeats(tokens, n))) == torch.nonzero(scores[0] == -float("inf")).flatten().tolist()
