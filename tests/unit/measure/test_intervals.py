"""Paired ratio estimates and the stopping rule (eagleflow.measure.intervals): the value is the ratio of sums, the
interval covers the truth about 95% of the time, narrows as rounds come in, and pairing beats two
independent windows when prompts differ."""

from __future__ import annotations

import math
import random

import pytest

from eagleflow.measure.intervals import (
    StoppingRule,
    acceptance_length,
    paired_speedup,
    ratio_of_sums,
    round_spread,
    t975,
)


def test_ratio_of_sums_and_its_interval():
    est = ratio_of_sums([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert est.value == 2.0 and est.low == est.high == 2.0 and est.n == 3  # no spread around the ratio
    assert ratio_of_sums([], []) is None and ratio_of_sums([1.0], [0.0]) is None
    one = ratio_of_sums([1.0], [2.0])
    assert one.value == 0.5 and math.isinf(one.rel_half_width)  # one round tells no spread


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = random.Random(0)
    covered, trials = 0, 400
    for _ in range(trials):
        x = [rng.uniform(1, 3) for _ in range(20)]
        y = [1.5 * xi + rng.gauss(0, 0.3) for xi in x]
        est = ratio_of_sums(y, x)
        covered += est.low <= 1.5 <= est.high
    assert 0.91 <= covered / trials <= 0.99, covered / trials


def test_pairing_cancels_prompt_to_prompt_variance():
    # Prompt lengths vary 4x; the drafter is 1.6x faster on each, with 5% noise of its own.
    rng = random.Random(1)
    base = [rng.uniform(1, 4) for _ in range(16)]
    new = [b / 1.6 * rng.uniform(0.95, 1.05) for b in base]
    est = paired_speedup(base, [100] * 16, new, [100] * 16)
    assert abs(est.value - 1.6) < 0.05 and est.rel_half_width < 0.03
    # The same speed measured on other prompts: the ratio of the two windows is far less certain.
    other = [rng.uniform(1, 4) / 1.6 for _ in range(16)]
    assert ratio_of_sums(base, other).rel_half_width > 3 * est.rel_half_width


def test_paired_speedup_uses_only_the_rounds_both_measured_and_scales_tokens():
    est = paired_speedup([1.0, 1.0, 9.0], [100, 100, 100], [0.5, 0.5], [100, 100])
    assert est.n == 2 and est.value == 2.0
    # a variant round that produced half the tokens is compared with half the baseline round's time
    assert paired_speedup([2.0], [100], [0.5], [50]).value == 2.0


def test_acceptance_length_is_one_plus_accepted_per_draft():
    est = acceptance_length([20.0, 22.0, 18.0], [10.0, 10.0, 10.0])
    assert est.value == 3.0 and est.low < 3.0 < est.high


def test_stopping_rule():
    rule = StoppingRule(precision=0.05, min_requests=8)
    tight = ratio_of_sums([2.0, 2.02, 1.98, 2.0], [1.0] * 4)
    loose = ratio_of_sums([1.0, 3.0, 1.5, 2.5], [1.0] * 4)
    assert not rule.done(4, [tight])  # fewer than min_requests
    assert rule.done(8, [tight, tight])
    assert not rule.done(8, [tight, loose])  # every interval must be within precision
    assert not rule.done(8, [tight, None])
    assert not StoppingRule(None, 2).done(100, [tight])  # fixed length
    assert t975(1) == 12.706 and t975(1000) == 1.96


def test_round_spread_is_the_larger_of_the_speedup_and_al_spreads():
    base, toks = [1.0] * 6, [100] * 6
    steady = [0.5] * 6  # 2x on every round
    al_drafts, al_acc = [10.0] * 6, [10.0, 30.0, 10.0, 30.0, 10.0, 30.0]  # AL 2, 4, 2, 4, ...
    spread = round_spread(base, toks, steady, toks, al_acc, al_drafts)
    assert spread == pytest.approx(1.0954451 / 3, rel=1e-6)  # the AL's: sd 1.095 over mean 3; the speedup's is 0
    assert round_spread(base[:3], toks[:3], steady[:3], toks[:3], al_acc[:3], al_drafts[:3]) is None
