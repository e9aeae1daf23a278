"""Text in and out of a ``task=generate`` artifact built from a checkpoint with its tokenizer: the artifact stores
the tokenizer (digested, part of the build key); both loaders, ``tripy-build generate --chat``, ``/generate`` with
``text_input`` and OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` give the text Hugging Face's tokenizer
decodes from the ids a plain argmax loop over the PyTorch model's logits picks (from the ids of its
``apply_chat_template``)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import tripy_build as tb  # noqa: E402
from examples.chat_checkpoint import checkpoint  # noqa: E402
from examples.classifier_checkpoint import checkpoint as classifier_checkpoint  # noqa: E402
from tripy_build import runtime  # noqa: E402
from tripy_build.builder.generate import resolved  # noqa: E402
from tripy_build.models.llama import Qwen2  # noqa: E402
from tripy_build.errors import ArtifactError, CallError  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402

from conftest import run_cli  # noqa: E402

transformers.logging.set_verbosity_error()
# opt 16, a bucket: no profile at a prompt chunk of 8, which generation never runs (it runs the buckets 1 and 16)
BUILD = ["model=hf", "task=generate", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,16,16]", "shapes.buckets.seq=[1,16]",
         "generate.max_length=96"]
HELLO = [{"role": "user", "content": "hello fox"}]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    ckpt = checkpoint(root / "ckpt")
    hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    model = transformers.Qwen2ForCausalLM.from_pretrained(ckpt).eval()
    proc = run_cli(*BUILD, f"params.checkpoint={ckpt}", f"artifacts_dir={root / 'arts'}", cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next((root / "arts" / "qwen2").iterdir()), ckpt, model, hf_tok


def argmax_loop(model, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


@pytest.fixture(scope="module")
def expected(built):
    """The chat prompt's ids and the greedy reply's, by Hugging Face's tokenizer and PyTorch's model."""
    _, _, model, hf_tok = built
    prompt = hf_tok.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=True)["input_ids"]
    return prompt, argmax_loop(model, prompt, 12)


@pytest.fixture(scope="module")
def server(built):
    with Server([built[0]], port=0).start() as srv:
        yield srv


def call(server, method: str, path: str, body=None) -> tuple[int, bytes]:
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def events(data: bytes) -> list:
    return [e[len(b"data: "):] for e in data.split(b"\n\n") if e]


def test_the_artifact_stores_the_tokenizer_and_both_loaders_speak_text(built, expected):
    art, _, _, hf_tok = built
    prompt, reply = expected
    meta = json.loads((art / "manifest.json").read_text())
    assert meta["metadata"]["tokenizer"] == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert set(meta["metadata"]["build_key_parts"]["tokenizer"]) == set(meta["metadata"]["tokenizer"])
    assert {f"tokenizer/{n}" for n in meta["metadata"]["tokenizer"]} <= set(meta["files"])
    shown = run_cli("inspect", str(art))
    assert "tokenizer: the checkpoint's, for text in and out (chat_template.jinja, tokenizer.json" in shown.stdout
    resaved = runtime.load(tb.load(art).save(art.parent.parent / "resaved"), warmup="none")  # the tokenizer goes along
    assert resaved.tokenizer.chat(HELLO) == prompt
    for load in (tb.load, runtime.load):
        exe = load(art)
        tok = exe.tokenizer
        assert tok.chat(HELLO) == prompt
        new = [int(t) for t in exe.generate([prompt], 12, eos_token_id=[])[0]]
        assert new == reply
        assert tok.decode(new) == hf_tok.decode(reply, skip_special_tokens=True)


def test_the_command_line_takes_a_chat_message_and_prints_the_reply(built, expected):
    art, _, _, hf_tok = built
    proc = run_cli("generate", str(art), "--chat", "hello fox", "--max-new-tokens", "12", "--eos-token-id", "none",
                   "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"text_output": hf_tok.decode(expected[1], skip_special_tokens=True),
                                       "output_ids": expected[1]}
    proc = run_cli("generate", str(art), "--system", "x", "--input-ids", "5", timeout=300)
    assert proc.returncode == 2 and "--system is the system message of a --chat" in proc.stderr


def test_generate_takes_text_input_and_streams_text_output(server, built, expected):
    _, _, _, hf_tok = built
    prompt_text = hf_tok.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    want = hf_tok.decode(expected[1], skip_special_tokens=True)
    status, data = call(server, "POST", "/v2/models/qwen2/generate",
                        {"text_input": prompt_text, "max_new_tokens": 12, "eos_token_id": []})
    assert status == 200, data
    body = json.loads(data)
    assert body["output_ids"] == expected[1] and body["text_output"] == want
    status, data = call(server, "POST", "/v2/models/qwen2/generate_stream",
                        {"text_input": prompt_text, "max_new_tokens": 12, "eos_token_id": []})
    parts = [json.loads(e) for e in events(data)]
    assert status == 200 and "".join(p["text_output"] for p in parts) == want
    assert [t for p in parts for t in p["output_ids"]] == expected[1]
    status, data = call(server, "POST", "/v2/models/qwen2/generate", {"text_input": "hi", "input_ids": [1]})
    assert status == 400 and "either \"input_ids\" (token ids) or \"text_input\" (text), not both" in json.loads(data)["error"]


def test_openai_chat_completions_answer_and_stream_the_reply(server, built, expected):
    _, _, _, hf_tok = built
    prompt, reply = expected
    stop = reply[5]  # a row stops at the first end id it generates: here a token of the greedy reply
    cut = reply[:reply.index(stop)]
    for stops, n, text, finish in [([], 12, reply, "length"), ([stop], 12, cut, "stop")]:
        status, data = call(server, "POST", "/v1/chat/completions", {
            "model": "qwen2", "messages": HELLO, "max_tokens": n, "temperature": 0, "eos_token_id": stops, "n": 1})
        assert status == 200, data
        answer = json.loads(data)
        assert answer["object"] == "chat.completion" and answer["model"] == "qwen2"
        assert answer["choices"][0]["message"] == {"role": "assistant", "reasoning_content": None,  # it did not think
                                                   "content": hf_tok.decode(text, skip_special_tokens=True)}
        assert answer["choices"][0]["finish_reason"] == finish
        generated = len(text) + (finish == "stop")
        cached = answer["usage"].pop("prompt_tokens_details")["cached_tokens"]
        assert answer["usage"].pop("completion_tokens_details") == {"reasoning_tokens": 0}  # it did not think
        assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": generated,
                                   "total_tokens": len(prompt) + generated}
        if stops:  # the same prompt ran just before: all but its last token are found in the cache
            assert cached == len(prompt) - 1
    status, data = call(server, "POST", "/v1/chat/completions", {
        "model": "qwen2", "messages": HELLO, "max_tokens": 12, "temperature": 0, "eos_token_id": [], "stream": True,
        "stream_options": {"include_usage": True}})
    parts = events(data)
    assert status == 200 and parts[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in parts[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == hf_tok.decode(
        reply, skip_special_tokens=True)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 12
    status, data = call(server, "POST", "/v1/completions", {"model": "qwen2", "prompt": "hello fox", "max_tokens": 4,
                                                            "temperature": 0})
    assert status == 200 and json.loads(data)["object"] == "text_completion"
    assert json.loads(data)["usage"]["completion_tokens"] <= 4
    parts = {"model": "qwen2", "max_tokens": 12, "temperature": 0, "eos_token_id": [], "logit_bias": {}, "tools": [],
             "stop": [], "response_format": {"type": "text"}, "presence_penalty": 0, "seed": None,
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "fox"}]}]}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", parts)[1])  # as chat UIs send it: parts, neutrals
    split = argmax_loop(built[2], hf_tok.apply_chat_template([{"role": "user", "content": "hello\nfox"}],
                                                             add_generation_prompt=True, tokenize=True)["input_ids"], 12)
    assert answer["choices"][0]["message"]["content"] == hf_tok.decode(split, skip_special_tokens=True), answer
    sampled = [json.loads(call(server, "POST", "/v1/chat/completions", {
        "model": "qwen2", "messages": HELLO, "max_tokens": 8, "seed": 3, "eos_token_id": []})[1])["choices"][0]
        ["message"]["content"] for _ in range(2)]  # temperature 1 (OpenAI's default): the same seed, the same text
    assert sampled[0] == sampled[1] != hf_tok.decode(reply[:8], skip_special_tokens=True)  # not greedy
    status, data = call(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(data)["data"]] == ["qwen2"]


def test_a_stop_string_ends_the_reply_before_it_streamed_or_not(server, built, expected):
    """OpenAI's ``stop``: the reply is the text before the first stop string (found across tokens), its generation
    stops there (``finish_reason`` stop, fewer tokens than asked), and a stream never sends a part of it."""
    _, _, _, hf_tok = built
    reply = expected[1]
    full = hf_tok.decode(reply, skip_special_tokens=True)
    stop = hf_tok.decode(reply[:6], skip_special_tokens=True).rstrip("\ufffd")[-2:]  # ends within the 6th token
    want = full[:full.index(stop)]
    n = next(n for n in range(1, 13) if stop in hf_tok.decode(reply[:n], skip_special_tokens=True))  # tokens it took
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": 12, "temperature": 0, "eos_token_id": [],
            "stop": ["never appears", stop]}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", body)[1])
    assert answer["choices"][0]["message"]["content"] == want and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == n <= 6
    status, data = call(server, "POST", "/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(p) for p in events(data)[:-1]]
    sent = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(sent) == want and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    nucleus = json.loads(call(server, "POST", "/v1/chat/completions", {**body, "temperature": 1, "top_p": 1e-6,
                                                                      "stop": None})[1])
    assert nucleus["choices"][0]["message"]["content"] == full  # top_p this small leaves the most likely token


def test_openai_models_list(server):
    status, data = call(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(data)["data"]] == ["qwen2"]


def test_what_the_openai_routes_refuse_is_one_line(server):
    cases = [({"model": "qwen2", "messages": HELLO, "n": 0}, 400, "n=0: the number of replies, an integer in [1, 128]"),
             ({"model": "qwen2", "messages": HELLO, "logit_bias": {"x5": 1}}, 400, "logit_bias['x5']=1: a token id"),
             ({"model": "qwen2", "messages": HELLO, "logit_bias": {"5": 101}}, 400, "to a number in [-100, 100]"),
             ({"model": "qwen2", "messages": HELLO, "logit_bias": {"999": 1}}, 400,
              "logit_bias: token id 999 is outside [0, 320) (this model's vocabulary)"),
             ({"model": "qwen2", "messages": HELLO, "user": 5}, 400, "user=5: a string identifying the end user"),
             ({"model": "qwen2", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
              400, "a message's content part of type 'image_url': this model takes text only"),
             ({"model": "qwen2", "messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
             ({"model": "qwen2", "messages": HELLO, "top_p": 0}, 400, "top_p=0: it is a probability in (0, 1]"),
             ({"model": "qwen2", "messages": HELLO, "logit_scale": 2}, 400, "'logit_scale' is not an option"),
             ({"model": "qwen2", "messages": []}, 400, '"messages" must be a non-empty list'),
             ({"model": "qwen2", "messages": [{"content": "hi"}]}, 400, "every message needs a role"),
             ({"model": "qwen2", "messages": HELLO, "max_tokens": 100}, 400, "generate.max_length=96"),
             ({"model": "qwen2", "messages": HELLO, "temperature": 3}, 400, "must be a number in [0, 2]"),
             ({"model": "gpt-4", "messages": HELLO}, 404, "'gpt-4': it is not served here; GET /v1/models lists"),
             ({"model": "qwen2", "prompt": "hi"}, 400, "'prompt' belongs to /v1/completions"),
             ({"model": "qwen2", "messages": HELLO, "chat_template_kwargs": [1]}, 400,
              "chat_template_kwargs=[1]: an object of the chat template's variables"),
             ({"model": "qwen2", "messages": HELLO, "chat_template_kwargs": {"tools": 1}}, 400,
              "the chat template's variable 'tools' is set by the call itself"),
             ({"model": "qwen2", "messages": HELLO, "tools": [WX], "response_format": {"type": "json_object"}}, 400,
              "response_format and tools together"),
             ({"model": "qwen2", "messages": HELLO, "tool_choice": "required"}, 400, "tool_choice=required needs tools"),
             ({"model": "qwen2", "messages": HELLO, "tools": [WX], "tool_choice": {"type": "function", "function": {
                 "name": "add"}}}, 400, "tool_choice names function 'add', which is not among the tools: wx"),
             ({"model": "qwen2", "messages": HELLO, "tools": [{"type": "function"}]}, 400, "tools[0]={'type': 'function'}")]
    for body, code, fragment in cases:
        status, data = call(server, "POST", "/v1/chat/completions", body)
        message = json.loads(data)["error"]["message"]  # OpenAI's shape
        assert status == code and fragment in message and "\n" not in message, (body, message)
    status, data = call(server, "GET", "/v1/chat/completions")
    assert status == 405
    status, data = call(server, "POST", "/v1/completions", {"model": "qwen2", "prompt": "hi", "tools": [WX]})
    assert status == 400 and "tools belong to /v1/chat/completions" in json.loads(data)["error"]["message"]


def test_logit_bias_moves_the_models_logits(server, built, expected):
    """OpenAI's ``logit_bias``: -100 bans a token (the greedy reply takes PyTorch's next most likely), 100 all but
    forces one, streamed or not."""
    _, _, model, hf_tok = built
    prompt, reply = expected
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    assert reply[0] == int(logits.argmax())
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": 1, "temperature": 0, "eos_token_id": [],
            "logprobs": True}
    banned = json.loads(call(server, "POST", "/v1/chat/completions", {**body, "logit_bias": {str(reply[0]): -100}})[1])
    picked = banned["choices"][0]["logprobs"]["content"][0]  # its log probability is the model's, before the bias
    assert abs(picked["logprob"] - float(logits.double().log_softmax(-1)[runner_up])) < 1e-4
    forced = {**body, "max_tokens": 5, "temperature": 1.0, "seed": 3, "logit_bias": {"7": 100}}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", forced)[1])
    assert answer["choices"][0]["message"]["content"] == hf_tok.decode([7] * 5)
    chunks = [json.loads(p) for p in events(call(server, "POST", "/v1/chat/completions", {**forced, "stream": True})[1])[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == hf_tok.decode([7] * 5)


def copied(ckpt: Path, to: Path, name: str, text: str) -> Path:
    """A copy of the checkpoint ``ckpt`` with its file ``name`` holding ``text``."""
    shutil.copytree(ckpt, to)
    (to / name).write_text(text)
    return to


def test_penalties_equal_transformers_generate_through_every_route(server, built, expected):
    """Greedy under ``repetition_penalty`` (transformers' ``RepetitionPenaltyLogitsProcessor`` over the prompt and the
    reply) gives ``generate(do_sample=False, repetition_penalty=...)``'s tokens through both loaders, the command
    line, ``/generate`` and OpenAI's route (where a greedy reply of this noise model repeats itself)."""
    art, _, model, hf_tok = built
    prompt = expected[0]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.5,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert want != expected[1]  # the penalty changes this reply
    for load in (tb.load, runtime.load):
        got = load(art).generate([prompt], 12, repetition_penalty=1.5, temperature=0, eos_token_id=[])
        assert [int(t) for t in got[0]] == want
    proc = run_cli("generate", str(art), "--chat", "hello fox", "--json", "--max-new-tokens", "12", "--eos-token-id",
                   "none", "--repetition-penalty", "1.5", timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["output_ids"] == want, proc.stderr[-2000:]
    status, data = call(server, "POST", "/v2/models/qwen2/generate", {
        "input_ids": prompt, "max_new_tokens": 12, "eos_token_id": [], "parameters": {"repetition_penalty": 1.5}})
    assert status == 200 and json.loads(data)["output_ids"] == want, data
    answer = json.loads(call(server, "POST", "/v1/chat/completions", {
        "model": "qwen2", "messages": HELLO, "max_tokens": 12, "temperature": 0, "eos_token_id": [],
        "repetition_penalty": 1.5})[1])
    assert answer["choices"][0]["message"]["content"] == hf_tok.decode(want, skip_special_tokens=True)
    status, data = call(server, "POST", "/v1/chat/completions", {"model": "qwen2", "messages": HELLO,
                                                                 "frequency_penalty": 2.5})
    assert status == 400 and "frequency_penalty=2.5: it is a number in [-2, 2]" in json.loads(data)["error"]["message"]


def test_openai_logprobs_are_the_models_log_softmax_with_each_tokens_bytes(server, built, expected):
    """Each generated token's log probability and its most likely alternatives equal ``log_softmax`` of PyTorch's
    logits at that step; the tokens' ``bytes`` join into the reply's text; a stream sends the same entries, a
    completion OpenAI's legacy shape."""
    _, _, model, hf_tok = built
    prompt, reply = expected
    n = 6
    with torch.no_grad():
        logp = [model(input_ids=torch.tensor([prompt + reply[:i]])).logits[0, -1].double().log_softmax(-1)
                for i in range(n)]
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": n, "temperature": 0, "eos_token_id": [],
            "logprobs": True, "top_logprobs": 3}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", body)[1])
    content = answer["choices"][0]["logprobs"]["content"]
    assert len(content) == n
    for entry, token, lp in zip(content, reply, logp):
        assert abs(entry["logprob"] - float(lp[token])) < 1e-4
        top = lp.topk(3)
        assert [a["logprob"] for a in entry["top_logprobs"]] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [a["token"] for a in entry["top_logprobs"]][0] == entry["token"]  # greedy: the most likely
    special = set(hf_tok.all_special_ids)
    joined = b"".join(bytes(e["bytes"]) for e, t in zip(content, reply) if t not in special)
    text = answer["choices"][0]["message"]["content"]  # the noise model's bytes need not be whole characters
    assert joined.decode(errors="replace") == text == hf_tok.decode(reply[:n], skip_special_tokens=True)
    stream = call(server, "POST", "/v1/chat/completions", {**body, "stream": True})[1]
    chunks = [json.loads(p) for p in events(stream)[:-1]]
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-9)
    done = json.loads(call(server, "POST", "/v1/completions", {"model": "qwen2", "prompt": "hello fox", "max_tokens": 4,
                                                               "temperature": 0, "eos_token_id": [], "logprobs": 2})[1])
    legacy = done["choices"][0]["logprobs"]
    assert len(legacy["tokens"]) == len(legacy["token_logprobs"]) == len(legacy["top_logprobs"]) == 4
    assert legacy["text_offset"][0] == 0 and all(len(t) == 2 for t in legacy["top_logprobs"])
    assert legacy["text_offset"] == [sum(len(t) for t in legacy["tokens"][:i]) for i in range(4)]
    for bad, fragment in [({"top_logprobs": 2}, "top_logprobs=2 needs logprobs: true"),
                          ({"logprobs": True, "top_logprobs": 21}, "top_logprobs=21: an integer in [0, 20]"),
                          ({"logprobs": 3}, "logprobs=3: true or false")]:
        status, data = call(server, "POST", "/v1/chat/completions", {**body, "logprobs": None, **bad})
        assert status == 400 and fragment in json.loads(data)["error"]["message"], (bad, data)


def test_n_replies_each_sample_with_their_own_seed_streamed_or_not(server, built, expected):
    """``n`` replies to one request: each a row of the running batch, choice i sampled with ``seed + i`` (what
    ``generate`` draws with that seed), streamed as chunks of their own index; ``usage`` counts every reply's
    tokens."""
    art, _, _, hf_tok = built
    prompt = expected[0]
    exe = runtime.load(art, warmup="none")
    want = [hf_tok.decode(exe.generate([prompt], 8, temperature=1.0, seed=7 + i, eos_token_id=[])[0],
                          skip_special_tokens=True) for i in range(3)]
    assert len(set(want)) == 3
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3,
            "eos_token_id": []}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", body)[1])
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in answer["choices"]] == want
    assert answer["usage"]["completion_tokens"] == 24
    chunks = [json.loads(p) for p in events(call(server, "POST", "/v1/chat/completions", {
        **body, "stream": True, "stream_options": {"include_usage": True}})[1])[:-1]]
    texts = ["".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]
                     and c["choices"][0]["index"] == i) for i in range(3)]
    assert texts == want and chunks[-1]["usage"]["completion_tokens"] == 24
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] == "length") == 3


# two tools whose calls fit the tiny build's cache (a call is ~43 of its tokens)
WX = {"type": "function", "function": {"name": "wx", "parameters": {
    "type": "object", "properties": {"u": {"enum": ["c", "f"]}}, "required": ["u"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}}}


def test_tool_calls_are_held_to_the_tools_and_read_back_streamed_or_not(server, built, expected):
    """``tools``: the chat template shows them to the model (the prompt is ``apply_chat_template``'s with tools), the
    reply is held to calls of them in the template's format (Qwen's ``<tool_call>`` JSON lines, the marks written as
    the tokens the tokenizer has for them), and the calls come back as ``message.tool_calls`` (``finish_reason``
    tool_calls, no content), streamed as whole calls in the deltas; a conversation with calls and their results
    goes back in as transformers renders it."""
    _, _, _, hf_tok = built
    body = {"model": "qwen2", "messages": HELLO, "tools": [WX, ADD], "max_tokens": 50, "temperature": 1.0, "seed": 4,
            "tool_choice": "required", "parallel_tool_calls": False, "logprobs": True}
    prompt = hf_tok.apply_chat_template(HELLO, tools=[WX, ADD], add_generation_prompt=True, tokenize=True)["input_ids"]
    seen = set()
    for seed in range(4):
        answer = json.loads(call(server, "POST", "/v1/chat/completions", {**body, "seed": seed})[1])
        choice = answer["choices"][0]
        assert answer["usage"]["prompt_tokens"] == len(prompt), answer
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
        (made,) = choice["message"]["tool_calls"]
        arguments = json.loads(made["function"]["arguments"])
        assert made["type"] == "function" and made["id"].startswith("call_")
        assert arguments in ({"u": "c"}, {"u": "f"}) if made["function"]["name"] == "wx" else (
            made["function"]["name"] == "add" and arguments in ({"a": True}, {"a": False})), made
        tokens = [t["token"] for t in choice["logprobs"]["content"]]
        assert tokens[0] == "<tool_call>" and tokens[-1] == "</tool_call>"  # one token each, as Qwen writes them
        seen.add(made["function"]["name"])
        chunks = [json.loads(p) for p in events(call(server, "POST", "/v1/chat/completions", {
            **body, "seed": seed, "stream": True})[1])[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        streamed = [t for d in deltas for t in d.get("tool_calls", [])]
        assert [(t["index"], t["function"]) for t in streamed] == [(0, made["function"])]
        assert "".join(d.get("content") or "" for d in deltas) == ""
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    named = json.loads(call(server, "POST", "/v1/chat/completions", {
        **body, "tool_choice": {"type": "function", "function": {"name": "add"}}})[1])["choices"][0]
    assert [c["function"]["name"] for c in named["message"]["tool_calls"]] == ["add"]
    none = json.loads(call(server, "POST", "/v1/chat/completions", {  # "none": the model is not shown the tools
        **body, "tool_choice": "none", "temperature": 0, "max_tokens": 12, "eos_token_id": [], "logprobs": False})[1])
    assert none["usage"]["prompt_tokens"] == len(expected[0])
    assert none["choices"][0]["message"] == {"role": "assistant", "content": hf_tok.decode(
        expected[1], skip_special_tokens=True), "reasoning_content": None}  # the template can think; it did not
    auto = json.loads(call(server, "POST", "/v1/chat/completions", {**body, "tool_choice": "auto"})[1])["choices"][0]
    assert "<tool_call>" not in (auto["message"]["content"] or "")  # text, or calls read out of it
    history = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "wx", "arguments": '{"u": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    again = json.loads(call(server, "POST", "/v1/chat/completions", {**body, "messages": history, "max_tokens": 1,
                                                                     "tool_choice": "none"})[1])
    rendered = [*history[:1], {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
        "name": "wx", "arguments": {"u": "c"}}}]}, history[2]]
    assert "usage" in again, again
    assert again["usage"]["prompt_tokens"] == len(hf_tok.apply_chat_template(
        rendered, add_generation_prompt=True, tokenize=True)["input_ids"]), again
    assert len(seen) == 2, seen  # the seeds' calls went to both tools
    generate = json.loads(call(server, "GET", "/v2/models/qwen2")[1])["generate"]
    assert (generate["tools"], generate["thinking"]) == ("hermes", True)  # what the chat template teaches


def test_a_reasoning_models_thinking_comes_apart_from_its_answer(server, built):
    """A template that writes ``<think>`` (here: with ``enable_thinking``, the generation prompt opens the block, as
    DeepSeek-R1's does): the reply, which starts inside the block, is the answer's ``reasoning_content`` (chat,
    whole and streamed) and its ``reasoning`` item (Responses), none of it ``content``."""
    _, _, model, hf_tok = built
    prompt = hf_tok.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=True,
                                        enable_thinking=True)["input_ids"]
    assert hf_tok.decode(prompt).endswith("<think>\n")
    thought = hf_tok.decode(argmax_loop(model, prompt, 8), skip_special_tokens=True).strip()
    assert thought and "</think>" not in thought
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": 8, "temperature": 0, "eos_token_id": [],
            "chat_template_kwargs": {"enable_thinking": True}}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", body)[1])
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "", "reasoning_content": thought}
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}  # cut inside the block
    chunks = [json.loads(p) for p in events(call(server, "POST", "/v1/chat/completions", {**body, "stream": True})[1])[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
    assert "".join(d.get("content") or "" for d in deltas) == ""
    responses = {"model": "qwen2", "input": "hello fox", "max_output_tokens": 8, "temperature": 0, "eos_token_id": [],
                 "chat_template_kwargs": {"enable_thinking": True}}
    whole = json.loads(call(server, "POST", "/v1/responses", responses)[1])
    output = whole["output"]
    assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": 8}
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": thought}]
    assert output[1]["content"][0]["text"] == ""


def test_the_responses_api_answers_as_the_chat_route_does_streamed_or_not(server, built, expected):
    """``/v1/responses`` (OpenAI's Responses API): the same prompt and reply as the chat route (text as a message
    item, ``incomplete`` at ``max_output_tokens``), its events in order with the deltas adding up to the text, and
    tool calls as ``function_call`` items that go back in ``input`` with their ``function_call_output``."""
    _, _, _, hf_tok = built
    prompt, reply = expected
    body = {"model": "qwen2", "input": "hello fox", "max_output_tokens": 12, "temperature": 0, "eos_token_id": []}
    answer = json.loads(call(server, "POST", "/v1/responses", body)[1])
    assert answer["object"] == "response" and answer["status"] == "incomplete", answer
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = answer["output"]
    assert item["type"] == "message" and item["content"][0]["type"] == "output_text"
    assert item["content"][0]["text"] == hf_tok.decode(reply, skip_special_tokens=True)
    assert (answer["usage"]["input_tokens"], answer["usage"]["output_tokens"]) == (len(prompt), 12)
    streamed = [json.loads(p) for p in events(call(server, "POST", "/v1/responses", {**body, "stream": True})[1])]
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    kinds = [e["type"] for e in streamed]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == "response.completed"
    assert "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta") == item["content"][0]["text"]
    assert streamed[-1]["response"]["output"][0]["content"] == item["content"]
    assert streamed[-1]["response"]["usage"]["input_tokens_details"] == {"cached_tokens": len(prompt) - 1}  # ran before
    tools = {"model": "qwen2", "input": "hello fox", "tools": [{"type": "function", **WX["function"]}],
             "tool_choice": "required", "parallel_tool_calls": False, "max_output_tokens": 50, "seed": 1}
    answer = json.loads(call(server, "POST", "/v1/responses", tools)[1])
    (made,) = answer["output"]
    assert answer["status"] == "completed" and made["type"] == "function_call" and made["name"] == "wx", answer
    assert json.loads(made["arguments"]) in ({"u": "c"}, {"u": "f"})
    streamed = [json.loads(p) for p in events(call(server, "POST", "/v1/responses", {**tools, "stream": True})[1])]
    done = [e["arguments"] for e in streamed if e["type"] == "response.function_call_arguments.done"]
    assert done == [made["arguments"]]  # the same seed, the same call
    history = ["hello fox", made, {"type": "function_call_output", "call_id": made["call_id"], "output": "rain"}]
    again = json.loads(call(server, "POST", "/v1/responses", {**tools, "tool_choice": "none", "max_output_tokens": 1,
                                                              "input": [{"role": "user", "content": history[0]},
                                                                        *history[1:]]})[1])
    messages = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [{"id": made["call_id"], "type": "function",
                "function": {"name": "wx", "arguments": json.loads(made["arguments"])}}]},
                {"role": "tool", "tool_call_id": made["call_id"], "content": "rain"}]
    assert again["usage"]["input_tokens"] == len(hf_tok.apply_chat_template(messages, add_generation_prompt=True,
                                                                            tokenize=True)["input_ids"]), again
    for bad, fragment in [({"previous_response_id": "resp_1"}, "previous_response_id: this server keeps no responses"),
                          ({"store": True}, "store: true: this server keeps no responses"),
                          ({"tools": [{"type": "web_search"}]}, "tools[0] of type 'web_search': this server runs "
                                                                 "function tools only"),
                          ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                           "input[0].content[0] of type 'input_image': this model takes text only")]:
        status, data = call(server, "POST", "/v1/responses", {**body, **bad})
        assert status == 400 and fragment in json.loads(data)["error"]["message"], data


ANSWER = {"type": "object", "properties": {"a": {"type": "string", "enum": ["yes", "no"]}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}  # 22 characters: within the tiny build's cache


def test_a_reply_held_to_a_json_schema_is_that_json_whole(server, built, expected):
    """``response_format`` (OpenAI's; ``json_schema=`` from Python): each step masks the tokens that cannot continue
    the schema's JSON, so the noise model's reply, greedy or sampled, streamed or not, is an object the schema
    accepts, and it ends there (``finish_reason`` stop) without an end id."""
    art, _, _, hf_tok = built
    prompt = expected[0]
    for load in (tb.load, runtime.load):
        exe = load(art)
        rows = exe.generate([prompt, prompt[:3]], 26, json_schema=ANSWER, temperature=0.9, seed=2)
        for row in rows:
            reply = json.loads(hf_tok.decode(row, skip_special_tokens=True))
            assert set(reply) == {"a", "b"} and reply["a"] in ("yes", "no") and isinstance(reply["b"], bool)
        assert rows.shape[1] < 26  # every row stopped when its JSON was whole
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    body = {"model": "qwen2", "messages": HELLO, "max_tokens": 26, "temperature": 0, "response_format": fmt}
    answer = json.loads(call(server, "POST", "/v1/chat/completions", body)[1])
    content = answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop" and json.loads(content)["a"] in ("yes", "no")
    assert content == hf_tok.decode(runtime.load(art).generate([prompt], 26, json_schema=ANSWER, temperature=0)[0],
                                    skip_special_tokens=True)
    chunks = [json.loads(p) for p in events(call(server, "POST", "/v1/chat/completions", {**body, "stream": True})[1])[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content
    proc = run_cli("generate", str(art), "--chat", "hello fox", "--json", "--max-new-tokens", "26", "--temperature",
                   "0", "--json-schema", json.dumps(ANSWER), timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["text_output"] == content, proc.stderr[-2000:]
    status, data = call(server, "POST", "/v2/models/qwen2/generate", {  # Triton's generate: json_schema
        "input_ids": prompt, "max_new_tokens": 26, "temperature": 0, "parameters": {"json_schema": ANSWER}})
    assert status == 200 and hf_tok.decode(json.loads(data)["output_ids"], skip_special_tokens=True) == content, data
    status, data = call(server, "POST", "/v2/models/qwen2/generate", {"input_ids": prompt, "json_schema": "{}"})
    assert status == 400 and "'json_schema' must be a JSON schema (an object)" in json.loads(data)["error"]
    anything = json.loads(call(server, "POST", "/v1/chat/completions", {
        **body, "response_format": {"type": "json_object"}, "max_tokens": 26})[1])["choices"][0]
    assert anything["message"]["content"].startswith("{")
    if anything["finish_reason"] == "stop":
        assert isinstance(json.loads(anything["message"]["content"]), dict)
    for fmt, fragment in [({"type": "xml"}, 'response_format={"type": "xml"}: it is {"type": "text"}'),
                          ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "minProperties": "x"}}},
                           "the JSON schema is not usable")]:
        status, data = call(server, "POST", "/v1/chat/completions", {**body, "response_format": fmt})
        assert status == 400 and fragment in json.loads(data)["error"]["message"], data


QWEN_SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def test_the_checkpoints_sampling_defaults_are_recorded_and_serve_calls_that_leave_them_out(built, expected, tmp_path):
    """A ``generation_config.json`` that samples (Qwen2.5-Instruct's) is recorded in the artifact and its build key,
    said in the build's log, and picks the tokens of every call that leaves the options out: ``generate``, the
    command line and OpenAI's route draw what the same options given draw; a call's own options replace them;
    ``generate.sampling`` replaces them at build (null: greedy)."""
    art, ckpt, _, _ = built
    config = {**json.loads((ckpt / "generation_config.json").read_text()), **QWEN_SAMPLING}
    copy = copied(ckpt, tmp_path / "ckpt", "generation_config.json", json.dumps(config))
    proc = run_cli(*BUILD, f"params.checkpoint={copy}", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("generate.sampling: temperature=0.7 top_k=20 top_p=0.8 repetition_penalty=1.05 from "
            f"{copy / 'generation_config.json'}") in proc.stdout + proc.stderr
    sampled = next((tmp_path / "arts" / "qwen2").iterdir())
    assert sampled.name != art.name  # a new build key
    recorded = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0, "repetition_penalty": 1.05}
    assert json.loads((sampled / "manifest.json").read_text())["metadata"]["generate"]["sampling"] == recorded
    shown = run_cli("inspect", str(sampled))
    assert ("calls that leave them out pick tokens by temperature=0.7 min_p=0 repetition_penalty=1.05 top_k=20 "
            "top_p=0.8") in shown.stdout
    prompt = expected[0]
    exe = runtime.load(sampled, warmup="none")
    drawn = [int(t) for t in exe.generate([prompt], 12, seed=5, eos_token_id=[])[0]]
    assert drawn == [int(t) for t in exe.generate([prompt], 12, seed=5, eos_token_id=[], **recorded)[0]]
    assert drawn != [int(t) for t in exe.generate([prompt], 12, seed=5, eos_token_id=[], temperature=0)[0]]
    greedy = [int(t) for t in exe.generate([prompt], 12, eos_token_id=[], temperature=0, repetition_penalty=1)[0]]
    assert greedy == expected[1]  # a call's own options replace the defaults
    proc = run_cli("generate", str(sampled), "--input-ids", ",".join(map(str, prompt)), "--max-new-tokens", "12",
                   "--eos-token-id", "none", "--seed", "5", "--json", timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["output_ids"] == drawn, proc.stderr[-2000:]
    with Server([sampled], port=0).start() as srv:
        answer = json.loads(call(srv, "POST", "/v1/chat/completions", {
            "model": "qwen2", "messages": HELLO, "max_tokens": 12, "seed": 5, "eos_token_id": []})[1])
        assert answer["choices"][0]["message"]["content"] == built[3].decode(drawn, skip_special_tokens=True)
        assert json.loads(call(srv, "GET", "/v2/models/qwen2")[1])["generate"]["sampling"] == recorded
    model = Qwen2(**{k: v for k, v in json.loads((copy / "config.json").read_text()).items()  # what the build resolves
                     if k in {f.name for f in dataclasses.fields(Qwen2)}})
    for given, want in (("auto", recorded), (None, {}), ({"top_p": 0.9}, {"top_p": 0.9})):
        assert resolved({"max_length": 48, "sampling": given}, model, str(copy))["sampling"] == want, given
    proc = run_cli(*BUILD, f"params.checkpoint={copy}", f"artifacts_dir={tmp_path / 'bad'}",
                   "generate.sampling={temperature: 0.7, top_p: 0}", cwd=tmp_path, timeout=600)
    assert proc.returncode != 0 and "generate.sampling: top_p=0: it is a probability in (0, 1]" in proc.stderr
    assert not (tmp_path / "bad" / "qwen2").exists()


def test_a_changed_chat_template_is_a_new_build_and_a_changed_stored_tokenizer_is_refused(built, tmp_path):
    art, ckpt, _, _ = built
    copy = copied(ckpt, tmp_path / "ckpt", "chat_template.jinja",
                  "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if suffix is defined %}{{ suffix }}{% endif %}")
    proc = run_cli(*BUILD, f"params.checkpoint={copy}", f"artifacts_dir={art.parent.parent}", cwd=tmp_path,
                   timeout=600)
    assert proc.returncode == 0 and "cache hit" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    other = next(p for p in (art.parent).iterdir() if p != art)
    assert runtime.load(other, warmup="none").tokenizer.render(HELLO) == "hello fox"
    with Server([other], port=0).start() as srv:  # vLLM's chat_template_kwargs: variables the template reads
        for kwargs, text in (({}, "hello fox"), ({"suffix": " the lazy dog"}, "hello fox the lazy dog")):
            status, data = call(srv, "POST", "/v1/chat/completions", {"model": "qwen2", "messages": HELLO,
                                                                      "max_tokens": 1, "chat_template_kwargs": kwargs})
            assert status == 200 and json.loads(data)["usage"]["prompt_tokens"] == len(built[3].encode(text)), data
    (other / "tokenizer" / "tokenizer.json").write_bytes((other / "tokenizer" / "tokenizer.json").read_bytes() + b" ")
    with pytest.raises(ArtifactError, match=r"tokenizer/tokenizer.json: size \d+ does not match manifest.json"):
        _ = runtime.load(other, warmup="none").tokenizer


def test_an_unreadable_tokenizer_is_left_out_saying_so(built, tmp_path):
    """A checkpoint whose tokenizer.json the tokenizers library cannot read builds an artifact of token ids only, and
    the build log says why (a server would otherwise refuse every text)."""
    copy = copied(built[1], tmp_path / "ckpt", "tokenizer.json", '{"model": {"type": "NoSuchModel"}}')
    # nothing here runs the artifact: one row (the last override wins) compiles half BUILD's profiles
    proc = run_cli(*BUILD, f"params.checkpoint={copy}", f"artifacts_dir={tmp_path / 'arts'}", "shapes.dims.batch=[1,1,1]",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the artifact takes and gives token ids only, not text: " in proc.stdout + proc.stderr
    art = next((tmp_path / "arts" / "qwen2").iterdir())
    assert "tokenizer" not in json.loads((art / "manifest.json").read_text())["metadata"]


def test_an_artifact_without_a_tokenizer_says_so_and_takes_ids(tmp_path):
    proc = run_cli("model=gpt2", "task=generate", "model.n_layer=1", "model.n_embd=16", "model.n_head=2",
                   "model.vocab_size=64", "model.n_positions=32", "generate.max_length=16", "shapes.dims.batch=[1,1,1]",
                   "shapes.dims.seq=[1,4,4]", f"artifacts_dir={tmp_path}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    art = next((tmp_path / "gpt2").iterdir())
    rt = runtime.load(art, warmup="none")
    with pytest.raises(CallError, match="has no tokenizer, so it takes and gives token ids only"):
        _ = rt.tokenizer
    assert np.asarray(rt.generate([[1, 2]], 3)).shape == (1, 3)
    with Server([art], port=0).start() as srv:
        status, data = call(srv, "POST", "/v2/models/gpt2/generate", {"text_input": "hello"})
        assert status == 400 and "takes and gives token ids only" in json.loads(data)["error"]
        status, data = call(srv, "POST", "/v1/chat/completions", {"model": "gpt2", "messages": HELLO})
        assert status == 404 and "it has no tokenizer (token ids only" in json.loads(data)["error"]["message"]


TEXTS = ["the quick brown fox", "hello", "héllo wörld, the lazy dog jumps", "don't", "fox"]


def test_openai_embeddings_equal_sentence_transformers_definition(tmp_path):
    """``/v1/embeddings`` over a BERT built with ``model.pooling=mean model.normalize=true``: each text's vector
    equals the mean of PyTorch's states over its tokens (Hugging Face's tokenizer, padded batch), unit length, as
    sentence-transformers computes it; five texts run as calls of the batch dim's 2; floats or base64 (OpenAI's
    client asks for base64); what the model cannot take is one line."""
    import base64

    ckpt = classifier_checkpoint(tmp_path / "bert", transformers.BertModel)
    assert transformers.AutoTokenizer.from_pretrained(ckpt)("fox")["input_ids"][::2] == [2, 3]  # [CLS] fox [SEP]
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "model.pooling=mean", "model.normalize=true",
                   "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[8,16]",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "bert").iterdir())
    hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    batch = hf_tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = transformers.BertModel.from_pretrained(ckpt).eval()(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    with Server([art], port=0).start() as srv:
        status, data = call(srv, "POST", "/v1/embeddings", {"model": "bert", "input": TEXTS})
        assert status == 200, data
        answer = json.loads(data)
        got = np.array([d["embedding"] for d in answer["data"]])
        assert np.abs(got - want).max() < 1e-5 and [d["index"] for d in answer["data"]] == list(range(5))
        assert answer["usage"]["prompt_tokens"] == int(batch["attention_mask"].sum())
        status, data = call(srv, "POST", "/v1/embeddings", {"model": "bert", "input": TEXTS[0],
                                                            "encoding_format": "base64"})
        vector = np.frombuffer(base64.b64decode(json.loads(data)["data"][0]["embedding"]), "<f4")
        assert status == 200 and np.abs(vector - want[0]).max() < 1e-5
        status, data = call(srv, "POST", "/v1/embeddings", {"model": "bert", "input": [hf_tok(TEXTS[1])["input_ids"]]})
        assert status == 200 and np.abs(np.array(json.loads(data)["data"][0]["embedding"]) - want[1]).max() < 1e-5
        assert [m["id"] for m in json.loads(call(srv, "GET", "/v1/models")[1])["data"]] == ["bert"]
        for body, code, fragment in [
                ({"model": "bert", "input": ["fox", "the fox " * 10]}, 400,
                 "input 1 is 22 tokens, but model 'bert' takes at most 16 (the build's seq range)"),
                ({"model": "bert", "input": TEXTS, "dimensions": 8}, 400, "embeds in 32 dimensions only"),
                ({"model": "bert", "input": []}, 400, '"input" must be a non-empty text'),
                ({"model": "bert", "messages": HELLO}, 400, "'messages' is not an option of /v1/embeddings")]:
            status, data = call(srv, "POST", "/v1/embeddings", body)
            message = json.loads(data)["error"]["message"]
            assert status == code and fragment in message and "\n" not in message, (body, message)
        status, data = call(srv, "POST", "/v1/chat/completions", {"model": "bert", "messages": HELLO})
        assert status == 404 and "it does not generate (an encoder: POST /v1/embeddings)" in data.decode()


def test_a_classifier_takes_text_and_answers_with_its_labels_over_http_and_grpc(tmp_path):
    """``/infer`` with a BYTES input ``text`` (JSON strings, Triton's binary form, gRPC's bytes_contents): the texts
    tokenized by the checkpoint's tokenizer and padded as Hugging Face pads a batch, the logits PyTorch's, and
    Triton's classification extension names the classes; the output ``classes`` and ``classify()`` (both loaders)
    answer as transformers' text-classification pipeline does, ``zero_shot()`` and the output ``zero_shot`` (HTTP and
    gRPC) as its zero-shot one; what cannot be taken is one line."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    ckpt = classifier_checkpoint(tmp_path / "cls", transformers.BertForSequenceClassification,
                                 id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    proc = run_cli("model=hf", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,1,4]", "shapes.dims.seq=[1,8,16]",
                   "shapes.buckets.seq=[8,16]", f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = next((tmp_path / "arts" / "bert").iterdir())
    hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    texts = TEXTS[:3]
    hf_model = transformers.BertForSequenceClassification.from_pretrained(ckpt).eval()
    with torch.no_grad():
        want = hf_model(**hf_tok(texts, padding=True, return_tensors="pt")).logits.numpy()
    pipe = transformers.pipeline("text-classification", model=hf_model, tokenizer=hf_tok)
    zero_shot = transformers.pipeline("zero-shot-classification", model=hf_model, tokenizer=hf_tok)

    def same(got, want):
        assert [[c["label"] for c in row] for row in got] == [[c["label"] for c in row] for row in want]
        assert np.allclose([c["score"] for row in got for c in row], [c["score"] for row in want for c in row],
                           rtol=0, atol=1e-5)

    wants_zs = {}
    for load in (runtime.load, tb.load):
        model = load(art)
        same(model.classify(TEXTS), pipe(TEXTS, top_k=1))  # five texts: two calls of the batch range's 4
        same([model.classify(TEXTS[0], top_k=2, function_to_apply="none")], [pipe(TEXTS[0], top_k=2,
                                                                                  function_to_apply="none")])
        for multi in (False, True):  # two texts by three labels: six pairs, two calls; no entailment class: the last
            want_zs = wants_zs[multi] = zero_shot([TEXTS[1], TEXTS[3]], candidate_labels=["fox", "dog", "lazy"],
                                                  multi_label=multi, hypothesis_template="is {}")
            got_zs = model.zero_shot([TEXTS[1], TEXTS[3]], "fox, dog, lazy", multi_label=multi,
                                     hypothesis_template="is {}")
            assert [g["labels"] for g in got_zs] == [w["labels"] for w in want_zs]
            assert np.allclose([g["scores"] for g in got_zs], [w["scores"] for w in want_zs], rtol=0, atol=1e-5)
        with pytest.raises(CallError, match=r"bert: text 0 with the hypothesis 'This example is fox.' is \d+ tokens, "
                                            r"but the model takes at most 16"):
            model.zero_shot(TEXTS[0], ["fox"])
    with Server([art], port=0, grpc_port=0).start() as srv:
        text = {"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}
        status, data = call(srv, "POST", "/v2/models/bert/infer", {"inputs": [text]})
        assert status == 200, data
        got = np.array(json.loads(data)["outputs"][0]["data"]).reshape(3, 2)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        status, data = call(srv, "POST", "/v2/models/bert/infer", {
            "inputs": [text], "outputs": [{"name": "logits", "parameters": {"classification": 1}}]})
        top = json.loads(data)["outputs"][0]["data"]
        assert [t.split(":")[2] for t in top] == [["negative", "positive"][i] for i in want.argmax(1)]
        status, data = call(srv, "POST", "/v2/models/bert/infer", {
            "inputs": [text], "outputs": [{"name": "classes", "parameters": {"top_k": 2}}]})
        same([json.loads(row) for row in json.loads(data)["outputs"][0]["data"]], pipe(texts, top_k=2))
        two = {**text, "shape": [2], "data": [TEXTS[1], TEXTS[3]]}
        for multi, want_zs in wants_zs.items():  # six pairs: two calls of the batch range's 4
            status, data = call(srv, "POST", "/v2/models/bert/infer", {"inputs": [two], "outputs": [{
                "name": "zero_shot", "parameters": {"candidate_labels": ["fox", "dog", "lazy"], "multi_label": multi,
                                                    "hypothesis_template": "is {}"}}]})
            assert status == 200, data
            (out,) = json.loads(data)["outputs"]
            assert out["datatype"] == "BYTES" and out["shape"] == [2]
            got_zs = [json.loads(row) for row in out["data"]]
            assert [g["sequence"] for g in got_zs] == [TEXTS[1], TEXTS[3]]
            assert [g["labels"] for g in got_zs] == [w["labels"] for w in want_zs]
            assert np.allclose([g["scores"] for g in got_zs], [w["scores"] for w in want_zs], rtol=0, atol=1e-5)
        meta = json.loads(call(srv, "GET", "/v2/models/bert")[1])
        assert meta["text_input"] == {"name": "text", "datatype": "BYTES", "shape": [-1], "pair": "text_pair",
                                      "stands_for": ["input_ids", "attention_mask", "token_type_ids"]}
        assert "entities" not in meta
        assert meta["classes"]["parameters"]["function_to_apply"]["default"] == "softmax"
        assert meta["zero_shot"]["parameters"]["hypothesis_template"]["default"] == "This example is {}."
        with pytest.raises(CallError, match=r"bert: finding entities needs a token classifier .*outputs are logits\."):
            runtime.load(art).entities("the fox")
        host = srv.url.split("//")[1]
        for client, module in ((triton_http.InferenceServerClient(host), triton_http),
                               (triton_grpc.InferenceServerClient(srv.grpc.address), triton_grpc)):
            inp = module.InferInput("text", [3], "BYTES")
            inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))  # binary over HTTP
            out = client.infer("bert", [inp]).as_numpy("logits")
            assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max(), module.__name__
            two_in = module.InferInput("text", [2], "BYTES")
            two_in.set_data_from_numpy(np.array([TEXTS[1].encode(), TEXTS[3].encode()], dtype=object))
            asked = module.InferRequestedOutput("zero_shot")
            if module is triton_http:
                asked._parameters.update(candidate_labels="fox, dog, lazy", hypothesis_template="is {}", multi_label=True)
            else:  # gRPC's parameters are scalars: the labels one comma-separated string
                asked._output.parameters["candidate_labels"].string_param = "fox, dog, lazy"
                asked._output.parameters["hypothesis_template"].string_param = "is {}"
                asked._output.parameters["multi_label"].bool_param = True
            got_zs = [json.loads(row) for row in client.infer("bert", [two_in], outputs=[asked]).as_numpy("zero_shot")]
            assert [g["labels"] for g in got_zs] == [w["labels"] for w in wants_zs[True]], module.__name__
            assert np.allclose([g["scores"] for g in got_zs], [w["scores"] for w in wants_zs[True]], rtol=0, atol=1e-5)
            client.close()
        for body, fragment in [
                ({"inputs": [text, {"name": "token_type_ids", "datatype": "INT32", "shape": [3, 1], "data": [0] * 3}]},
                 "input 'text' stands for input_ids, attention_mask and token_type_ids (the texts tokenized): send it "
                 "alone (or with 'text_pair')"),
                ({"inputs": [{**text, "shape": [5], "data": TEXTS}]}, "5 texts, but model 'bert' takes at most 4 rows"),
                ({"inputs": [{**text, "datatype": "INT32"}]}, "input 'text': BYTES of shape [n] (or [n, 1])"),
                ({"inputs": [{**text, "shape": [1], "data": ["fox " * 20]}]}, "input 0 is 22 tokens, but model 'bert' "
                                                                              "takes at most 16"),
                ({"inputs": [text], "outputs": [{"name": "entities"}]},  # a token classifier's output only
                 "output 'entities': bert has no such output; it has logits (and 'classes', 'zero_shot' with texts)."),
                ({"inputs": [text], "outputs": [{"name": "zero_shot"}]},
                 "output 'zero_shot' scores candidate labels: give them as its parameter \"candidate_labels\""),
                ({"inputs": [text], "outputs": [{"name": "zero_shot", "parameters": {"candidate_labels": []}}]},
                 "output 'zero_shot': candidate_labels must be a non-empty list of label names"),
                ({"inputs": [text], "outputs": [{"name": "zero_shot", "parameters": {
                    "candidate_labels": "fox", "hypothesis_template": "no slot"}}]},
                 "output 'zero_shot': hypothesis_template 'no slot' has no {} for the label to go in"),
                ({"inputs": [text], "outputs": [{"name": "zero_shot", "parameters": {
                    "candidate_labels": "fox", "multi_label": "yes"}}]},
                 "output 'zero_shot': multi_label must be true or false, got 'yes'."),
                ({"inputs": [two], "outputs": [{"name": "zero_shot", "parameters": {
                    "candidate_labels": "fox", "hypothesis_template": "is {}"}}, {"name": "logits"}]},
                 "output 'logits': a request for 'zero_shot' runs each text with every candidate label's hypothesis "
                 "and is answered with 'zero_shot' alone"),
                ({"inputs": [{**text, "shape": [1], "data": [TEXTS[0]]}], "outputs": [{
                    "name": "zero_shot", "parameters": {"candidate_labels": "fox"}}]},
                 "text 0 with the hypothesis 'This example is fox.' is"),
                ({"inputs": [text, {**text, "name": "text_pair"}], "outputs": [{
                    "name": "zero_shot", "parameters": {"candidate_labels": "fox"}}]},
                 "output 'zero_shot' runs each text as rows of its own: send 'text' alone, without 'text_pair'."),
                ({"inputs": [text], "outputs": [{"name": "logits", "parameters": {"candidate_labels": "fox"}}]},
                 "output 'logits': parameter 'candidate_labels' scores candidate labels, which output 'zero_shot' "
                 "gives."),
                ({"inputs": [text], "outputs": [{"name": "logits", "parameters": {"aggregation_strategy": "simple"}}]},
                 "groups entities, which output 'entities' gives (bert's outputs do not include it)"),
                ({"inputs": [text], "outputs": [{"name": "classes", "parameters": {"top_k": 3}}]},
                 "output 'classes': top_k is how many classes to answer with, an integer in [1, 2], got 3."),
                ({"inputs": [text], "outputs": [{"name": "classes", "parameters": {"classification": 1}}]},
                 "output 'classes' is scored classes already: ask for its top_k")]:
            status, data = call(srv, "POST", "/v2/models/bert/infer", body)
            message = json.loads(data)["error"]
            assert status == 400 and fragment in message and "\n" not in message, (body, message)
        status, data = call(srv, "POST", "/v1/rerank", {"model": "bert", "query": "fox", "documents": ["a fox"]})
        assert status == 404 and "it is not a cross-encoder (a sequence classifier of one class" in data.decode()
