"""CLIP: zero-shot image classification and image embeddings, tripy_build next to transformers on PyTorch, in one run.

The model: a ``CLIPModel`` at openai/clip-vit-base-patch32's size (``CLIPConfig()``: a ViT-B/32 image tower at 224 x 224
and a 12-layer text tower of 512; 151M parameters), random weights (``torch.manual_seed(0)``), with the letters tokenizer
of ``examples/clip_checkpoint.py`` (a label's text is a few more tokens than CLIP's own BPE gives), saved with
``save_pretrained``. Two builds from it: ``model=hf shapes=image_text`` (the whole model: images batch up to ``--images``,
texts up to 8, seq buckets 16, 32, 77) and ``model=clip_vision`` (its image tower and projection alone, batch buckets
1, 8 and ``--images``).

Contenders, each timed over ``--rounds`` requests after two untimed ones, on the same ``--images`` random images (pixel
values, as CLIP's image processor makes them) and ``--labels`` labels in "a photo of a {}":

- zero-shot: ``runtime.load(clip).zero_shot_image(pixels, labels)`` (the labels tokenized, padded to the longest, both
  towers, the softmax) against ``CLIPModel(**tokenizer(texts, padding=True), pixel_values)`` and its softmax on PyTorch
  (the same work; transformers' pipeline adds its image preprocessing and runs one image per forward);
- image embeddings: ``runtime.load(clip_vision)(pixel_values=...)["image_embeds"]`` against
  ``CLIPVisionModelWithProjection(pixel_values).image_embeds`` (the tower a search index embeds its images with), at
  batch 1 and ``--images``.

Reported: median and p90 ms per request, the ratio of PyTorch's median to ours (> 1: faster than PyTorch), and the
largest difference from PyTorch's values. Every contender uses all the cores this process may run on.

    .venv/bin/python bench/clip.py                      # 8 images, 5 labels, 10 rounds
    .venv/bin/python bench/clip.py --images 16 --labels 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rerank import timed

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LABELS = ["cat", "dog", "car", "tree", "boat", "house", "bird", "horse"]
TEMPLATE = "a photo of a {}"


def build(root: Path, ckpt: Path, model: str, *overrides: str) -> tuple[Path, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tripy_build", f"model={model}", f"params.checkpoint={ckpt}",
                           *overrides, f"artifacts_dir={root / 'arts'}"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    name = "clip" if model == "hf" else model
    return next((root / "arts" / name).iterdir()), time.perf_counter() - started


def row(name: str, ours: list[float], theirs: list[float], diff: float) -> str:
    ms = [statistics.median(t) * 1e3 for t in (ours, theirs)]
    p90 = sorted(ours)[int(0.9 * (len(ours) - 1))] * 1e3
    return f"{name:24} {ms[0]:9.1f} {p90:8.1f} {ms[1]:10.1f} {ms[1] / ms[0]:8.2f}x {diff:11.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8, help="images per request (default 8)")
    parser.add_argument("--labels", type=int, default=5, help=f"candidate labels, at most {len(LABELS)} (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="timed requests per contender (default 10)")
    args = parser.parse_args()

    import torch
    import transformers

    from examples.clip_checkpoint import BASE, checkpoint
    from tripy_build import runtime

    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    transformers.logging.set_verbosity_error()
    root = Path(tempfile.mkdtemp(prefix="clip-bench-"))
    model, tok = checkpoint(root / "ckpt", BASE)
    n = args.images
    whole, whole_s = build(root, root / "ckpt", "hf", "shapes=image_text", f"shapes.dims.batch=[1,{n},{n}]",
                           "shapes.dims.texts=[1,8,8]", f"shapes.buckets.batch=[{n}]", "shapes.buckets.texts=[8]",
                           "shapes.buckets.seq=[16,32,77]")
    tower, tower_s = build(root, root / "ckpt", "clip_vision", f"shapes.dims.batch=[1,{n},{n}]",
                           f"shapes.buckets.batch=[{','.join(map(str, sorted({1, min(8, n), n})))}]")
    labels = LABELS[:args.labels]
    texts = [TEMPLATE.format(label) for label in labels]
    pixels = np.random.default_rng(0).standard_normal((n, 3, 224, 224)).astype(np.float32)
    print(f"{cores} cores; CLIP ViT-B/32 (random weights); {n} images x {len(labels)} labels of up to "
          f"{max(len(tok(t)['input_ids']) for t in texts)} tokens; builds: clip {whole_s:.0f} s, clip_vision {tower_s:.0f} s")

    def torch_zero_shot():
        with torch.inference_mode():
            logits = model(**tok(texts, padding=True, return_tensors="pt"), pixel_values=torch.from_numpy(pixels))
            return logits.logits_per_image.softmax(dim=1).numpy()
    vision = transformers.CLIPVisionModelWithProjection.from_pretrained(root / "ckpt").eval()

    def torch_embed(x):
        with torch.inference_mode():
            return vision(pixel_values=torch.from_numpy(x)).image_embeds.numpy()

    clip, images = runtime.load(whole), runtime.load(tower)
    clip.wait_warmed()
    images.wait_warmed()
    ours, got = timed(lambda: clip.zero_shot_image(pixels, labels, hypothesis_template=TEMPLATE), args.rounds)
    theirs, want = timed(torch_zero_shot, args.rounds)
    got = np.array([[dict((a["label"], a["score"]) for a in image)[label] for label in labels] for image in got])
    print(f"{'request':24} {'median ms':>9} {'p90 ms':>8} {'torch ms':>10} {'vs torch':>9} {'max |diff|':>11}")
    print(row(f"zero-shot {n}x{len(labels)}", ours, theirs, float(np.abs(got - want).max())))
    for batch in sorted({1, n}):
        x = pixels[:batch]
        ours, got = timed(lambda x=x: images(pixel_values=x)["image_embeds"], args.rounds)
        theirs, want = timed(lambda x=x: torch_embed(x), args.rounds)
        print(row(f"image embeddings x{batch}", ours, theirs, float(np.abs(np.asarray(got) - want).max())))


if __name__ == "__main__":
    main()
