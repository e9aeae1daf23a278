"""T5's encoder from Hugging Face checkpoints (``models/t5.py``): ``T5EncoderModel`` with T5's feed-forward and T5
v1.1's gated one, mT5's and UMT5's against PyTorch's, at padded rows and an attention wider than the model
(``num_heads * d_kv``); a ``T5ForConditionalGeneration`` checkpoint's encoder alone with ``model.head=none`` (its
generation: ``test_t5_generation.py``); a sentence embedding built through ``model=hf`` on both loaders at padded shapes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
SIZES = dict(vocab_size=60, d_model=16, d_kv=6, d_ff=24, num_layers=2, num_heads=3, relative_attention_num_buckets=8,
             relative_attention_max_distance=12, decoder_start_token_id=0)


def save(cls_name: str, path, proj: str = "relu", family: str = "T5"):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**SIZES, feed_forward_proj=proj)
    model = getattr(transformers, cls_name)(config).eval()
    model.save_pretrained(path)
    return model


def inputs(lengths: list[int], seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of ids ending in T5's </s> (1), padded with 0 (its pad id) to ``seq``: distances past max_distance."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), seq), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = [*rng.integers(2, 60, n - 1), 1]
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int32)}


def states(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in x.items()}).last_hidden_state.numpy()


def close(got, want, real) -> None:
    got, want = np.asarray(got)[real], np.asarray(want)[real]
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()


@pytest.mark.parametrize("family, proj", [("T5", "relu"), ("T5", "gated-gelu"), ("MT5", "gated-gelu"),
                                          ("UMT5", "gated-gelu")])
def test_the_encoder_matches_pytorch(family, proj, tmp_path):
    """T5's, T5 v1.1's (gated), mT5's and UMT5's (a table of position biases in every layer, each its own)."""
    model = save(f"{family}EncoderModel", tmp_path, proj, family)
    assert hf.model_name(tmp_path) == family.lower()
    ours, params = hf.load_pretrained(MODELS[family.lower()], tmp_path)
    x = inputs([20, 7, 14], 20)
    close(ours.apply(params, **x)["last_hidden_state"], states(model, x), x["attention_mask"].astype(bool))


def test_a_conditional_generation_checkpoint_builds_its_encoder_alone_with_head_none(tmp_path, caplog):
    model = save("T5ForConditionalGeneration", tmp_path, "gated-gelu")
    assert hf.load_pretrained(MODELS["t5"], tmp_path)[0].task == "conditional_generation"  # tests/models/test_t5_generation.py
    with caplog.at_level("INFO"):
        ours, params = hf.load_pretrained(MODELS["t5"], tmp_path, {"head": "none"})
    assert "of a head not built (head=none: the model alone) skipped: decoder." in caplog.text
    x = inputs([9, 4], 9)
    close(ours.apply(params, **x)["last_hidden_state"], states(model.encoder, x), x["attention_mask"].astype(bool))


def test_a_sentence_embedding_builds_and_runs_padded_on_both_loaders(tmp_path):
    """sentence-T5's recipe: the encoder's states averaged over the real tokens and scaled to unit length."""
    model = save("T5EncoderModel", tmp_path / "t5", "gated-gelu")
    proc = run_cli("model=hf", f"params.checkpoint={tmp_path / 't5'}", "model.pooling=mean", "model.normalize=true",
                   "shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,16,32]", "shapes.buckets.batch=[4]",
                   "shapes.buckets.seq=[16,32]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "t5").iterdir())
    x = inputs([19, 5, 11], 19)  # 3 rows of 19 run padded to 4 rows of 32
    want = states(model, x)
    keep = x["attention_mask"][..., None]
    pooled = (want * keep).sum(1) / keep.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    for load in (runtime.load, tb.load):
        got = load(art)(**x)
        close(got["last_hidden_state"], want, x["attention_mask"].astype(bool))
        assert np.abs(np.asarray(got["sentence_embedding"]) - pooled).max() <= SCALE_TOL
