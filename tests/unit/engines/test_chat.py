"""The chat client (eagleflow.engines.chat): an answer with neither content nor reasoning is an error;
content and reasoning are read from either field name the servers use."""

from __future__ import annotations

from eagleflow.engines.chat import parse_choice


def test_answer_without_content_is_an_error():
    assert parse_choice(0, {"choices": [{"message": {"content": None}, "finish_reason": "length"}]}).error
    assert parse_choice(0, {"oops": 1}).error
    r = parse_choice(0, {"choices": [{"message": {"content": "x", "reasoning_content": "r"}}],
                         "usage": {"completion_tokens": 3}})
    assert (r.error, r.content, r.reasoning, r.completion_tokens) == (None, "x", "r", 3)
    assert parse_choice(0, {"choices": [{"message": {"content": None, "reasoning": "r"}}]}).reasoning == "r"
