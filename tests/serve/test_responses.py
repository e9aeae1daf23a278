"""``serve/responses.py``: a Responses API request read as the chat request it means, and the events a reply's
thinking, text and calls stream as (the tiny model's run over HTTP is in ``test_text.py``)."""

from __future__ import annotations

import pytest

from tripy_build.errors import CallError
from tripy_build.serve.responses import Answer, chat_body

TOOL = {"type": "function", "name": "wx", "description": "weather", "parameters": {"type": "object"}}


def test_input_items_are_the_conversation_as_chat_messages():
    body = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5,
            "tools": [TOOL], "tool_choice": {"type": "function", "name": "wx"},
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
            "input": [{"role": "developer", "content": "Use tools."},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"},
                                                                      {"type": "input_text", "text": "Now."}]},
                      {"type": "reasoning", "id": "rs_1", "summary": [],
                       "content": [{"type": "reasoning_text", "text": "they want weather"}]},
                      {"type": "function_call", "call_id": "c1", "name": "wx", "arguments": '{"city": "Paris"}'},
                      {"type": "function_call", "call_id": "c2", "name": "wx", "arguments": '{"city": "Lyon"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                      {"type": "function_call_output", "call_id": "c2", "output": {"sky": "clear"}}]}
    chat = chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Paris?\nNow."},
        {"role": "assistant", "content": None, "reasoning_content": "they want weather", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"sky": "clear"}'}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "wx", "description": "weather",
                                                               "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "wx"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    assert (chat["max_tokens"], chat["temperature"]) == (9, 0.5)
    assert chat_body({"model": "m", "input": "Hi"})["messages"] == [{"role": "user", "content": "Hi"}]


def test_what_cannot_be_meant_here_is_refused_by_name():
    for bad, fragment in [({"input": []}, '"input" must be a non-empty string or list of items'),
                          ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role='tool'"),
                          ({"input": [{"type": "web_search_call"}]}, "input[0] of type 'web_search_call'"),
                          ({"include": ["reasoning.encrypted_content"]}, "'include' is not an option"),
                          ({"metadata": {"a": "b"}}, "metadata: this server keeps no responses"),
                          ({"instructions": 3}, "instructions=3: a string"),
                          ({"max_output_tokens": 0}, "max_output_tokens=0: must be an integer of at least 1")]:
        with pytest.raises(CallError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            chat_body({"model": "m", "input": "Hi", **bad})


def test_the_events_open_and_close_each_item_in_order():
    answer = Answer({"model": "m"}, {"model": "m"})
    events = answer.start()
    events += answer.feed("they greet", "", [])
    events += answer.feed("", "Hel", [])
    events += answer.feed("", "lo", [{"id": "call_1", "function": {"name": "wx", "arguments": "{}"}}])
    events += answer.end("stop", {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                                  "prompt_tokens_details": {"cached_tokens": 3},
                                  "completion_tokens_details": {"reasoning_tokens": 2}})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hello" and final["status"] == "completed"
    assert final["output"][2]["call_id"] == "call_1" and final["usage"] == {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 12}
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
