"""``runtime/tools.py``: the tool-call format read off real checkpoints' chat templates (Qwen2.5's and Llama 3.1's, as
their ``tokenizer_config.json`` ship them), the tools and a conversation with calls rendered as transformers'
``apply_chat_template`` renders them, the grammar that holds a reply to the calls a request allows (driven token by
token through llguidance over a real byte-level tokenizer), and the calls read back out of the text, whole or
streamed."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from examples.chat_checkpoint import tokenizer as byte_level  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.grammar import constraints  # noqa: E402
from tripy_build.runtime.tokenizer import FILES, Tokenizer  # noqa: E402
from tripy_build.runtime.tools import HERMES, LLAMA3_JSON, Calls, Tools, format_of, messages_for_template, tokens_of  # noqa: E402
from tripy_build.serve.generation import Reply, Sequence  # noqa: E402
from tripy_build.serve.openai import Plan, Request  # noqa: E402

transformers.logging.set_verbosity_error()
TEMPLATES = Path(__file__).parent / "templates"
WX = {"type": "function", "function": {"name": "wx", "description": "the weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
CALLED = [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Paris"}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return byte_level(tmp_path_factory.mktemp("tok"))


def with_template(saved: Path, tmp_path: Path, name: str) -> Path:
    hf = transformers.AutoTokenizer.from_pretrained(saved)
    hf.chat_template = (TEMPLATES / name).read_text()
    hf.save_pretrained(tmp_path / name)
    return tmp_path / name


def ours(path: Path) -> Tokenizer:
    return Tokenizer({n: (path / n).read_bytes() for n in FILES if (path / n).is_file()}, str(path))


def test_the_format_is_read_off_real_templates(saved):
    assert format_of((TEMPLATES / "qwen2.5.jinja").read_text()) is HERMES
    assert format_of((TEMPLATES / "qwen3.jinja").read_text()) is HERMES
    assert format_of((TEMPLATES / "llama3.1.jinja").read_text()) is LLAMA3_JSON
    chatml = ours(saved).chat_template
    assert format_of(chatml) is HERMES  # the test checkpoint's: ChatML with Qwen's calls
    assert format_of("{% for m in messages %}{{ m['content'] }}{% endfor %}") is None  # shows no tools
    assert format_of("{% if tools %}<|tool|>{{ tools | tojson }}<|/tool|>{% endif %}<|tool_call|>") is None  # Phi-4's
    assert format_of("[AVAILABLE_TOOLS]{{ tools | tojson }}[TOOL_CALLS]{{ name }}[ARGS]") is None  # Mistral's v11
    coder = "{% if tools %}<tools>{% endif %}<tool_call>\n<function={{ name }}>\n<parameter=x>"  # Qwen3-Coder's XML
    assert format_of(coder) is None


@pytest.mark.parametrize("name", ["qwen2.5.jinja", "qwen3.jinja", "llama3.1.jinja"])
def test_tools_and_a_conversation_with_calls_render_as_apply_chat_template(saved, tmp_path, name):
    path = with_template(saved, tmp_path, name)
    hf, tok = transformers.AutoTokenizer.from_pretrained(path), ours(path)
    read = messages_for_template(CALLED)
    assert read[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # the templates write it with tojson
    assert CALLED[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the request is left as it was
    for messages in (CALLED[:1], read):
        want = hf.apply_chat_template(messages, tools=[WX, ADD], add_generation_prompt=True, tokenize=False)
        assert tok.render(messages, tools=[WX, ADD]) == want
        assert tok.chat(messages, tools=[WX, ADD]) == hf.apply_chat_template(
            messages, tools=[WX, ADD], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert '"name": "wx"' in tok.render(CALLED[:1], tools=[WX]) and "wx" not in tok.render(CALLED[:1])
    with pytest.raises(CallError, match="tools must be a list of objects"):
        tok.render(CALLED[:1], tools={"wx": 1})


def fed(plan: Plan, tok: Tokenizer, text: str, eos: int, step=lambda *made: None):
    """``plan``'s first reply fed ``text``'s tokens, then the end id ``eos``, as the server feeds a row's: ``step(
    thought, content, calls)`` with what each lets out, and once more with what ``end`` does; the ``Choice``."""
    seq = Sequence(None, 64, None, (eos,), lambda t: None, lambda e: None)
    choice = plan.choice(0, seq, Reply(tok, seq.eos_token_id, [], plan.marks))
    for token in [*tok._fast.encode(text, add_special_tokens=False).ids, eos]:
        seq.tokens.append(token)
        step(*choice.take(token, False), choice.new_calls())
    step(*choice.end(), choice.new_calls())
    return choice


def drive(tok: Tokenizer, grammar, text: str | list[int]) -> tuple[bool, bool]:
    """Feed ``text``'s tokens (the tag tokens as the model writes them; or these ids) to a fresh matcher of
    ``grammar``: whether every token was allowed by the mask before it, and whether the reply may end there."""
    eos = tok.token_id("<|im_end|>")
    constraint = constraints(tok, grammar, tok.vocab_size)([eos])
    import numpy as np

    for token in tok._fast.encode(text, add_special_tokens=False).ids if isinstance(text, str) else text:
        if not np.isfinite(constraint.mask(np.zeros(tok.vocab_size))[token]):
            return False, False
        constraint.advance(token)
    return True, bool(np.isfinite(constraint.mask(np.zeros(tok.vocab_size))[eos])) or constraint.ended


CALL = '<tool_call>\n{"name": "wx", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>'


def test_the_grammar_holds_a_hermes_reply_to_the_calls_the_request_allows(saved):
    tok = ours(saved)
    tags, words = tokens_of(tok, HERMES)
    assert tags == {"<tool_call>": tok.token_id("<tool_call>"), "</tool_call>": tok.token_id("</tool_call>")}
    assert words == []
    auto = Tools([WX, ADD]).grammar(HERMES, tags)
    assert drive(tok, auto, "hello fox") == (True, True)  # text alone
    assert drive(tok, auto, "Let me look.\n" + CALL) == (True, True)  # text, then a call
    assert drive(tok, auto, CALL + "\n" + CALL2) == (True, True)  # parallel calls
    assert drive(tok, auto, CALL[:-len("\n</tool_call>")])[1] is False  # an open call cannot end the reply
    for bad in ('<tool_call>\n{"name": "mul"',  # no such tool
                '<tool_call>\n{"name": "wx", "arguments": {"days": 2}}',  # its required city missing
                '<tool_call>\n{"name": "wx", "arguments": {"city": 3',  # a number for a string
                '<tool_call>\n{"name":"wx"',  # not the templates' layout
                CALL + " and then text"):  # text after the calls
        assert drive(tok, auto, bad)[0] is False, bad
    one = Tools([WX, ADD], "auto", parallel=False).grammar(HERMES, tags)
    assert drive(tok, one, CALL) == (True, True) and drive(tok, one, CALL + "\n<tool_call>")[0] is False
    required = Tools([WX, ADD], "required").grammar(HERMES, tags)
    assert drive(tok, required, CALL2) == (True, True) and drive(tok, required, "hello")[0] is False
    assert drive(tok, required, "")[1] is False  # a call is required
    named = Tools([WX, ADD], {"type": "function", "function": {"name": "add"}}).grammar(HERMES, tags)
    assert drive(tok, named, CALL2) == (True, True) and drive(tok, named, CALL)[0] is False
    # Pydantic's schemas refer to their own $defs: each tool's references still resolve, to its own definitions
    unit = {"type": "function", "function": {"name": "wx", "parameters": {
        "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"],
        "$defs": {"City": {"enum": ["Paris", "Lyon"]}}}}}
    other = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/City"}}, "required": ["a"],
        "$defs": {"City": {"type": "integer"}}}}}  # the same name, another definition
    refs = Tools([unit, other]).grammar(HERMES, tags)
    assert drive(tok, refs, CALL) == (True, True)
    assert drive(tok, refs, '<tool_call>\n{"name": "wx", "arguments": {"city": "Nice')[0] is False
    assert drive(tok, refs, '<tool_call>\n{"name": "add", "arguments": {"a": 7}}\n</tool_call>') == (True, True)


def test_call_marks_a_tokenizer_does_not_have_are_spelt_out(tmp_path):
    """A tokenizer without ``<tool_call>`` as a token of its own: the model writes the marks as text, and the text
    before a call ends at the first one."""
    tok = ours(byte_level(tmp_path, tool_tokens=False))
    assert tokens_of(tok, HERMES) == ({}, [])
    for grammar in (Tools([WX]).grammar(HERMES, {}), Tools([WX], "required").grammar(HERMES, {})):
        assert drive(tok, grammar, CALL) == (True, True)
        assert drive(tok, grammar, '<tool_call>\n{"name": "nope"')[0] is False
        assert drive(tok, grammar, CALL + " text")[0] is False
    auto = Tools([WX]).grammar(HERMES, {})
    assert drive(tok, auto, "Let me look.\n" + CALL) == (True, True) and drive(tok, auto, "hello") == (True, True)


def test_the_prose_before_a_call_may_hold_the_other_text_tokens(saved, tmp_path):
    """Qwen3 thinks in ``<think>`` ... ``</think>``, tokens of their own that are not special (llguidance takes every
    added token for special, so a grammar of plain text would keep the model from writing them)."""
    hf = transformers.AutoTokenizer.from_pretrained(saved)
    hf.add_tokens(["<think>", "</think>"])
    hf.save_pretrained(tmp_path / "think")
    tok = ours(tmp_path / "think")
    tags, words = tokens_of(tok, HERMES)
    assert words == [tok.token_id("<think>"), tok.token_id("</think>")]
    thought = "<think>\nthe weather\n</think>\n\n"
    assert drive(tok, Tools([WX]).grammar(HERMES, tags, words), thought + CALL) == (True, True)
    assert drive(tok, Tools([WX]).grammar(HERMES, tags), thought + CALL)[0] is False  # without them: refused


def test_a_llama3_call_may_lead_with_its_python_tag(saved, tmp_path):
    """Llama 3.1 and 3.2 often write ``<|python_tag|>`` (a special token) before a JSON call: the grammar allows it
    there, and only there; decoding drops it, so the call reads as it would without."""
    hf = transformers.AutoTokenizer.from_pretrained(saved)
    hf.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})
    hf.chat_template = (TEMPLATES / "llama3.1.jinja").read_text()
    hf.save_pretrained(tmp_path / "llama")
    tok = ours(tmp_path / "llama")
    tags, words = tokens_of(tok, LLAMA3_JSON)
    assert tags == {"<|python_tag|>": tok.token_id("<|python_tag|>")}
    call = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    for choice in ("auto", "required"):
        grammar = Tools([WX, ADD], choice).grammar(LLAMA3_JSON, tags, words)
        assert drive(tok, grammar, "<|python_tag|>" + call) == (True, True) and drive(tok, grammar, call) == (True, True)
    assert drive(tok, Tools([WX, ADD]).grammar(LLAMA3_JSON, tags, words), "Sure. <|python_tag|>")[0] is False
    req = Request({"model": "m", "messages": [{"role": "user", "content": "1+2?"}], "tools": [ADD]}, chat=True)
    plan = Plan(req, tok)
    assert plan.marks == {}  # nothing put back into the text: the reply reads as a call from its "{"
    choice = fed(plan, tok, "<|python_tag|>" + call, 0)
    assert [c["function"]["arguments"] for c in choice.all_calls()] == ['{"a": 1, "b": 2}']


def test_a_llama3_reply_is_a_call_or_text(saved):
    tok = ours(saved)
    auto = Tools([WX, ADD]).grammar(LLAMA3_JSON, {})
    call = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert drive(tok, auto, call) == (True, True) and drive(tok, auto, "It is sunny.") == (True, True)
    assert drive(tok, auto, '{"name": "add", "arguments"')[0] is False  # Llama 3.1's key is "parameters"
    assert drive(tok, Tools([WX, ADD], "required").grammar(LLAMA3_JSON, {}), "It")[0] is False
    calls = Calls(LLAMA3_JSON)
    assert calls.feed(call[:10]) + calls.feed(call[10:]) == "" and calls.end() == ""
    assert [c["function"] for c in calls.calls] == [{"name": "add", "arguments": '{"a": 1, "b": 2}'}]
    text = Calls(LLAMA3_JSON)
    assert text.feed(" It is") + text.feed(" {sunny}") + text.end() == " It is {sunny}" and not text.calls


def read(text: str, pieces: int) -> tuple[str, list]:
    calls = Calls(HERMES)
    size = max(1, len(text) // pieces)
    out = "".join(calls.feed(text[i:i + size]) for i in range(0, len(text), size)) + calls.end()
    return out, [c["function"] for c in calls.calls]


def test_calls_are_read_out_of_the_text_whole_or_streamed():
    text = "Let me look.\n" + CALL + "\n" + CALL2
    want = ("Let me look.\n", [{"name": "wx", "arguments": '{"city": "Paris"}'},
                               {"name": "add", "arguments": '{"a": 1, "b": 2.5}'}])
    for pieces in (1, 7, len(text)):  # whole, in chunks, a character at a time
        assert read(text, pieces) == want
    calls = Calls(HERMES)
    assert calls.feed("a <tool") == "a " and calls.feed("box") == "<toolbox"  # held only while it could be a mark
    assert calls.feed(CALL) == "" and [c["index"] for c in calls.new()] == [0] and calls.new() == []
    # a call the reply was cut in (max_tokens) or that does not read as one is text, never dropped
    assert read("hi " + CALL[:30], 1) == ("hi " + CALL[:30], [])
    broken = '<tool_call>\n{"name": "wx", "arguments": 3}\n</tool_call>'
    assert read(broken, 5) == (broken, [])


def test_bad_tools_are_refused_naming_what_was_wrong():
    cases = [([], "a non-empty list of"),
             ([{"type": "code_interpreter"}], "tools[0]="),
             ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name='a b': 1 to 64 letters"),
             ([WX, WX], "tools[1]: a second function named 'wx'"),
             ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters=[]")]
    for tools, fragment in cases:
        with pytest.raises(CallError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            Tools(tools)
    with pytest.raises(CallError, match="tool_choice names function 'mul', which is not among the tools: wx, add"):
        Tools([WX, ADD], {"type": "function", "function": {"name": "mul"}})
    with pytest.raises(CallError, match="tool_choice=always: none, auto, required or"):
        Tools([WX], "always")
    with pytest.raises(CallError, match="parallel_tool_calls=1: true or false"):
        Tools([WX], parallel=1)
    with pytest.raises(CallError, match=r"messages\[1\].tool_calls\[0\]=.*: a call is"):
        messages_for_template([CALLED[0], {"role": "assistant", "tool_calls": [{"function": {"name": "wx"}}]}])
    with pytest.raises(CallError, match=r"messages\[1\].tool_calls\[0\].function.arguments is not JSON"):
        messages_for_template([CALLED[0], {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "wx", "arguments": "{city"}}]}])
    assert not Tools([WX], "none").active and Tools([WX]).choice == "auto"
    none = {"type": "function", "function": {"name": "none", "parameters": {"type": "object"}}}
    named = Tools([WX, none], {"type": "function", "function": {"name": "none"}})  # a function may be named "none"
    assert named.active and (named.choice, named.named) == ("function", "none")


MISTRAL_SPECIALS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                    "[/TOOL_RESULTS]"]


@pytest.fixture(scope="module")
def mistral(saved, tmp_path_factory) -> Path:
    """The test tokenizer with Mistral 7B Instruct v0.3's template and control tokens (special: decoding drops them)."""
    hf = transformers.AutoTokenizer.from_pretrained(saved)
    hf.add_special_tokens({"additional_special_tokens": MISTRAL_SPECIALS})
    hf.chat_template = (TEMPLATES / "mistral-v0.3.jinja").read_text()
    path = tmp_path_factory.mktemp("mistral")
    hf.save_pretrained(path)
    return path


def test_mistral_calls_are_a_list_after_its_control_token(mistral):
    from tripy_build.runtime.tools import MISTRAL

    tok, hf = ours(mistral), transformers.AutoTokenizer.from_pretrained(mistral)
    assert format_of(tok.chat_template) is MISTRAL
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "a1b2c3d4e", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "sunny"}]
    read = messages_for_template(history)
    assert tok.render(read, tools=[WX, ADD]) == hf.apply_chat_template(read, tools=[WX, ADD], add_generation_prompt=True,
                                                                       tokenize=False)
    tags, words = tokens_of(tok, MISTRAL)
    assert tags == {"[TOOL_CALLS]": tok.token_id("[TOOL_CALLS]")} and not tok.decode([tags["[TOOL_CALLS]"]])
    one = '[TOOL_CALLS] [{"name": "wx", "arguments": {"city": "Paris"}}]'
    two = '[TOOL_CALLS] [{"name": "wx", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]'
    auto = Tools([WX, ADD]).grammar(MISTRAL, tags, words)
    assert drive(tok, auto, "Let me see. " + one) == (True, True) and drive(tok, auto, two) == (True, True)
    assert drive(tok, auto, "It is sunny.") == (True, True)
    assert drive(tok, auto, '[TOOL_CALLS] [{"name": "mul"')[0] is False
    assert drive(tok, Tools([WX, ADD], parallel=False).grammar(MISTRAL, tags, words), two)[0] is False
    assert drive(tok, Tools([WX, ADD], "required").grammar(MISTRAL, tags, words), "It")[0] is False
    # through OpenAI's answer: the control token is not decoded, yet the calls are read after it; ids of 9
    req = Request({"model": "m", "messages": history[:1], "tools": [WX, ADD]}, chat=True)
    plan = Plan(req, tok)
    assert plan.marks == {tags["[TOOL_CALLS]"]: "[TOOL_CALLS]"} and plan.ids == tok.chat(history[:1], tools=[WX, ADD])
    answer = req.answer([fed(plan, tok, two, tok.token_id("<|im_end|>"))], tok, 0)["choices"][0]
    assert answer["finish_reason"] == "tool_calls" and answer["message"]["content"] is None
    made = answer["message"]["tool_calls"]
    assert [c["function"] for c in made] == [{"name": "wx", "arguments": '{"city": "Paris"}'},
                                             {"name": "add", "arguments": '{"a": 1, "b": 2}'}]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in made)
    back = messages_for_template([*history[:1], answer["message"], {"role": "tool", "tool_call_id": made[0]["id"],
                                                                    "content": "sunny"}])
    assert f'"id": "{made[0]["id"]}"' in tok.render(back, tools=[WX])  # the template takes the ids given back
    calls = Calls(MISTRAL)
    assert calls.feed("[TOOL_CALLS] [{\"name\": \"wx\", \"argu") == "" and calls.end().startswith("[TOOL_CALLS]")
