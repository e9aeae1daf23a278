"""Zero-shot classification: ``model.zero_shot`` side by side with transformers' zero-shot pipeline on PyTorch, in one run.

The model: a BART NLI classifier at facebook/bart-large-mnli's size (``BartForSequenceClassification``: 12 + 12 layers
of 1024, 16 heads, feed-forward 4096, vocabulary 50265; 407M parameters), random weights (``torch.manual_seed(0)``),
with the byte-level BPE tokenizer of ``examples/nli_checkpoint.py``, saved with ``save_pretrained`` and built once
(``model=hf``, batch up to ``--texts`` x ``--labels`` pairs, buckets batch 8 and that, seq up to 128 in
``--seq-buckets``: 32, 64 and 128 by default, the powers of two the default policy gives from 32). A
request: ``--texts`` texts of ``--words`` words each, drawn (seeded) from the tokenizer's own words, and ``--labels``
candidate labels; every text is paired with every label's hypothesis ("This example is {}.").

Contenders, each timed over ``--rounds`` requests after two untimed ones:

- ``runtime``      ``tripy_build.runtime.load(ART).zero_shot(texts, labels)`` (the pairs in as many of the build's
                   batches as they fill);
- ``torch``        ``pipeline("zero-shot-classification", model, tokenizer)(texts, candidate_labels=labels)``: the
                   pipeline as it comes, one pair per forward (its default ``batch_size`` 1);
- ``torch-batch``  the same pipeline with ``batch_size`` = the pairs of a request: one forward for them all.

Reported: each contender's median and p90 latency per request, pairs per second, the ratio of its pairs per second
to each torch contender's, and the largest difference of its scores from the pipeline's. Every contender uses all
the cores this process may run on.

    .venv/bin/python bench/zero_shot.py                   # 4 texts of 24 words, 5 labels, 10 rounds
    .venv/bin/python bench/zero_shot.py --texts 1 --labels 3
    .venv/bin/python bench/zero_shot.py --seq-buckets 32,48,64,80,96,112,128
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rerank import seq_list, timed

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORDS = "hello world the quick brown fox jumps over lazy dog don't".split()
LABELS = ["fox", "dog", "world", "hello", "lazy", "quick", "brown", "jumps"]


def build(ckpt: Path, root: Path, pairs: int, seq_buckets: str) -> tuple[Path, float]:
    started = time.perf_counter()
    buckets = sorted({min(8, pairs), pairs})
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "model=hf", f"params.checkpoint={ckpt}",
                           f"shapes.dims.batch=[1,{pairs},{pairs}]", "shapes.dims.seq=[1,64,128]",
                           f"shapes.buckets.batch=[{','.join(map(str, buckets))}]", f"shapes.buckets.seq={seq_list(seq_buckets)}",
                           f"artifacts_dir={root / 'arts'}"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return next((root / "arts" / "bart").iterdir()), time.perf_counter() - started


def scores(answers: list[dict], labels: list[str]) -> np.ndarray:
    """Each text's score per label, in ``labels``' order (answers list them highest first)."""
    return np.array([[dict(zip(a["labels"], a["scores"]))[label] for label in labels] for a in answers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=4, help="texts per request (default 4)")
    parser.add_argument("--words", type=int, default=24, help="words per text (default 24)")
    parser.add_argument("--labels", type=int, default=5, help=f"candidate labels, at most {len(LABELS)} (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="timed requests per contender (default 10)")
    parser.add_argument("--seq-buckets", default="32,64,128",
                        help="the build's seq buckets: sizes, or a policy such as fine:32 (default 32,64,128)")
    args = parser.parse_args()

    import torch
    import transformers

    from examples.nli_checkpoint import LARGE, checkpoint

    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    transformers.logging.set_verbosity_error()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(args.words)) for _ in range(args.texts)]
    labels = LABELS[:args.labels]
    pairs = args.texts * len(labels)
    root = Path(tempfile.mkdtemp(prefix="zero-shot-bench-"))
    model, tok = checkpoint(root / "ckpt", LARGE, 50265)
    art, build_s = build(root / "ckpt", root, pairs, args.seq_buckets)
    longest = max(len(tok(t, f"This example is {label}.")["input_ids"]) for t in texts for label in labels)
    print(f"{cores} cores; {args.texts} texts of {args.words} words x {len(labels)} labels = {pairs} pairs of up to "
          f"{longest} tokens; seq buckets {args.seq_buckets}; build {build_s:.0f} s")

    pipe = transformers.pipeline("zero-shot-classification", model=model, tokenizer=tok)
    results = {"torch": timed(lambda: pipe(texts, candidate_labels=labels), args.rounds),
               "torch-batch": timed(lambda: pipe(texts, candidate_labels=labels, batch_size=pairs), args.rounds)}
    from tripy_build import runtime

    rt = runtime.load(art)
    rt.wait_warmed()
    results["runtime"] = timed(lambda: rt.zero_shot(texts, labels), args.rounds)
    want = scores(results["torch"][1], labels)
    rates = {name: pairs / statistics.median(times) for name, (times, _) in results.items()}
    print(f"{'contender':12} {'median ms':>10} {'p90 ms':>8} {'pairs/s':>8} {'vs torch':>9} {'vs batch':>9} "
          f"{'max |diff|':>11}")
    for name in ("runtime", "torch-batch", "torch"):
        times, answers = results[name]
        median, p90 = statistics.median(times), sorted(times)[int(0.9 * (len(times) - 1))]
        print(f"{name:12} {median * 1e3:10.1f} {p90 * 1e3:8.1f} {rates[name]:8.1f} {rates[name] / rates['torch']:8.2f}x "
              f"{rates[name] / rates['torch-batch']:8.2f}x {float(np.abs(scores(answers, labels) - want).max()):11.2e}")


if __name__ == "__main__":
    main()
