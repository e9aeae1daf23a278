"""Real models: tripy_build next to Hugging Face transformers on PyTorch and ONNX Runtime.

Eight models at their real size (``--quick``: 2 layers, hidden 64), each a Hugging Face model built
from its default config (or the published checkpoint's, ``real``) with ``torch.manual_seed(0)``, put in
eval mode and written once with ``save_pretrained`` (``config.json`` + ``model.safetensors``); every contender starts from that
directory, so all run the same random weights:

- ``bert``      ``BertModel(BertConfig())``          input_ids, attention_mask, token_type_ids -> last_hidden_state, pooler_output
- ``bert-classifier`` ``BertForSequenceClassification(BertConfig())`` the same inputs -> logits (``model=hf``)
- ``deberta-classifier`` ``DebertaV2ForSequenceClassification`` at deberta-v3-base's config: input_ids,
                attention_mask -> logits (``model=hf``)
- ``mpnet``     ``MPNetModel(MPNetConfig(...))`` at all-mpnet-base-v2's: input_ids, attention_mask ->
                last_hidden_state, pooler_output
- ``modernbert-classifier`` ``ModernBertForSequenceClassification`` at ModernBERT-base's config: input_ids,
                attention_mask -> logits (``model=hf``)
- ``gpt2``      ``GPT2LMHeadModel(GPT2Config())``    input_ids, attention_mask -> logits (``use_cache=False``)
- ``vit``       ``ViTModel(ViTConfig())``            pixel_values [batch, 3, 224, 224] -> last_hidden_state, pooler_output
- ``resnet50``  ``ResNetModel(ResNetConfig())``      pixel_values [batch, 3, 224, 224] -> last_hidden_state, pooler_output

Shapes: bert and gpt2 at (batch, seq) = (1, 128), (8, 128), (1, 512), new shape (3, 77); vit and
resnet50 at batch 1 and 8, new batch 3. Inputs: int32 token ids in [0, vocab) from a seeded numpy RNG,
attention_mask all ones, token_type_ids zeros; pixel_values standard normal (float32).

Contenders (each a class below; one that fails to build, export, compile or run is reported with its
one-line reason and the others go on):

- ``tripy_build``          ``python -m tripy_build model=<name> params.checkpoint=<hf dir> artifacts_dir=<dir>``
                           from the repo root (the models' own shapes: text batch 1..16 x seq 1..512,
                           image batch 1..16; ``--quick`` adds ``TB_OVERRIDES``), loaded with ``tripy_build.load``;
                           Its default ``warmup="background"`` deserializes and runs every profile
                           once in a thread from load on: in the cold-start process that thread runs
                           beside the first calls (the kept process waits for it before timed calls);
- ``tripy_build.runtime``  the same artifact, loaded with ``tripy_build.runtime.load`` (no jax; the same
                           default ``warmup="background"``, which prepares a profile over 192 KiB only when
                           no call has been in flight for 50 ms: a call prepares its own until then);
- ``torch``                ``<HF class>.from_pretrained(dir)`` (default attention: sdpa), called under
                           ``torch.inference_mode()``;
- ``torch.compile``        the same model through ``torch.compile`` (default mode; it recompiles with
                           dynamic dims at the second shape it meets). Its "build" is the first call's
                           compile with an empty TorchInductor cache; later processes start with that cache;
- ``ort``                  ``torch.onnx.export`` of the model loaded with ``attn_implementation="eager"``
                           (the attention graph ONNX Runtime's fusions recognise), TorchScript exporter
                           (opset 17; the dynamo exporter if it fails), dynamic batch and seq axes, run by
                           an ``InferenceSession`` with ``ORT_ENABLE_ALL``;
- ``ort-opt``              that .onnx through ``onnxruntime.transformers.optimizer.optimize_model``
                           (model_type bert / gpt2 / vit, the config's heads and hidden size, default
                           fusion options: exact GELU kept), run the same way. Not for resnet50.
                           "best ORT" is the faster of ``ort`` and ``ort-opt``, per column.

Threads: every contender uses all the cores this process may run on (``len(os.sched_getaffinity(0))``):
``torch.set_num_threads``, ORT ``intra_op_num_threads`` (inter-op 1), ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS``; XLA sizes its own pool to the cores. No pinning.

Columns, per model and contender:

- build s      tripy_build: the CLI's wall time (a fresh ``XDG_CACHE_HOME``, so no cache hit);
               ort: ``torch.onnx.export``; ort-opt: export + optimize_model; torch.compile: the
               first call's compile (empty cache). Imports and loading the HF model not counted.
- size MB      tripy_build: the artifact directory; ort: the .onnx file(s); torch: the HF directory.
- cold s       the parent's wall time from spawning a fresh process to its line saying the first
               result (at the first shape) is in host memory: imports, load, first call. Median of
               ``--rounds`` processes, the contenders' order rotating each round.
- RSS MB       that process's peak RSS (``VmHWM`` from ``/proc/self/status``) at its first result.
- <shape> ms   steady latency: median (and p90) of ``--calls`` calls per shape, after two untimed
               warm-up calls per shape. All contenders of a model are alive at once (the first
               round's processes, kept) and the parent asks each in turn for one turn: an untimed
               call, then ``PER_TURN`` (2) timed calls back to back; shape by shape, the order
               rotating every turn, with a short pause between turns. The untimed call wakes the
               worker threads, asleep after the pause (on this VM that cost 2-180 ms, most for
               torch's OpenMP threads; its times are in the JSON). The machine's noise is shared.
- new 1st ms   in the cold-start process, right after the first result: the first call at a shape
               none of its calls used (tripy_build pads it to a precompiled bucket; torch.compile
               recompiles). Median over rounds.
- rel err      every output at every shape (and the new one) against the PyTorch eager reference:
               max |a - b| / max |ref|, the worst over outputs and shapes (checked: <= 1e-4).
- pad err      bert/gpt2 only: the second shape again with a right-padded attention_mask (zeros at
               the end of some rows), compared at the real positions only.

Ratios ``(xR)`` are each contender's value over the best ORT variant's in that column: < 1 means
faster (or smaller) than ONNX Runtime at its best. No timing is checked: this is a bench.

Measured on 2 cores: the full run takes ~45 minutes (bert 11, gpt2 19, vit 12, resnet50 3; the
tripy_build builds 16-155 s each, 3 cold starts x 6 contenders x 4 models, 10 calls per shape at up
to 4.6 s a call); ``--quick`` ~80 s (the floor: ~3.5 s to import torch + transformers per process).

    pip install -e '.[real-models]'   # torch's CPU wheel: pip install torch==2.13.0+cpu first
    python bench/real_models.py --quick                       # tiny configs, a smoke test
    python bench/real_models.py --models bert,gpt2 --json /tmp/real.json
    python bench/real_models.py --models bert --shapes 1x128,8x128 --contenders torch,ort,ort-opt
"""

from __future__ import annotations

import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RTOL = 1e-4
TEXT = ("input_ids", "attention_mask", "token_type_ids")
MODELS = {
    "bert": {"kind": "text", "hf": "BertModel", "config": "BertConfig", "inputs": TEXT,
             "outputs": ("last_hidden_state", "pooler_output"), "ort_type": "bert",
             "quick": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}},
    # a fine-tuned BERT-base classifier as deployed: model=hf builds its head (two classes)
    "bert-classifier": {"kind": "text", "hf": "BertForSequenceClassification", "config": "BertConfig", "inputs": TEXT,
                        "outputs": ("logits",), "ort_type": "bert", "tb_model": "hf",
                        "quick": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                  "intermediate_size": 128}},
    # a fine-tuned DeBERTa-v3-base classifier (NLI, rerankers): relative attention over 256 log buckets, no token
    # types; DebertaV2Config's own defaults are v2-xlarge's, so the real size is v3-base's config.json
    "deberta-classifier": {"kind": "text", "hf": "DebertaV2ForSequenceClassification", "config": "DebertaV2Config",
                           "inputs": TEXT[:2], "outputs": ("logits",), "ort_type": None, "tb_model": "hf",
                           "real": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                                    "intermediate_size": 3072, "vocab_size": 128100, "relative_attention": True,
                                    "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                                    "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
                                    "type_vocab_size": 0, "layer_norm_eps": 1e-7, "max_relative_positions": -1},
                           "quick": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                     "intermediate_size": 128, "relative_attention": True, "position_buckets": 32,
                                     "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
                                     "position_biased_input": False, "type_vocab_size": 0}},
    # all-mpnet-base-v2's encoder (mpnet-base's sizes): T5's relative position bias in every layer
    "mpnet": {"kind": "text", "hf": "MPNetModel", "config": "MPNetConfig", "inputs": TEXT[:2],
              "outputs": ("last_hidden_state", "pooler_output"), "ort_type": "bert",
              "real": {"max_position_embeddings": 514, "layer_norm_eps": 1e-5},
              "quick": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}},
    # a fine-tuned ModernBERT-base classifier (rerankers such as gte-reranker-modernbert-base): rotary positions, a
    # 128-token window in two layers of three, GLU MLPs; ModernBertConfig's defaults are base's sizes, but its
    # classifier_pooling is cls where ModernBERT-base's config.json says mean. ORT's optimizer has no ModernBERT type
    "modernbert-classifier": {"kind": "text", "hf": "ModernBertForSequenceClassification", "config": "ModernBertConfig",
                              "inputs": TEXT[:2], "outputs": ("logits",), "ort_type": None, "tb_model": "hf",
                              "real": {"classifier_pooling": "mean"},
                              "quick": {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 2,
                                        "intermediate_size": 96, "local_attention": 8, "classifier_pooling": "mean"}},
    "gpt2": {"kind": "text", "hf": "GPT2LMHeadModel", "config": "GPT2Config", "inputs": TEXT[:2],
             "outputs": ("logits",), "ort_type": "gpt2", "call": {"use_cache": False},
             "quick": {"n_layer": 2, "n_embd": 64, "n_head": 2}},
    "vit": {"kind": "image", "hf": "ViTModel", "config": "ViTConfig", "inputs": ("pixel_values",),
            "outputs": ("last_hidden_state", "pooler_output"), "ort_type": "vit",
            "quick": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                      "image_size": 32, "patch_size": 8}},
    "resnet50": {"kind": "image", "hf": "ResNetModel", "config": "ResNetConfig", "inputs": ("pixel_values",),
                 "outputs": ("last_hidden_state", "pooler_output"), "ort_type": None,
                 "quick": {"embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]}},
}
# (batch, seq) for text, (batch,) for images; "new" is the unseen in-range shape of the cold-start process
SHAPES = {"text": {"real": [(1, 128), (8, 128), (1, 512)], "new": (3, 77),
                   "quick": [(1, 16), (4, 16), (1, 32)], "quick_new": (3, 7)},
          "image": {"real": [(1,), (8,)], "new": (3,), "quick": [(1,), (4,)], "quick_new": (3,)}}
# tripy_build CLI overrides per kind. Real size: none (model=bert/gpt2 choose shapes=text, batch 1..16 x
# seq 1..512; vit/resnet50 shapes=image, batch 1..16: every shape here is in range). Quick: small dims and
# few buckets, so that the tiny models build in seconds.
TB_OVERRIDES = {"text": {"real": [], "quick": ["shapes.dims.batch=[1,4,4]", "shapes.dims.seq=[1,16,32]",
                                               "shapes.buckets.batch=[1,4]", "shapes.buckets.seq=[16,32]"]},
                "image": {"real": [], "quick": ["shapes.dims.batch=[1,4,4]", "shapes.buckets.batch=[1,4]"]}}
# A turn: one untimed call, then PER_TURN timed ones back to back. The untimed call wakes the contender's
# worker threads: on this VM a thread asleep after an idle pause took 2-180 ms to wake (OpenMP most).
PER_TURN = 2
PAUSE_S = {"real": 0.05, "quick": 0.01}  # between two timed calls (of different contenders): spinning threads go idle


def clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def one_line(e: BaseException | str, limit: int = 240) -> str:
    text = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:limit]


def cores() -> int:
    return len(os.sched_getaffinity(0))


def threads() -> int:
    """The intra-op threads of every contender (the parent passes ``--threads`` as OMP_NUM_THREADS)."""
    return int(os.environ.get("OMP_NUM_THREADS") or cores())


def dir_size(path: Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def vm_hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


def load_average() -> str:
    """The 1/5/15-minute load averages: how busy the (shared) machine was."""
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def shape_key(shape) -> str:
    return "x".join(map(str, shape))


def image_size(cfg: dict) -> int:
    """The pixel size the model takes (ViT: its config; ResNet: 224, what tripy_build's resnet declares)."""
    size = cfg.get("image_size", 224)
    return size[0] if isinstance(size, (list, tuple)) else size


def make_inputs(name: str, spec: dict, hf_config: dict, shapes: list, pad_shape) -> dict:
    """{shape key: {input name: array}} for every shape (seeded), plus "pad": the pad shape right-padded."""
    import numpy as np
    out = {}
    for i, shape in enumerate(shapes):
        rng = np.random.default_rng(1000 + i)
        if spec["kind"] == "text":
            ids = rng.integers(0, hf_config["vocab_size"], size=shape, dtype=np.int64).astype(np.int32)
            x = {"input_ids": ids, "attention_mask": np.ones(shape, np.int32), "token_type_ids": np.zeros(shape, np.int32)}
            out[shape_key(shape)] = {k: x[k] for k in spec["inputs"]}
        else:
            hw = image_size(hf_config)
            out[shape_key(shape)] = {"pixel_values": rng.standard_normal((shape[0], 3, hw, hw), dtype=np.float32)}
    if pad_shape is not None:
        x = {k: v.copy() for k, v in out[shape_key(pad_shape)].items()}
        batch, seq = pad_shape
        lengths = np.random.default_rng(7).integers(1, seq, size=batch)
        lengths[0] = seq  # one full row, the others cut short
        x["attention_mask"] = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
        out["pad"] = x
    return out


def save_arrays(path: Path, tree: dict) -> None:
    import numpy as np
    np.savez(path, **{f"{s}/{k}": np.asarray(v) for s, d in tree.items() for k, v in d.items()})


def load_arrays(path: Path) -> dict:
    import numpy as np
    tree: dict = {}
    with np.load(path) as data:
        for key in data.files:
            s, k = key.split("/", 1)
            tree.setdefault(s, {})[k] = data[key]
    return tree


# --- the contenders, in the child processes -------------------------------------------------------
class TorchEager:
    key, label = "torch", "torch eager"

    def load(self, job: dict):
        import torch
        import transformers
        torch.set_num_threads(threads())
        spec = MODELS[job["model"]]
        model = getattr(transformers, spec["hf"]).from_pretrained(job["hf_dir"]).eval()
        return self.wrap(model, spec)

    def wrap(self, model, spec):
        import torch
        call = spec.get("call", {})

        def run(x: dict) -> dict:
            with torch.inference_mode():
                out = model(**{k: torch.from_numpy(v) for k, v in x.items()}, **call)
            return {k: out[k].numpy() for k in spec["outputs"]}
        return run


class TorchCompile(TorchEager):
    key, label = "torch.compile", "torch.compile"

    def load(self, job: dict):
        import torch
        import transformers
        torch.set_num_threads(threads())
        spec = MODELS[job["model"]]
        model = getattr(transformers, spec["hf"]).from_pretrained(job["hf_dir"]).eval()
        return self.wrap(torch.compile(model), spec)


class Ort:
    key, label, file = "ort", "ONNX Runtime", "model.onnx"

    def load(self, job: dict):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads(), 1
        sess = ort.InferenceSession(str(Path(job["art"]) / self.file), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return lambda x: dict(zip(names, sess.run(None, x)))


class OrtOpt(Ort):
    key, label = "ort-opt", "ONNX Runtime + transformer optimizer"


class TripyBuild:
    key, label = "tripy_build", "tripy_build (tb.load)"

    def load(self, job: dict):
        import numpy as np
        import tripy_build as tb
        exe = self.loaded = tb.load(job["art"])
        outputs = MODELS[job["model"]]["outputs"]

        def run(x: dict) -> dict:
            out = exe(**x)
            if not isinstance(out, dict):
                out = dict(zip(outputs, out if isinstance(out, (list, tuple)) else [out]))
            return {k: np.asarray(v) for k, v in out.items()}
        return run

    def settle(self) -> None:
        """Wait for the background warm-up of every profile, so that it does not run beside timed calls."""
        self.loaded.wait_warmed()


class TripyRuntime(TripyBuild):
    key, label = "tripy_build.runtime", "tripy_build.runtime (no jax)"

    def load(self, job: dict):
        from tripy_build import runtime
        rt = self.loaded = runtime.load(job["art"])
        outputs = MODELS[job["model"]]["outputs"]

        def run(x: dict) -> dict:
            out = rt(**x)
            return out if isinstance(out, dict) else dict(zip(outputs, out if isinstance(out, (list, tuple)) else [out]))
        return run


CONTENDERS = [TripyBuild(), TripyRuntime(), TorchEager(), TorchCompile(), Ort(), OrtOpt()]
BY_KEY = {c.key: c for c in CONTENDERS}
ORT_KEYS = ("ort", "ort-opt")


# --- the children: python -c CHILD BENCH '<json>' -------------------------------------------------
# The protocol goes over a copy of stdout; fd 1 itself is pointed at stderr (the log), so that what
# libraries print cannot mix with it.
CHILD = ("import time; t0 = time.clock_gettime(time.CLOCK_MONOTONIC); import os, sys; "
         "proto = os.fdopen(os.dup(1), 'w', buffering=1); os.dup2(2, 1); "
         "sys.path.insert(0, sys.argv[1]); import real_models; real_models.child(sys.argv[2], proto, t0)")


def child(arg: str, proto, t0: float) -> None:
    job = json.loads(arg)

    def send(**kw):
        proto.write(json.dumps(kw) + "\n")
    {"prepare": child_prepare, "run": child_run}[job["mode"]](job, send, t0)


def child_prepare(job, send, t0):
    """One process per model, one message per stage: the HF model and PyTorch's reference outputs, then
    the ONNX export, the ORT optimizer and torch.compile's first compile, each timed alone (imports
    not counted). A stage that raises sends its reason and the next goes on."""
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(threads())
    spec, work = MODELS[job["model"]], Path(job["work"])
    config = getattr(transformers, spec["config"])(**(spec["quick"] if job["quick"] else spec.get("real", {})))
    torch.manual_seed(0)
    model = getattr(transformers, spec["hf"])(config).eval()
    model.save_pretrained(job["hf_dir"])
    cfg = json.loads((Path(job["hf_dir"]) / "config.json").read_text())
    shapes = [tuple(s) for s in job["shapes"]] + [tuple(job["new"])]
    xs = make_inputs(job["model"], spec, cfg, shapes, tuple(job["pad"]) if job["pad"] else None)
    save_arrays(work / "inputs.npz", xs)
    ref = {s: TorchEager().wrap(model, spec)(x) for s, x in xs.items()}
    save_arrays(work / "ref.npz", ref)
    send(stage="setup", params=sum(p.numel() for p in model.parameters()),
         attn=getattr(model.config, "_attn_implementation", None), dtype=str(next(model.parameters()).dtype))
    del model
    first = xs[shape_key(job["shapes"][0])]
    ranks = {k: np.ndim(v) for k, v in ref[shape_key(job["shapes"][0])].items()}
    for stage, wanted, fn in (("export", job["export"], lambda: export_onnx(job, spec, first, ranks)),
                              ("optimize", job["optimize"], lambda: optimize_onnx(job, spec, cfg)),
                              ("compile", job["compile"], lambda: compile_first(job, first))):
        if not wanted or (stage == "optimize" and not (Path(job["ort"]) / "model.onnx").exists()):
            continue
        try:
            send(stage=stage, **fn())
        except Exception as e:  # noqa: BLE001 - any failure of this stage: reported, the next stage goes on
            send(stage=stage, failed=one_line(e))


def hf_model(job: dict, **kw):
    import transformers
    return getattr(transformers, MODELS[job["model"]]["hf"]).from_pretrained(job["hf_dir"], **kw).eval()


def export_onnx(job: dict, spec: dict, xs: dict, ranks: dict) -> dict:
    """torch.onnx.export of the model with eager attention, dynamic batch (and seq); TorchScript, else dynamo."""
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    art = Path(job["ort"])
    model = hf_model(job, attn_implementation="eager")
    names, outs, call = spec["inputs"], spec["outputs"], spec.get("call", {})

    class Wrapped(torch.nn.Module):  # positional inputs, a tuple of the outputs HF names
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *xs):
            out = self.model(**dict(zip(names, xs)), **call)
            return tuple(out[k] for k in outs)

    example = tuple(torch.from_numpy(xs[k]) for k in names)
    text = spec["kind"] == "text"
    dyn_in = {0: "batch", 1: "seq"} if text else {0: "batch"}
    dyn_out = {k: {0: "batch", 1: "seq"} if text and ranks[k] == 3 else {0: "batch"} for k in outs}
    errors = []
    for exporter in ("torchscript", "dynamo"):
        for f in art.glob("model.onnx*"):
            f.unlink()
        t = clock()
        try:
            if exporter == "torchscript":
                torch.onnx.export(Wrapped().eval(), example, str(art / "model.onnx"), dynamo=False, opset_version=17,
                                  input_names=list(names), output_names=list(outs),
                                  dynamic_axes={**{k: dyn_in for k in names}, **dyn_out})
            else:
                from torch.export import Dim
                dims = {0: Dim("batch", min=1, max=64)} | ({1: Dim("seq", min=1, max=512)} if text else {})
                torch.onnx.export(Wrapped().eval(), example, str(art / "model.onnx"), dynamo=True,
                                  input_names=list(names), output_names=list(outs),
                                  dynamic_shapes=(tuple(dims for _ in names),))
            return {"export_s": clock() - t, "exporter": exporter, "errors": errors}
        except Exception as e:  # noqa: BLE001 - any exporter failure: try the other, report both
            errors.append(f"{exporter}: {one_line(e)}")
    raise RuntimeError("; ".join(errors))


def optimize_onnx(job: dict, spec: dict, cfg: dict) -> dict:
    """ONNX Runtime's transformer optimizer (fused attention, LayerNorm, GELU) on the exported model."""
    from onnxruntime.transformers.optimizer import optimize_model
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    hidden = cfg.get("hidden_size", cfg.get("n_embd"))
    t = clock()
    opt = optimize_model(str(Path(job["ort"]) / "model.onnx"), model_type=spec["ort_type"], num_heads=heads,
                         hidden_size=hidden)
    opt.save_model_to_file(str(Path(job["ort_opt"]) / "model.onnx"))
    return {"optimize_s": clock() - t, "fused": {k: v for k, v in opt.get_fused_operator_statistics().items() if v}}


def compile_first(job: dict, xs: dict) -> dict:
    """torch.compile's first call at the first shape, with an empty TorchInductor cache (kept for later)."""
    fn = TorchCompile().load(job)
    t = clock()
    fn(xs)
    return {"compile_s": clock() - t}


def child_run(job, send, t0):
    """Cold start (imports, load, first call), the new shape's first call; kept: warm-up, outputs, timed calls."""
    c = BY_KEY[job["contender"]]
    stamps = {"start": t0}
    xs = load_arrays(Path(job["work"]) / "inputs.npz")
    stamps["inputs"] = clock()
    fn = c.load(job)
    stamps["loaded"] = clock()
    first = job["shapes"][0]
    outs = {first: fn(xs[first])}
    stamps["result"] = clock()
    send(event="first", stamps=stamps, rss_kb=vm_hwm_kb())
    t = clock()
    outs[job["new"]] = fn(xs[job["new"]])
    t1 = clock()
    fn(xs[job["new"]])
    send(event="new", first=t1 - t, second=clock() - t1, rss_kb=vm_hwm_kb())
    if not job["keep"]:
        return
    if isinstance(c, TripyBuild):
        c.settle()
    for s in job["shapes"] + (["pad"] if "pad" in xs else []):
        for _ in range(2):
            outs[s] = fn(xs[s])
    save_arrays(Path(job["out"]), outs)
    send(event="ready", rss_kb=vm_hwm_kb())
    for line in sys.stdin:  # "call SHAPE K": one untimed call (wakes the threads), then K timed ones
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            break
        x, times = xs[cmd[1]], []
        t = clock()
        fn(x)
        wake = clock() - t
        for _ in range(int(cmd[2])):
            t = clock()
            fn(x)
            times.append(clock() - t)
        send(event="call", wake=wake, seconds=times)
    send(event="exit", rss_kb=vm_hwm_kb())


# --- the parent -----------------------------------------------------------------------------------
class Ended(RuntimeError):
    """The child exited normally with nothing more to say."""


class Child:
    """A child process speaking JSON lines; stderr goes to a log whose last line explains a failure."""

    def __init__(self, job: dict, env: dict, log: Path, keep_stdin: bool = False):
        self.log = log
        self.err = open(log, "w")
        self.t0 = clock()
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(BENCH), json.dumps(job)], env=env,
                                     cwd=str(REPO), stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.err)
        self.buf = b""

    def read(self, timeout: float) -> tuple[dict, float]:
        """The next JSON line and the seconds from spawn to its arrival; RuntimeError when the child ends first."""
        deadline = clock() + timeout
        while b"\n" not in self.buf:
            left = deadline - clock()
            if left <= 0:
                self.kill()
                raise RuntimeError(f"no answer in {timeout:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    if self.proc.wait() == 0:
                        raise Ended("exited before answering")
                    raise RuntimeError(self.failure())
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line), clock() - self.t0

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def failure(self) -> str:
        rc = self.proc.wait()
        self.err.flush()
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        hint = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
        return f"exit {rc}: {one_line(hint)}"

    def close(self) -> None:
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        self.err.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def child_env(root: Path, n_threads: int) -> dict:
    n = str(n_threads)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "TORCHINDUCTOR", "XLA_FLAGS"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n,
               XDG_CACHE_HOME=str(root / "xdg"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    if n_threads == 1:  # XLA: one intra-op thread (else it sizes its pool to the cores)
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"
    return env


def parse_args(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny configs (2 layers, hidden 64), small shapes, 1 round, "
                   "4 calls; leaves out torch.compile unless --contenders names it")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--shapes", help="comma-separated subset: BxS for bert/gpt2 (e.g. 1x128,8x128), B for vit/resnet50 "
                   "(e.g. 8); a model none of them fits keeps all its shapes")
    p.add_argument("--contenders", help=f"comma-separated, from {', '.join(BY_KEY)} (default all)")
    p.add_argument("--rounds", type=int, help="cold-start processes per contender (default 3, quick 1)")
    p.add_argument("--calls", type=int, help="timed calls per shape per contender (default 10, quick 4), "
                   f"in turns of {PER_TURN} after an untimed one")
    p.add_argument("--threads", type=int, help=f"intra-op threads of every contender (default: the cores allowed, {cores()})")
    p.add_argument("--tb-override", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra override for the tripy_build CLI (repeatable; after TB_OVERRIDES)")
    p.add_argument("--build-timeout", type=float, help="seconds per build (default 3600, quick 600)")
    p.add_argument("--workdir", help="work here (kept) instead of a temporary directory")
    p.add_argument("--json", help="also write every measurement to this file")
    args = p.parse_args(argv)
    args.size = "quick" if args.quick else "real"
    args.threads = args.threads or cores()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.calls = args.calls or (4 if args.quick else 10)
    args.build_timeout = args.build_timeout or (600 if args.quick else 3600)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    default = [k for k in BY_KEY if not (args.quick and k == "torch.compile")]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()] if args.contenders else default
    for what, chosen, known in (("model", args.models, MODELS), ("contender", args.contenders, BY_KEY)):
        bad = [c for c in chosen if c not in known]
        if bad:
            p.error(f"unknown {what}(s) {', '.join(bad)}; choose from {', '.join(known)}")
    args.shapes_for = {}
    tokens = [t.strip() for t in (args.shapes or "").split(",") if t.strip()]
    for m in args.models:
        kind = MODELS[m]["kind"]
        all_shapes = SHAPES[kind][args.size]
        picked = [s for s in all_shapes if shape_key(s) in tokens]
        args.shapes_for[m] = picked or all_shapes
    known = {shape_key(s) for k in SHAPES.values() for s in k[args.size]}
    bad = [t for t in tokens if t not in known]
    if bad:
        p.error(f"unknown shape(s) {', '.join(bad)} for this size; choose from {', '.join(sorted(known))}")
    return args


def environment(args) -> dict:
    import importlib.metadata as md
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    env = {"python": platform.python_version(), "machine": f"{platform.machine()}, {cpu}, "
           f"{os.cpu_count()} CPUs ({cores()} allowed)"}
    for dist in ("jax", "jaxlib", "numpy", "torch", "transformers", "safetensors", "onnx", "onnxscript", "onnxruntime"):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = "not installed"
    rev = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    env["tripy_build"] = f"{REPO / 'tripy_build'} ({rev.stdout.strip()[:80] or 'not a git checkout'})"
    n = args.threads
    xla = "XLA one thread (--xla_cpu_multi_thread_eigen=false)" if n == 1 else f"XLA its own pool ({cores()} cores)"
    env["threads"] = (f"{n} per contender ({cores()} cores allowed): torch.set_num_threads({n}), ORT intra_op_num_threads={n} "
                      f"inter_op 1, OMP_NUM_THREADS={n} MKL_NUM_THREADS={n}; {xla}; not pinned")
    env["load average"] = load_average()
    return env


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def p90(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = 0.9 * (len(xs) - 1)
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def tb_argv(m: str, checkpoint: Path, artifacts: Path, args) -> list[str]:
    """The build command, run from the repository root."""
    return [sys.executable, "-m", "tripy_build", f"model={MODELS[m].get('tb_model', m)}", f"params.checkpoint={checkpoint}",
            f"artifacts_dir={artifacts}", *TB_OVERRIDES[MODELS[m]["kind"]][args.size], *args.tb_override]


class Bench:
    def __init__(self, args, root: Path):
        self.args, self.root, self.env = args, root, child_env(root, args.threads)
        self.results: dict = {}

    def say(self, text: str) -> None:
        print(text, flush=True)

    def fail(self, m: str, key: str, stage: str, reason: str) -> None:
        r = self.results[m]["contenders"].setdefault(key, {})
        if "failed" not in r:
            r["failed"] = f"{stage}: {reason}"
            self.say(f"  {m}: {key} skipped ({stage} failed: {reason})")

    # -- per model: setup, builds, cold starts and steady calls --
    def model(self, m: str) -> None:
        args, spec = self.args, MODELS[m]
        work = self.root / m
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        shapes = [shape_key(s) for s in args.shapes_for[m]]
        new = SHAPES[spec["kind"]]["quick_new" if args.quick else "new"]
        pad = next((s for s in args.shapes_for[m] if s[0] > 1), None) if spec["kind"] == "text" else None
        hf_dir = work / "hf"
        self.results[m] = res = {"shapes": shapes, "new": shape_key(new), "pad": shape_key(pad) if pad else None,
                                 "contenders": {}}
        base = {"model": m, "work": str(work), "hf_dir": str(hf_dir), "quick": args.quick,
                "shapes": shapes, "new": shape_key(new)}
        res["load_average"] = {"start": load_average()}
        self.say(f"\n== {m}: shapes {', '.join(shapes)}; new shape {shape_key(new)}"
                 + (f"; padded mask at {shape_key(pad)}" if pad else "") + f" (load average {load_average()})")
        for key in args.contenders:
            res["contenders"][key] = {}
        self.prepare(m, dict(base, mode="prepare", shapes=[list(s) for s in args.shapes_for[m]], new=list(new),
                             pad=list(pad) if pad else None), work)
        if res.get("failed"):
            return
        if any(k in res["contenders"] for k in ("tripy_build", "tripy_build.runtime")):
            self.tripy_build(m, work)
        self.runs(m, base, work)

    def prepare(self, m: str, job: dict, work: Path) -> None:
        """The prepare child's stages: HF model + reference (else the model is skipped), export, optimize, compile."""
        spec, res = MODELS[m], self.results[m]["contenders"]
        for key in ("torch", "torch.compile"):
            if key in res:
                res[key]["art"] = job["hf_dir"]
        if "ort-opt" in res and not spec["ort_type"]:
            self.fail(m, "ort-opt", "optimize", f"onnxruntime.transformers has no optimizer for {m}")
        (work / "ort").mkdir()
        (work / "ort-opt").mkdir()
        job.update(ort=str(work / "ort"), ort_opt=str(work / "ort-opt"),
                   export=any(k in res and "failed" not in res[k] for k in ORT_KEYS),
                   optimize="ort-opt" in res and "failed" not in res["ort-opt"], compile="torch.compile" in res)
        env = dict(self.env, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"))
        child = Child(job, env, work / "prepare.log")
        stage, export = "setup", None
        try:
            while True:
                try:
                    msg, wall = child.read(self.args.build_timeout)
                except Ended:
                    break
                stage = msg["stage"]
                if stage == "setup":
                    self.results[m]["setup"] = msg
                    size = dir_size(job["hf_dir"])
                    for key in ("torch", "torch.compile"):
                        if key in res:
                            res[key]["size"] = size
                    self.say(f"  {m}: {msg['params'] / 1e6:.3g} M parameters, {msg['dtype']}, HF attention {msg['attn']}; "
                             f"saved and PyTorch's reference outputs in {wall:.1f} s, {size / 1e6:.1f} MB")
                elif msg.get("failed"):
                    keys = {"export": ORT_KEYS, "optimize": ("ort-opt",), "compile": ("torch.compile",)}[stage]
                    for key in keys:
                        if key in res:
                            self.fail(m, key, stage, msg["failed"])
                elif stage == "export":
                    export = msg
                    size = sum(dir_size(f) for f in (work / "ort").glob("model.onnx*"))
                    note = f" (after {'; '.join(msg['errors'])})" if msg["errors"] else ""
                    self.say(f"  {m}: torch.onnx.export ({msg['exporter']}) in {msg['export_s']:.1f} s, "
                             f"{size / 1e6:.1f} MB{note}")
                    if "ort" in res:
                        res["ort"].update(art=str(work / "ort"), build_s=msg["export_s"], size=size, build=msg)
                elif stage == "optimize":
                    fused = ", ".join(f"{k} {v}" for k, v in msg["fused"].items()) or "nothing fused"
                    self.say(f"  {m}: optimize_model(model_type={spec['ort_type']}) in {msg['optimize_s']:.1f} s: {fused}")
                    res["ort-opt"].update(art=str(work / "ort-opt"), build_s=export["export_s"] + msg["optimize_s"],
                                          size=sum(dir_size(f) for f in (work / "ort-opt").glob("model.onnx*")),
                                          build=dict(export, **msg))
                elif stage == "compile":
                    res["torch.compile"].update(build_s=msg["compile_s"], build=msg)
                    self.say(f"  {m}: torch.compile's first call (compile, empty cache) {msg['compile_s']:.1f} s")
        except RuntimeError as e:
            if stage == "setup" and "setup" not in self.results[m]:
                self.results[m]["failed"] = f"setup: {one_line(str(e))}"
                self.say(f"  {m}: setup failed ({self.results[m]['failed']}); model skipped")
            else:
                following = {"setup": ("export", "optimize", "compile"), "export": ("optimize", "compile"),
                             "optimize": ("compile",), "compile": ()}[stage]
                for key, st in (("ort", "export"), ("ort-opt", "export"), ("ort-opt", "optimize"),
                                ("torch.compile", "compile")):
                    if key in res and st in following and "build_s" not in res[key]:
                        self.fail(m, key, st, f"the prepare process died: {one_line(str(e))}")
        finally:
            child.close()

    def tripy_build(self, m: str, work: Path) -> None:
        args, res = self.args, self.results[m]["contenders"]
        argv = tb_argv(m, work / "hf", work / "tb-artifacts", args)
        env = dict(self.env, XDG_CACHE_HOME=str(work / "tb-xdg"))
        log = work / "tripy_build.build.log"
        t = clock()
        try:
            proc = subprocess.run(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=args.build_timeout)
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
        seconds = clock() - t
        log.write_text(" ".join(argv) + "\n" + out)
        path = next((ln.split("artifact:", 1)[1].split("  (")[0].strip() for ln in out.splitlines()
                     if ln.strip().startswith("artifact:")), None)
        if rc != 0 or path is None:
            lines = [ln for ln in out.splitlines() if ln.strip()]
            hint = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "")
            reason = f"exit {rc}: {one_line(hint)}" if rc != 0 else "no 'artifact: <path>' line in its output"
            for key in ("tripy_build", "tripy_build.runtime"):
                if key in res:
                    self.fail(m, key, "build", f"python -m tripy_build model={m} ... {reason}")
            return
        art = (REPO / path).resolve()
        size = dir_size(art)
        parts = {p.name: dir_size(p) for p in sorted(art.iterdir())}
        self.say(f"  {m}: tripy_build built {art.name} in {seconds:.1f} s, {size / 1e6:.1f} MB")
        for key in ("tripy_build", "tripy_build.runtime"):
            if key in res:
                res[key].update(art=str(art), build_s=seconds, size=size, build={"argv": argv[1:], "files": parts,
                                                                                  "summary": out[-4000:]})

    def runs(self, m: str, base: dict, work: Path) -> None:
        """Round 0 keeps its processes for the steady calls; later rounds are cold starts only."""
        args, res = self.args, self.results[m]["contenders"]
        timeout = args.build_timeout
        for r in range(args.rounds):
            keys = [k for k in res if "failed" not in res[k]]
            if not keys:
                return
            keys = keys[r % len(keys):] + keys[:r % len(keys)]
            alive = {}
            for key in keys:
                c = res[key]
                env = dict(self.env, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"))
                job = dict(base, mode="run", contender=key, art=c.get("art"), keep=r == 0,
                           out=str(work / f"out-{key}.npz"))
                child = Child(job, env, work / f"{key}.run{r}.log", keep_stdin=r == 0)
                try:
                    msg, cold = child.read(timeout)
                    new, _ = child.read(timeout)
                    run = {"cold": cold, "stamps": msg["stamps"], "spawn": child.t0, "rss_kb": msg["rss_kb"],
                           "new_first": new["first"], "new_second": new["second"], "rss_new_kb": new["rss_kb"]}
                    if r == 0:
                        ready, _ = child.read(timeout)
                        run["rss_ready_kb"] = ready["rss_kb"]
                        alive[key] = child
                    else:
                        child.close()
                except RuntimeError as e:
                    child.close() if child.proc.poll() is not None else child.kill()
                    self.fail(m, key, "run", one_line(str(e)))
                    continue
                c.setdefault("runs", []).append(run)
                if r == 0:
                    self.check(m, key, work)
                self.say(f"  {m}: round {r + 1}/{args.rounds} {key}: cold {cold:.2f} s, new shape 1st "
                         f"{new['first'] * 1e3:.0f} ms, RSS {msg['rss_kb'] / 1024:.0f} MB"
                         + (f", rel err {c['err']:.1e}" if r == 0 and c.get("err") is not None else ""))
            if r == 0:
                self.steady(m, alive)

    def steady(self, m: str, alive: dict) -> None:
        """Turns of one untimed and PER_TURN timed calls, each contender in turn (order rotating), shape by shape."""
        args, res = self.args, self.results[m]["contenders"]
        shapes = self.results[m]["shapes"]
        times = {k: {s: [] for s in shapes} for k in alive}
        wakes = {k: {s: [] for s in shapes} for k in alive}
        turns = -(-args.calls // PER_TURN)
        self.say(f"  {m}: steady calls, {len(alive)} contenders interleaved, {turns} turns of 1 untimed + "
                 f"{PER_TURN} timed calls per shape")
        for i in range(turns):
            for s in shapes:
                keys = list(alive)
                for key in keys[i % len(keys):] + keys[:i % len(keys)] if keys else keys:
                    if key not in alive:
                        continue
                    try:
                        alive[key].send(f"call {s} {PER_TURN}")
                        msg, _ = alive[key].read(args.build_timeout)
                        times[key][s] += msg["seconds"]
                        wakes[key][s].append(msg["wake"])
                    except (RuntimeError, OSError) as e:
                        self.fail(m, key, "steady call", one_line(str(e)))
                        alive.pop(key).kill()
                    time.sleep(PAUSE_S[args.size])
        for key, child in alive.items():
            try:
                child.send("exit")
                msg, _ = child.read(120)
                res[key]["rss_exit_kb"] = msg["rss_kb"]
            except (RuntimeError, OSError):
                pass
            child.close()
            res[key]["steady"] = {s: {"median": median(t), "p90": p90(t), "n": len(t), "all": t,
                                      "untimed_first_of_turn": wakes[key][s]} for s, t in times[key].items()}

    def check(self, m: str, key: str, work: Path) -> None:
        """Outputs against PyTorch eager's: max |a - b| / max |ref| per output, the worst over shapes."""
        import numpy as np
        ref, got = load_arrays(work / "ref.npz"), load_arrays(work / f"out-{key}.npz")
        xs = load_arrays(work / "inputs.npz")
        errs, pad_err = {}, None
        for s, outs in got.items():
            for name, y in outs.items():
                r = ref[s].get(name)
                if r is None:
                    continue
                if y.shape != r.shape:
                    e = float("inf")
                elif s == "pad":
                    lengths = xs["pad"]["attention_mask"].sum(axis=1)
                    real = [(y[i, :n], r[i, :n]) if y.ndim == 3 else (y[i], r[i]) for i, n in enumerate(lengths)]
                    e = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in real) / float(np.max(np.abs(r)))
                else:
                    e = float(np.max(np.abs(y.astype(np.float64) - r))) / float(np.max(np.abs(r)))
                if s == "pad":
                    pad_err = max(pad_err or 0.0, e)
                else:
                    errs[f"{s}/{name}"] = e
        missing = [f"{s}/{n}" for s in got if s in ref for n in ref[s] if n not in got[s]]
        c = self.results[m]["contenders"][key]
        c["errors"], c["err"], c["pad_err"] = errs, max(errs.values()) if errs else None, pad_err
        c["ok"] = bool(errs) and not missing and c["err"] <= RTOL and (pad_err is None or pad_err <= RTOL)
        if missing:
            c["missing_outputs"] = missing


# --- the report -----------------------------------------------------------------------------------
def summarize(results: dict) -> dict:
    out = {}
    for m, r in results.items():
        rows = {}
        for key, c in r.get("contenders", {}).items():
            runs = c.get("runs", [])
            row = {"failed": c.get("failed"), "build": c.get("build_s"), "size": c.get("size"),
                   "cold": median([x["cold"] for x in runs]), "rss": median([x["rss_kb"] * 1024 for x in runs]),
                   "rss_exit": c["rss_exit_kb"] * 1024 if c.get("rss_exit_kb") else None,
                   "new": median([x["new_first"] for x in runs]), "new2": median([x["new_second"] for x in runs]),
                   "err": c.get("err"), "pad_err": c.get("pad_err"), "ok": c.get("ok"),
                   "split": {k: median([x["stamps"][b] - x["stamps"][a] for x in runs])
                             for k, a, b in (("numpy + inputs", "start", "inputs"), ("import + load", "inputs", "loaded"),
                                             ("first call", "loaded", "result"))},
                   "startup": median([x["stamps"]["start"] - x["spawn"] for x in runs])}
            for s in r["shapes"]:
                st = c.get("steady", {}).get(s, {})
                row[s], row[s + " p90"] = st.get("median"), st.get("p90")
            rows[key] = row
        best = {}
        for col in ["build", "size", "cold", "rss", "new", *r.get("shapes", [])]:
            vals = [rows[k][col] for k in ORT_KEYS if k in rows and rows[k][col] is not None and rows[k]["ok"]]
            best[col] = min(vals) if vals else None
        out[m] = {"rows": rows, "best_ort": best}
    return out


def num(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def cell(v, best, scale: float, p90v=None) -> str:
    if v is None:
        return "-"
    text = num(v * scale) + (f" / {num(p90v * scale)}" if p90v is not None else "")
    return text + (f" (x{v / best:.2f})" if best else "")


def report(args, results: dict, summary: dict) -> list[str]:
    """A Markdown table per model; returns the lines (also printed)."""
    lines = ["", "## Results", "",
             "Medians. `(xR)`: ratio to the best ONNX Runtime variant in that column (< 1: tripy_build, or that row, is",
             "faster or smaller). Latency cells: median / p90 ms of steady calls. cold: spawn -> first result, s.",
             "new 1st: first call at the new shape in the cold-start process. rel err: max |a-b| / max |ref| against",
             "PyTorch eager over every output and shape; pad err: the right-padded mask, at real positions."]
    for m in args.models:
        r, s = results.get(m, {}), summary.get(m)
        lines += ["", f"### {m}"]
        if not s or r.get("failed"):
            lines.append(f"not run: {r.get('failed', 'no results')}")
            continue
        shapes, best = r["shapes"], s["best_ort"]
        head = ["contender", "build s", "size MB", "cold s", "RSS MB", *[f"{x} ms" for x in shapes],
                f"new {r['new']} 1st ms", "rel err"] + (["pad err"] if r.get("pad") else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for key, row in s["rows"].items():
            if row["failed"]:
                lines.append(f"| {key} | " + " | ".join(["-"] * (len(head) - 2)) + f" | {row['failed']} |")
                continue
            err = "-" if row["err"] is None else f"{row['err']:.1e}" + ("" if row["ok"] else " (!)")
            cells = [key, cell(row["build"], best["build"], 1), cell(row["size"], best["size"], 1e-6),
                     cell(row["cold"], best["cold"], 1), cell(row["rss"], best["rss"], 2 ** -20),
                     *[cell(row[x], best[x], 1e3, row[x + " p90"]) for x in shapes],
                     cell(row["new"], best["new"], 1e3), err]
            if r.get("pad"):
                cells.append("-" if row["pad_err"] is None else f"{row['pad_err']:.1e}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cold start split (medians, ms: spawn -> the child's first Python line, numpy + reading the inputs,"
              " import + load, first call) and the new shape's second call:"]
    for m in args.models:
        for key, row in summary.get(m, {}).get("rows", {}).items():
            if row["failed"] or row["cold"] is None:
                continue
            sp = ", ".join(f"{k} {num(v * 1e3)}" for k, v in [("startup", row["startup"]), *row["split"].items()]
                           if v is not None)
            lines.append(f"- {m} {key}: {sp}; new 2nd {num(row['new2'] * 1e3)}")
    lines += ["", "Peak RSS (MB) of the kept process at its exit: every shape run, tb.load's background warm-up of"
              " every profile done:"]
    for m in args.models:
        rows = summary.get(m, {}).get("rows", {})
        parts = [f"{k} {num(row['rss_exit'] / 2 ** 20)}" for k, row in rows.items() if row.get("rss_exit")]
        if parts:
            lines.append(f"- {m}: " + ", ".join(parts))
    for line in lines:
        print(line)
    return lines


def main(argv=None) -> int:
    import tempfile
    args = parse_args(argv)
    info = environment(args)
    for k, v in info.items():
        print(f"{k + ':':<16} {v}")
    print(f"{'size:':<16} {args.size}; {args.rounds} cold-start round(s), {args.calls} timed calls per shape; "
          f"contenders {', '.join(args.contenders)}")
    if args.quick and "torch.compile" not in args.contenders:
        print("torch.compile left out of --quick (each compile takes 10-40 s here); --contenders adds it")
    t_start = clock()
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="tripy_build-real-")
    root = Path(args.workdir or tmp.name).resolve()
    root.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, root)
    try:
        for m in args.models:
            t = clock()
            bench.model(m)
            bench.results[m]["wall_s"] = clock() - t
            bench.results[m].setdefault("load_average", {})["end"] = load_average()
            print(f"  {m}: done in {clock() - t:.0f} s (load average {load_average()})", flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    summary = summarize(bench.results)
    lines = report(args, bench.results, summary)
    total = clock() - t_start
    print(f"\ntotal {total:.0f} s (load average {load_average()})")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": info, "args": vars(args), "results": bench.results,
                                               "summary": summary, "table": lines, "total_s": total},
                                              indent=1, default=str))
    bad = [f"{m}/{k}: rel err {row['err']} pad err {row['pad_err']} > {RTOL}" for m, s in summary.items()
           for k, row in s["rows"].items() if not row["failed"] and row["ok"] is False]
    for b in bad:
        print(f"MISMATCH: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
