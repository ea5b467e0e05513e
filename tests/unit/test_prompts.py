import json

import pytest

from eagleflow.prompts import PromptError, load_prompts, split_indices


def test_load_both_shapes(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "hi"}) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n")
    assert load_prompts(p) == [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]


@pytest.mark.parametrize("text, match", [
    ("", "holds no prompts"),
    ("{not json\n", r"p.jsonl:1: not valid JSON"),
    ('{"x": 1}\n', r"p.jsonl:1: expected an object"),
    ('{"messages": [{"role": "user", "content": "  "}]}\n', "user message is empty"),
    ('{"messages": [{"role": "assistant", "content": "a"}]}\n', "last message must be the user"),
])
def test_bad_prompt_files_name_path_and_line(tmp_path, text, match):
    p = tmp_path / "p.jsonl"
    p.write_text(text)
    with pytest.raises(PromptError, match=match):
        load_prompts(p)


def test_missing_file(tmp_path):
    with pytest.raises(PromptError, match="generate.prompts_path"):
        load_prompts(tmp_path / "none.jsonl")


def test_split_is_seeded_and_disjoint():
    train, hold = split_indices(100, 50, 10, seed=3)
    assert (train, hold) == split_indices(100, 50, 10, seed=3)
    assert len(hold) == 10 and len(train) == 40 and not set(train) & set(hold)
    with pytest.raises(PromptError, match="num_samples"):
        split_indices(10, 50, 5, seed=0)
