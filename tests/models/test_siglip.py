"""SigLIP from Hugging Face checkpoints (``models/siglip.py``): every class (``SiglipModel``, each tower) against
PyTorch's, a tower read from a whole ``SiglipModel`` checkpoint, and a ``SiglipModel`` built through ``model=hf`` with
a tokenizer, answering ``zero_shot_image()`` as transformers' zero-shot-image-classification pipeline does for SigLIP
(texts padded to the fixed width, a sigmoid per label) on both loaders."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.clip_checkpoint import tokenizer  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402
from test_clip import answers_as_the_pipeline, close, images, torch_run  # noqa: E402

transformers.logging.set_verbosity_error()

WIDTH = 64  # every text's tokens: max_position_embeddings (SigLIP's, and the pipeline's max_length)
TEXT = dict(vocab_size=60, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=WIDTH)
VISION = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4, image_size=12,
              patch_size=4)


def config(cls_name: str):
    if cls_name.startswith("SiglipText"):
        return transformers.SiglipTextConfig(**TEXT)
    if cls_name.startswith("SiglipVision"):
        return transformers.SiglipVisionConfig(**VISION)
    return transformers.SiglipConfig(text_config=TEXT, vision_config=VISION)


def save(cls_name: str, path):
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config(cls_name)).eval()
    with torch.no_grad():  # SiglipModel starts its scale and bias at random: fixed, and not 0, 1
        for name, value in (("logit_scale", 1.3), ("logit_bias", -2.0)):
            if hasattr(model, name):
                getattr(model, name).fill_(value)
    model.save_pretrained(path)
    return model


def ids(rows: int, seed: int = 0) -> np.ndarray:
    """Texts as SigLIP's processor gives them: tokens, then padding (id 1) to the fixed width."""
    rng = np.random.default_rng(seed)
    out = np.ones((rows, WIDTH), np.int32)
    for row, n in enumerate(rng.integers(3, WIDTH, rows)):
        out[row, :n] = rng.integers(2, 60, n)
    return out


@pytest.mark.parametrize("cls_name, zoo, outputs", [
    ("SiglipTextModel", "siglip_text", {"last_hidden_state", "pooler_output"}),
    ("SiglipVisionModel", "siglip_vision", {"last_hidden_state", "pooler_output"}),
    ("SiglipModel", "siglip", {"logits_per_image", "logits_per_text", "text_embeds", "image_embeds"}),
])
def test_every_class_matches_pytorch(cls_name, zoo, outputs, tmp_path):
    model = save(cls_name, tmp_path)
    assert hf.model_name(tmp_path) == zoo
    ours, params = hf.load_pretrained(MODELS[zoo], tmp_path)
    x = {"input_ids": ids(3)} if zoo != "siglip_vision" else {}
    if zoo != "siglip_text":
        x["pixel_values"] = images(2)
    got, want = ours.apply(params, **x), torch_run(model, **x)
    assert set(got) == outputs
    for name in outputs:
        close(got[name], getattr(want, name), name)


@pytest.mark.parametrize("zoo", ["siglip_text", "siglip_vision"])
def test_a_tower_reads_a_whole_siglip_checkpoint(zoo, tmp_path, caplog):
    whole = save("SiglipModel", tmp_path)
    with caplog.at_level("INFO"):
        tower, params = hf.load_pretrained(MODELS[zoo], tmp_path)
    assert "of the rest of the checkpoint skipped" in caplog.text
    with torch.no_grad():
        if zoo == "siglip_text":
            x = {"input_ids": ids(2, seed=3)}
            want = whole.get_text_features(input_ids=torch.tensor(x["input_ids"], dtype=torch.long))
        else:
            x = {"pixel_values": images(3)}
            want = whole.get_image_features(pixel_values=torch.tensor(x["pixel_values"]))
    close(tower.apply(params, **x)["pooler_output"], getattr(want, "pooler_output", want), "pooler_output")


def test_a_siglip_model_answers_zero_shot_image_classification_as_the_pipeline(tmp_path):
    """model=hf on a SiglipModel checkpoint with a tokenizer that gives no attention mask (as SigLIP's): its texts run
    at the fixed width, padded as SigLIP's processor pads them, each label's score a sigmoid on its own."""
    model = save("SiglipModel", tmp_path / "siglip")
    tok = tokenizer()
    tok.model_input_names = ["input_ids"]  # SigLIP's tokenizer gives no attention_mask: the pads are attended
    tok.save_pretrained(tmp_path / "siglip")
    proc = run_cli("model=hf", f"params.checkpoint={tmp_path / 'siglip'}", "shapes=image_text",
                   "shapes.dims.batch=[1,1,4]", "shapes.dims.texts=[1,2,4]", "shapes.buckets.texts=[4]",
                   "shapes.buckets.batch=[4]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "siglip").iterdir())
    processor = transformers.SiglipImageProcessor(size={"height": 12, "width": 12})
    x = {"input_ids": ids(3, seed=2), "pixel_values": images(3, seed=4)}  # 3 texts and 3 images: padded rows
    want = torch_run(model, **x)
    for load in (runtime.load, tb.load):
        exe = load(art)
        got = exe(**x)
        for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
            close(got[name], getattr(want, name), name)
        answers_as_the_pipeline(exe, model, tok, processor)


def test_a_text_tower_takes_text_padded_to_its_width_on_the_server(tmp_path):
    """model=siglip_text from a SiglipModel checkpoint with its tokenizer, served: texts on /infer are tokenized and
    padded to the build's fixed width (SigLIP's processor's padding="max_length"), never to the longest text, which
    would move the position the tower pools; the embeddings are SiglipModel's get_text_features."""
    import json
    import urllib.request

    from tripy_build.serve.http import Server

    whole = save("SiglipModel", tmp_path / "siglip")
    tok = tokenizer()
    tok.model_input_names = ["input_ids"]
    tok.save_pretrained(tmp_path / "siglip")
    proc = run_cli("model=siglip_text", f"params.checkpoint={tmp_path / 'siglip'}", "shapes.dims.batch=[1,2,4]",
                   "shapes.buckets.batch=[4]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "siglip_text").iterdir())
    texts = ["a cat", "the dog sat"]
    with torch.no_grad():
        want = whole.get_text_features(**tok(texts, padding="max_length", max_length=WIDTH, return_tensors="pt"))
    want = getattr(want, "pooler_output", want).numpy()
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}], "outputs": [
        {"name": "pooler_output"}]}
    with Server([art], port=0).start() as server:
        req = urllib.request.Request(f"{server.url}/v2/models/siglip_text/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())["outputs"][0]
    close(np.array(out["data"]).reshape(out["shape"]), want, "pooler_output")
