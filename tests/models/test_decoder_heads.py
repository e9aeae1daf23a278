"""The decoders' heads beside the LM head (the Llama family's and GPT-2's), from Hugging Face checkpoints: the bare
decoder (``*Model``: ``last_hidden_state``, and the sentence embedding the decoder embedding models read,
Qwen3-Embedding's last token), ``*ForSequenceClassification`` (reward models, classifiers: the last real token's
``score``), ``*ForTokenClassification`` and ``*ForQuestionAnswering`` (an answer span's start and end logits).

Tiny ``save_pretrained`` checkpoints of several families and heads (MoE and Gemma's included), read by
``models/hf.py`` from ``config.json``'s ``architectures`` and run under ``jax.jit``: their outputs against the
PyTorch model's within 1e-4 of the output's scale, at the real positions of padded rows. A classifier and an
embedding model built through the command line from directories with a tokenizer, called through both loaders at a
padded shape and served texts (``/infer``'s ``text``, OpenAI's ``/v1/embeddings``); the class names in the manifest
and the server's answers; generation and a pooling the family lacks refused in one line.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import transformers  # noqa: E402

import tripy_build as tb  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.models import MODELS, hf  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()

SCALE_TOL = 1e-4
VOCAB = 64
PAD = 3
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
LABELS = {0: "safe", 1: "unsafe", 2: "unsure"}
CASES = {  # case -> (zoo model, config class, Hugging Face class, extra settings)
    "llama-classifier": ("llama", transformers.LlamaConfig, transformers.LlamaForSequenceClassification,
                         {"pad_token_id": PAD, "id2label": LABELS}),
    "llama-bare": ("llama", transformers.LlamaConfig, transformers.LlamaModel, {}),
    "qwen3-bare": ("qwen3", transformers.Qwen3Config, transformers.Qwen3Model, {"head_dim": 16}),
    "qwen2-tokens": ("qwen2", transformers.Qwen2Config, transformers.Qwen2ForTokenClassification, {"num_labels": 5}),
    "gemma2-tokens": ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForTokenClassification,
                      {"head_dim": 16, "query_pre_attn_scalar": 12, "num_labels": 5}),
    "gemma3-classifier": ("gemma3", transformers.Gemma3TextConfig, transformers.Gemma3TextForSequenceClassification,
                          {"head_dim": 16, "query_pre_attn_scalar": 12, "pad_token_id": PAD, "sliding_window": 4,
                           "sliding_window_pattern": 2}),
    "qwen3_moe-classifier": ("qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForSequenceClassification,
                             {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
                              "pad_token_id": PAD}),
    "phi3-tokens": ("phi3", transformers.Phi3Config, transformers.Phi3ForTokenClassification,
                    {"pad_token_id": 0, "eos_token_id": 2, "token_classification_bias": False}),
    # OLMo 2's reward models (OLMo-2-1124-7B-RM) are Olmo2ForSequenceClassification
    "olmo2-classifier": ("olmo2", transformers.Olmo2Config, transformers.Olmo2ForSequenceClassification,
                         {"pad_token_id": PAD, "id2label": LABELS}),
    "olmoe-bare": ("olmoe", transformers.OlmoeConfig, transformers.OlmoeModel,
                   {"num_experts": 4, "num_experts_per_tok": 2}),
    "mixtral-bare": ("mixtral", transformers.MixtralConfig, transformers.MixtralModel,
                     {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # GPT-2's: DialogRPT and reward models are GPT2ForSequenceClassification, its score Linear without a bias
    "gpt2-classifier": ("gpt2", transformers.GPT2Config, transformers.GPT2ForSequenceClassification,
                        {"pad_token_id": PAD, "id2label": LABELS}),
    "gpt2-tokens": ("gpt2", transformers.GPT2Config, transformers.GPT2ForTokenClassification, {"num_labels": 5}),
    "gpt2-bare": ("gpt2", transformers.GPT2Config, transformers.GPT2Model, {}),
    # extractive QA heads (qa_outputs): Llama's and Qwen3-MoE's under transformer., Mistral's under model., GPT-2's
    "llama-qa": ("llama", transformers.LlamaConfig, transformers.LlamaForQuestionAnswering, {}),
    "mistral-qa": ("mistral", transformers.MistralConfig, transformers.MistralForQuestionAnswering, {}),
    "qwen3_moe-qa": ("qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForQuestionAnswering,
                     {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24}),
    "gpt2-qa": ("gpt2", transformers.GPT2Config, transformers.GPT2ForQuestionAnswering, {}),
}
OUTPUTS = {"none": ["last_hidden_state"], "question_answering": ["start_logits", "end_logits"]}  # else ["logits"]
SIZES_OF = {"gpt2": dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)}  # GPT2Config's keys


def save(case: str, path):
    name, config, cls, extra = CASES[case]
    torch.manual_seed(0)
    model = cls(config(**SIZES_OF.get(name, SIZES), **extra)).eval()
    model.save_pretrained(path)
    return model


def batch(seq: int, real: list[int], seed: int, pad: int | None = PAD) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded rows of ``real`` tokens each, the padding ``pad`` (random ids where None)."""
    ids = np.random.default_rng(seed).integers(4, VOCAB, (len(real), seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.asarray(real)[:, None]).astype(np.int32)
    if pad is not None:
        ids[mask == 0] = pad
    return ids, mask


def torch_out(model, ids: np.ndarray, mask: np.ndarray):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.abs(got - want).max() <= SCALE_TOL * np.abs(want).max())


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_match_pytorch(case, tmp_path):
    """Each head as Hugging Face computes it; a classifier's rows: full, padded, and one whose last real token is the
    pad id (Hugging Face classifies the token before it, and so does the zoo)."""
    model = save(case, tmp_path)
    name, task = CASES[case][0], hf.architectures()[type(model).__name__][1]
    assert hf.model_name(tmp_path) == name
    zoo, params = hf.load_pretrained(MODELS[name], tmp_path)
    assert zoo.task == task and "lm_head" not in params and ("score" in params) == (task != "none")
    ids, mask = batch(9, [9, 6, 2], seed=0)
    ids[0, 8] = PAD
    got = jax.jit(zoo.apply)(params, ids, mask)
    out = torch_out(model, ids, mask)
    assert sorted(got) == sorted(OUTPUTS.get(task, ["logits"]))
    for key in got:
        want, mine = getattr(out, key).numpy(), np.asarray(got[key])
        if task == "sequence_classification":
            assert mine.shape == (3, zoo.num_labels) and close(mine, want)
        else:
            real = mask.astype(bool)
            assert mine.shape[:2] == ids.shape and close(mine[real], want[real])


def with_tokenizer(path) -> tuple[Any, int]:
    """``examples/chat_checkpoint``'s byte-level BPE tokenizer (Qwen's kind: ``<|endoftext|>`` pads) saved in
    ``path``; with the vocabulary a model over it needs."""
    from examples.chat_checkpoint import tokenizer

    tokenizer(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return tok, len(tok) + 8


def post(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_a_classifier_builds_and_serves_its_class_names_at_padded_shapes(tmp_path):
    """LlamaForSequenceClassification through ``model=hf`` from a directory with its tokenizer: the head from
    ``architectures``, the class names from ``id2label`` in the manifest; logits through both loaders at a padded
    sequence and batch, and texts through the server's ``/infer`` (tokenized and padded with the tokenizer's pad
    id, as Hugging Face pads a batch), equal to PyTorch's, the server naming each text's class; generation from it
    is refused in one line naming the head."""
    ckpt = tmp_path / "ckpt"
    tok, vocab = with_tokenizer(ckpt)
    torch.manual_seed(0)
    model = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
        **{**SIZES, "vocab_size": vocab}, pad_token_id=tok.pad_token_id, id2label=LABELS)).eval()
    model.save_pretrained(ckpt)
    arts = f"artifacts_dir={tmp_path / 'arts'}"
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.batch=[4]", "shapes.buckets.seq=[8,16]", arts, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "llama").iterdir())
    assert json.loads((art / "manifest.json").read_text())["metadata"]["labels"] == {"logits": list(LABELS.values())}
    ids, mask = batch(11, [11, 7, 3], seed=1, pad=tok.pad_token_id)  # seq 11 runs padded to 16, 3 rows to 4
    want = torch_out(model, ids, mask).logits.numpy()
    for loader in (tb.load, runtime.load):
        got = np.asarray(loader(art)(input_ids=ids, attention_mask=mask)["logits"])
        assert got.shape == (3, 3) and close(got, want), loader
    texts = ["the quick brown fox", "hello", "héllo wörld, the lazy dog jumps"]
    with torch.no_grad():
        want = model(**tok(texts, padding=True, return_tensors="pt")).logits.numpy()
    with Server([art], port=0).start() as server:
        text = {"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}
        got = np.array(post(server, "/v2/models/llama/infer", {"inputs": [text]})["outputs"][0]["data"]).reshape(3, 3)
        assert close(got, want)
        top = post(server, "/v2/models/llama/infer", {"inputs": [text], "outputs": [
            {"name": "logits", "parameters": {"classification": 1}}]})["outputs"][0]["data"]
        assert [t.split(":")[2] for t in top] == [LABELS[i] for i in want.argmax(1)]
    gen = run_cli("model=hf", "task=generate", f"params.checkpoint={ckpt}", arts, cwd=tmp_path)
    assert gen.returncode == 2 and "is built with head=sequence_classification, which has no language model head" \
        in gen.stderr, gen.stderr[-2000:]


def test_a_question_answering_decoder_builds_and_answers_at_padded_shapes(tmp_path):
    """Qwen2ForQuestionAnswering (its decoder under ``transformer.``) through ``model=hf``: the head from
    ``architectures``, an answer span's start and end logits through both loaders at a padded sequence and batch
    (right padding: the real positions' logits are PyTorch's)."""
    ckpt = tmp_path / "ckpt"
    torch.manual_seed(0)
    model = transformers.Qwen2ForQuestionAnswering(transformers.Qwen2Config(**SIZES)).eval()
    model.save_pretrained(ckpt)
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.batch=[4]", "shapes.buckets.seq=[8,16]", f"artifacts_dir={tmp_path / 'arts'}",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "qwen2").iterdir())
    config = json.loads((art / "manifest.json").read_text())["metadata"]["build_key_parts"]["config"]
    assert config["model"]["head"] == "question_answering"
    ids, mask = batch(11, [11, 7, 3], seed=3)  # seq 11 runs padded to 16, 3 rows to 4
    want = torch_out(model, ids, mask)
    real = mask.astype(bool)
    for loader in (tb.load, runtime.load):
        out = loader(art)(input_ids=ids, attention_mask=mask)
        assert sorted(out) == ["end_logits", "start_logits"], loader
        for key in out:
            got = np.asarray(out[key])
            assert got.shape == (3, 11) and close(got[real], getattr(want, key).numpy()[real]), (loader, key)


def test_a_decoder_embedding_model_pools_its_last_real_token(tmp_path):
    """Qwen3-Embedding's recipe: a Qwen3ForCausalLM checkpoint built with ``model.pooling=last model.normalize=true``
    is the decoder alone (its LM head skipped, said in the log) and outputs sentence-transformers' last-token pooling
    of the states, scaled to unit length, at a padded shape, and through OpenAI's ``/v1/embeddings`` for texts; a
    pooling the decoders lack is refused naming theirs."""
    ckpt = tmp_path / "ckpt"
    tok, vocab = with_tokenizer(ckpt)
    torch.manual_seed(0)
    causal = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**SIZES, "vocab_size": vocab}, head_dim=16)).eval()
    causal.save_pretrained(ckpt)
    arts = f"artifacts_dir={tmp_path / 'arts'}"
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "model.pooling=last", "model.normalize=true",
                   "shapes.dims.batch=[1,2,2]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[8,16]", arts,
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 tensor(s) of a head not built (head=none: the model alone) skipped: lm_head.weight" \
        in proc.stdout + proc.stderr

    def last_token(ids, mask) -> np.ndarray:  # sentence-transformers' lasttoken pooling, normalized
        with torch.no_grad():
            states = causal.model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                  attention_mask=torch.as_tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
        out = states[np.arange(len(states)), np.asarray(mask).sum(1) - 1]
        return out / np.linalg.norm(out, axis=-1, keepdims=True)
    ids, mask = batch(11, [11, 4], seed=2, pad=None)
    want = last_token(ids, mask)
    art = next((tmp_path / "arts" / "qwen3").iterdir())
    for loader in (tb.load, runtime.load):
        out = loader(art)(input_ids=ids, attention_mask=mask)
        assert sorted(out) == ["last_hidden_state", "sentence_embedding"]
        got = np.asarray(out["sentence_embedding"])
        assert got.shape == (2, 32) and np.abs(got - want).max() <= SCALE_TOL, loader
    texts = ["the quick brown fox", "hello", "héllo wörld, the lazy dog jumps"]  # three texts: calls of 2 and 1
    encoded = tok(texts, padding=True, return_tensors="np")
    want = last_token(encoded["input_ids"], encoded["attention_mask"])
    with Server([art], port=0).start() as server:
        answer = post(server, "/v1/embeddings", {"model": "qwen3", "input": texts})
    assert np.abs(np.array([d["embedding"] for d in answer["data"]]) - want).max() <= SCALE_TOL
    bad = run_cli("model=hf", f"params.checkpoint={ckpt}", "model.pooling=cls", arts, cwd=tmp_path)
    assert bad.returncode == 2 and "pooling='cls' is not a pooling of Qwen3; one of none, last, mean" in bad.stderr


def test_settings_of_another_head_are_dropped_and_pooling_needs_the_bare_decoder():
    """``pad_token_id`` and ``token_classification_bias`` act under their own head only: config.json holds them
    whatever the head, and a build records none that changed nothing. A head with a pooling is refused."""
    qwen3 = MODELS["qwen3"]
    assert qwen3(**SIZES, pad_token_id=PAD).pad_token_id is None  # causal_lm
    assert qwen3(**SIZES, head="sequence_classification", pad_token_id=PAD).pad_token_id == PAD
    assert qwen3(**SIZES, head="none", token_classification_bias=False).token_classification_bias is True
    with pytest.raises(ValueError, match="pooling=last makes a sentence embedding of the model's states, and "
                                         "head=causal_lm replaces them"):
        qwen3(**SIZES, pooling="last")
    with pytest.raises(ValueError, match="head='masked_lm' is not a head of Qwen3; one of auto, causal_lm, none"):
        qwen3(**SIZES, head="masked_lm")
