"""T5's decoder from Hugging Face checkpoints (``models/t5.py``, ``head=conditional_generation``) against PyTorch's
``*ForConditionalGeneration``: the logits over padded sources, ``encode`` and ``step`` a token at a time into a
cache (rows at positions of their own), and greedy decoding against ``generate``; for t5-small's LM head (the shared
table, the output scaled), FLAN-T5's (gated, an LM head of its own, fewer decoder layers than encoder layers), mT5's
and UMT5's (a position table in every decoder layer); FLAN-T5's built with ``task=generate`` and run by both
loaders; checkpoints as transformers 4 saved them (an untied config, the
tied head's tensors, the cross-attention's unread position table); the refusals."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-5
VOCAB, EOS, PAD = 64, 1, 0
SIZES = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
             relative_attention_max_distance=6, decoder_start_token_id=PAD)
MAX_LENGTH = 8  # the decoder's cache: past max_distance, so the last bucket is read
# (family, feed_forward_proj, an LM head of its own, the config's other settings; transformers 5 keeps a new
# model's LM head tied whatever tie_word_embeddings says, and saves tie_word_embeddings=false as
# scale_decoder_outputs=false)
CASES = {"t5": ("T5", "relu", False, {}),
         "flan-t5": ("T5", "gated-gelu", True, {"tie_word_embeddings": False, "num_decoder_layers": 1}),
         "mt5": ("MT5", "gated-gelu", True, {}),
         "umt5": ("UMT5", "gated-gelu", True, {"tie_word_embeddings": False})}


def save(path, family: str, proj: str, own_head: bool, **settings):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**SIZES, feed_forward_proj=proj, **settings)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(config).eval()
    if own_head:
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    model.save_pretrained(path)
    return model


def sources(lengths: list[int], seq: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of ids ending in </s>, padded with 0 to ``seq``."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), seq), PAD, np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = [*rng.integers(2, VOCAB, n - 1), EOS]
    return {"input_ids": ids, "attention_mask": (ids != PAD).astype(np.int32)}


def torch_logits(model, x, decoder_ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(x["attention_mask"], dtype=torch.long),
                     decoder_input_ids=torch.tensor(decoder_ids, dtype=torch.long)).logits.numpy()


def close(got, want, real=...) -> None:
    got, want = np.asarray(got)[real], np.asarray(want)[real]
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family, proj, own_head, settings = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    torch_model = save(path, family, proj, own_head, **settings)
    model, params = hf.load_pretrained(MODELS[family.lower()], path)
    return request.param, path, torch_model, model, params, jax.jit(model.encode), jax.jit(model.step)


def test_the_logits_match_pytorch(case):
    """``apply``: the decoder over the sources shifted right, as transformers' forward with its labels' shift."""
    name, path, torch_model, model, params, _, _ = case
    assert hf.model_name(path) == CASES[name][0].lower()
    assert (model.task, model.own_lm_head, model.scaled) == ("conditional_generation", name != "t5", name == "t5")
    assert ("lm_head" in params) == model.own_lm_head
    assert len(params["decoder"]["layers"]) == CASES[name][3].get("num_decoder_layers", 2)
    x = sources([12, 5, 9])
    want = torch_logits(torch_model, x, torch_model._shift_right(torch.tensor(x["input_ids"], dtype=torch.long)).numpy())
    got = jax.jit(model.apply)(params, **x)["logits"]
    close(got, want, x["attention_mask"].astype(bool))


def test_encode_and_step_match_pytorch_token_by_token(case):
    """Each row's token at its own position (row r lags r steps, its first token written again meanwhile): the
    logits at every position are PyTorch's over the whole decoder input."""
    _, _, torch_model, model, params, encode, step = case
    x = sources([12, 5, 9], seed=1)
    decoder_ids = np.random.default_rng(2).integers(2, VOCAB, (3, MAX_LENGTH)).astype(np.int32)
    decoder_ids[:, 0] = model.decoder_start_token_id
    want = torch_logits(torch_model, x, decoder_ids)
    cross = encode(params, **x)["cross"]
    assert len(cross) == 2 * model.decoder_layers
    assert all(c.shape == model.cross_shape(3, 12) and c.dtype == jnp.float32 for c in cross)
    cache = zeros(model, 3, jnp.float32)
    rows = np.arange(3)
    for t in range(MAX_LENGTH + 2):
        at = np.clip(t - rows, 0, MAX_LENGTH - 1).astype(np.int32)
        out = step(params, decoder_ids[rows, at][:, None], at, x["attention_mask"], cross, cache)
        cache = out["cache"]
        close(out["logits"], want[rows, at])


def zeros(model, batch: int, dtype) -> list[jax.Array]:
    """``step``'s empty cache: an array per decoder layer and kind."""
    return [jnp.zeros(model.cache_shape(batch, MAX_LENGTH), dtype) for _ in range(2 * model.decoder_layers)]


def greedy(model, params, encode, step, x, n: int) -> np.ndarray:
    """The argmax token at each step until every row ended (``EOS``; an ended row's tokens ``PAD``), as
    ``generate`` picks them without sampling."""
    cross = encode(params, **x)["cross"]
    b = len(x["input_ids"])
    cache = zeros(model, b, jnp.float32)
    token, done, out = np.full(b, model.decoder_start_token_id, np.int32), np.zeros(b, bool), []
    for t in range(n):
        r = step(params, token[:, None], np.full(b, t, np.int32), x["attention_mask"], cross, cache)
        cache = r["cache"]
        token = np.where(done, PAD, np.argmax(np.asarray(r["logits"]), -1)).astype(np.int32)
        out.append(token)
        done |= token == EOS
        if done.all():
            break
    return np.stack(out, axis=1)


def test_greedy_decoding_matches_generate(case):
    _, _, torch_model, model, params, encode, step = case
    x = sources([12, 5, 9], seed=3)
    with torch.no_grad():
        want = torch_model.generate(input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
                                    attention_mask=torch.tensor(x["attention_mask"], dtype=torch.long),
                                    max_new_tokens=6, do_sample=False, num_beams=1).numpy()
    assert (want[:, 0] == model.decoder_start_token_id).all()
    np.testing.assert_array_equal(greedy(model, params, encode, step, x, 6), want[:, 1:])


@pytest.mark.parametrize("case", ["flan-t5"], indirect=True)
def test_an_artifact_generates_as_transformers_with_both_loaders(case, tmp_path):
    """Built through the command line (task=generate): three sources padded to 4 rows and 16 positions."""
    _, path, torch_model, *_ = case
    r = run_cli("model=hf", "task=generate", f"params.checkpoint={path}", f"generate.max_length={MAX_LENGTH}",
                "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[16]",
                "shapes.buckets.batch=[4]", f"artifacts_dir={tmp_path}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    x = sources([12, 5, 9], seed=3)
    with torch.no_grad():
        want = torch_model.generate(input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
                                    attention_mask=torch.tensor(x["attention_mask"], dtype=torch.long),
                                    max_new_tokens=MAX_LENGTH, do_sample=False, num_beams=1).numpy()[:, 1:]
    with torch.no_grad():  # a beam search, its cache (T5's) reordered
        beams = torch_model.generate(input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
                                     attention_mask=torch.tensor(x["attention_mask"], dtype=torch.long),
                                     max_new_tokens=MAX_LENGTH, do_sample=False, num_beams=2,
                                     length_penalty=0.5).numpy()[:, 1:]
    for load in (runtime.load, tb.load):
        exe = load(next((tmp_path / "t5").iterdir()))
        got = exe.generate(x["input_ids"], MAX_LENGTH, attention_mask=x["attention_mask"])
        np.testing.assert_array_equal(got, want[:, :got.shape[1]])
        assert got.shape[1] == want.shape[1] or (got[:, -1] == EOS).all()
        searched = exe.generate(x["input_ids"], MAX_LENGTH, attention_mask=x["attention_mask"], num_beams=2,
                                length_penalty=0.5)
        np.testing.assert_array_equal(searched, beams)


@pytest.mark.parametrize("case", ["umt5"], indirect=True)
def test_in_bfloat16_the_caches_are_the_weights_dtype_and_the_logits_float32(case):
    _, _, _, model, params, encode, step = case
    half = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    x = sources([12, 5, 9], seed=4)
    cross = encode(half, **x)["cross"]
    assert all(c.dtype == jnp.bfloat16 for c in cross)
    cache = zeros(model, 3, jnp.bfloat16)
    start = np.full((3, 1), model.decoder_start_token_id, np.int32)
    out = step(half, start, np.zeros(3, np.int32), x["attention_mask"], cross, cache)
    assert all(c.dtype == jnp.bfloat16 for c in out["cache"]) and out["logits"].dtype == jnp.float32
    want = np.asarray(step(params, start, np.zeros(3, np.int32), x["attention_mask"], encode(params, **x)["cross"],
                           zeros(model, 3, jnp.float32))["logits"])
    assert np.abs(np.asarray(out["logits"]) - want).max() <= 0.05 * np.abs(want).max()


def rewritten(src, dst, config_edit=None, tensors_edit=None):
    shutil.copytree(src, dst)
    if config_edit is not None:
        config = json.loads((dst / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    if tensors_edit is not None:
        tensors = load_file(dst / "model.safetensors")
        tensors_edit(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_checkpoints_as_transformers_4_saved_them(tmp_path):
    """t5-small's file with its tied tensors saved (the LM head and both embed_tokens, equal to the shared table) and
    the cross-attention's position table T5 never reads; FLAN-T5's config.json with tie_word_embeddings=false and no
    scale_decoder_outputs (an LM head of its own, the output unscaled): both read as their transformers 5 saves."""
    save(tmp_path / "t5", "T5", "relu", False)
    save(tmp_path / "flan", "T5", "gated-gelu", True, tie_word_embeddings=False)

    def old_tensors(t):
        t.update({k: t["shared.weight"] for k in ("lm_head.weight", "encoder.embed_tokens.weight",
                                                  "decoder.embed_tokens.weight")})
        t["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = np.ones((8, 4), np.float32)

    def old_config(c):
        c["tie_word_embeddings"] = False
        del c["scale_decoder_outputs"]
    for name, edits in (("t5", {"tensors_edit": old_tensors}), ("flan", {"config_edit": old_config})):
        new, new_params = hf.load_pretrained(MODELS["t5"], tmp_path / name)
        old, old_params = hf.load_pretrained(MODELS["t5"], rewritten(tmp_path / name, tmp_path / f"{name}-old", **edits))
        assert (old.task, old.scaled, old.own_lm_head) == (new.task, new.scaled, new.own_lm_head) == \
            ("conditional_generation", name == "t5", name == "flan")
        assert jax.tree_util.tree_structure(old_params) == jax.tree_util.tree_structure(new_params)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(old_params),
                                                        jax.tree_util.tree_leaves(new_params)))


def test_an_unscaled_output_without_its_own_lm_head_is_refused_naming_the_fix(tmp_path):
    """transformers 5 ties a new T5 v1.1-style model's LM head to the shared table (saving none): refused, and read
    once saved with a head of its own as the message says."""
    model = save(tmp_path / "tied", "T5", "gated-gelu", False, tie_word_embeddings=False)
    with pytest.raises(hf.CheckpointError, match=r"missing tensor lm_head\.weight .*an LM head of its own, which this "
                                                 r"checkpoint does not hold .*model\.lm_head\.weight = torch\.nn\."
                                                 r"Parameter\(model\.shared\.weight\.clone\(\)\)"):
        hf.load_pretrained(MODELS["t5"], tmp_path / "tied")
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.clone())
    model.save_pretrained(tmp_path / "own")
    ours, params = hf.load_pretrained(MODELS["t5"], tmp_path / "own")
    x = sources([12, 5, 9], seed=6)
    want = torch_logits(model, x, model._shift_right(torch.tensor(x["input_ids"], dtype=torch.long)).numpy())
    close(ours.apply(params, **x)["logits"], want, x["attention_mask"].astype(bool))


@pytest.mark.parametrize("settings, message", [
    ({"head": "causal_lm"}, r"head='causal_lm' is not a head of T5Encoder; one of auto, none \(the \*EncoderModel\), "
                            r"conditional_generation"),
    ({"head": "conditional_generation", "pooling": "mean"},
     "pooling=mean makes a sentence embedding of the encoder's states, and head=conditional_generation outputs the "
     "decoder's logits: pool with head=none"),
    ({"head": "conditional_generation", "num_decoder_layers": 0}, r"num_decoder_layers=0: give a positive count, or "
                                                                   r"null for num_layers \(2\)"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        MODELS["t5"](**SIZES, **settings)
