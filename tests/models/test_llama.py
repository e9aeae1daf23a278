"""The Llama family (Llama 2 and 3 with ``rope_type: llama3``, Qwen2 (with YaRN too), Qwen3, Mistral, Gemma 2 and 3,
Phi-3, OLMo 2 and 3, and the mixtures of experts Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE and gpt-oss) from Hugging
Face checkpoints.

Tiny ``save_pretrained`` checkpoints of each (grouped-query attention: 4 query heads over 2 key/value heads): the
logits of ``models/llama.py`` against the PyTorch model's within 1e-4 of their scale at the real positions of
right-padded rows, tied and untied embeddings, sliding windows shorter than the sequence (Mistral's in every
layer, Qwen2's from ``max_window_layers`` on); then built through the command line with ``model=hf task=generate``,
whose greedy ids equal a plain argmax loop over the PyTorch model's logits (no logits processors) for prompts of
several lengths, with both loaders; a ``task=forward`` build's logits through both loaders at a padded shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 64
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
PHI3_IDS = {"pad_token_id": 0, "eos_token_id": 2}  # Phi-3's 32000 are outside the tiny vocabulary
FAMILIES = {  # name -> (zoo model, config class, causal LM class, extra settings)
    "llama": ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama3": ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_scaling": LLAMA3_ROPE}),
    "llama-tied": ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM, {"tie_word_embeddings": True}),
    "qwen2": ("qwen2", transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": ("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
    "mistral": ("mistral", transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 4}),
    "qwen2-window": ("qwen2", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                     {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),
    # caps low enough that the tiny model's scores and logits reach them
    "gemma2": ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               {"head_dim": 16, "sliding_window": 4, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 0.5,
                "final_logit_softcapping": 0.2}),
    # layer 0 sliding with its own rotary base, layer 1 global with linear scaling
    "gemma3": ("gemma3", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               {"head_dim": 16, "sliding_window": 4, "query_pre_attn_scalar": 12, "sliding_window_pattern": 2,
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}}),
    "phi3": ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM, {"sliding_window": 4, **PHI3_IDS}),
    # longrope's short factors and attention factor (128 / 32), half of each head rotated (Phi-4-mini: 0.75)
    "phi3-longrope": ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
                      {"original_max_position_embeddings": 32, "partial_rotary_factor": 0.5, **PHI3_IDS,
                       "rope_scaling": {"type": "longrope", "short_factor": [2.0, 0.02], "long_factor": [4.0, 3.0]}}),
    # mixtures of experts: layer 1 of Qwen3-MoE's dense (mlp_only_layers), layer 0 of Qwen2-MoE's (every second
    # layer sparse), both of Mixtral's sparse; 18 tokens' picks over 4 experts fill several blocks of one expert
    "qwen3_moe": ("qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
                   "norm_topk_prob": True, "mlp_only_layers": [1]}),
    "qwen2_moe": ("qwen2_moe", transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                   "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2}),
    "mixtral": ("mixtral", transformers.MixtralConfig, transformers.MixtralForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Gemma 1: 1 + weight norms, scaled embeddings, tied; the first releases' hidden_act "gelu" (the tanh one meant)
    "gemma": ("gemma", transformers.GemmaConfig, transformers.GemmaForCausalLM, {"head_dim": 16, "hidden_act": "gelu"}),
    # SmolLM3: layer 1 without rotary positions (every 2nd here; every 4th in SmolLM3-3B), its window layer 1's
    "smollm3": ("smollm3", transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM,
                {"no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": 4, "pad_token_id": 0,
                 "bos_token_id": 1, "eos_token_id": 2}),
    # Granite 3's four scalars, as granite-3.1-8b sets them (the scores' scale its own, not 1/sqrt(head_dim))
    "granite": ("granite", transformers.GraniteConfig, transformers.GraniteForCausalLM,
                {"embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
                 "logits_scaling": 16.0}),
    # Granite-MoE: the same scalars, every MLP 4 experts (their tensors stacked in the checkpoint), 2 per token
    "granite_moe": ("granite_moe", transformers.GraniteMoeConfig, transformers.GraniteMoeForCausalLM,
                    {"embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
                     "logits_scaling": 6.0, "num_local_experts": 4, "num_experts_per_tok": 2}),
    # YaRN over a 32-position original (Qwen's long-context configs), rounded outwards (truncate's default)
    "qwen2-yarn": ("qwen2", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   {"rope_theta": 100.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 32}}),
    # gpt-oss: sinks and biases drawn large (DRAWN), its own YaRN unrounded, a window in layer 0
    "gpt_oss": ("gpt_oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
                {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "sliding_window": 4, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0,
                                                          "beta_slow": 1.0, "original_max_position_embeddings": 32,
                                                          "truncate": False, "rope_theta": 100.0}}),
    # OLMo 2: norms after the branches, of all the queries and keys at once (each norm's weights drawn: DRAWN)
    "olmo2": ("olmo2", transformers.Olmo2Config, transformers.Olmo2ForCausalLM, {}),
    # OLMo 3: layer 0 sliding at its own rotary base, layer 1 global with YaRN (OLMo-3's long-context setting)
    "olmo3": ("olmo3", transformers.Olmo3Config, transformers.Olmo3ForCausalLM,
              {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 100.0,
                                                      "original_max_position_embeddings": 32},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}}),
    # OLMoE: OLMo's query and key norms, 4 experts of 48 in every layer, 2 per token, their weights not renormalised
    "olmoe": ("olmoe", transformers.OlmoeConfig, transformers.OlmoeForCausalLM,
              {"num_experts": 4, "num_experts_per_tok": 2}),
}
# Parameters Hugging Face's init leaves at a constant, drawn so that a misplaced one shows: gpt-oss's attention sinks
# and biases (~0: drawn N(0, 1)), OLMo's and OLMoE's norms (ones: drawn N(1, 0.3), so that each norm is told from the others)
DRAWN = {"gpt_oss": (("sinks", "bias"), 0.0, 1.0), **{case: (("norm.weight",), 1.0, 0.3) for case in ("olmo2", "olmo3", "olmoe")}}
TIED = {"llama-tied", "gemma", "gemma2", "gemma3", "smollm3"}
PROMPTS = [[5, 17, 33, 2, 9], [7, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for case, (_, config, causal, extra) in FAMILIES.items():
        torch.manual_seed(0)
        model = causal(config(**SIZES, **extra)).eval()
        if case in DRAWN:
            suffixes, mean, std = DRAWN[case]
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith(suffixes):
                        param.normal_(mean, std)
        path = tmp_path_factory.mktemp(case)
        model.save_pretrained(path)
        out[case] = (model, path)
    return out


@pytest.mark.parametrize("case", list(FAMILIES))
def test_logits_match_pytorch(case, checkpoints):
    model, path = checkpoints[case]
    name = FAMILIES[case][0]
    assert hf.model_name(path) == name
    zoo, params = hf.load_pretrained(MODELS[name], path)
    assert ("lm_head" in params) == (case not in TIED)
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    got = np.asarray(jax.jit(zoo.apply)(params, ids, mask)["logits"])
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    real = mask.astype(bool)
    assert np.abs(got[real] - want[real]).max() <= SCALE_TOL * np.abs(want[real]).max()


def test_gemmas_first_configs_gelu_is_read_as_the_tanh_approximation(checkpoints, tmp_path):
    """gemma-2b's and gemma-7b's config.json say ``hidden_act: gelu`` and mean the tanh approximation (transformers
    reads it so); a Gemma 2 config's ``gelu`` is the exact one."""
    import shutil

    model, path = checkpoints["gemma"]
    shutil.copytree(path, tmp_path / "gemma")
    config = json.loads((tmp_path / "gemma" / "config.json").read_text())
    (tmp_path / "gemma" / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    zoo, params = hf.load_pretrained(MODELS["gemma"], tmp_path / "gemma")
    assert zoo.hidden_act == "gelu_pytorch_tanh" and MODELS["gemma2"](hidden_act="gelu").hidden_act == "gelu"
    ids = np.random.default_rng(1).integers(0, VOCAB, (1, 7)).astype(np.int32)
    got = np.asarray(jax.jit(zoo.apply)(params, ids, np.ones_like(ids))["logits"])
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """A plain argmax loop over the PyTorch model's logits: no cache, no logits processors."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


# the mixtures of experts share moe.routed (its block sizes a branch each under a symbolic token count): gpt-oss's
# generation runs it; Qwen3-MoE's, Qwen2-MoE's, Mixtral's and Granite-MoE's glue around it is in
# test_logits_match_pytorch (Granite's multipliers in a cache's steps: granite's generation). Qwen2's biases and
# Mistral's window in every layer run in qwen2-window's generation, Phi-3's fused projections in phi3-longrope's.
@pytest.mark.parametrize("case", ["llama3", "qwen3", "qwen2-window", "gemma2", "gemma3", "phi3-longrope", "gpt_oss",
                                  "granite", "smollm3", "olmo3"])
def test_generate_equals_an_argmax_loop_over_pytorch(case, checkpoints, tmp_path):
    model, path = checkpoints[case]
    # prompt chunks of 8 and 1 (the prompts: 5 = 5 x 1, 11 = 8 + 3 x 1), the windows of 3 and 4 within a chunk;
    # rows of different lengths side by side where a family's own code sees them (a window, the experts' routing,
    # longrope's choice of factors), else a row at a time (half the profiles to compile)
    batch = "[1,1,2]" if case in ("qwen2-window", "gemma2", "gemma3", "gpt_oss", "phi3-longrope") else "[1,1,1]"
    proc = run_cli("model=hf", "task=generate", f"params.checkpoint={path}", f"shapes.dims.batch={batch}",
                   "shapes.dims.seq=[1,8,8]", "shapes.buckets.seq=[1,8]", "generate.max_length=32",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / FAMILIES[case][0]).iterdir())
    want = [greedy(model, p, 10) for p in PROMPTS]
    for loader in (tb.load, runtime.load):
        got = loader(art).generate(PROMPTS, max_new_tokens=10, eos_token_id=[])  # as the loop: no stop
        assert [list(map(int, g)) for g in got] == want, loader


def test_generation_stops_at_any_of_the_checkpoints_eos_ids_as_hugging_face_does(checkpoints, tmp_path):
    """An instruct model stops at one of several ids (Llama 3's end of text and end of turn): the build takes them
    from generation_config.json (generate.eos_token_id=auto), and generate stops a row at any of them and fills
    it with the pad id, as Hugging Face's generate does with the same file; eos_token_id=[] runs to the end."""
    import shutil

    model, path = checkpoints["llama3"]
    plain = [greedy(model, p, 10) for p in PROMPTS]
    stops = [plain[0][3], plain[2][6]]  # ids the model does generate: rows 0 and 2 stop at different ones
    ckpt = tmp_path / "ckpt"
    shutil.copytree(path, ckpt)
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": stops, "pad_token_id": VOCAB - 1}))
    # the three prompts run as one group of 4 rows, the one prompt as 1: the batch buckets those two (no batch-2
    # profiles), the prompt chunks 8 and 1 (opt 8: no seq-4 profile, which generation never runs)
    proc = run_cli("model=hf", "task=generate", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,1,4]",
                   "shapes.buckets.batch=[1,4]", "shapes.dims.seq=[1,8,8]", "shapes.buckets.seq=[1,8]",
                   "generate.max_length=32", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "llama").iterdir())
    recorded = json.loads((art / "manifest.json").read_text())["metadata"]["generate"]
    assert recorded["eos_token_id"] == stops and recorded["pad_token_id"] == VOCAB - 1
    model.generation_config = transformers.GenerationConfig.from_pretrained(ckpt)
    rows = []
    for p in PROMPTS:
        with torch.no_grad():
            rows.append(model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p):].tolist())
    assert any(r[-1] in stops and len(r) < 10 for r in rows)  # Hugging Face stopped rows early
    n = max(map(len, rows))
    want = [r + [VOCAB - 1] * (n - len(r)) for r in rows]
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        assert [list(map(int, g)) for g in exe.generate(PROMPTS, max_new_tokens=10)] == want, loader
        assert [list(map(int, g)) for g in exe.generate(PROMPTS, max_new_tokens=10, eos_token_id=[])] == plain
        one = exe.generate([PROMPTS[0]], max_new_tokens=10, eos_token_id=stops[1])  # a call's own id
        cut = plain[0].index(stops[1]) + 1 if stops[1] in plain[0] else 10
        assert list(map(int, one[0])) == plain[0][:cut]


def test_a_forward_build_serves_logits_past_mistrals_sliding_window(checkpoints, tmp_path):
    """task=forward: logits through both loaders at an unpadded and a padded shape, both longer than Mistral's
    sliding window (4); the position table (128) bounds the sequence a build may declare."""
    model, path = checkpoints["mistral"]
    arts = f"artifacts_dir={tmp_path / 'arts'}"
    over = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.seq=[1,8,200]", arts, cwd=tmp_path)
    assert over.returncode == 2 and "Mistral's position table holds 128 positions" in over.stderr
    pooled = run_cli("model=hf", f"params.checkpoint={path}", "model.pooling=cls", arts, cwd=tmp_path)
    assert pooled.returncode == 2 and "pooling='cls' is not a pooling of Mistral; one of none, last, mean" in pooled.stderr
    # the calls below are all of 2 rows: batch 2 is the one batch bucket (2 profiles, not 4)
    proc = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.batch=[1,2,2]", "shapes.buckets.batch=[2]",
                   "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[8,16]", arts, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "mistral").iterdir())
    for loader in (tb.load, runtime.load):
        exe = loader(art)
        for seq, real in [(8, [8, 8]), (11, [11, 7])]:  # 11 runs padded to 16
            ids = np.random.default_rng(seq).integers(0, VOCAB, (2, seq))  # int64, as a tokenizer gives them
            mask = (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)
            got = np.asarray(exe(input_ids=ids, attention_mask=mask)["logits"])
            with torch.no_grad():
                want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask, dtype=torch.long)).logits
            sel = mask.astype(bool)
            assert np.abs(got[sel] - want.numpy()[sel]).max() <= SCALE_TOL * np.abs(want.numpy()[sel]).max()


def test_tied_embeddings_are_held_once_transposed(checkpoints, tmp_path):
    """The output projection is the tied table transposed, ``[d, vocab]`` (XLA's CPU dot is fastest so at a few
    rows), and the inputs' embeddings are read as its columns: the artifact stores that one copy, not the table
    as the checkpoint has it besides, and its logits still match PyTorch's."""
    model, path = checkpoints["llama-tied"]
    zoo, params = hf.load_pretrained(MODELS["llama"], path)
    d = SIZES["hidden_size"]
    ids_info = tb.InputInfo((2, 9), "int32", values=(0, VOCAB))
    exe = tb.compile(zoo.apply, args=[params, ids_info, tb.InputInfo((2, 9), "int32", values=(0, 2))])
    art = Path(exe.save(tmp_path / "tied"))
    m = json.loads((art / "manifest.json").read_text())
    stored = [w for w in m["weights"] if w["file"]] + [w for c in m["prep"]["chunks"] for w in c["at_rest"]]
    assert [w["shape"] for w in stored if VOCAB in w["shape"]] == [[d, VOCAB]], stored
    assert next(w for w in m["weights"] if w["path"] == "params['embed']")["file"] == ""  # prepared, not stored
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 9)).astype(np.int32)
    got = np.asarray(runtime.load(art)(ids, np.ones_like(ids))["logits"])
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()


def test_a_bfloat16_generate_build_writes_its_cache_in_its_own_dtype(checkpoints, tmp_path):
    """precision=bfloat16: the cache is bfloat16 (half a float32 one's bytes; a float32 cache was cast to bfloat16
    and back on every step), the new keys and values are written in its dtype (jax warns that an implicit cast of a
    float32 value into a bfloat16 scatter will be an error), and both loaders generate the same ids."""
    _, path = checkpoints["qwen2"]
    proc = run_cli("model=hf", "task=generate", f"params.checkpoint={path}", "precision=bfloat16",
                   "shapes.dims.batch=[1,1,1]", "shapes.dims.seq=[1,8,8]", "shapes.buckets.seq=[1,8]",  # opt a bucket
                   "generate.max_length=32", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "qwen2").iterdir())
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["metadata"]["generate"]["cache_dtype"] == "bfloat16"
    got = [[list(map(int, g)) for g in load(art).generate(PROMPTS, max_new_tokens=6)] for load in (tb.load, runtime.load)]
    assert got[0] == got[1] and all(0 <= t < VOCAB for row in got[0] for t in row)


def test_layer_types_set_each_layers_window_and_an_unknown_type_is_refused(checkpoints, tmp_path):
    """config.json's ``layer_types`` (transformers 5 writes it) names each layer's attention: the windows follow it,
    not ``max_window_layers``; a type the family does not implement is refused naming it, never run as full
    attention."""
    model, path = checkpoints["qwen2-window"]
    config = json.loads((path / "config.json").read_text())
    assert config["layer_types"] == ["full_attention", "sliding_attention"]
    zoo, _ = hf.load_pretrained(MODELS["qwen2"], path)
    assert zoo.layer_windows() == (None, 3)
    for types, windows in [(["sliding_attention", "full_attention"], (3, None)), (["full_attention"] * 2, (None, None))]:
        (tmp_path / "types").mkdir(exist_ok=True)
        (tmp_path / "types" / "config.json").write_text(json.dumps({**config, "layer_types": types}))
        assert hf.model_from_config(MODELS["qwen2"], tmp_path / "types").layer_windows() == windows
    (tmp_path / "types" / "config.json").write_text(
        json.dumps({**config, "layer_types": ["full_attention", "chunked_attention"]}))
    with pytest.raises(tb.TripyBuildError, match=r"layer_types holds \['chunked_attention'\]; the Llama family "
                                                  "implements full_attention, sliding_attention"):
        hf.model_from_config(MODELS["qwen2"], tmp_path / "types")
    (tmp_path / "types" / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"]}))
    with pytest.raises(tb.TripyBuildError, match="layer_types names 1 layers, but num_hidden_layers is 2"):
        hf.model_from_config(MODELS["qwen2"], tmp_path / "types")


@pytest.mark.parametrize("model", ["mistral", "gemma3"])
def test_the_zoo_builds_a_windowed_family_without_a_checkpoint(model, tmp_path):
    """model=mistral (a window from layer 0: max_window_layers=0) and model=gemma3 (windowed and global layers, each
    with its rotary base) from random weights, through the command line, generate the same ids with both loaders.
    (Every family's own window is checked against PyTorch from a checkpoint above; test_zoo traces every zoo
    model's init and generation at its defaults.)"""
    tiny = [f"model.{k}={v}" for k, v in dict(SIZES, head_dim=8, sliding_window=4).items()]
    proc = run_cli(f"model={model}", "task=generate", *tiny, "generate.max_length=32", "shapes.dims.batch=[1,1,1]",
                   "shapes.dims.seq=[1,8,8]", "shapes.buckets.seq=[1,8]",  # an 8-token chunk spans two windows
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / model).iterdir())
    ids = [loader(art).generate(PROMPTS, max_new_tokens=8) for loader in (tb.load, runtime.load)]
    np.testing.assert_array_equal(*ids)
    assert ids[0].shape == (3, 8)


def test_gemma3s_older_config_keys_read_as_its_newer_ones(checkpoints, tmp_path):
    """Gemma 3 configs on the Hub predate transformers 5's: ``rope_theta``, ``rope_local_base_freq``,
    ``rope_scaling`` (the global layers') and ``sliding_window_pattern`` instead of per-type ``rope_parameters``
    and ``layer_types``; both read to the same model."""
    _, path = checkpoints["gemma3"]
    config = json.loads((path / "config.json").read_text())
    new = hf.model_from_config(MODELS["gemma3"], path)
    assert new.kinds() == ("sliding_attention", "full_attention")
    assert new.layer_rope(0) == {"rope_type": "default", "rope_theta": 10.0}
    assert new.layer_rope(1)["rope_type"] == "linear" and new.layer_rope(1)["factor"] == 4.0
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types")}
    old.update(rope_theta=1e6, rope_local_base_freq=10.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
               sliding_window_pattern=2)
    (tmp_path / "config.json").write_text(json.dumps(old))
    legacy = hf.model_from_config(MODELS["gemma3"], tmp_path)
    assert legacy.kinds() == new.kinds() and legacy.layer_windows() == new.layer_windows() == (4, None)
    assert [legacy.layer_rope(i) for i in range(2)] == [new.layer_rope(i) for i in range(2)]


def test_a_longrope_build_is_bounded_by_its_original_positions(checkpoints, tmp_path):
    """Past original_max_position_embeddings Hugging Face switches a longrope model to its long factors by each
    call's length, which chunked prefill over a cache cannot follow: a longer build is refused naming why."""
    _, path = checkpoints["phi3-longrope"]
    over = run_cli("model=hf", f"params.checkpoint={path}", "shapes.dims.seq=[1,8,64]", cwd=tmp_path)
    assert over.returncode == 2, over.stderr[-2000:]
    assert "shapes.dims.seq=[1,8,64]: Phi3 serves 32 positions: rope_type longrope's original_max_position_" \
           "embeddings" in over.stderr and "set it to at most 32" in over.stderr


def test_phi3s_first_configs_name_longrope_su(checkpoints, tmp_path):
    """Phi-3's first configs on the Hub called longrope ``su``: read as longrope, as Hugging Face does."""
    _, path = checkpoints["phi3-longrope"]
    config = json.loads((path / "config.json").read_text())
    rope = {k: v for k, v in config.pop("rope_parameters").items() if k not in ("rope_type", "type")}
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {**rope, "type": "su"}}))
    old, new = (hf.model_from_config(MODELS["phi3"], p) for p in (tmp_path, path))
    assert dict(old.rope_parameters)["rope_type"] == "longrope" and old.inv_freq().tolist() == new.inv_freq().tolist()
    assert old.attention_factor() == new.attention_factor() > 1 and old.max_positions() == 32


def test_a_checkpoint_stored_in_bfloat16_is_read_exactly_and_built_in_either_precision(tmp_path):
    """The Hub's language models are stored in bfloat16: each tensor is widened to float32 exactly (the logits
    equal the PyTorch model's in float32), the build log says so, and ``precision=bfloat16`` stores the
    checkpoint's own bits. A quantized (int8) tensor is refused naming it and the dtypes read."""
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SIZES)).to(torch.bfloat16).eval()
    path = tmp_path / "bf16"
    model.save_pretrained(path)
    zoo, params = hf.load_pretrained(MODELS["qwen2"], path)
    leaves = jax.tree_util.tree_leaves(params)
    assert {leaf.dtype for leaf in leaves} == {np.dtype(np.float32)}
    embed = model.model.embed_tokens.weight.detach()
    assert np.array_equal(np.asarray(params["embed"]), embed.float().numpy())
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 9)).astype(np.int32)
    got = np.asarray(jax.jit(zoo.apply)(params, ids, np.ones_like(ids))["logits"])
    with torch.no_grad():
        want = model.float()(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()

    proc = run_cli("model=hf", f"params.checkpoint={path}", "precision=bfloat16", "shapes.dims.batch=[1,1,1]",
                   "shapes.dims.seq=[8,8,8]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bfloat16 tensor(s) read as float32, exactly; precision=bfloat16 builds" in proc.stdout + proc.stderr
    art = next((tmp_path / "arts" / "qwen2").iterdir())
    m = json.loads((art / "manifest.json").read_text())
    entry = next(w for w in m["weights"] if w["path"] == "params['embed']")
    from tripy_build.artifact.npy import from_npy
    stored = from_npy((art / entry["file"]).read_bytes(), entry["file"], entry["dtype"])
    assert entry["dtype"] == "bfloat16" and stored.view(np.uint16).tolist() == embed.view(torch.int16).numpy().view(
        np.uint16).tolist()

    from safetensors.numpy import load_file, save_file
    tensors = load_file(path / "model.safetensors")  # ml_dtypes (imported by jax) gives numpy bfloat16
    tensors["model.norm.weight"] = np.ones(tensors["model.norm.weight"].shape, np.int8)
    (tmp_path / "int8").mkdir()
    save_file(tensors, tmp_path / "int8" / "model.safetensors")
    (tmp_path / "int8" / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(hf.CheckpointError, match=r"tensor model\.norm\.weight in .* has dtype I8, expected one of "
                                                 r"F32, BF16, F16 \(for norm\): a quantized"):
        hf.load_pretrained(MODELS["qwen2"], tmp_path / "int8")


def mxfp4_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w: [..., out, in]`` as MXFP4 blocks ``[..., out, in / 32, 16]`` and scales ``[..., out, in / 32]``: each
    group of 32 scaled by the power of two that fits its largest value within E2M1's 6, every value the nearest code,
    two codes to a byte (the first in the low nibble), as gpt-oss is published."""
    from tripy_build.models.mxfp4 import E2M1

    groups = np.ascontiguousarray(w).reshape(*w.shape[:-1], -1, 32)  # safetensors writes an array's memory as laid out
    exponent = np.ceil(np.log2(np.maximum(np.abs(groups).max(-1, keepdims=True), 1e-30) / 6.0)).astype(np.int32)
    codes = np.abs((groups / np.exp2(exponent))[..., None] - E2M1).argmin(-1).astype(np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent[..., 0] + 127).astype(np.uint8)


def test_gpt_oss_reads_mxfp4_experts_as_transformers_dequantizes_them(tmp_path):
    """gpt-oss as the Hub has it: each expert tensor as MXFP4 ``_blocks`` and ``_scales`` (``quantization_config``
    mxfp4). Read as float32, every value equals transformers' own dequantization (``convert_moe_packed_tensors``),
    and the logits equal the PyTorch model's with those values; a checkpoint quantized another way is refused in
    one line naming its method."""
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    _, config, causal, extra = FAMILIES["gpt_oss"]
    torch.manual_seed(0)
    model = causal(config(**{**SIZES, "intermediate_size": 64}, **extra)).eval()  # groups of 32 along d and ff
    model.save_pretrained(tmp_path)
    tensors, packed = load_file(str(tmp_path / "model.safetensors")), {}
    for key, value in load_file(str(tmp_path / "model.safetensors")).items():
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del tensors[key]
            packed[key] = mxfp4_codes(np.swapaxes(value, 1, 2))
            tensors[key + "_blocks"], tensors[key + "_scales"] = packed[key]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    settings = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**settings, "quantization_config": {"quant_method": "mxfp4"}}))
    zoo, params = hf.load_pretrained(MODELS["gpt_oss"], tmp_path)
    with torch.no_grad():
        for key, (blocks, scales) in packed.items():
            theirs = convert_moe_packed_tensors(torch.tensor(blocks), torch.tensor(scales), dtype=torch.float32)
            layer, name = int(key.split(".")[2]), {"gate_up_proj": "gate_up", "down_proj": "down"}[key.split(".")[-1]]
            assert np.array_equal(np.asarray(params["layers"][layer]["experts"][name]), theirs.numpy()), key
            model.get_parameter(key).copy_(theirs)
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 9)).astype(np.int32)
    got = np.asarray(jax.jit(zoo.apply)(params, ids, np.ones_like(ids))["logits"])
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max()
    (tmp_path / "config.json").write_text(json.dumps({**settings, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(tb.TripyBuildError, match="quantization_config.quant_method='fp8': a quantized checkpoint is "
                                                  "not read"):
        hf.load_pretrained(MODELS["gpt_oss"], tmp_path)
