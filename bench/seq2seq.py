"""Encoder-decoders generating (``task=generate`` of a ``*ForConditionalGeneration``): tripy_build (both loaders)
next to transformers' ``generate`` on PyTorch: greedy (one sequence per source) and by beam search (4 beams, as
BART's summarizers and Marian's translators search).

Models, random weights from ``torch.manual_seed(0)`` at real sizes (no checkpoint is downloaded here; only the sizes
matter for speed), written once with ``save_pretrained``:

- ``t5``:   t5-small's ``T5ForConditionalGeneration`` (6 + 6 layers, 512 wide, vocab 32128: 60M parameters);
- ``bart``: bart-base's ``BartForConditionalGeneration`` (6 + 6 layers, 768 wide, vocab 50265: 140M);
- ``whisper``: whisper-base's ``WhisperForConditionalGeneration`` (6 + 6 layers, 512 wide, vocab 51865: 73M), its
  sources 30 seconds of random log-mel features ``[batch, 80, 3000]`` (``--source`` unread), each reply opening with
  the start token alone (random weights: no language to detect).

tripy_build builds each with ``task=generate`` (sources up to 128 tokens, buckets 64 and 128; batch buckets 1 and
4; ``generate.max_length`` 64). Each contender generates ``--new`` (64) tokens for a batch of sources of ``--source``
(128) random ids, no early stop (``eos_token_id`` none; the checkpoint's forced tokens unset), in a process of its own
(one XLA client, or torch's pool, at a time), after one untimed call; the median of ``--rounds`` calls.

Columns per model, batch and beams (greedy at batch 1 and 4; 4 beams for one source: 4 decoder rows, the cache's
rows reordered after each step, on the device for tripy_build, ``index_select`` for torch): the whole call's ms, new
tokens per second (of the answers, summed over the batch), the ratio to torch's, and whether the ids equal torch's.

Run: ``python bench/seq2seq.py`` (~9 min on 2 cores), ``--quick`` (2 + 2 layers, 64 wide).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"t5": ("T5", dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                            decoder_start_token_id=0)),
          "bart": ("Bart", dict(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                                encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                                decoder_ffn_dim=3072, max_position_embeddings=1024)),
          "whisper": ("Whisper", dict(vocab_size=51865, d_model=512, encoder_layers=6, decoder_layers=6,
                                      encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                                      decoder_ffn_dim=2048, num_mel_bins=80, decoder_start_token_id=50258))}
QUICK = {"t5": dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0),
         "bart": dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256),
         "whisper": dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, decoder_start_token_id=1,
                         pad_token_id=2, bos_token_id=2, eos_token_id=2, begin_suppress_tokens=[2])}
RUNS = ((1, 1), (4, 1), (1, 4))  # (sources, beams)


def checkpoint(work: Path, name: str, quick: bool) -> Path:
    import torch
    import transformers

    path = work / f"{name}-ckpt"
    family, sizes = MODELS[name]
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**(QUICK[name] if quick else sizes), forced_eos_token_id=None)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(config).eval()
    model.generation_config.forced_bos_token_id = model.generation_config.forced_eos_token_id = None
    model.save_pretrained(path)
    return path


def build(ckpt: Path, work: Path, new: int) -> tuple[Path, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tripy_build", "model=hf", "task=generate", f"params.checkpoint={ckpt}",
                        f"generate.max_length={new}", "generate.eos_token_id=null", "shapes.dims.batch=[1,1,4]",
                        "shapes.dims.seq=[1,128,128]", "shapes.buckets.seq=[64,128]", "shapes.buckets.batch=[1,4]",
                        f"artifacts_dir={work / 'artifacts'}"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"build failed:\n{r.stderr[-3000:]}")
    path = next(p for p in r.stdout.splitlines() if p.startswith("artifact: ")).split(": ", 1)[1]
    return Path(path), time.perf_counter() - t0


def measure(contender: str, where: str, batch: int, beams: int, source: int, new: int, rounds: int,
            speech: bool = False) -> dict:
    """In this process: the contender's median ms for one generate call, and its ids (``speech``: Whisper's, of
    features)."""
    rng = np.random.default_rng(0)
    ids = (rng.standard_normal((batch, 80, 3000)).astype(np.float32) if speech else
           rng.integers(3, 400, (batch, source)).astype(np.int32))
    if contender == "torch":
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        auto = transformers.AutoModelForSpeechSeq2Seq if speech else transformers.AutoModelForSeq2SeqLM
        model = auto.from_pretrained(where).eval()

        def run() -> np.ndarray:
            with torch.inference_mode():
                if speech:  # WhisperForConditionalGeneration.generate returns the new tokens alone
                    return model.generate(torch.tensor(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                          num_beams=beams, eos_token_id=None, use_cache=True).numpy()
                out = model.generate(torch.tensor(ids, dtype=torch.long), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                     max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=beams,
                                     eos_token_id=None, use_cache=True)
            return out[:, 1:].numpy()
    else:
        import tripy_build
        from tripy_build import runtime

        exe = (runtime.load if contender == "tripy_build.runtime" else tripy_build.load)(where)
        exe.wait_warmed()

        def run() -> np.ndarray:
            if speech:
                return exe.generate(input_features=ids, max_new_tokens=new, eos_token_id=[], num_beams=beams)
            return exe.generate(ids, max_new_tokens=new, eos_token_id=[], num_beams=beams)
    out = run()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "ids": out.tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="t5,bart,whisper")
    p.add_argument("--source", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--measure", nargs=7, metavar=("CONTENDER", "WHERE", "BATCH", "BEAMS", "SOURCE", "NEW", "MODEL"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        contender, where, batch, beams, source, new, name = args.measure
        print(json.dumps(measure(contender, where, int(batch), int(beams), int(source), int(new), args.rounds,
                                 name == "whisper")))
        return
    work = Path(tempfile.mkdtemp(prefix="seq2seq-bench-"))
    print(f"source {args.source} tokens, {args.new} new tokens, median of {args.rounds}; {os.cpu_count()} cores")
    print(f"{'model':6} {'batch':>5} {'beams':>5} {'contender':22} {'ms':>9} {'tok/s':>8} {'x torch':>8} "
          f"{'ids = torch':>12}")
    for name in args.models.split(","):
        ckpt = checkpoint(work, name, args.quick)
        art, seconds = build(ckpt, work, args.new)
        print(f"{name}: built in {seconds:.0f} s ({art})")
        for batch, beams in RUNS:
            results = {}
            for contender, where in (("torch", ckpt), ("tripy_build", art), ("tripy_build.runtime", art)):
                r = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--measure", contender,
                                    str(where), str(batch), str(beams), str(args.source), str(args.new), name],
                                   capture_output=True, text=True, cwd=ROOT)
                if r.returncode:
                    sys.exit(f"{contender} failed:\n{r.stderr[-3000:]}")
                results[contender] = json.loads(r.stdout.strip().splitlines()[-1])
            base = results["torch"]
            for contender, res in results.items():
                tok_s = batch * args.new / (res["ms"] / 1e3)
                print(f"{name:6} {batch:>5} {beams:>5} {contender:22} {res['ms']:>9.1f} {tok_s:>8.1f} "
                      f"{base['ms'] / res['ms']:>7.2f}x {str(res['ids'] == base['ids']):>12}")


if __name__ == "__main__":
    main()
