"""benchmark.k_sweep's table (eagleflow.measure.k_sweep.summarize): each k's windows paired with the same baseline,
read over production's traffic where it is stated, else at the first setting; the fastest k, and what to launch."""

from __future__ import annotations

import pytest

from eagleflow.config import BenchmarkConfig
from eagleflow.config.production import TrafficCell
from eagleflow.contracts.benchmark_records import Measurement
from eagleflow.measure.k_sweep import summarize, sweep_markdown
from tests.helpers.records import window

ROUNDS = 8


def rounds(variant: str, tok_s: float, t: float, c: int, al: float | None = None, jitter: float = 0.02) -> Measurement:
    """A window of ROUNDS rounds of c requests, 64 tokens each, at `tok_s` (a little spread, so intervals exist)."""
    w = window(variant, tok_s, al, t=t, c=c)
    tokens = 64 * c
    w.round_tokens = [tokens] * ROUNDS
    w.round_seconds = [tokens / tok_s * (1 + jitter * (-1) ** i) for i in range(ROUNDS)]
    return w


B = BenchmarkConfig(temperatures=[0.0, 1.0], concurrencies=[1, 8], num_speculative_tokens=3, k_sweep=[2, 3, 5])
BASE = [rounds("baseline", 100.0, t, c) for t in (0.0, 1.0) for c in (1, 8)]


def drafter_at(speed: dict[tuple[float, int], float], al: float, jitter: float = 0.02) -> list[Measurement]:
    return [rounds("drafter", 100.0 * x, t, c, al, jitter) for (t, c), x in speed.items()]


def test_the_fastest_k_at_the_first_setting_and_what_to_launch():
    by_k = {
        2: drafter_at({(0.0, 1): 1.5, (0.0, 8): 1.2, (1.0, 1): 1.3, (1.0, 8): 1.1}, 2.4),
        3: drafter_at({(0.0, 1): 1.8, (0.0, 8): 1.1, (1.0, 1): 1.2, (1.0, 8): 0.9}, 3.0),
        5: drafter_at({(0.0, 1): 2.0, (0.0, 8): 0.9, (1.0, 1): 1.0, (1.0, 8): 0.7}, 3.6),
    }
    s = summarize(B, BASE, by_k, [], 0.1)
    assert [r.k for r in s.rows] == [2, 3, 5] and s.over == "temperature 0, concurrency 1"
    assert s.best_k == 5 and s.rows[2].speedup == pytest.approx(2.0, rel=0.01)
    assert s.rows[2].mean_acceptance_length == 3.6 and s.rows[2].speedup_ci is not None
    assert "launch production with num_speculative_tokens 5" in s.summary and "configured k=3" in s.summary
    assert "| 3 (configured) | 1.80x |" in "\n".join(sweep_markdown(s))


def test_over_productions_traffic_the_k_of_its_busy_sampled_cell_wins():
    """The same drafters, production serving 80% at temperature 1.0 / concurrency 8: k=2, the slowest at the first
    setting, serves the mix fastest; the deep k that wins greedy one at a time is slower than no speculation there."""
    traffic = [
        TrafficCell(temperature=1.0, concurrency=8, share=0.8, name="thinking"),
        TrafficCell(temperature=0.0, concurrency=1, share=0.2, name="greedy"),
    ]
    by_k = {
        2: drafter_at({(0.0, 1): 1.5, (0.0, 8): 1.2, (1.0, 1): 1.3, (1.0, 8): 1.1}, 2.4),
        5: drafter_at({(0.0, 1): 2.0, (0.0, 8): 0.9, (1.0, 1): 1.0, (1.0, 8): 0.7}, 3.6),
    }
    s = summarize(B, BASE, by_k, traffic, 0.1)
    assert s.over == "production's traffic" and s.best_k == 2
    mix2 = 1 / (0.8 / 1.1 + 0.2 / 1.5)
    assert s.rows[0].speedup == pytest.approx(mix2, rel=0.01)
    assert (
        "k=2 serves fastest over production's traffic" in s.summary
        and "not measured at the configured k=3" in s.summary
    )


def test_when_no_k_beats_no_speculation_it_says_so_instead_of_naming_a_k_to_launch():
    """The demo drafter over Kimi-K2.5's traffic on an H100 (docs/benchmarks.md): k=4 read 0.97x (0.93-1.01), the
    configured k=3 0.79x; the sweep said "launch production with num_speculative_tokens 4", a k that pays nothing."""
    by_k = {
        3: drafter_at({(0.0, 1): 0.79}, 3.0, jitter=0.05),
        4: drafter_at({(0.0, 1): 0.99}, 3.4, jitter=0.05),
    }
    s = summarize(B.model_copy(update={"k_sweep": [3, 4]}), BASE, by_k, [], 0.1)
    lo, hi = s.rows[1].speedup_ci
    assert s.best_k == 4 and lo < 1.0 < hi
    assert s.summary.startswith("no k serves faster than no speculation beyond noise over temperature 0")
    assert "launch production" not in s.summary and "configured k=3 0.79x" in s.summary


def test_the_configured_k_fastest_says_so():
    by_k = {3: drafter_at({(0.0, 1): 1.8}, 3.0), 2: drafter_at({(0.0, 1): 1.4}, 2.4)}
    s = summarize(B, BASE, by_k, [], 0.1)
    assert s.best_k == 3 and s.summary.startswith("k=3 (benchmark.num_speculative_tokens) serves fastest")


def test_a_sweep_needs_an_engine_of_its_own_and_sane_ks():
    with pytest.raises(ValueError, match="k_sweep \\[2, 4\\] needs drafter_on 'engine'"):
        BenchmarkConfig(k_sweep=[4, 2], drafter_on="production")
    with pytest.raises(ValueError, match="distinct values in \\[1, 16\\]"):
        BenchmarkConfig(k_sweep=[2, 2])
    assert BenchmarkConfig(k_sweep=[5, 1, 3]).k_sweep == [1, 3, 5]


def test_a_best_k_within_noise_of_the_configured_one_is_not_pressed():
    """The integration run's untrained drafters: k=2 0.50x (0.00-1.43) against 0.50x (0.00-1.28) at k=3."""
    noisy = {
        2: drafter_at({(0.0, 1): 1.52}, 2.4, jitter=-0.3),  # rounds that swing +-30%, against the baseline's 2%
        3: drafter_at({(0.0, 1): 1.50}, 3.0, jitter=0.3),
    }
    s = summarize(B, BASE, noisy, [], 0.1)
    assert s.best_k == 2 and not s.beyond_noise
    assert "within noise of" in s.summary and "keep it" in s.summary and "launch production" not in s.summary
