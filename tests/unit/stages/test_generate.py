"""Sampled answers' seeds (eagleflow.stages.generate.answer_seeds): a function of generate.seed and the prompt, so
a shard generated again, resumed, or a request sent again after production came back, answers the same. The
engine's side (a seed repeats an answer) is tests/integration/production/test_window.py's restart case."""

from __future__ import annotations

from eagleflow.config import load_config
from eagleflow.stages.generate import answer_seeds
from tests.conftest import ROOT


def cfg(**generate: object):
    return load_config(ROOT / "configs" / "demo.yaml", {f"generate.{k}": v for k, v in generate.items()})


def test_greedy_answers_carry_no_seed():
    assert answer_seeds(cfg(), [0, 1, 2]) is None


def test_a_sampled_answer_is_seeded_by_its_prompt_and_generate_seed_alone():
    c = cfg(temperature=1.0, top_p=0.95)
    seeds = answer_seeds(c, [5, 9, 700])
    assert seeds is not None and len(set(seeds)) == 3
    assert answer_seeds(c, [700, 5]) == [seeds[2], seeds[0]]  # whichever shard or resend carries the prompt
    other = answer_seeds(cfg(temperature=1.0, top_p=0.95, seed=1), [5, 9, 700])
    assert other is not None and not set(other) & set(seeds)
    assert all(0 <= s < 2**31 for s in seeds + other)
