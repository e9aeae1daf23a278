"""CLIP from Hugging Face checkpoints (``models/clip.py``): every class (``CLIPModel``, each tower with and without
its projection) against PyTorch's, a tower read from a whole ``CLIPModel`` checkpoint, both pooling rules of the
text tower (the first end-of-text id, and older configs' largest id), and a ``CLIPModel`` built through ``model=hf``
and called through both loaders at padded shapes of images, texts and tokens; a row without its end of text is
refused, where transformers would pool at position 0 without a word."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from examples.clip_checkpoint import checkpoint  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB, EOS, PAD = 60, 59, 0  # the end of text is the vocabulary's last id, as CLIP's 49407
TEXT = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=12, projection_dim=8, eos_token_id=EOS, bos_token_id=EOS - 1, pad_token_id=PAD)
VISION = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4, image_size=12,
              patch_size=4, projection_dim=8)


def config(cls_name: str, eos: int = EOS):
    text = dict(TEXT, eos_token_id=eos)
    if cls_name.startswith("CLIPText"):
        return transformers.CLIPTextConfig(**text)
    if cls_name.startswith("CLIPVision"):
        return transformers.CLIPVisionConfig(**VISION)
    return transformers.CLIPConfig(text_config=text, vision_config=VISION, projection_dim=8,
                                   logit_scale_init_value=1.7)


def save(cls_name: str, path, eos: int = EOS):
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config(cls_name, eos)).eval()
    model.save_pretrained(path)
    return model


def texts(lengths: list[int], seq: int, seed: int = 0, eos: int = EOS) -> dict[str, np.ndarray]:
    """Rows as CLIP's tokenizer makes them: the start id, ids, the end of text, then padding."""
    ids = np.full((len(lengths), seq), PAD, np.int32)
    rng = np.random.default_rng(seed)
    for row, n in enumerate(lengths):
        ids[row, :n] = [eos - 1, *rng.integers(1, eos - 1, n - 2), eos]
    return {"input_ids": ids, "attention_mask": (np.arange(seq)[None] < np.array(lengths)[:, None]).astype(np.int32)}


def images(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 12, 12)).astype(np.float32)


def torch_run(model, **x):
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long if v.dtype == np.int32 else torch.float32)
                        for k, v in x.items()})


def close(got, want, what: str, real: np.ndarray | None = None) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    if real is not None:
        got, want = got[real], want[real]
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max(), what


@pytest.mark.parametrize("cls_name, zoo, head, outputs", [
    ("CLIPTextModel", "clip_text", "none", {"last_hidden_state", "pooler_output"}),
    ("CLIPTextModelWithProjection", "clip_text", "projection", {"last_hidden_state", "text_embeds"}),
    ("CLIPVisionModel", "clip_vision", "none", {"last_hidden_state", "pooler_output"}),
    ("CLIPVisionModelWithProjection", "clip_vision", "projection", {"last_hidden_state", "image_embeds"}),
    ("CLIPModel", "clip", "none", {"logits_per_image", "logits_per_text", "text_embeds", "image_embeds"}),
])
def test_every_class_matches_pytorch(cls_name, zoo, head, outputs, tmp_path):
    model = save(cls_name, tmp_path)
    assert hf.model_name(tmp_path) == zoo
    ours, params = hf.load_pretrained(MODELS[zoo], tmp_path)
    assert ours.task == head
    x = texts([7, 3, 5], 8) if zoo != "clip_vision" else {}  # padded rows: the causal and the padding mask
    if zoo != "clip_text":
        x["pixel_values"] = images(2)
    got, want = ours.apply(params, **x), torch_run(model, **x)
    assert set(got) == outputs
    for name in outputs:
        real = x["attention_mask"].astype(bool) if name == "last_hidden_state" and zoo == "clip_text" else None
        close(got[name], getattr(want, name), name, real)


def test_the_legacy_eos_rule_pools_at_the_largest_id(tmp_path):
    """A config whose eos_token_id is 2 (CLIP's before transformers' PR #24773) pools each row at its largest id (the
    first of equals, as torch's argmax), and a call then need not hold an end of text; the first-eos rule asks it."""
    model = save("CLIPTextModel", tmp_path, eos=2)
    ours, params = hf.load_pretrained(MODELS["clip_text"], tmp_path)
    x = texts([6, 4], 8)
    x["input_ids"][0, 2] = EOS  # row 0: the largest id twice, pooled at the first
    x["input_ids"][1, 3] = 30  # row 1: no end of text, pooled at its largest id
    close(ours.apply(params, **x)["pooler_output"], torch_run(model, **x).pooler_output, "pooler_output")
    assert ours.input_holds() == {}
    assert MODELS["clip_text"](eos_token_id=EOS).input_holds() == {"input_ids": EOS}


@pytest.mark.parametrize("zoo, kept", [("clip_text", "text_embeds"), ("clip_vision", "image_embeds")])
def test_a_tower_reads_a_whole_clip_checkpoint(zoo, kept, tmp_path, caplog):
    """model=clip_text (clip_vision) on a CLIPModel checkpoint: its tower and projection, as CLIPModel's
    get_text_features (get_image_features) computes them; the other tower's tensors skipped and said."""
    whole = save("CLIPModel", tmp_path)
    with caplog.at_level("INFO"):
        tower, params = hf.load_pretrained(MODELS[zoo], tmp_path)
    assert tower.task == "projection" and tower.projection_dim == 8
    assert "of the rest of the checkpoint skipped" in caplog.text
    with torch.no_grad():
        if zoo == "clip_text":
            x = texts([5, 8], 8)
            want = whole.get_text_features(input_ids=torch.tensor(x["input_ids"], dtype=torch.long),
                                           attention_mask=torch.tensor(x["attention_mask"], dtype=torch.long))
        else:
            x = {"pixel_values": images(3)}
            want = whole.get_image_features(pixel_values=torch.tensor(x["pixel_values"]))
    close(tower.apply(params, **x)[kept], getattr(want, "pooler_output", want), kept)
    alone, params = hf.load_pretrained(MODELS[zoo], tmp_path, {"head": "none"})
    assert alone.task == "none" and set(alone.apply(params, **x)) == {"last_hidden_state", "pooler_output"}


def test_an_older_config_s_text_config_dict_is_read_as_transformers_reads_it(tmp_path):
    """openai/clip-vit-large-patch14's config.json holds each tower's settings in text_config_dict and
    vision_config_dict, which transformers reads in place of text_config and vision_config."""
    import json

    model = save("CLIPModel", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config_dict"], config["text_config"] = config["text_config"], {"hidden_size": 99}
    config["vision_config_dict"], config["vision_config"] = config["vision_config"], None
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert transformers.CLIPConfig.from_pretrained(tmp_path).text_config.hidden_size == 16
    ours, params = hf.load_pretrained(MODELS["clip"], tmp_path)
    x = {**texts([5, 3], 6), "pixel_values": images(2)}
    close(ours.apply(params, **x)["logits_per_image"], torch_run(model, **x).logits_per_image, "logits_per_image")
    tower, params = hf.load_pretrained(MODELS["clip_text"], tmp_path)  # a tower of it reads the same settings
    assert tower.hidden_size == 16


def test_the_other_towers_tensors_are_skipped_only_in_a_whole_checkpoint(tmp_path):
    """A text tower's own checkpoint holding an image tower's tensor is refused naming it: only a CLIPModel's has the
    other tower, skipped."""
    from safetensors.numpy import load_file, save_file

    save("CLIPTextModelWithProjection", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({**tensors, "vision_model.post_layernorm.weight": np.ones(16, np.float32)}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(hf.CheckpointError, match="unexpected tensor vision_model.post_layernorm.weight"):
        hf.load_pretrained(MODELS["clip_text"], tmp_path)


def test_a_clip_model_builds_and_answers_zero_shot_image_classification_as_the_pipeline(tmp_path):
    """model=hf on a CLIPModel checkpoint with its tokenizer: called at padded shapes of images, texts and tokens on
    both loaders; zero_shot_image() as transformers' zero-shot-image-classification pipeline answers, its labels and
    images past the build's texts and batch run in more calls; a row without its end of text is refused."""
    model, tok = checkpoint(tmp_path / "clip")
    refused = run_cli("model=hf", f"params.checkpoint={tmp_path / 'clip'}", cwd=tmp_path)  # model=hf's text shapes
    assert refused.returncode == 2 and "is named 'texts', but the shapes config does not define it; add " \
        "shapes.dims.texts=[min,opt,max] or ={size}, or choose shapes=image_text, which does." in refused.stderr
    proc = run_cli("model=hf", f"params.checkpoint={tmp_path / 'clip'}", "shapes=image_text",
                   "shapes.dims.batch=[1,1,4]", "shapes.dims.texts=[1,2,4]", "shapes.dims.seq=[1,12,12]",
                   "shapes.buckets.seq=[12]", "shapes.buckets.texts=[4]", "shapes.buckets.batch=[4]",  # one profile
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "clip").iterdir())
    x = {**texts([6, 3, 5], 7, seed=4, eos=53), "pixel_values": images(3, seed=5)}  # 3 texts of 7, 3 images: padded
    want = torch_run(model, **x)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 12}, crop_size={"height": 12, "width": 12})
    for load in (runtime.load, tb.load):
        exe = load(art)
        got = exe(**x)
        for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
            close(got[name], getattr(want, name), name)
        pixels, pictures, pipe = answers_as_the_pipeline(exe, model, tok, processor)
        assert exe.zero_shot_image(pixels[0], "cat, dog", hypothesis_template="a {}")[0]["label"] == \
            pipe(pictures[0], candidate_labels=["cat", "dog"], hypothesis_template="a {}")[0]["label"]
        with pytest.raises(CallError, match=r"images must be pixel values, floats \[images, 3, 12, 12\]"):
            exe.zero_shot_image(pixels[:, :, :8], ["cat"])
        bad = {k: v.copy() for k, v in x.items()}
        bad["input_ids"][1, 2] = 5  # row 1's end of text replaced: it would be pooled at position 0
        with pytest.raises(CallError, match=r"input 'input_ids' row 1 holds no 53"):
            exe(**bad)


def answers_as_the_pipeline(exe, model, tok, processor):
    """``exe.zero_shot_image`` against transformers' zero-shot-image-classification pipeline on five images and five
    labels (past the tests' builds' texts and batch of 4: more calls): the same labels in the same order, the same
    scores; the images' pixels, the images and the pipeline."""
    from PIL import Image

    pipe = transformers.pipeline("zero-shot-image-classification", model=model, tokenizer=tok, image_processor=processor)
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 255, (20, 16, 3), dtype=np.uint8)) for _ in range(5)]
    pixels = processor(pictures, return_tensors="np")["pixel_values"]
    labels = ["cat", "dog", "fox", "owl", "ox"]
    expected = pipe(pictures, candidate_labels=labels, hypothesis_template="a {}")
    answers = exe.zero_shot_image(pixels, labels, hypothesis_template="a {}")
    assert [[a["label"] for a in row] for row in answers] == [[e["label"] for e in row] for row in expected]
    assert np.allclose([[a["score"] for a in row] for row in answers], [[e["score"] for e in row] for row in expected],
                       rtol=0, atol=1e-5)
    return pixels, pictures, pipe


def test_the_towers_of_one_checkpoint_serve_text_to_image_search(tmp_path):
    """model=clip_text and model=clip_vision built from one CLIPModel checkpoint with its tokenizer, served side by
    side: texts embedded through OpenAI's /v1/embeddings, images through /infer; their cosine similarity times the
    checkpoint's exp(logit_scale) is CLIPModel's logits_per_image on the same texts and images."""
    from tripy_build.serve.http import Server

    whole, tok = checkpoint(tmp_path / "clip")
    for tower, seq in (("clip_text", ["shapes.buckets.seq=[12]"]), ("clip_vision", [])):  # one profile each
        proc = run_cli(f"model={tower}", f"params.checkpoint={tmp_path / 'clip'}", "shapes.dims.batch=[1,2,4]",
                       "shapes.buckets.batch=[4]", *seq, f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    arts = [next((tmp_path / "arts" / tower).iterdir()) for tower in ("clip_text", "clip_vision")]
    words, pixels = ["a cat", "the dog", "fox"], images(3, seed=7)
    with torch.no_grad():
        want = whole(**tok(words, padding=True, return_tensors="pt"), pixel_values=torch.tensor(pixels))
    with Server(arts, port=0).start() as server:
        text = post(server, "/v1/embeddings", {"model": "clip_text", "input": words})
        text = np.array([row["embedding"] for row in text["data"]])
        image = post(server, "/v2/models/clip_vision/infer", {"inputs": [
            {"name": "pixel_values", "shape": list(pixels.shape), "datatype": "FP32", "data": pixels.ravel().tolist()}]})
        image = np.array(image["outputs"][0]["data"]).reshape(3, -1)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    close(np.exp(whole.logit_scale.item()) * image @ text.T, want.logits_per_image, "logits_per_image")
    close(text, want.text_embeds, "text_embeds")


def post(server, route: str, body: dict) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(server.url + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_settings_that_do_not_fit_are_refused_naming_them(tmp_path):
    """A head the model lacks names the towers; a tower's setting that does not fit names it under its prefix; on the
    command line, one line."""
    with pytest.raises(ValueError, match="head='projection' is not a head of Clip; one of auto, none. The towers alone: "
                                         "model=clip_text or model=clip_vision"):
        MODELS["clip"](head="projection")
    with pytest.raises(ValueError, match=r"vision_\*: hidden_size \(30\) must be divisible by num_attention_heads \(4\)"):
        MODELS["clip"](vision_hidden_size=30, vision_num_attention_heads=4)
    with pytest.raises(ValueError, match="image_size 8 is smaller than patch_size 16"):
        MODELS["siglip_vision"](image_size=8)
    proc = run_cli("model=clip_text", "model.head=classifier", f"artifacts_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "head='classifier' is not a head of ClipText; one of auto, none, projection" \
        in proc.stderr and not (tmp_path / "clip_text").exists()
