"""The cost of picking a token, per decode step: ``runtime/sampling.Sampler`` (numpy, on the host) next to
transformers' logits processors and warpers on PyTorch (what ``generate`` runs between two forward passes), over
the same logits.

Options: greedy; Llama 3 Instruct's ``generation_config.json`` (temperature 0.6, top_p 0.9, and transformers'
top_k 50); Qwen2.5-Instruct's (temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.05); the same with
OpenAI's penalties (presence 0.5, frequency 0.5: ours only, transformers has none). Vocabularies: GPT-2's 50,257
and Qwen2.5's 151,936; rows: 1 and 8; each row's history a 128-token prompt and a reply growing from 0 to 128
tokens. Logits: a seeded normal times 3 (a model's spread). Median ms per step over the 128 steps, after 8
untimed; PyTorch on every core it may use.

Run: ``python bench/sampling.py`` (~1 min).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

OPTIONS = {
    "greedy": {},
    "llama3": {"temperature": 0.6, "top_k": 50, "top_p": 0.9},
    "qwen2.5": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05},
    "qwen2.5+openai": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05,
                       "presence_penalty": 0.5, "frequency_penalty": 0.5},
}
STEPS, WARM = 128, 8


def ours(options: dict, logits: np.ndarray, prompts: list[np.ndarray]) -> float:
    from tripy_build.runtime.sampling import Options, Sampler

    sampler = Sampler(Options(**options), 0, prompts)
    times = []
    for step in range(WARM + STEPS):
        t0 = time.perf_counter()
        sampler(logits[step % len(logits)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARM:]) * 1e3


def hugging_face(options: dict, logits: np.ndarray, prompts: list[np.ndarray]) -> float | None:
    import torch
    import transformers

    if "presence_penalty" in options:
        return None
    chain = transformers.LogitsProcessorList()
    if "repetition_penalty" in options:
        chain.append(transformers.RepetitionPenaltyLogitsProcessor(options["repetition_penalty"]))
    if options:
        chain += [transformers.TemperatureLogitsWarper(options["temperature"]),
                  transformers.TopKLogitsWarper(options["top_k"]), transformers.TopPLogitsWarper(options["top_p"])]
    ids = torch.tensor(np.stack(prompts), dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    times = []
    with torch.inference_mode():
        for step in range(WARM + STEPS):
            scores = torch.from_numpy(logits[step % len(logits)])
            t0 = time.perf_counter()
            scores = chain(ids, scores)
            if options:
                token = torch.multinomial(torch.softmax(scores, -1), 1, generator=gen)
            else:
                token = scores.argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t0)
            ids = torch.cat([ids, token], -1)
    return statistics.median(times[WARM:]) * 1e3


def main() -> None:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    print(f"ms per step (median of {STEPS}); {len(os.sched_getaffinity(0))} cores")
    print(f"{'vocab':>7} {'rows':>4}  {'options':<16} {'tripy_build':>11} {'transformers':>12} {'ratio':>6}")
    for vocab in (50257, 151936):
        for rows in (1, 8):
            rng = np.random.default_rng(vocab + rows)
            logits = (rng.normal(size=(16, rows, vocab)) * 3).astype(np.float32)
            prompts = [rng.integers(0, vocab, 128) for _ in range(rows)]
            for name, options in OPTIONS.items():
                a, b = ours(options, logits, prompts), hugging_face(options, logits, prompts)
                theirs = f"{b:>12.2f} {a / b:>5.2f}x" if b is not None else f"{'-':>12} {'':>6}"
                print(f"{vocab:>7} {rows:>4}  {name:<16} {a:>11.2f} {theirs}")


if __name__ == "__main__":
    main()
