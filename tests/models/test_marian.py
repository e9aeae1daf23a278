"""Marian (``models/bart.py``'s ``Marian``: the Helsinki-NLP/opus-mt-* translators) from Hugging Face checkpoints.

A tiny ``MarianMTModel`` (opus-mt's layout: the pad token starts the decoder, 0 ends a sentence, ``bad_words_ids`` the
pad, swish, scaled embeddings) is saved with ``save_pretrained``: its logits, and a bare ``MarianModel``'s states,
equal PyTorch's; an older file's sinusoidal position tables are read past; the decoder token by token (``encode``,
``step``) equals the whole sequence; built through ``model=hf task=generate`` its greedy replies equal transformers'
``generate`` on both loaders, the pad never generated, and so do its beam searches; a checkpoint of separate encoder
and decoder tables is refused.

Its tokenizer is opus-mt's kind: a SentencePiece model (trained here on a few sentences) with ``vocab.json``, saved by
``MarianTokenizer``: ``runtime/marian_tokenizer.py`` encodes and decodes as it does, and the artifact translates text
(``tripy-build generate --prompt``) as transformers' tokenizer and ``generate`` do.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.nli_checkpoint import TINY  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB, PAD, EOS = 64, 63, 0  # opus-mt's: the pad (the decoder's start) last, </s> 0
TOL = 1e-5
MAX_LENGTH = 12
SIZES = dict(TINY, activation_function="swish", scale_embedding=True)


def config(**kw) -> transformers.MarianConfig:
    return transformers.MarianConfig(vocab_size=VOCAB, **SIZES, init_std=0.5, pad_token_id=PAD,
                                     decoder_start_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=EOS, **kw)


CORPUS = ["the quick brown fox jumps over the lazy dog", "Hello world, how are you today?", "Über naïve café — 東京 2026!",
          "translation models read sentences and write them again", "a dog, a cat and a bird"]
TEXTS = ["the quick brown fox", "Hello world, how are you today?", ">>fr<< a dog", "Über naïve café — 東京 2026! zq", "",
         "  spaced   out  ", "a</s>b", "x<unk>y<pad>", ">>de<<", "tab\tnew\nline"]


def tokenizer(path, tmp_path):
    """opus-mt's kind of tokenizer saved in ``path``: a unigram SentencePiece model of 60 pieces, ``vocab.json``
    mapping all but two of them (those are ``<unk>``) into the model's 64 ids, with two language codes; returns
    transformers' ``MarianTokenizer`` read back from ``path``."""
    import sentencepiece

    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS * 20))
    sentencepiece.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=60, model_type="unigram", character_coverage=1.0,
                                             minloglevel=2)
    spm = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    pieces = [p for p in map(spm.id_to_piece, range(spm.get_piece_size())) if p not in ("<unk>", "<s>", "</s>")]
    vocab = {"</s>": EOS, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces[:-2])}, ">>fr<<": 60, ">>de<<": 61,
             "<pad>": PAD}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    transformers.MarianTokenizer(source_spm=str(tmp_path / "spm.model"), target_spm=str(tmp_path / "spm.model"),
                                 vocab=str(tmp_path / "vocab.json")).save_pretrained(path)
    return transformers.MarianTokenizer.from_pretrained(path)


def sources(lengths=(5, 11, 3), seed: int = 1) -> list[list[int]]:
    """Sources as Marian's tokenizer makes them: ids, then ``</s>``."""
    rng = np.random.default_rng(seed)
    return [[*rng.integers(1, PAD, n - 1).tolist(), EOS] for n in lengths]


def padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([r + [PAD] * (max(map(len, rows)) - len(r)) for r in rows], np.int32)
    return ids, (ids != PAD).astype(np.int32)


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """(transformers' ``MarianMTModel``, its directory): the pad's logit raised so that only ``bad_words_ids``
    (opus-mt's generation_config.json has ``[[pad]]``) keeps greedy replies from it."""
    root = tmp_path_factory.mktemp("marian")
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config()).eval()
    model.final_logits_bias[0, PAD] = 4.0
    model.generation_config.bad_words_ids = [[PAD]]
    model.save_pretrained(root / "ckpt")
    tokenizer(root / "ckpt", root)
    return model, root / "ckpt"


def test_the_tokenizer_encodes_and_decodes_as_transformers(translator):
    """Special tokens in the text, a language code, characters the pieces lack, blanks; and random ids decoded (those
    ``vocab.json`` lacks as transformers reads them: the SentencePiece model's pieces)."""
    from tripy_build.builder.tokenizer import files
    from tripy_build.runtime.stored_tokenizer import read

    theirs = transformers.MarianTokenizer.from_pretrained(translator[1])
    stored = files(str(translator[1]))
    assert sorted(stored) == ["source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]
    ours = read(stored, "marian")
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) == ids and ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    rng = np.random.default_rng(0)
    for _ in range(100):
        ids = [t for t in rng.integers(0, VOCAB, 10).tolist() if t != 62]  # 62: in neither (transformers raises)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids
    stream = ours.stream()
    assert "".join(map(stream.add, ours.encode(TEXTS[1]))) + stream.flush() == TEXTS[1]
    with pytest.raises(tb.errors.CallError, match="a grammar \\(json_schema\\) is not a Marian translator's"):
        ours.serialized()


@pytest.mark.parametrize("suffix", ["Model", "MTModel"])
def test_outputs_match_pytorch_and_an_older_file_s_position_tables_are_read_past(suffix, translator, tmp_path):
    from safetensors.numpy import load_file, save_file

    if suffix == "MTModel":
        model, path = translator
    else:
        torch.manual_seed(0)
        model, path = transformers.MarianModel(config()).eval(), tmp_path / "bare"
        model.save_pretrained(path)
    assert hf.model_name(path) == "marian"
    zoo, params = hf.load_pretrained(MODELS["marian"], path)
    assert zoo.task == ("conditional_generation" if suffix == "MTModel" else "none")
    assert "position" not in params["encoder"] and "ln" not in params["decoder"]
    ids, mask = padded(sources())
    decoder = np.concatenate([np.full((len(ids), 1), PAD, np.int32), ids[:, :-1]], axis=1)  # Marian's shift
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(),
                       decoder_input_ids=torch.tensor(decoder).long())
    ours = zoo.apply(params, ids, mask)
    assert set(ours) == ({"logits"} if suffix == "MTModel" else {"last_hidden_state", "encoder_last_hidden_state"})
    real = mask.astype(bool)
    for name, got in ours.items():
        got, want = np.asarray(got)[real], getattr(theirs, name).numpy()[real]
        assert np.abs(got - want).max() <= TOL * np.abs(want).max(), name

    if suffix == "MTModel":  # a file that saved the tables (_keys_to_ignore_on_save drops them now): read past
        old = tmp_path / "old"
        old.mkdir()
        tensors = load_file(path / "model.safetensors")
        for side in ("encoder", "decoder"):
            tensors[f"model.{side}.embed_positions.weight"] = getattr(model.model, side).embed_positions.weight.numpy()
        save_file(tensors, old / "model.safetensors")
        (old / "config.json").write_text((path / "config.json").read_text())
        _, again = hf.load_pretrained(MODELS["marian"], old)
        assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool((a == b).all()), params, again))


def test_the_decoder_token_by_token_equals_the_whole_sequence(translator):
    """``encode`` then ``step`` at positions 0, 1, ... (the sinusoids' rows at ``cache_index``) give ``apply``'s
    logits."""
    zoo, params = hf.load_pretrained(MODELS["marian"], translator[1])
    ids, mask = padded(sources())
    b, s = ids.shape
    whole = np.asarray(zoo.apply(params, ids, mask)["logits"])
    cross = zoo.encode(params, ids, mask)["cross"]
    cache = [jnp.zeros(zoo.cache_shape(b, MAX_LENGTH), jnp.float32) for _ in range(2 * zoo.decoder_layers)]
    step = jax.jit(zoo.step)
    token = np.full((b, 1), PAD, np.int32)
    for at in range(s):
        out = step(params, token, jnp.full((b,), at, jnp.int32), mask, cross, cache)
        cache = out["cache"]
        got = np.asarray(out["logits"])
        assert np.abs(got - whole[:, at]).max() <= TOL * np.abs(whole).max(), at
        token = ids[:, at:at + 1]


def hf_generate(model, rows: list[list[int]], n: int, **kw) -> list[list[int]]:
    """transformers' greedy replies (its start token left out; a finished row's padding cut)."""
    ids, mask = padded(rows)
    with torch.no_grad():
        out = model.generate(torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(), max_new_tokens=n,
                             **{"do_sample": False, "num_beams": 1, **kw})
    return [cut(r) for r in out[:, 1:].tolist()]


def cut(row) -> list[int]:
    """A reply up to its first end, the end kept."""
    row = [int(t) for t in row]
    return row[:row.index(EOS) + 1] if EOS in row else row


def test_greedy_translations_equal_transformers_and_never_hold_the_pad(translator, tmp_path):
    model, path = translator
    r = run_cli("model=hf", "task=generate", f"generate.max_length={MAX_LENGTH}", "shapes.dims.batch=[1,1,4]",
                "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[16]", "shapes.buckets.batch=[4]",  # the profile called
                f"params.checkpoint={path}", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    art = next((tmp_path / "arts" / "marian").iterdir())
    meta = json.loads((art / "manifest.json").read_text())["metadata"]["generate"]
    assert (meta["decoder_start_token_id"], meta["forced_eos_token_id"], meta["eos_token_id"]) == (PAD, EOS, [EOS])
    rows = sources()  # 5, 11 and 3 tokens: three rows padded to batch 4 and the 16 bucket
    assert any(PAD in row for row in hf_generate(model, rows, MAX_LENGTH, bad_words_ids=None))  # its suppression tested
    for load in (tb.load, runtime.load):
        exe = load(art)
        for n in (1, 6, MAX_LENGTH):
            want = hf_generate(model, rows, n)
            assert [cut(row) for row in exe.generate(rows, max_new_tokens=n)] == want, (load, n)
            assert not any(PAD in row for row in want)
        # opus-mt's search: 4 beams (a source a batch of 4 rows), the pad suppressed in every beam
        want = hf_generate(model, rows, MAX_LENGTH, num_beams=4)
        assert [cut(row) for row in exe.generate(rows, max_new_tokens=MAX_LENGTH, num_beams=4)] == want, load
        assert not any(PAD in row for row in want)
    # text in and out, through the tokenizer the artifact stores
    theirs = transformers.MarianTokenizer.from_pretrained(path)
    ids = theirs(TEXTS[0])["input_ids"]  # 16 tokens: the build's longest source
    reply = hf_generate(model, [ids], MAX_LENGTH)[0]
    r = run_cli("generate", str(art), "--prompt", TEXTS[0], "--max-new-tokens", str(MAX_LENGTH), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["text_output"] == theirs.decode(reply, skip_special_tokens=True)


@pytest.mark.parametrize("setting, message", [
    ({"share_encoder_decoder_embeddings": False},
     "share_encoder_decoder_embeddings=False, but Marian implements only share_encoder_decoder_embeddings=True"),
    ({"decoder_vocab_size": VOCAB + 2},
     f"decoder_vocab_size={VOCAB + 2} with vocab_size={VOCAB}: Marian reads one table, shared by the encoder"),
])
def test_separate_encoder_and_decoder_tables_are_refused_in_one_line(setting, message, translator, tmp_path):
    if "share_encoder_decoder_embeddings" in setting:  # a checkpoint of its own: no shared table, a decoder one
        transformers.MarianMTModel(config(**setting, decoder_vocab_size=VOCAB + 2)).save_pretrained(tmp_path / "ckpt")
    else:  # the setting alone
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "model.safetensors").write_bytes((translator[1] / "model.safetensors").read_bytes())
        cfg = json.loads((translator[1] / "config.json").read_text())
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**cfg, **setting}))
    with pytest.raises(hf.CheckpointError, match=message) as e:
        hf.load_pretrained(MODELS["marian"], tmp_path / "ckpt")
    assert "\n" not in str(e.value)
