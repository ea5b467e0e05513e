"""Prompt files (eagleflow.contracts.prompts): both line shapes, every malformed file named with path and line,
the seeded train/holdout split, and the held-out prompts the benchmark sends."""

import json

import pytest

from eagleflow.contracts.prompts import PromptError, holdout_prompts, load_prompts, split_indices


def test_load_both_shapes(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(
        json.dumps({"prompt": "hi"}) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n"
    )
    assert load_prompts(p) == [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "holds no prompts"),
        ("{not json\n", r"p.jsonl:1: not valid JSON"),
        ('{"x": 1}\n', r"p.jsonl:1: expected an object"),
        ('{"messages": [{"role": "user", "content": "  "}]}\n', "user message is empty"),
        ('{"messages": [{"role": "assistant", "content": "a"}]}\n', "last message must be the user"),
    ],
)
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


def test_holdout_prompts_are_the_held_out_split_in_sample_order(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(100)))
    _, hold = split_indices(100, 50, 10, seed=3)
    held = holdout_prompts(p, 50, 10, seed=3)
    assert held == [[{"role": "user", "content": f"q{i}"}] for i in hold]
    assert holdout_prompts(p, 50, 10, seed=3, n=4) == held[:4]  # the benchmark's first n
    assert holdout_prompts(p, 50, 10, seed=4) != held  # another seed, another sample
    with pytest.raises(PromptError, match="num_samples"):
        holdout_prompts(p, 500, 10, seed=3)
