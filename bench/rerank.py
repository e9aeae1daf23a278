"""Reranking: ``tripy-build serve``'s ``/v1/rerank`` side by side with PyTorch scoring the same pairs, in one run.

The model: a cross-encoder at cross-encoder/ms-marco-MiniLM-L-6-v2's shape (``BertForSequenceClassification``: 6
layers of 384, 12 heads, intermediate 1536, vocabulary 30522, one class), random weights (``torch.manual_seed(0)``),
with the WordPiece tokenizer of ``examples/classifier_checkpoint.py``, saved with ``save_pretrained`` and built once
(``model=hf``, batch up to ``--docs``, seq up to 256, buckets ``shapes.buckets``: batch 8 and ``--docs``, seq
``--seq-buckets``: 64, 128 and 256, the powers of two the default policy would give, from 64). A request: a query
of 8 words and ``--docs`` documents of ``--words`` words each, drawn (seeded) from the tokenizer's own words (one
token each, but "don't": three); the run prints the pairs' length.

Contenders, each timed over ``--rounds`` requests after two untimed ones:

- ``serve``   ``tripy-build serve ART`` in its own process, ``POST /v1/rerank`` over loopback HTTP from this one
              (JSON in and out: the tokenizing, padding and batching the server does included);
- ``runtime`` ``tripy_build.runtime.load(ART).classify([(query, doc), ...])`` in this process (no HTTP);
- ``torch``   ``tokenizer([query] * n, docs, padding=True)``, the model and a sigmoid under
              ``torch.inference_mode()``, ``torch.set_num_threads`` the cores this process may use: what
              sentence-transformers' ``CrossEncoder.predict`` runs.

Reported: each contender's median and p90 latency per request, documents per second, the ratio of its
documents per second to torch's, and the largest difference of its scores from torch's. Every contender uses all
the cores this process may run on; the server's are shared with the client (this process), as on one host.

    .venv/bin/python bench/rerank.py                      # 32 documents of 110 words, 20 rounds
    .venv/bin/python bench/rerank.py --docs 8 --rounds 50
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORDS = "hello world the quick brown fox jumps over lazy dog don't".split()


def checkpoint(root: Path) -> Path:
    import torch
    import transformers

    from examples.classifier_checkpoint import checkpoint as tiny

    path = tiny(root / "ckpt", num_labels=1)  # the tokenizer (and a tiny model, replaced below)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
        num_labels=1, pad_token_id=tok.pad_token_id)).eval().save_pretrained(path)
    return path


def seq_list(buckets: str) -> str:
    """``--seq-buckets`` as a Hydra value: sizes (``64,128,256``) as a list, a policy (``fine:64``) as it is."""
    return f"[{buckets}]" if all(b.strip().isdigit() for b in buckets.split(",")) else buckets


def build(ckpt: Path, root: Path, docs: int, seq_buckets: str) -> tuple[Path, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tripy_build", "model=hf", f"params.checkpoint={ckpt}",
                           f"shapes.dims.batch=[1,{docs},{docs}]", "shapes.dims.seq=[1,128,256]",
                           f"shapes.buckets.batch=[{min(8, docs)},{docs}]", f"shapes.buckets.seq={seq_list(seq_buckets)}",
                           f"artifacts_dir={root / 'arts'}"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return next((root / "arts" / "bert").iterdir()), time.perf_counter() - started


def timed(call, rounds: int) -> tuple[list[float], list[float]]:
    for _ in range(2):
        call()
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
    return times, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=32, help="documents per request (default 32)")
    parser.add_argument("--words", type=int, default=110, help="words per document (default 110)")
    parser.add_argument("--rounds", type=int, default=20, help="timed requests per contender (default 20)")
    parser.add_argument("--seq-buckets", default="64,128,256",
                        help="the build's seq buckets: sizes, or a policy such as fine:64 (default 64,128,256)")
    args = parser.parse_args()

    import torch
    import transformers

    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    rng = random.Random(0)
    query = " ".join(rng.choice(WORDS) for _ in range(8))
    docs = [" ".join(rng.choice(WORDS) for _ in range(args.words)) for _ in range(args.docs)]
    root = Path(tempfile.mkdtemp(prefix="rerank-bench-"))
    ckpt = checkpoint(root)
    art, build_s = build(ckpt, root, args.docs, args.seq_buckets)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    model = transformers.BertForSequenceClassification.from_pretrained(ckpt).eval()
    pairs = tok([query] * len(docs), docs, padding=True, return_tensors="pt")
    print(f"{cores} cores; {args.docs} documents of {args.words} words: pairs of {pairs['input_ids'].shape[1]} tokens; "
          f"seq buckets {args.seq_buckets}; build {build_s:.0f} s")

    def torch_call():
        with torch.inference_mode():
            batch = tok([query] * len(docs), docs, padding=True, return_tensors="pt")
            return torch.sigmoid(model(**batch).logits[:, 0]).numpy()

    results = {"torch": timed(torch_call, args.rounds)}
    from tripy_build import runtime

    rt = runtime.load(art)
    rt.wait_warmed()
    results["runtime"] = timed(lambda: np.array([c[0]["score"] for c in rt.classify([(query, d) for d in docs])]),
                               args.rounds)
    port = 18431
    server = subprocess.Popen([sys.executable, "-m", "tripy_build", "serve", str(art), "--port", str(port),
                               "--wait-ready"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in server.stdout:
            if line.startswith("serving on"):
                break
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = json.dumps({"model": "bert", "query": query, "documents": docs, "return_documents": False})

        def serve_call():
            conn.request("POST", "/v1/rerank", body, {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            scores = np.zeros(len(docs))
            for r in answer["results"]:
                scores[r["index"]] = r["relevance_score"]
            return scores

        results["serve"] = timed(serve_call, args.rounds)
    finally:
        server.terminate()
        server.wait(30)
    want = results["torch"][1]
    base = args.docs / statistics.median(results["torch"][0])
    print(f"{'contender':10} {'median ms':>10} {'p90 ms':>8} {'docs/s':>8} {'vs torch':>9} {'max |diff|':>11}")
    for name in ("serve", "runtime", "torch"):
        times, scores = results[name]
        median, p90 = statistics.median(times), sorted(times)[int(0.9 * (len(times) - 1))]
        rate = args.docs / median
        print(f"{name:10} {median * 1e3:10.1f} {p90 * 1e3:8.1f} {rate:8.1f} {rate / base:8.2f}x "
              f"{float(np.abs(scores - want).max()):11.2e}")


if __name__ == "__main__":
    main()
