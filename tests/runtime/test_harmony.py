"""``runtime/harmony.py``: gpt-oss's replies (messages on the analysis, commentary and final channels, a tool call
as a message to ``functions.NAME``) read apart into ``reasoning_content``, ``content`` and ``tool_calls``, whole or
streamed, through OpenAI's answer; the grammar that holds the answer (a JSON schema, the tools' calls) after the
thinking, driven token by token through llguidance; a past turn's thinking written back for the template; and a
build over a harmony tokenizer served, its answers in OpenAI's shape."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from examples.chat_checkpoint import tokenizer as byte_level  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime import harmony  # noqa: E402
from tripy_build.runtime.reasoning import thinks  # noqa: E402
from tripy_build.runtime.tools import Tools, format_of  # noqa: E402
from tripy_build.serve.http import Server  # noqa: E402
from tripy_build.serve.openai import Plan, Request  # noqa: E402

from conftest import run_cli  # noqa: E402
from test_tools import ADD, CALLED, TEMPLATES, WX, drive, fed, ours  # noqa: E402

transformers.logging.set_verbosity_error()
ANALYSIS = "<|channel|>analysis<|message|>They ask the weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny."
CALL = '<|start|>assistant<|channel|>commentary to=functions.wx <|constrain|>json<|message|>{"city": "Paris"}'
ROLE_CALL = '<|start|>assistant to=functions.wx<|channel|>commentary json<|message|>{"city": "Paris"}'
ANSWER = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> Path:
    """The test tokenizer with the harmony marks as special tokens (as gpt-oss's o200k_harmony has them) and a
    harmony template."""
    root = tmp_path_factory.mktemp("harmony")
    hf = transformers.AutoTokenizer.from_pretrained(byte_level(root / "base"))
    hf.add_special_tokens({"additional_special_tokens": list(harmony.MARKS)})
    hf.chat_template = (TEMPLATES / "harmony.jinja").read_text()
    hf.save_pretrained(root / "gpt_oss")
    return root / "gpt_oss"


def split(text: str, size: int, calls: bool = True) -> tuple[str, str, list]:
    messages = harmony.Messages(calls)
    parts = [messages.feed(text[i:i + size]) for i in range(0, len(text), size)] + [messages.end()]
    return ("".join(t for t, _ in parts), "".join(a for _, a in parts),
            [(c["function"]["name"], c["function"]["arguments"]) for c in messages.calls])


def test_a_harmony_template_is_told_from_the_others():
    template = (TEMPLATES / "harmony.jinja").read_text()
    assert harmony.speaks(template) and not thinks(template) and format_of(template) is None
    assert not any(harmony.speaks((TEMPLATES / t).read_text()) for t in ("qwen3.jinja", "llama3.1.jinja"))


def test_a_reply_is_read_apart_by_channel_whole_or_streamed():
    wx = [("wx", '{"city": "Paris"}')]
    cases = [(ANALYSIS + FINAL, True, ("They ask the weather.", "It is sunny.", [])),
             (FINAL[len("<|start|>assistant"):], True, ("", "It is sunny.", [])),  # no thinking
             (ANALYSIS + "<|start|>assistant<|channel|>analysis<|message|>Twice.<|end|>" + FINAL, True,
              ("They ask the weather.\nTwice.", "It is sunny.", [])),
             (ANALYSIS + CALL, True, ("They ask the weather.", "", wx)),
             (ANALYSIS + ROLE_CALL, True, ("They ask the weather.", "", wx)),  # the recipient in the role's part
             ("<|channel|>commentary<|message|>Looking it up.<|end|>" + CALL, True, ("", "Looking it up.", wx)),
             (ANALYSIS + CALL[:-5], True, ("They ask the weather.", '{"city": "Pa', [])),  # cut: arguments kept
             (ANALYSIS + CALL, False, ("They ask the weather.", '{"city": "Paris"}', [])),  # no tools offered
             ("<|channel|>analysis<|message|>cut at max_tokens", True, ("cut at max_tokens", "", [])),
             ("Plain text, no header.", True, ("", "Plain text, no header.", [])),
             ("<|channel|>analysis<|message|>a <|e", True, ("a <|e", "", [])),  # a mark's start, never finished
             (ANALYSIS + "<|start|>assistant<|channel|>fin", True, ("They ask the weather.", "", [])),  # cut: a header
             (ANALYSIS + CALL + "<|call|><|start|>functions.wx", True, ("They ask the weather.", "", wx)),  # no end id
             (ANALYSIS + FINAL + "<|return|>", True, ("They ask the weather.", "It is sunny.", []))]
    for text, calls, want in cases:
        for size in (1, 2, 5, len(text)):
            assert split(text, size, calls) == want, (text, size)


def reply(plan: Plan, req: Request, tok, text: str, end: str = "<|return|>"):
    deltas = []

    def step(thought: str, content: str, calls: list) -> None:
        deltas.append(req.chunk(content or None, calls=calls, reasoning=thought)["choices"][0]["delta"])
    choice = fed(plan, tok, text, tok.token_id(end), step)
    return deltas, req.answer([choice], tok, 0)


def test_openais_answer_carries_the_channels_apart(gpt_oss):
    tok = ours(gpt_oss)
    hello = [{"role": "user", "content": "Weather in Paris?"}]
    req = Request({"model": "m", "messages": hello}, chat=True)
    plan = Plan(req, tok)
    assert plan.harmony and plan.thinking and plan.grammar is None
    assert tok.render(hello).endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")
    assert sorted(plan.marks.values()) == sorted(harmony.MARKS)  # special: kept in the text the parser reads
    deltas, answer = reply(plan, req, tok, ANALYSIS + FINAL)
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny.",
                                 "reasoning_content": "They ask the weather."}
    assert choice["finish_reason"] == "stop"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "They ask the weather."
    assert "".join(d.get("content") or "" for d in deltas) == "It is sunny."
    # the analysis message's tokens, its marks with them, are reasoning tokens; the final message's and the end id not
    thinking = len(tok._fast.encode(ANALYSIS, add_special_tokens=False).ids)
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": thinking}
    made = len(tok._fast.encode(ANALYSIS + FINAL, add_special_tokens=False).ids) + 1
    assert answer["usage"]["completion_tokens"] == made and thinking >= 8


def test_a_call_is_read_as_tool_calls_and_its_thinking_goes_back_to_the_template(gpt_oss):
    tok = ours(gpt_oss)
    req = Request({"model": "m", "messages": CALLED[:1], "tools": [WX, ADD]}, chat=True)
    plan = Plan(req, tok)
    assert "type wx = " in tok.decode(plan.ids) and plan.grammar.startswith("start: <[")
    deltas, answer = reply(plan, req, tok, ANALYSIS + CALL, end="<|call|>")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"] == "They ask the weather."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == \
        [("wx", '{"city": "Paris"}')]
    assert [c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", [])] == ['{"city": "Paris"}']
    # the next turn: the call with its thinking (as this server answered it) and the tool's output
    history = [CALLED[0], {**CALLED[1], "reasoning_content": "They ask the weather."}, CALLED[2]]
    again = Plan(Request({"model": "m", "messages": history, "tools": [WX]}, chat=True), tok)
    prompt = tok.decode(again.ids)  # marks left out: the text between them
    assert "analysisThey ask the weather." in prompt and 'commentary json{"city": "Paris"}' in prompt
    assert prompt.endswith('functions.wx to=assistantcommentary"sunny"assistant')


def test_the_grammar_holds_the_answer_after_any_thinking(gpt_oss):
    tok = ours(gpt_oss)
    tags = {m: tok.token_id(m) for m in harmony.MARKS}
    schema = harmony.grammar(tags, ANSWER)
    body = '<|start|>assistant<|channel|>final<|message|>{"a": true}'
    assert drive(tok, schema, ANALYSIS + body) == (True, True)
    assert drive(tok, schema, body[len("<|start|>assistant"):]) == (True, True)  # thinking is the model's to skip
    assert drive(tok, schema, ANALYSIS + FINAL)[0] is False  # the answer is JSON
    assert drive(tok, schema, ANALYSIS)[1] is False  # the reply goes on to an answer
    auto = harmony.grammar(tags, tools=Tools([WX, ADD]))
    assert drive(tok, auto, ANALYSIS + CALL) == (True, True)
    assert drive(tok, auto, ANALYSIS + FINAL) == (True, True)  # auto: the model may answer instead
    assert drive(tok, auto, "<|channel|>commentary<|message|>First, the weather.<|end|>" + CALL) == (True, True)
    assert drive(tok, auto, ANALYSIS + CALL.replace("Paris", "Paris\", \"days\": \"two"))[0] is False  # schema
    assert drive(tok, auto, ANALYSIS + CALL.replace("functions.wx", "functions.sky"))[0] is False  # no such tool
    required = harmony.grammar(tags, tools=Tools([WX, ADD], "required"))
    assert drive(tok, required, ANALYSIS + FINAL)[0] is False and drive(tok, required, ANALYSIS + CALL) == (True, True)
    named = harmony.grammar(tags, tools=Tools([WX, ADD], {"type": "function", "function": {"name": "add"}}))
    assert drive(tok, named, ANALYSIS + CALL)[0] is False
    assert drive(tok, named, CALL[len("<|start|>assistant"):].replace("wx", "add").replace(
        '{"city": "Paris"}', '{"a": 1, "b": 2}')) == (True, True)


def test_a_grammar_without_the_marks_as_tokens_is_refused(gpt_oss, tmp_path):
    hf = transformers.AutoTokenizer.from_pretrained(byte_level(tmp_path / "base"))
    hf.chat_template = (TEMPLATES / "harmony.jinja").read_text()
    hf.save_pretrained(tmp_path / "spelt")
    tok = ours(tmp_path / "spelt")
    plain = Plan(Request({"model": "m", "messages": CALLED[:1]}, chat=True), tok)
    assert plain.harmony and plain.marks == {}  # spelt out: decoding keeps the marks' text
    with pytest.raises(CallError, match=r"harmony format, but its tokenizer has no token <\|start\|>.*tools"):
        Plan(Request({"model": "m", "messages": CALLED[:1], "tools": [WX]}, chat=True), tok)


def test_reasoning_effort_is_the_templates_and_refused_where_it_has_none(gpt_oss, tmp_path):
    from tripy_build.serve.responses import chat_body

    tok = ours(gpt_oss)
    hello = [{"role": "user", "content": "hi"}]
    for effort in ("low", "high"):
        plan = Plan(Request({"model": "m", "messages": hello, "reasoning_effort": effort}, chat=True), tok)
        assert f"Reasoning: {effort}\n" in tok.decode(plan.ids)
    assert "Reasoning: medium\n" in tok.decode(Plan(Request({"model": "m", "messages": hello}, chat=True), tok).ids)
    responses = chat_body({"model": "m", "input": "hi", "reasoning": {"effort": "low"}})
    assert "Reasoning: low\n" in tok.decode(Plan(Request(responses, chat=True), tok).ids)
    with pytest.raises(CallError, match=r"reasoning_effort=extreme: one of low, medium, high"):
        Request({"model": "m", "messages": hello, "reasoning_effort": "extreme"}, chat=True)
    with pytest.raises(CallError, match=r"reasoning_effort=low: .* on /v1/chat/completions"):
        Request({"model": "m", "prompt": "hi", "reasoning_effort": "low"}, chat=False)
    with pytest.raises(CallError, match=r'reasoning=.*: this server takes \{"effort": "low"\}'):
        chat_body({"model": "m", "input": "hi", "reasoning": {"summary": "auto"}})
    qwen = ours(byte_level(tmp_path / "chatml"))  # ChatML: no reasoning effort to set
    with pytest.raises(CallError, match=r"reasoning_effort=low: model 'm'.s chat template takes no reasoning effort"):
        Plan(Request({"model": "m", "messages": hello, "reasoning_effort": "low"}, chat=True), qwen)


def test_a_harmony_reply_stops_at_return_and_call_whatever_the_build_recorded(gpt_oss):
    """Some gpt-oss checkpoints' ``generation_config.json`` leave ``<|call|>`` out of ``eos_token_id``: a reply
    would write on past its call. The plan adds both marks to the build's end ids, and leaves a request's own."""
    tok = ours(gpt_oss)
    ret, call = tok.token_id("<|return|>"), tok.token_id("<|call|>")
    req = Request({"model": "m", "messages": CALLED[:1], "tools": [WX]}, chat=True)
    Plan(req, tok).stop_at(req, (ret, 0))
    assert req.options["eos_token_id"] == [ret, 0, call]
    own = Request({"model": "m", "messages": CALLED[:1], "eos_token_id": [7]}, chat=True)
    Plan(own, tok).stop_at(own, (ret,))
    assert own.options["eos_token_id"] == [7]
    chatml = ours(byte_level(gpt_oss.parent / "base"))
    other = Request({"model": "m", "messages": CALLED[:1]}, chat=True)
    Plan(other, chatml).stop_at(other, (3,))
    assert "eos_token_id" not in other.options  # the build's, as recorded


def test_a_build_over_a_harmony_tokenizer_answers_in_openais_shape(gpt_oss, tmp_path):
    """End to end: a 2-layer Qwen2 over the harmony tokenizer built with ``task=generate``, its generation config
    ending at ``<|return|>`` only (as some gpt-oss fine-tunes' do), served. Greedy, its random weights steered by
    ``logit_bias`` (``f`` and ``c`` and a space all but forced where the grammar allows them): a JSON answer in the
    final channel, then a call of the named tool, streamed, read back as OpenAI's API gives them."""
    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(gpt_oss, ckpt)
    tok = ours(ckpt)
    end = tok.token_id("<|return|>")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      eos_token_id=end, pad_token_id=tok.token_id("<|endoftext|>"))
    transformers.Qwen2ForCausalLM(config).eval().save_pretrained(ckpt)
    proc = run_cli("model=hf", "task=generate", f"params.checkpoint={ckpt}", "shapes.dims.batch=[1,1,2]",
                   "shapes.dims.seq=[1,8,16]", "shapes.buckets.seq=[1,16]", "generate.max_length=512",
                   f"artifacts_dir={tmp_path / 'arts'}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bias = {str(tok.token_id(t)): 100 for t in ("f", "c", "\u0120")}  # "\u0120": the byte-level vocabulary's space

    with Server([next((tmp_path / "arts" / "qwen2").iterdir())], port=0).start() as server:
        def post(body: dict) -> bytes:
            request = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(body).encode(),
                                             {"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                raise AssertionError(e.read().decode()) from None
        with urllib.request.urlopen(server.url + "/v2/models/qwen2", timeout=60) as response:
            generate = json.loads(response.read())["generate"]
        assert (generate["tools"], generate["thinking"], generate["eos_token_id"]) == ("harmony", True, [end])
        ask = {"model": "qwen2", "messages": [{"role": "user", "content": "yes?"}], "temperature": 0,
               "max_tokens": 60, "logit_bias": bias}
        schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
        choice = json.loads(post({**ask, "response_format": schema}))["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": '{"a": false}', "reasoning_content": None}
        assert choice["finish_reason"] == "stop"
        flag = {"type": "function", "function": {"name": "flag", "parameters": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}}}
        stream = post({**ask, "tools": [flag], "tool_choice": {"type": "function", "function": {"name": "flag"}},
                       "stream": True})
        chunks = [json.loads(e[len(b"data: "):]) for e in stream.split(b"\n\n") if e and e != b"data: [DONE]"]
        calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("flag", '{"ok": false}')]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert not "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)  # the marks in nothing
