"""Encoder-decoders generating (``task=generate`` of a ``*ForConditionalGeneration``): tripy_build (both loaders)
next to transformers' ``generate`` on PyTorch: greedy (one sequence per source) and by beam search (4 beams, as
BART's summarizers and Marian's translators search).

Models, random weights from ``torch.manual_seed(0)`` at real sizes (no checkpoint is downloaded here; only the sizes
matter for speed), written once with ``save_pretrained``:

- ``t5``:   t5-small's ``T5ForConditionalGeneration`` (6 + 6 layers, 512 wide, vocab 32128: 60M parameters);
- ``bart``: bart-base's ``BartForConditionalGeneration`` (6 + 6 layers, 768 wide, vocab 50265: 140M);
- ``whisper``: whisper-base's ``WhisperForConditionalGeneration`` (6 + 6 layers, 512 wide, vocab 51865: 73M), its
  sources 30 seconds of random log-mel features ``[batch, 80, 3000]`` (``--source`` unread), each reply opening with
  the start token, ``<|en|><|transcribe|><|notimestamps|>`` (the language given on both sides: none detected).

tripy_build builds each with ``task=generate`` (sources up to 128 tokens, buckets 64 and 128; batch buckets 1 and
4; ``generate.max_length`` 64). Each contender generates ``--new`` (64) tokens for a batch of sources of ``--source``
(128) random ids, no early stop (``eos_token_id`` none; the checkpoint's forced tokens unset), in a process of its own
(one XLA client, or torch's pool, at a time), after one untimed call; the median of ``--rounds`` calls.

Whisper also transcribes ``--long`` (120) seconds of audio (random features ``[1, 80, 12000]``) window by window
with timestamps, as transformers' long-form ``generate(return_timestamps=True)`` does (``runtime/longform.py``):
each window's reply held to the timestamp rule, up to ``--new`` tokens, ended by the model's end id; the next window
starts at the last whole segment's end. Its generation config is whisper-base's timestamp settings
(``no_timestamps_token_id`` 50363, ``max_initial_timestamp_index`` 50) and the language given (``en``).

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
                                      decoder_ffn_dim=2048, num_mel_bins=80, decoder_start_token_id=50258,
                                      pad_token_id=50257, bos_token_id=50257, eos_token_id=50257))}
# whisper-base's generation config's timestamp and language settings (a long-form run needs them)
SPEECH = dict(no_timestamps_token_id=50363, max_initial_timestamp_index=50, is_multilingual=True,
              lang_to_id={"<|en|>": 50259}, task_to_id={"translate": 50358, "transcribe": 50359})
QUICK_SPEECH = dict(no_timestamps_token_id=300, max_initial_timestamp_index=50, is_multilingual=True,
                    lang_to_id={"<|en|>": 3}, task_to_id={"translate": 4, "transcribe": 5})
QUICK = {"t5": dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0),
         "bart": dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256),
         "whisper": dict(vocab_size=300 + 1 + 1501, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
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
    if name == "whisper":
        for key, value in (QUICK_SPEECH if quick else SPEECH).items():
            setattr(model.generation_config, key, value)
        model.generation_config._from_model_config = False  # else from_pretrained drops the keys set above
    model.save_pretrained(path)
    return path


def build(ckpt: Path, work: Path, new: int, opening: int = 0) -> tuple[Path, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tripy_build", "model=hf", "task=generate", f"params.checkpoint={ckpt}",
                        f"generate.max_length={new + opening}", "shapes.dims.batch=[1,1,4]",
                        "shapes.dims.seq=[1,128,128]", "shapes.buckets.seq=[64,128]", "shapes.buckets.batch=[1,4]",
                        f"artifacts_dir={work / 'artifacts'}"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"build failed:\n{r.stderr[-3000:]}")
    path = next(p for p in r.stdout.splitlines() if p.startswith("artifact: ")).split(": ", 1)[1]
    return Path(path), time.perf_counter() - t0


def measure(contender: str, where: str, batch: int, beams: int, source: int, new: int, rounds: int,
            speech: bool = False, long: float = 0) -> dict:
    """In this process: the contender's median ms for one generate call, and its ids (``speech``: Whisper's, of
    features; ``long``: of that many seconds, with timestamps)."""
    rng = np.random.default_rng(0)
    frames = int(long * 100) or 3000
    ids = (rng.standard_normal((batch, 80, frames)).astype(np.float32) if speech else
           rng.integers(3, 400, (batch, source)).astype(np.int32))
    if contender == "torch":
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        auto = transformers.AutoModelForSpeechSeq2Seq if speech else transformers.AutoModelForSeq2SeqLM
        model = auto.from_pretrained(where).eval()

        def run() -> np.ndarray:
            with torch.inference_mode():
                if long:
                    return model.generate(torch.tensor(ids), max_new_tokens=new, do_sample=False, language="en",
                                          return_timestamps=True).numpy()
                if speech:  # WhisperForConditionalGeneration.generate returns the new tokens alone
                    return model.generate(torch.tensor(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                          num_beams=beams, eos_token_id=None, use_cache=True, language="en",
                                          force_unique_generate_call=True).numpy()[:, 4:]
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
            if long:
                return exe.generate(input_features=ids, max_new_tokens=new, language="en", return_timestamps=True)
            if speech:
                return exe.generate(input_features=ids, max_new_tokens=new, eos_token_id=[], num_beams=beams,
                                    language="en")
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
    p.add_argument("--long", type=float, default=120.0, help="seconds of audio Whisper transcribes in windows (0: none)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--measure", nargs=8, help=argparse.SUPPRESS,
                   metavar=("CONTENDER", "WHERE", "BATCH", "BEAMS", "SOURCE", "NEW", "MODEL", "LONG"))
    args = p.parse_args()
    if args.measure:
        contender, where, batch, beams, source, new, name, long = args.measure
        print(json.dumps(measure(contender, where, int(batch), int(beams), int(source), int(new), args.rounds,
                                 name == "whisper", float(long))))
        return
    work = Path(tempfile.mkdtemp(prefix="seq2seq-bench-"))
    print(f"source {args.source} tokens, {args.new} new tokens, median of {args.rounds}; {os.cpu_count()} cores")
    print(f"{'model':6} {'batch':>5} {'beams':>5} {'contender':22} {'ms':>9} {'tok/s':>8} {'x torch':>8} "
          f"{'ids = torch':>12}")
    for name in args.models.split(","):
        ckpt = checkpoint(work, name, args.quick)
        art, seconds = build(ckpt, work, args.new, 3 if name == "whisper" else 0)
        print(f"{name}: built in {seconds:.0f} s ({art})")
        long = [(1, 1, args.long)] if name == "whisper" and args.long else []
        for batch, beams, seconds in [(b, k, 0) for b, k in RUNS] + long:
            results = {}
            for contender, where in (("torch", ckpt), ("tripy_build", art), ("tripy_build.runtime", art)):
                r = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--measure", contender,
                                    str(where), str(batch), str(beams), str(args.source), str(args.new), name,
                                    str(seconds)], capture_output=True, text=True, cwd=ROOT)
                if r.returncode:
                    sys.exit(f"{contender} failed:\n{r.stderr[-3000:]}")
                results[contender] = json.loads(r.stdout.strip().splitlines()[-1])
            base = results["torch"]
            for contender, res in results.items():
                made = sum(len(row) for row in res["ids"]) if seconds else batch * args.new  # with timestamps
                label = f"{name} {seconds:g}s" if seconds else name
                print(f"{label:6} {batch:>5} {beams:>5} {contender:22} {res['ms']:>9.1f} {made / (res['ms'] / 1e3):>8.1f} "
                      f"{base['ms'] / res['ms']:>7.2f}x {str(res['ids'] == base['ids']):>12}")


if __name__ == "__main__":
    main()
