"""``runtime/reasoning.py``: a reasoning model's thinking read off Qwen3's own chat template, split from the answer
whole or streamed (and through OpenAI's answer: ``reasoning_content`` beside ``content`` and tool calls), and a
grammar (a JSON schema, tool calls) held after the thinking rather than in place of it."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from examples.chat_checkpoint import tokenizer as byte_level  # noqa: E402
from tripy_build.runtime.reasoning import Thoughts, after_thinking, opened, thinks  # noqa: E402
from tripy_build.runtime.tools import HERMES, Tools, tokens_of  # noqa: E402
from tripy_build.serve.openai import Plan, Request  # noqa: E402

from test_tools import CALL, TEMPLATES, WX, drive, fed, ours  # noqa: E402

transformers.logging.set_verbosity_error()
# as DeepSeek-R1's: a past reply's thinking cut off at </think>, and the generation prompt opens the block itself
R1 = ("{% for m in messages %}<｜{{ m['role'] }}｜>{{ m['content'].split('</think>')[-1] }}{% endfor %}"
      "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")
ANSWER = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    """The test tokenizer with Qwen3's template and its ``<think>`` and ``</think>`` (tokens that are not special)."""
    root = tmp_path_factory.mktemp("qwen3")
    hf = transformers.AutoTokenizer.from_pretrained(byte_level(root / "base"))
    hf.add_tokens(["<think>", "</think>"])
    hf.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    hf.save_pretrained(root / "qwen3")
    return root / "qwen3"


def test_thinking_is_read_off_the_template_and_its_generation_prompt(qwen3):
    tok = ours(qwen3)
    assert thinks(tok.chat_template) and not thinks((TEMPLATES / "qwen2.5.jinja").read_text())
    hello = [{"role": "user", "content": "hello"}]
    assert not opened(tok.render(hello))  # the reply opens the block
    assert not opened(tok.render(hello, enable_thinking=False))  # an empty block closed in the prompt: no thinking
    assert opened(tok.render(hello, enable_thinking=False) + "<think>\n") and not opened("x</think>\n\n")
    history = [*hello, {"role": "assistant", "content": "Hi!", "reasoning_content": "a greeting"}]
    hf = transformers.AutoTokenizer.from_pretrained(qwen3)
    assert tok.render(history, add_generation_prompt=False) == hf.apply_chat_template(history, tokenize=False)
    assert "<think>\na greeting\n</think>\n\nHi!" in tok.render(history, add_generation_prompt=False)


def split(text: str, size: int, inside: bool = False) -> tuple[str, str]:
    thoughts = Thoughts(inside)
    parts = [thoughts.feed(text[i:i + size]) for i in range(0, len(text), size)] + [thoughts.end()]
    return "".join(t for t, _ in parts), "".join(a for _, a in parts)


def test_the_thinking_is_split_from_the_answer_whole_or_streamed():
    cases = [("<think>\nstep one\nstep two\n</think>\n\nThe answer.", False, ("step one\nstep two", "The answer.")),
             ("The answer, unthought.", False, ("", "The answer, unthought.")),
             ("  <thinking aloud> is text", False, ("", "  <thinking aloud> is text")),
             ("<think>\ncut at max_tokens", False, ("cut at max_tokens", "")),
             ("reasoned\n</think>\n\nanswered", True, ("reasoned", "answered")),  # the prompt opened the block
             ("<think></think>x", False, ("", "x"))]
    for text, inside, want in cases:
        for size in (1, 2, 5, len(text)):
            assert split(text, size, inside) == want, (text, size)


def test_a_grammar_holds_the_answer_after_the_thinking(qwen3):
    tok = ours(qwen3)
    marks = (tok.token_id("<think>"), tok.token_id("</think>"))
    schema = after_thinking(ANSWER, marks, inside=False)
    assert drive(tok, schema, '<think>\nhmm, yes\n</think>\n\n{"a": true}') == (True, True)
    assert drive(tok, schema, '{"a": false}') == (True, True)  # thinking is the model's to skip
    assert drive(tok, schema, '<think>\nhmm\n</think>\n\nno')[0] is False  # the answer is still held
    assert drive(tok, schema, "hmm")[0] is False
    opened_ = after_thinking(ANSWER, marks, inside=True)
    assert drive(tok, opened_, 'hmm\n</think>\n\n{"a": true}') == (True, True)
    assert drive(tok, opened_, '{"a": true}') == (True, False)  # still thinking: the block must close first
    tags, words = tokens_of(tok, HERMES)
    calls = after_thinking(Tools([WX], "required").grammar(HERMES, tags, words), marks, inside=False)
    assert drive(tok, calls, "<think>\nthe weather\n</think>\n\n" + CALL) == (True, True)
    assert drive(tok, calls, "<think>\nx\n</think>\n\nsunny")[0] is False


def reply(plan: Plan, req: Request, tok, text: str):
    """Plan's first choice fed ``text``'s tokens, then an end id: the stream's deltas and the whole answer."""
    deltas = []

    def step(thought: str, content: str, calls: list) -> None:
        deltas.append(req.chunk(content or None, calls=calls, reasoning=thought)["choices"][0]["delta"])
    choice = fed(plan, tok, text, tok.token_id("<|im_end|>"), step)
    return deltas, req.answer([choice], tok, 0)["choices"][0]


def test_openais_answer_carries_the_thinking_apart_streamed_or_not(qwen3):
    tok = ours(qwen3)
    hello = [{"role": "user", "content": "hello"}]
    req = Request({"model": "m", "messages": hello}, chat=True)
    plan = Plan(req, tok)
    assert plan.thinking and not plan.inside and plan.grammar is None and plan.ids == tok.chat(hello)
    deltas, answer = reply(plan, req, tok, "<think>\nthey greet\n</think>\n\nHello!")
    assert answer["message"] == {"role": "assistant", "content": "Hello!", "reasoning_content": "they greet"}
    assert answer["finish_reason"] == "stop"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "they greet"
    assert "".join(d.get("content") or "" for d in deltas) == "Hello!"
    tools = Request({"model": "m", "messages": hello, "tools": [WX]}, chat=True)
    plan = Plan(tools, tok)
    assert plan.grammar.startswith("start: (<[")  # the calls' grammar after the thinking
    deltas, answer = reply(plan, tools, tok, "<think>\nweather?\n</think>\n\n" + CALL)
    assert answer["finish_reason"] == "tool_calls" and answer["message"]["content"] is None
    assert answer["message"]["reasoning_content"] == "weather?"
    assert [c["function"]["name"] for c in answer["message"]["tool_calls"]] == ["wx"]
    assert [c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", [])] == ['{"city": "Paris"}']
    off = Request({"model": "m", "messages": hello, "chat_template_kwargs": {"enable_thinking": False}}, chat=True)
    plan = Plan(off, tok)
    assert not plan.inside and plan.ids == tok.chat(hello, enable_thinking=False)
    assert reply(plan, off, tok, "Hello!")[1]["message"] == {"role": "assistant", "content": "Hello!",
                                                              "reasoning_content": None}


def test_the_thinkings_tokens_are_counted_as_reasoning_tokens(qwen3):
    """OpenAI's ``usage.completion_tokens_details.reasoning_tokens``: the block's tokens, its marks with them; the
    answer's and the end id's not."""
    tok = ours(qwen3)
    req = Request({"model": "m", "messages": [{"role": "user", "content": "hello"}]}, chat=True)
    plan = Plan(req, tok)
    thinking, answer = "<think>\nthey greet\n</think>", "\n\nHello!"
    choice = fed(plan, tok, thinking + answer, tok.token_id("<|im_end|>"))
    count = len(tok._fast.encode(thinking, add_special_tokens=False).ids)
    made = len(tok._fast.encode(thinking + answer, add_special_tokens=False).ids) + 1
    assert count >= 6 and made > count + 2
    assert req.answer([choice], tok, 5)["usage"] == {
        "prompt_tokens": 5, "completion_tokens": made, "total_tokens": 5 + made,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": count}}
    unthought = fed(plan, tok, "Hello!", tok.token_id("<|im_end|>"))
    assert req.answer([unthought], tok, 5)["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_a_prompt_that_opens_the_block_starts_the_reply_inside_it(qwen3, tmp_path):
    hf = transformers.AutoTokenizer.from_pretrained(qwen3)
    hf.chat_template = R1
    hf.save_pretrained(tmp_path / "r1")
    tok = ours(tmp_path / "r1")
    req = Request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, chat=True)
    plan = Plan(req, tok)
    assert plan.thinking and plan.inside
    _, answer = reply(plan, req, tok, "they say hi\n</think>\n\nHi.")
    assert answer["message"] == {"role": "assistant", "content": "Hi.", "reasoning_content": "they say hi"}
