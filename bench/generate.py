"""GPT-2 small (or, ``--model qwen2``, a Llama-family model of Qwen2.5-0.5B's shape; ``--model gemma3``, of
gemma-3-270m's; ``--model qwen3_moe``, a mixture of experts of two of Qwen3-30B-A3B's layers; ``--model gpt_oss``,
one of gpt-oss-20b's; ``--model olmo2``, four of OLMo-2-0425-1B's) generating tokens:
tripy_build (both loaders, and its server) next to Hugging Face on PyTorch and ONNX Runtime.

The model is ``GPT2LMHeadModel(GPT2Config())`` (GPT-2 small: 12 layers, 768 wide, vocab 50257) from
``torch.manual_seed(0)``, written once with ``save_pretrained``; every contender starts from that
directory. tripy_build builds it with ``task=generate`` (a 256-position cache, prompt chunks up to 128,
batch buckets 1 2 4 8):

    python -m tripy_build model=gpt2 task=generate params.checkpoint=DIR

Prompts: ``--prompt`` (128) random token ids per row from a seeded numpy RNG; ``--new`` (128) new tokens,
greedy, no early stop (Hugging Face's ``eos_token_id`` set to None, ``min_new_tokens`` = ``max_new_tokens``);
``--sampling qwen``: every contender samples with Qwen2.5-Instruct's options (temperature 0.7, top_k 20, top_p 0.8,
repetition_penalty 1.05: transformers' processors on torch and ONNX Runtime, ``runtime/sampling.py`` here).

Contenders, each measured in a process of its own (one XLA client, or torch's pool, at a time: two
clients' thread pools in one process fight over the cores), each using every core it may run on:

- ``torch``               ``GPT2LMHeadModel.from_pretrained(DIR).generate(..., do_sample=False, use_cache=True)``
                          under ``torch.inference_mode()`` (its DynamicCache, sdpa attention);
- ``tripy_build``         ``tripy_build.load(ART).generate(ids, max_new_tokens=N)``;
- ``tripy_build.runtime`` ``tripy_build.runtime.load(ART).generate(...)`` (no jax);
- ``ort``                 ONNX Runtime through optimum's ``ORTModelForCausalLM`` (exported once with a cache),
                          with ``--ort PYTHON``: an interpreter that has
                          ``optimum-onnx[onnxruntime]`` (it needs transformers < 4.58, so usually a venv of its
                          own); else its column says why not.

Columns per batch (1 and 8):

- TTFT ms     time to first token: ``generate(..., max_new_tokens=1)`` (the prompt's prefill and one token);
- decode tok/s the new tokens after the first, per second, summed over the batch:
              ``batch * (N - 1) / (T(N) - T(1))``;
- the greedy ids of each contender against torch's (rows equal / rows).

Median of ``--rounds`` rounds, a fresh process per contender, batch and round (after one untimed
generate); the contenders' order rotates each round. Also measured:

- a conversation's second turn (batch 1): the first turn's ``--prompt``-token prompt, its 32-token reply and a
  32-token message, time to first token once the first turn ran (tripy_build finds all but the reply's last
  token held in its cache and runs only the rest; torch and ONNX Runtime's ``generate`` run the whole prompt)
  and for a prompt of that length that nothing ran before; medians of ``--rounds`` processes;
- the decode step's time with the cache half full and nearly full (the cache is donated and attended at
  its full length, so a step costs the same at any fill: it is not copied per step);
- serving: ``tripy-build serve``'s ``/generate`` (in-process server, the jax-free runtime) with one client,
  then 8 concurrent clients, each asking for ``--new`` tokens: total new tokens per second, and the ratio
  of the medians over ``--rounds`` rounds (one client then 8, each round).

Run: ``python bench/generate.py`` (real size, ~25 min on 2 cores with ``--ort``), ``--quick`` (2 layers, 64 wide,
16 new); ``--precision bfloat16``: tripy_build built with ``precision=bfloat16`` and torch's model loaded in
bfloat16 (ONNX Runtime's export stays float32).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import http.client
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# --sampling: how every contender picks tokens (None: greedy); the ids are then not compared (different generators)
SAMPLING = {"greedy": None, "qwen": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --model: (transformers config class, causal LM class, its settings, quick settings, the tripy_build model option).
# qwen2: Qwen2.5-0.5B's shape (24 layers, 896 wide, 14 query heads over 2 key/value heads, vocab 151936, tied
# embeddings), its rotary base left at the default (an older transformers, optimum's, would not read 5's
# rope_parameters: every contender runs the same positions).
GENERATORS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}, {"n_layer": 2, "n_embd": 64, "n_head": 4}, "model=gpt2"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
               "tie_word_embeddings": True},
              {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": True}, "model=hf"),
    # gemma-3-270m's shape: 18 layers, 640 wide, 4 query heads over 1 key/value head of 256, vocab 262144 (tied),
    # a 512-token window in five layers of six, each with its own rotary base
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
                "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768,
                "sliding_window": 512, "query_pre_attn_scalar": 256},
               {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 1000, "sliding_window": 16,
                "sliding_window_pattern": 2}, "model=hf"),
    # Qwen3-30B-A3B's layers (2048 wide, 32 query heads over 4 key/value heads of 128, 128 experts of 768, 8 per
    # token, every top-k renormalised), two of its 48, embeddings tied to fit this machine (1.55 B parameters)
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 2, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 768, "norm_topk_prob": True, "vocab_size": 151936,
                   "max_position_embeddings": 32768, "tie_word_embeddings": True},
                  {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "vocab_size": 1000, "tie_word_embeddings": True}, "model=hf"),
    # gpt-oss-20b's layers (2880 wide, 64 query heads over 8 key/value heads of 64 with sinks, 32 experts of 2880, 4
    # per token, a 128-token window, YaRN), one of its 24, embeddings tied to fit this machine (1.4 B parameters:
    # two layers' 2.2 B took the build past this machine's 24 GB)
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 1, "num_attention_heads": 64,
                 "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
                 "vocab_size": 201088, "sliding_window": 128, "tie_word_embeddings": True},
                {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "vocab_size": 1000, "sliding_window": 16, "tie_word_embeddings": True}, "model=hf"),
    # OLMo-2-0425-1B's layers (2048 wide, 16 heads of 128, an MLP of 8192, norms after the branches and of all the
    # queries and keys, vocab 100352, embeddings and LM head apart), four of its 16 (0.68 B parameters)
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4, "num_attention_heads": 16,
               "num_key_value_heads": 16, "vocab_size": 100352, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
               "rope_theta": 500000.0},
              {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4, "vocab_size": 1000}, "model=hf"),
}


def hf_dir(work: Path, quick: bool, model: str = "gpt2") -> Path:
    import torch
    import transformers

    config_class, causal, real, small, _ = GENERATORS[model]
    out = work / (f"{model}-quick" if quick else model)
    if not (out / "model.safetensors").exists():
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**(small if quick else real))
        getattr(transformers, causal)(config).eval().save_pretrained(out)
    return out


def vocab(ckpt: Path) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["vocab_size"])


def build(ckpt: Path, work: Path, quick: bool, model: str = "gpt2", precision: str = "float32") -> tuple[Path, float]:
    arts = work / "arts"
    t0 = time.perf_counter()
    args = [sys.executable, "-m", "tripy_build", GENERATORS[model][4], "task=generate", f"params.checkpoint={ckpt}",
            f"artifacts_dir={arts}", "force=true", f"precision={precision}"]
    if quick:
        args += ["generate.max_length=64", "shapes.dims.seq=[1,32,32]"]
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "XDG_CACHE_HOME": str(work / "xdg")})
    if r.returncode:
        raise SystemExit(f"build failed:\n{r.stderr[-3000:]}")
    seconds = time.perf_counter() - t0
    path = Path(next(line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("artifact: ")))
    return path, seconds


class Torch:
    name = "torch"

    def __init__(self, ckpt: Path, precision: str = "float32"):
        import torch
        import transformers

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, precision)).eval()
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = 0

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        with self.torch.inference_mode():
            x = self.torch.from_numpy(ids.astype(np.int64))
            out = self.model.generate(x, attention_mask=self.torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                      use_cache=True, **hf_options(self.sampling))
        return out[:, ids.shape[1]:].numpy()


class Tripy:
    def __init__(self, art: Path, runtime: bool):
        import tripy_build as tb
        from tripy_build import runtime as rt

        self.name = "tripy_build.runtime" if runtime else "tripy_build"
        self.model = (rt.load if runtime else tb.load)(art, warmup="now")

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        return self.model.generate(ids, n, eos_token_id=[], seed=0, **(self.sampling or {"temperature": 0}))


class Ort:
    name = "ort"

    def __init__(self, ckpt: Path):
        from optimum.onnxruntime import ORTModelForCausalLM  # an export with a KV cache

        self.model = ORTModelForCausalLM.from_pretrained(ort_dir(ckpt), use_cache=True)
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = 0

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        import torch

        x = torch.from_numpy(ids.astype(np.int64))
        out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                  **hf_options(self.sampling))
        return out[:, ids.shape[1]:].numpy()


def hf_options(sampling: dict | None) -> dict:
    """Hugging Face's ``generate`` options for ``--sampling`` (None: greedy)."""
    return {"do_sample": True, **sampling} if sampling else {"do_sample": False}


def ort_dir(ckpt: Path) -> Path:
    return ckpt.parent / (ckpt.name + "-onnx")


def ort_export(ckpt: Path) -> None:
    """Export once, beside the checkpoint (each worker then loads the ONNX files, as a deployment would)."""
    from optimum.onnxruntime import ORTModelForCausalLM

    out = ort_dir(ckpt)
    if not (out / "model.onnx").exists():
        ORTModelForCausalLM.from_pretrained(ckpt, export=True, use_cache=True).save_pretrained(out)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def cache_fill(art: Path) -> list[tuple[int, float]]:
    """The runtime's decode step (batch 1) at a half-full and a nearly full cache: (fill, median ms of 20 steps)."""
    from tripy_build import runtime
    from tripy_build.runtime.generate import Session

    rt = runtime.load(art, warmup="now")
    steps = rt.generation_steps()
    spec = steps.spec()
    out = []
    for fill in (spec.max_length // 2, spec.max_length - 21):
        s = Session(steps, spec, 1)
        s.admit(0, np.arange(fill, dtype=np.int32) % 1000)
        times = [timed(s.step, {0: 5}) for _ in range(20)]
        out.append((fill, statistics.median(times) * 1e3))
    return out


def serving(art: Path, prompt: int, new: int, rounds: int, vocab_size: int,
            clients: int = 8) -> list[tuple[float, float]]:
    """Total new tokens per second through /generate with one client, then ``clients`` at once, per round."""
    from tripy_build.serve.http import Server

    rng = np.random.default_rng(1)
    with Server([art], port=0).start() as srv:
        host, port = srv.url.split("//")[1].split(":")
        name = next(iter(srv.endpoints))

        def one(i: int) -> int:
            ids = rng.integers(0, vocab_size, prompt).tolist() if i >= 0 else [1]
            conn = http.client.HTTPConnection(host, int(port), timeout=600)
            request = {"input_ids": ids, "max_new_tokens": new, "eos_token_id": []}  # no early stop
            conn.request("POST", f"/v2/models/{name}/generate", json.dumps(request), {"content-type": "application/json"})
            body = json.loads(conn.getresponse().read())
            conn.close()
            if "output_ids" not in body:
                raise SystemExit(f"/generate answered {body}")
            return len(body["output_ids"])
        one(0)  # warm
        out = []
        for _ in range(rounds):
            single = new / timed(one, 0)
            results = [0] * clients

            def run(i: int, results: list[int] = results) -> None:
                results[i] = one(i)
            threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
            t0 = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            out.append((single, sum(results) / (time.perf_counter() - t0)))
    return out


CONTENDERS = {"torch": lambda ckpt, art, precision: Torch(ckpt, precision),
              "tripy_build": lambda ckpt, art, precision: Tripy(art, False),
              "tripy_build.runtime": lambda ckpt, art, precision: Tripy(art, True),
              "ort": lambda ckpt, art, precision: Ort(ckpt)}


def worker(args: argparse.Namespace) -> None:
    """One contender at one batch in this process: its ids, then the timed TTFT and full generation, as JSON.

    Each call has prompts of its own: tripy_build keeps what a cache holds, so a prompt that ran before would
    find all but its last token there (``turns`` measures that on purpose)."""
    contender = CONTENDERS[args.worker](Path(args.ckpt), Path(args.art), args.precision)
    contender.sampling = SAMPLING.get(args.sampling)
    if args.turns:
        return turns(contender, args)
    rng = np.random.default_rng(args.batch)
    ids, fresh, other = (rng.integers(0, vocab(Path(args.ckpt)), (args.batch, args.prompt)).astype(np.int32)
                         for _ in range(3))
    out = contender.generate(ids, args.new)  # untimed: the first call's costs, and the ids compared
    ttft = timed(contender.generate, fresh, 1)
    total = timed(contender.generate, other, args.new)
    print(json.dumps({"ids": out.tolist(), "ttft": ttft, "total": total}))


def turns(contender, args: argparse.Namespace) -> None:
    """A conversation's second turn: the first turn's prompt (``--prompt`` tokens) and reply, then a new message
    (``turn`` tokens each). Its time to first token after the first turn ran (``warm``), and the same length
    of prompt that nothing ran before (``cold``: another first token), as JSON."""
    rng = np.random.default_rng(7)
    n = vocab(Path(args.ckpt))
    contender.generate(rng.integers(0, n, (1, args.prompt + 2 * turn(args))).astype(np.int32), 1)  # first-call costs
    first = rng.integers(0, n, (1, args.prompt)).astype(np.int32)
    reply = contender.generate(first, turn(args))
    second = np.concatenate([first, reply, rng.integers(0, n, (1, turn(args))).astype(np.int32)], axis=1)
    warm = timed(contender.generate, second, 1)
    cold = second.copy()
    cold[0, 0] = (cold[0, 0] + 1) % n
    print(json.dumps({"warm": warm, "cold": timed(contender.generate, cold, 1), "tokens": second.shape[1]}))


def turn(args: argparse.Namespace) -> int:
    """The tokens of the first turn's reply in ``turns``, and of the user's next message: 32 (``--quick``: 20)."""
    return min(32, args.prompt)


def spawn(name: str, batch: int, args: argparse.Namespace, ckpt: Path, art: Path, turns: bool = False) -> dict:
    python = args.ort if name == "ort" else sys.executable
    cmd = [python, __file__, "--worker", name, "--batch", str(batch), "--prompt", str(args.prompt),
           "--new", str(args.new), "--ckpt", str(ckpt), "--art", str(art), "--sampling", args.sampling,
           "--precision", args.precision,
           *(["--turns"] if turns else [])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        return {"error": lines[-1][:200] if lines else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def conversation(names: list[str], args: argparse.Namespace, ckpt: Path, art: Path) -> None:
    """The second turn's time to first token per contender (``turns``), medians of ``--rounds`` processes each."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(spawn(name, 1, args, ckpt, art, turns=True))
    print(f"\na conversation's second turn (batch 1): the first turn's {args.prompt}-token prompt, its {turn(args)}-token "
          f"reply and a {turn(args)}-token message; time to first token, ms")
    print(f"{'contender':<20} {'after turn 1':>12} {'nothing ran':>12} {'gain':>6} {'vs torch':>9}")
    ok = {n: [x for x in runs[n] if "error" not in x] for n in names}
    torch_ms = statistics.median(x["warm"] for x in ok["torch"]) * 1e3 if ok.get("torch") else None
    for name in names:
        if not ok[name]:
            print(f"{name:<20} {runs[name][0]['error']}")
            continue
        warm, cold = (statistics.median(x[k] for x in ok[name]) * 1e3 for k in ("warm", "cold"))
        ratio = f"{warm / torch_ms:>8.2f}x" if torch_ms else ""
        print(f"{name:<20} {warm:>12.1f} {cold:>12.1f} {cold / warm:>5.2f}x {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/tripy_build-bench-generate")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", choices=list(GENERATORS), default="gpt2",
                    help="gpt2 (GPT-2 small), qwen2 (Qwen2.5-0.5B's shape), gemma3 (gemma-3-270m's), qwen3_moe (two of "
                         "Qwen3-30B-A3B's layers), gpt_oss (one of gpt-oss-20b's) or olmo2 (four of OLMo-2-0425-1B's), random "
                         "weights")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--ort", metavar="PYTHON", help="add ONNX Runtime through optimum, run by this interpreter "
                    "(one with optimum-onnx[onnxruntime] installed)")
    ap.add_argument("--sampling", choices=list(SAMPLING), default="greedy",
                    help="how tokens are picked, by every contender: greedy (the default), or qwen: Qwen2.5-Instruct's "
                         "generation_config.json (temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.05)")
    ap.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                    help="tripy_build's build precision (precision=...) and the dtype torch loads the model in; "
                         "ONNX Runtime's export stays float32")
    ap.add_argument("--export-ort", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--art", help=argparse.SUPPRESS)
    ap.add_argument("--turns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.export_ort:
        return ort_export(Path(args.export_ort))
    if args.worker:
        return worker(args)
    if args.quick:
        args.prompt, args.new, args.rounds = 20, 16, 1
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = hf_dir(work, args.quick, args.model)
    art, build_s = build(ckpt, work, args.quick, args.model, args.precision)
    log(f"built {art} in {build_s:.1f} s")
    names = ["torch", "tripy_build", "tripy_build.runtime"]
    notes = [] if args.ort else ["ort: not run (--ort PYTHON: ONNX Runtime through optimum's ORTModelForCausalLM, "
                                 "an export with a cache)"]
    if args.ort:
        r = subprocess.run([args.ort, __file__, "--export-ort", str(ckpt)], capture_output=True, text=True)
        if r.returncode:
            notes.append(f"ort: the export failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        else:
            names.append("ort")
    rows = []
    for batch in (1, 8):
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                runs[name].append(spawn(name, batch, args, ckpt, art))
            log(f"batch {batch} round {r + 1}/{args.rounds} done")
        ref = np.array(runs["torch"][0]["ids"]) if "ids" in runs["torch"][0] else None
        for name in names:
            ok = [x for x in runs[name] if "error" not in x]
            if not ok:
                notes.append(f"{name}, batch {batch}: {runs[name][0]['error']}")
                continue
            t1, tn = statistics.median(x["ttft"] for x in ok), statistics.median(x["total"] for x in ok)
            ids = np.array(ok[0]["ids"])
            same = int((ids == ref).all(axis=1).sum()) if ref is not None else 0
            rows.append((batch, name, t1 * 1e3, batch * (args.new - 1) / max(tn - t1, 1e-9),
                         f"{same}/{batch}" if args.sampling == "greedy" else "sampled"))
    title = {"gpt2": "GPT-2 small", "qwen2": "Qwen2.5-0.5B's shape (Qwen2ForCausalLM)",
             "gemma3": "gemma-3-270m's shape (Gemma3ForCausalLM)",
             "qwen3_moe": "two of Qwen3-30B-A3B's layers (Qwen3MoeForCausalLM)",
             "gpt_oss": "one of gpt-oss-20b's layers (GptOssForCausalLM)",
             "olmo2": "four of OLMo-2-0425-1B's layers (Olmo2ForCausalLM)"}[args.model]
    print(f"\n{title}{' (quick)' if args.quick else ''}, {args.precision}: prompt {args.prompt}, {args.new} new tokens, "
          f"{args.sampling}; {len(os.sched_getaffinity(0))} cores; tripy_build build {build_s:.1f} s")
    print(f"{'batch':>5}  {'contender':<20} {'TTFT ms':>9} {'vs torch':>8} {'decode tok/s':>13} {'vs torch':>8}  ids = torch")
    by = {(b, n): (t, d) for b, n, t, d, _ in rows}
    for b, n, t, d, same in rows:
        tt, td = by.get((b, "torch"), (t, d))
        print(f"{b:>5}  {n:<20} {t:>9.1f} {t / tt:>7.2f}x {d:>13.1f} {d / td:>7.2f}x  {same}")
    for note in notes:
        print(note)
    conversation(names, args, ckpt, art)
    (fa, a), (fb, b) = cache_fill(art)
    print(f"\ndecode step (runtime, batch 1) with {fa} cache positions filled: {a:.2f} ms; with {fb}: {b:.2f} ms "
          f"(ratio {b / a:.2f})")
    served = serving(art, args.prompt, args.new, args.rounds, vocab(ckpt))
    single, many = (statistics.median(x[k] for x in served) for k in (0, 1))
    print(f"serving /generate: 1 client {single:.1f} tok/s, 8 concurrent clients {many:.1f} tok/s in total "
          f"({many / single:.2f}x; medians of {len(served)} rounds, each: "
          f"{', '.join(f'{m:.1f}/{s:.1f}' for s, m in served)})")


if __name__ == "__main__":
    main()
