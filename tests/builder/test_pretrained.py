"""Hugging Face checkpoints as params: tiny configurations of each real architecture, saved with
``save_pretrained``, built through the command line from that directory, loaded by both loaders and
compared with the PyTorch model (within 1e-4 of the output's scale) at shapes that run a profile as it is
and shapes just past a bucket (padded), over random right-padded attention masks; and the checkpoints and
calls that must be refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 99
TEXT_SHAPES = ["shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,8,16]"]
IMAGE_SHAPES = ["shapes.dims.batch=[1,2,4]"]
SMALL_TEXT = ["shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[8,8,8]"]  # after TEXT_SHAPES: the last value of a key counts

# zoo name -> (HF model class, its tiny config, build overrides)
CASES = {
    "bert": (transformers.BertModel, transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64), TEXT_SHAPES),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), TEXT_SHAPES),
    "vit": (transformers.ViTModel, transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37), IMAGE_SHAPES),
    "resnet50": (transformers.ResNetModel, transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[16, 24, 32, 40], depths=[1, 2, 1, 1]), [*IMAGE_SHAPES, "model.image_size=32"]),
}


def save_pretrained(name: str, directory: Path):
    cls, config, _ = CASES[name]
    torch.manual_seed(0)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():  # inference BatchNorm with statistics that are not the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    model.save_pretrained(directory)
    return model


def build(name: str, checkpoint: Path, arts: Path, *extra: str):
    return run_cli(f"model={name}", f"params.checkpoint={checkpoint}", f"artifacts_dir={arts}", *CASES[name][2],
                   *extra, cwd=arts.parent, env={"TRIPY_BUILD_NO_MEMO": "1"}, timeout=600)


_BUILT: dict[str, tuple] = {}


def _built(name: str, tmp_path_factory) -> tuple:
    """(name, the PyTorch model, the artifact), built once per architecture through the command line."""
    if name not in _BUILT:
        tmp = tmp_path_factory.mktemp(name)
        model = save_pretrained(name, tmp / "hf")
        proc = build(name, tmp / "hf", tmp / "arts")
        assert proc.returncode == 0, proc.stderr[-3000:]
        path = Path(next(line.split(":", 1)[1].strip().split()[0] for line in proc.stdout.splitlines()
                         if line.startswith("artifact:")))
        _BUILT[name] = (name, model, path)
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def built(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def built_text(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)


def _scale_error(got, want, rows=None) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if rows is not None:  # text: compare the real positions only
        return max(np.abs(got[i, :n] - want[i, :n]).max() for i, n in enumerate(rows)) / np.abs(want).max()
    return np.abs(got - want).max() / np.abs(want).max()


def test_built_from_a_checkpoint_matches_pytorch_unpadded_and_padded(built):
    name, model, path = built
    # the recorded config is the checkpoint's (config.json's), not the zoo's defaults: a rebuild makes this model
    recorded = json.loads((path / "manifest.json").read_text())["metadata"]["build_key_parts"]["config"]["model"]
    width = {"gpt2": "n_embd", "resnet50": "hidden_sizes"}.get(name, "hidden_size")
    assert recorded[width] == getattr(model.config, width)
    loaders = {"tb.load": tb.load(path), "tripy_build.runtime": runtime.load(path)}
    rng = np.random.default_rng(0)
    if name in ("bert", "gpt2"):
        shapes = [(2, 8), (3, 9), (4, 16), (1, 5)]  # a profile as it is, then batch and seq just past a bucket
        for b, s in shapes:
            ids = rng.integers(0, VOCAB, (b, s)).astype(np.int32)
            lengths = rng.integers(1, s + 1, b)
            mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if name == "bert":
                feeds["token_type_ids"] = rng.integers(0, 2, (b, s)).astype(np.int32)
            with torch.inference_mode():
                ref = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in feeds.items()})
            for loader, run in loaders.items():
                out = run(**feeds)
                for key in (("last_hidden_state", "pooler_output") if name == "bert" else ("logits",)):
                    rows = lengths if out[key].ndim == 3 else None
                    err = _scale_error(out[key], getattr(ref, key).numpy(), rows)
                    assert err <= SCALE_TOL, (loader, (b, s), key, err)
    else:
        for b in (2, 3):
            pixels = rng.standard_normal((b, 3, 32, 32)).astype(np.float32)
            with torch.inference_mode():
                ref = model(pixel_values=torch.tensor(pixels))
            for loader, run in loaders.items():
                out = run(pixel_values=pixels)
                for key in ("last_hidden_state", "pooler_output"):
                    err = _scale_error(out[key], getattr(ref, key).numpy())
                    assert np.asarray(out[key]).shape == tuple(getattr(ref, key).shape)
                    assert err <= SCALE_TOL, (loader, b, key, err)


def test_a_stream_over_random_masks_never_compiles(built_text, caplog):
    """Random (batch, seq) in range and random right-padded masks: every call runs a precompiled profile."""
    import logging

    name, model, path = built_text
    exe = tb.load(path, warmup="none")
    rng = np.random.default_rng(1)
    with caplog.at_level(logging.INFO, logger="tripy_build"):
        for _ in range(20):
            b, s = int(rng.integers(1, 5)), int(rng.integers(1, 17))
            ids = rng.integers(0, VOCAB, (b, s)).astype(np.int32)
            mask = (np.arange(s)[None, :] < rng.integers(1, s + 1, b)[:, None]).astype(np.int32)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if name == "bert":
                feeds["token_type_ids"] = np.zeros((b, s), np.int32)
            exe(**feeds)
    assert "on first use" not in caplog.text and "compile cache" not in caplog.text


def test_token_ids_outside_the_vocabulary_are_refused(built_text):
    name, _, path = built_text
    feeds = {"input_ids": np.array([[1, VOCAB]], np.int32), "attention_mask": np.ones((1, 2), np.int32)}
    if name == "bert":
        feeds["token_type_ids"] = np.zeros((1, 2), np.int32)
    for run in (tb.load(path, warmup="none"), runtime.load(path)):
        with pytest.raises(tb.TripyBuildError, match=rf"input 'input_ids' holds {VOCAB}, but its values must lie in "
                                                     rf"\[0, {VOCAB}\)"):
            run(**feeds)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    for name in ("bert", "gpt2"):
        save_pretrained(name, tmp / name)
    return tmp


def _edited(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


BAD = {
    "another architecture": (lambda c, t: c / "gpt2", "bert", [],
                             "is a 'gpt2' (GPT2LMHeadModel) checkpoint, not 'bert'"),
    "a contradicting size": (lambda c, t: c / "bert", "bert", ["model.hidden_size=64"],
                             "hidden_size=64 was given, but the checkpoint"),
    "a missing tensor": (lambda c, t: _edited(c / "bert", t / "missing", lambda d: d.pop("pooler.dense.bias")),
                         "bert", [], "missing tensor pooler.dense.bias"),
    "an extra tensor": (lambda c, t: _edited(c / "bert", t / "extra", lambda d: d.update(
        {"encoder.layer.7.output.dense.bias": np.zeros(32, np.float32)})), "bert", [],
        "unexpected tensor encoder.layer.7.output.dense.bias"),
    "a mis-shaped tensor": (lambda c, t: _edited(c / "bert", t / "shape", lambda d: d.update(
        {"pooler.dense.bias": np.zeros(31, np.float32)})), "bert", [],
        "tensor pooler.dense.bias in"),
    "a model without a Hugging Face architecture": (lambda c, t: c / "bert", "geglu", [],
                                                    "has no Hugging Face architecture"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_checkpoint_is_one_line_naming_the_tensor_and_nothing_is_written(case, checkpoints, tmp_path):
    make, model, extra, needle = BAD[case]
    checkpoint = make(checkpoints, tmp_path)
    proc = run_cli(f"model={model}", f"params.checkpoint={checkpoint}", f"artifacts_dir={tmp_path / 'arts'}",
                   *(TEXT_SHAPES if model != "geglu" else []), *extra, cwd=tmp_path, env={"TRIPY_BUILD_NO_MEMO": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "arts").exists() or not any((tmp_path / "arts").rglob("manifest.json"))


def test_weights_saved_prepared_rebuild_from_their_checkpoint_and_raw_ones_keep_every_tensor(tmp_path):
    """weights=prepared (the default) stores BERT's prepared matrices in place of the raw tensors: a rebuild
    reads the checkpoint the artifact records (its path and files' digests, in the index) while it is there and
    unchanged, else the one given (verify --rebuild --checkpoint), and says so without it; weights=raw keeps them.
    (Two profiles each: the weights are what is checked, and the test builds four times.)"""
    hf = tmp_path / "hf"
    save_pretrained("bert", hf)
    assert build("bert", hf, tmp_path / "arts", *SMALL_TEXT).returncode == 0
    path = next((tmp_path / "arts" / "bert").iterdir())
    m = json.loads((path / "manifest.json").read_text())
    assert all(c.get("at_rest") for c in m["prep"]["chunks"])
    assert sum(not w["file"] for w in m["weights"]) > 0
    assert str(hf.resolve()) not in (path / "manifest.json").read_text()  # the manifest's bytes do not depend on it
    assert json.loads((path / "index.json").read_text())["checkpoint"]["path"] == str(hf.resolve())
    r = run_cli("verify", "--rebuild", str(path), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "PASS  rebuild: bytes weights/prepared_0.npy  identical" in r.stdout
    assert "PASS  rebuild: bytes manifest.json  identical" in r.stdout
    assert "PASS  rebuild: params by value" in r.stdout

    moved = tmp_path / "hf2"  # a checkpoint changed since the build: not read, and the fix named
    shutil.copytree(hf, moved)
    assert build("bert", moved, tmp_path / "arts2", *SMALL_TEXT).returncode == 0
    copy = next((tmp_path / "arts2" / "bert").iterdir())
    params = json.loads((copy / "manifest.json").read_text())["metadata"]["params"]["sha256"]
    assert f"ckpt=hf2@{params[:8]}" in run_cli("list", str(tmp_path / "arts2"), cwd=tmp_path).stdout
    with open(moved / "config.json", "a") as f:
        f.write("\n")
    r = run_cli("verify", "--rebuild", str(copy), cwd=tmp_path, timeout=600)
    assert r.returncode == 1 and "verify --rebuild --checkpoint DIR" in r.stdout, r.stdout[-3000:]
    assert f"the checkpoint this artifact was built from, {moved.resolve()}, has changed since (config.json)" in r.stderr
    r = run_cli("verify", "--rebuild", "--checkpoint", str(hf), str(copy), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "PASS  rebuild: params by value" in r.stdout
    raw = build("bert", hf, tmp_path / "raw", *SMALL_TEXT, "weights=raw")
    assert raw.returncode == 0, raw.stderr[-3000:]
    raw_path = next((tmp_path / "raw" / "bert").iterdir())
    assert all(w["file"] for w in json.loads((raw_path / "manifest.json").read_text())["weights"])
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 8)).astype(np.int32)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    want = tb.load(path)(**inputs)["last_hidden_state"]
    got = runtime.load(raw_path)(**inputs)["last_hidden_state"]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
