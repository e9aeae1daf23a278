"""task=generate: GPT-2's prefill and decode entries against Hugging Face's ``generate`` with its cache.

A tiny GPT-2 (2 layers, 32 wide) is saved with ``save_pretrained`` and built through the command line
with a 32-position cache, batch buckets 1 and 4 (two or three rows run padded to 4) and prompt chunks 1 2 4 8.
Greedy ids must equal ``GPT2LMHeadModel.generate(do_sample=False, use_cache=True)`` for single prompts and
batches of different lengths (left-padded for Hugging Face), with both loaders and the CLI.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402
import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.generate import chunks  # noqa: E402

from conftest import run_cli  # noqa: E402

VOCAB, MAX_LENGTH = 96, 32
BUILD = ["model=gpt2", "task=generate", f"generate.max_length={MAX_LENGTH}", "shapes.dims.batch=[1,1,4]",
         "shapes.dims.seq=[1,4,8]", "generate.eos_token_id=null",  # the checkpoint's eos (0) not used: run to the end
         "shapes.buckets.batch=[1,4]"]
PROMPTS = [[5, 17, 33, 2, 9], [7, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [40]]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(Hugging Face model, artifact path) for a tiny GPT-2 built with task=generate from its checkpoint."""
    root = tmp_path_factory.mktemp("gen")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(root / "ckpt")
    model.generation_config.eos_token_id = None  # generate every token asked for, as the build (eos_token_id=null)
    model.generation_config.pad_token_id = 0
    r = run_cli(*BUILD, f"params.checkpoint={root / 'ckpt'}", f"artifacts_dir={root / 'arts'}", cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout + r.stderr  # the driver calls bucket-sized chunks only: no first-use compile to warn of
    assert "compile on first use" not in said and "not every in-range shape" not in said
    assert "dim decode: seq [1..8]: not padded, buckets 1 8; generation runs these sizes only" in said
    return model, next((root / "arts" / "gpt2").iterdir())


def hf_generate(model, prompts, n, **kw):
    """Hugging Face's new tokens for prompts of any lengths (left-padded, as decoder-only generation needs)."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, use_cache=True, **kw)
    return out[:, longest:].numpy()


@pytest.fixture(scope="module", params=["load", "runtime"])
def loaded(request, gpt2):
    return (tb.load if request.param == "load" else runtime.load)(gpt2[1])


def test_the_artifact_has_two_entries_sharing_weights(gpt2):
    m = json.loads((gpt2[1] / "manifest.json").read_text())
    assert m["entry"] == "prefill" and [e["name"] for e in m["entries"]] == ["decode"]
    decode = m["entries"][0]
    assert [w["file"] for w in decode["weights"]] == [w["file"] for w in m["weights"]]  # stored once
    assert decode["prep"] == m["prep"]  # the same weight-only work, prepared once
    # and stored as it makes them, once for both entries: the output projection (wte transposed), not wte
    rest = [w for c in m["prep"]["chunks"] for w in c["at_rest"]]
    assert rest and all(w["file"] and not w["file"].startswith("entries/") for w in rest)
    assert next(w for w in m["weights"] if w["path"] == "params['wte']")["file"] == ""
    assert not (gpt2[1] / "entries" / "decode" / "weights").exists()
    assert m["donated"] == decode["donated"] == ["cache"]
    assert m["metadata"]["generate"]["max_length"] == MAX_LENGTH
    assert m["metadata"]["generate"]["eos_token_id"] == []  # generate.eos_token_id=null over the checkpoint's [0]
    assert sorted(e["profile"]["seq"] for e in m["executables"] if e["profile"]["batch"] == 1) == [1, 2, 4, 8]
    # decode: one token per row, or a whole-batch prompt chunk: 8 (the longest prompt chunk; 8 // 8 = 1) and 4
    # (the dim's opt, as every entry's all-opt profile)
    assert sorted(e["profile"]["seq"] for e in decode["executables"] if e["profile"]["batch"] == 1) == [1, 4, 8]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ids_equal_hugging_face_for_one_prompt(gpt2, loaded, prompt):
    model, _ = gpt2
    np.testing.assert_array_equal(loaded.generate([prompt], 12), hf_generate(model, [prompt], 12))


def test_greedy_ids_equal_hugging_face_for_a_batch_of_lengths(gpt2, loaded):
    model, _ = gpt2
    want = hf_generate(model, PROMPTS, 10)
    got = loaded.generate(PROMPTS, 10)
    assert got.dtype == np.int32 and got.shape == (4, 10)
    np.testing.assert_array_equal(got, want)
    # the same prompts as one padded array, padded on the right, with their mask
    longest = max(map(len, PROMPTS))
    ids = np.array([p + [3] * (longest - len(p)) for p in PROMPTS], np.int32)
    mask = np.array([[1] * len(p) + [0] * (longest - len(p)) for p in PROMPTS], np.int32)
    np.testing.assert_array_equal(loaded.generate(ids, 10, attention_mask=mask), want)


def test_prompts_that_start_together_prefill_their_common_length_as_one_batch(gpt2, loaded):
    """Lengths 11, 9 and 12 share 9 tokens: one ``decode`` call of 8 tokens over every row, then each row's rest
    through ``prefill`` (3 = 2 + 1, 1, 4 tokens: 4 calls) instead of 3 + 2 + 2 = 7 one-row chunk calls."""
    from tripy_build.runtime.generate import generate

    model, _ = gpt2
    prompts = [list(range(20, 31)), list(range(40, 49)), list(range(60, 72))]
    steps = loaded.generation_steps()
    calls = []
    run = steps.run
    steps.run = lambda entry, profile, leaves: calls.append((entry, dict(profile))) or run(entry, profile, leaves)
    got = generate(steps, steps.spec(), "gpt2", prompts, 3)
    np.testing.assert_array_equal(got, hf_generate(model, prompts, 3))
    prefill = [c for c in calls if c[0] == "prefill"]
    wide = [c for c in calls if c[0] == "decode" and c[1]["seq"] > 1]
    assert wide == [("decode", {"batch": 4, "seq": 8})]
    assert [p["seq"] for _, p in prefill] == [2, 1, 1, 4]
    assert len(calls) == 1 + 4 + 2  # and two steps for the second and third tokens


def test_a_finished_sessions_cache_is_taken_by_the_next_without_clearing(gpt2, loaded):
    """The second generate at a batch places no cache (it takes the one the first left), and what the first
    wrote there changes nothing: the ids still equal Hugging Face's."""
    model, _ = gpt2
    steps = loaded.generation_steps()
    assert steps is loaded.generation_steps()
    placed, zeros = [], steps.zeros
    steps.zeros = lambda shape, dtype: placed.append(tuple(shape)) or zeros(shape, dtype)
    try:
        short = [[9, 8, 7]]
        for _ in range(2):
            np.testing.assert_array_equal(loaded.generate(PROMPTS, 6), hf_generate(model, PROMPTS, 6))
            np.testing.assert_array_equal(loaded.generate(short, 9), hf_generate(model, short, 9))
            if _ == 0:
                first = list(placed)
    finally:
        del steps.zeros
    assert placed == first and len(first) <= 2  # nothing placed the second time round


def prompt_tokens_run(steps, monkeypatch) -> list[tuple[str, int]]:
    """The entry calls ``steps`` makes from here on, as (entry, tokens per row): ``prefill`` and ``decode``'s
    chunks (seq > 1) run prompt tokens; a ``decode`` of 1 is a generation step."""
    calls, run = [], steps.run
    monkeypatch.setattr(steps, "run", lambda entry, profile, leaves: calls.append((entry, profile["seq"])) or
                        run(entry, profile, leaves))
    return calls


def test_a_prompt_that_begins_as_the_last_call_ran_prefills_only_what_follows(gpt2, loaded, monkeypatch):
    """A conversation's next turn: the last prompt, its reply and a new message. The session takes the cache the
    last one left, whose row holds the prompt and the reply's tokens but the last (never fed back), and runs only
    the rest; the ids still equal Hugging Face's over the whole prompt."""
    model, _ = gpt2
    first = [50, 51, 52, 53, 54, 55]
    reply = loaded.generate([first], 5)[0].tolist()
    turn = first + reply + [60, 61, 62]
    calls = prompt_tokens_run(loaded.generation_steps(), monkeypatch)
    np.testing.assert_array_equal(loaded.generate([turn], 4), hf_generate(model, [turn], 4))
    assert sum(n for e, n in calls if (e, n) != ("decode", 1)) == 4  # reply[4], 60, 61, 62 of 14 tokens
    assert calls.count(("decode", 1)) == 3
    # a prompt that leaves the held tokens part way runs from there: 3 of 7 held, 5 to run
    other = first[:3] + [1, 2, 3, 4, 5]
    calls.clear()
    np.testing.assert_array_equal(loaded.generate([other], 2), hf_generate(model, [other], 2))
    assert sum(n for e, n in calls if (e, n) != ("decode", 1)) == 5


def test_prompts_go_to_the_rows_that_hold_their_first_tokens(gpt2, loaded, monkeypatch):
    """Two conversations in one batch come back in the other order: each prompt is placed in the row that holds
    its beginning, not in the row of its index, and runs only its new tokens."""
    model, _ = gpt2
    a, b = [70, 71, 72, 73, 74, 75, 76], [80, 81, 82, 83, 84]
    ra, rb = loaded.generate([a, b], 3).tolist()
    turns = [b + rb + [1, 2], a + ra + [3]]  # 2 of each reply held (the third never fed back)
    calls = prompt_tokens_run(loaded.generation_steps(), monkeypatch)
    np.testing.assert_array_equal(loaded.generate(turns, 3), hf_generate(model, turns, 3))
    assert sum(n for e, n in calls if (e, n) != ("decode", 1)) == 3 + 2  # of 10 + 11


def test_a_free_rows_tokens_outlast_the_steps_of_the_others(gpt2, loaded):
    """A free row still computes in every decode step (on a mask of zeros): it writes past the tokens it holds,
    so they serve a later prompt, and the logits then equal PyTorch's over the whole prompt. A row that filled
    the cache gives up its last position only."""
    from tripy_build.runtime.generate import Session

    model, _ = gpt2
    steps = loaded.generation_steps()
    s = Session(steps, steps.spec(), 4)
    kept = np.arange(30, 40, dtype=np.int32)
    full = np.arange(2, 2 + MAX_LENGTH - 1, dtype=np.int32) % VOCAB
    rows = {}
    for name, prompt in (("kept", kept), ("full", full)):
        rows[name] = s.row_for(prompt)
        s.admit(rows[name], prompt)
        s.step({rows[name]: 7})  # "full" now holds every position
        s.release(rows[name])
    busy = s.row_for(np.array([1, 2], np.int32))
    assert busy not in rows.values()  # the rows that hold tokens are given up last
    s.admit(busy, np.array([1, 2], np.int32))
    for _ in range(20):
        s.step({busy: 5})

    def last_logits(prompt):
        with torch.no_grad():
            return model(torch.tensor([prompt.tolist()])).logits[0, -1].numpy()

    for name, prompt in (("kept", np.concatenate([kept, [7, 9, 8]])), ("full", np.concatenate([full[:-1], [9]]))):
        row = s.row_for(prompt)
        assert row == rows[name] and s.reusable(row, prompt) == len(prompt) - (2 if name == "kept" else 1)
        np.testing.assert_allclose(s.admit(row, prompt), last_logits(prompt), atol=1e-4)
        assert s.reused[row] == s.reusable(row, prompt) or name == "kept"
    s.close()


def test_more_prompts_than_the_largest_batch_bucket_run_in_groups(gpt2, loaded):
    model, _ = gpt2
    prompts = PROMPTS + [[1, 2, 3], [60, 61]]  # 6 rows, the largest bucket is 4
    np.testing.assert_array_equal(loaded.generate(prompts, 6), hf_generate(model, prompts, 6))


def test_sampling_is_reproducible_for_a_seed_and_the_same_in_both_loaders(gpt2, loaded):
    a = loaded.generate(PROMPTS, 8, temperature=0.9, top_k=20, seed=7)
    assert np.array_equal(a, loaded.generate(PROMPTS, 8, temperature=0.9, top_k=20, seed=7))
    assert not np.array_equal(a, loaded.generate(PROMPTS, 8, temperature=0.9, top_k=20, seed=8))
    other = (runtime.load if isinstance(loaded, tb.Executable) else tb.load)(gpt2[1], warmup="none")
    np.testing.assert_array_equal(a, other.generate(PROMPTS, 8, temperature=0.9, top_k=20, seed=7))
    greedy = loaded.generate(PROMPTS, 8)
    assert not np.array_equal(a, greedy)
    np.testing.assert_array_equal(loaded.generate(PROMPTS, 8, temperature=1e-6, seed=1), greedy)
    top1 = loaded.generate(PROMPTS, 8, temperature=5.0, top_k=1, seed=3)  # only the most likely token remains
    np.testing.assert_array_equal(top1, greedy)


def test_eos_stops_a_row_and_pads_it(gpt2, loaded):
    model, _ = gpt2
    greedy = loaded.generate(PROMPTS, 10)
    eos = int(greedy[0, 3])  # a token row 0 generates at step 3
    got = loaded.generate(PROMPTS, 10, eos_token_id=eos, pad_token_id=95)
    want = hf_generate(model, PROMPTS, 10, eos_token_id=eos, pad_token_id=95)
    np.testing.assert_array_equal(got, want)
    first = list(got[0]).index(eos)
    assert (got[0, first + 1:] == 95).all()
    single = loaded.generate([PROMPTS[0]], 10, eos_token_id=eos)
    assert single.shape == (1, first + 1) and single[0, -1] == eos  # every row stopped: fewer columns


def test_bad_requests_are_one_line_errors(loaded):
    with pytest.raises(CallError, match=r"input_ids\[2\] is a prompt of 11 tokens; plus max_new_tokens=25 is 36 "
                                        r"positions, over this artifact's generate.max_length=32.*at most 21 new tokens"):
        loaded.generate(PROMPTS, 25)
    with pytest.raises(CallError, match=r"input_ids\[1\] holds token id 96, outside \[0, 96\)"):
        loaded.generate([[1, 2], [3, 96]], 2)
    with pytest.raises(CallError, match=r"input_ids\[0\] is empty"):
        loaded.generate([[]], 2)
    with pytest.raises(CallError, match="max_new_tokens=0"):
        loaded.generate([[1]], 0)
    with pytest.raises(CallError, match="temperature=-1"):
        loaded.generate([[1]], 2, temperature=-1)


def test_the_decode_step_updates_the_cache_in_place(gpt2):
    """The cache is donated: the decode step's output is the input's buffer, the input consumed, not copied."""
    exe = tb.load(gpt2[1], warmup="none")
    decode = exe.entry("decode")
    cache = jnp.zeros((2, 2, 4, 4, MAX_LENGTH, 8), jnp.float32)  # 4 rows: a batch bucket (a padded one is copied)
    where = cache.unsafe_buffer_pointer()
    mask = np.zeros((4, MAX_LENGTH), np.int32)
    mask[:, 0] = 1
    out = decode(np.array([[5], [6], [7], [8]], np.int32), np.zeros((4, 1), np.int32), mask, cache,
                 np.zeros(4, np.int32))
    assert cache.is_deleted()
    assert out["cache"].unsafe_buffer_pointer() == where
    written = np.asarray(out["cache"])
    assert np.abs(written[:, :, :, :, 0]).sum() > 0 and not written[:, :, :, :, 1:].any()
    with pytest.raises(CallError, match="no entry 'encode'; its entries: 'prefill', 'decode'"):
        exe.entry("encode")


def test_chunks_are_bucket_sums():
    assert chunks(11, [1, 2, 4, 8]) == [8, 2, 1]
    assert chunks(16, [1, 2, 4, 8, 16]) == [16]
    assert sum(chunks(127, [1, 2, 4, 8, 16, 32, 64])) == 127


def test_cli_generate_prints_the_new_ids(gpt2, tmp_path):
    model, art = gpt2
    want = hf_generate(model, [PROMPTS[0]], 6)[0].tolist()
    r = run_cli("generate", str(art), "--input-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "6",
                "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"output_ids": want}
    r = run_cli("generate", str(art), "--input-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "6",
                "--eos-token-id", f"{want[4]},{want[2]}", "--json", cwd=tmp_path)  # stops at either
    first = min(want.index(want[4]), want.index(want[2]))
    assert r.returncode == 0 and json.loads(r.stdout) == {"output_ids": want[:first + 1]}, r.stderr
    r = run_cli("generate", str(art), "--input-ids", "5,17", "--max-new-tokens", "40", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "generate.max_length=32" in r.stderr


def test_an_eos_id_outside_the_vocabulary_is_refused_given_and_left_out_from_the_checkpoint(gpt2, tmp_path):
    """No row could stop at an id the vocabulary (96) cannot hold: given on the command line it is refused; a
    checkpoint's (transformers' tiny configs keep GPT-2's 50256) is left out, and said. A malformed value is refused."""
    ckpt = gpt2[1].parents[2] / "ckpt"
    r = run_cli(*BUILD[:5], "generate.eos_token_id=[3,500]", f"params.checkpoint={ckpt}", cwd=tmp_path)
    assert r.returncode == 2 and "generate.eos_token_id: 500 is outside the vocabulary [0, 96)" in r.stderr, r.stderr[-800:]
    r = run_cli(*BUILD[:5], "generate.eos_token_id=[eos]", f"params.checkpoint={ckpt}", cwd=tmp_path)
    assert r.returncode == 2 and "generate.eos_token_id: ['eos'] is not a token id" in r.stderr, r.stderr[-800:]
    assert not (tmp_path / "artifacts").exists()
    other = tmp_path / "ckpt"
    other.mkdir()
    for f in ("config.json", "model.safetensors"):
        (other / f).write_bytes((ckpt / f).read_bytes())
    (other / "generation_config.json").write_text(json.dumps({"eos_token_id": [50256, 7]}))
    r = run_cli(*BUILD[:5], "shapes.dims.batch=[1,1,1]", "shapes.buckets.seq=[1,8]", f"params.checkpoint={other}",
                f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)  # what it records, at 2 profiles an entry
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the checkpoint's [50256] is outside the vocabulary [0, 96) and never generated: left out" in r.stdout + r.stderr
    art = next((tmp_path / "arts" / "gpt2").iterdir())
    assert json.loads((art / "manifest.json").read_text())["metadata"]["generate"]["eos_token_id"] == [7]


def test_task_generate_refuses_models_and_shapes_it_cannot_serve(tmp_path):
    r = run_cli("model=mlp", "task=generate", cwd=tmp_path)
    assert r.returncode == 2 and "cannot generate" in r.stderr and "gpt2" in r.stderr, r.stderr[-800:]
    r = run_cli(*BUILD[:3], "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[2,4,8]", "model.n_layer=1",
                "model.n_embd=16", "model.n_head=2", "model.vocab_size=64", cwd=tmp_path)
    assert r.returncode == 2 and "must include 1" in r.stderr, r.stderr[-800:]
    r = run_cli(*BUILD[:3], "shapes.dims.seq=[1,8,32]", cwd=tmp_path)
    assert r.returncode == 2 and "leaves no room" in r.stderr, r.stderr[-800:]
    assert not (tmp_path / "artifacts").exists()


def test_verify_rebuilds_the_artifact_byte_for_byte(gpt2, tmp_path):
    r = run_cli("verify", "--rebuild", str(gpt2[1]), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "PASS  rebuild: bytes entries/decode/program.jaxexport  identical" in r.stdout
    assert "PASS  rebuild: entry decode: self-test opt" in r.stdout
