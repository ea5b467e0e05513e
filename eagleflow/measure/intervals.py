"""Paired ratio estimates with 95% intervals, and the benchmark's sequential stopping rule.

The sampling unit is a *round*: the same held-out prompts sent to each variant at one setting (one
prompt at concurrency 1, `c` at concurrency c), greedy or with the same seeds. Pairing rounds across
variants cancels most of the prompt-to-prompt variance (a long prompt is slow for both), so the paired
speedup converges in far fewer requests than two independent throughputs would.

Both figures are ratios of sums over rounds:
- speedup = sum(baseline seconds) / sum(variant seconds), each baseline round scaled to the variant's
  output tokens (equal with `ignore_eos`, so it is the throughput ratio over the paired rounds);
- acceptance length = 1 + sum(accepted drafts) / sum(drafting steps).

Their interval is the delta method's (Cochran's ratio estimator, as in survey sampling): with
R = sum(y) / sum(x) over n rounds, var(R) ~ sum((y_i - R x_i)^2) / ((n - 1) n mean(x)^2), and the
half-width is Student's t(0.975, n - 1) times its square root. Pure standard library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom 1..30; 1.96 beyond.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Estimate:
    """A ratio of sums over n paired rounds and its 95% interval [low, high]."""

    value: float
    low: float
    high: float
    n: int
    paired: bool = True  # False: two windows measured at different times (`unpaired_speedup`)

    @property
    def rel_half_width(self) -> float:
        """Half the interval's width over the value: 0.03 is 'within +-3%'."""
        return (self.high - self.low) / 2 / abs(self.value) if self.value else math.inf

    def shifted(self, by: float) -> Estimate:
        return Estimate(self.value + by, self.low + by, self.high + by, self.n, self.paired)


def ratio_of_sums(y: Sequence[float], x: Sequence[float]) -> Estimate | None:
    """sum(y) / sum(x) over paired units, with its 95% interval; None with no unit or sum(x) == 0.
    One unit has an unbounded interval (no spread is known yet)."""
    n = min(len(y), len(x))
    y, x = list(y[:n]), list(x[:n])
    if n == 0 or sum(x) <= 0:
        return None
    r = sum(y) / sum(x)
    if n == 1:
        return Estimate(r, -math.inf, math.inf, 1)
    mean_x = sum(x) / n
    var = sum((yi - r * xi) ** 2 for yi, xi in zip(y, x)) / ((n - 1) * n * mean_x**2)
    half = t975(n - 1) * math.sqrt(var)
    return Estimate(r, r - half, r + half, n)


def paired_speedup(
    base_s: Sequence[float], base_tokens: Sequence[int], var_s: Sequence[float], var_tokens: Sequence[int]
) -> Estimate | None:
    """The variant's throughput over the baseline's on the rounds both measured (the first min(n) rounds:
    every variant sends the held-out prompts in the same order). Each baseline round's seconds are
    scaled to the variant's tokens in that round, so unequal answer lengths cannot bias it."""
    n = min(len(base_s), len(var_s))
    y = [base_s[i] * var_tokens[i] / base_tokens[i] if base_tokens[i] else 0.0 for i in range(n)]
    return ratio_of_sums(y, list(var_s[:n]))


def unpaired_speedup(
    base_s: Sequence[float], base_tokens: Sequence[int], var_s: Sequence[float], var_tokens: Sequence[int]
) -> Estimate | None:
    """The variant's throughput over the baseline's when the two windows were measured at different times (one reused
    from an earlier run): the same prompts, but not the same hour, so the machine's load and clocks did not cancel
    and the rounds are not paired. Each window's throughput (tokens over seconds, a ratio of sums over its own rounds)
    has its own interval; the ratio's interval carries both spreads (on the log scale, their variances add), with
    the smaller window's degrees of freedom. On the first min(n) rounds, as `paired_speedup`: the same prompts."""
    n = min(len(base_s), len(var_s))
    b = ratio_of_sums(list(base_tokens[:n]), list(base_s[:n]))
    v = ratio_of_sums(list(var_tokens[:n]), list(var_s[:n]))
    if b is None or v is None or b.value <= 0:
        return None
    r, n = v.value / b.value, min(b.n, v.n)
    if n < 2:
        return Estimate(r, -math.inf, math.inf, n, paired=False)
    se = math.hypot(b.rel_half_width / t975(b.n - 1), v.rel_half_width / t975(v.n - 1))
    half = t975(n - 1) * se
    return Estimate(r, r * math.exp(-half), r * math.exp(half), n, paired=False)


def widened(est: Estimate, spread: float, df: int) -> Estimate:
    """A throughput ratio between two engines with the engine-to-engine spread in its interval.

    `spread`: the standard deviation of log throughput from one engine to the next at the same setting (the engine
    process's own luck: threads, memory, the host's other work in its hour), measured by serving no speculation
    twice (eagleflow.measure.verdict.engine_spread) with `df` degrees of freedom. Rounds paired between two engines
    cancel the prompts' spread but not the engines' offsets; each engine adds its own, so the ratio's log carries
    2 spread^2 beyond its rounds' variance. Student's t at the smaller of the two degrees of freedom."""
    if est.n < 2 or not (math.isfinite(est.low) and math.isfinite(est.high)) or est.value <= 0:
        return est
    se = math.hypot(est.rel_half_width / t975(est.n - 1), math.sqrt(2.0) * spread)
    half = t975(min(est.n - 1, df)) * se
    return Estimate(est.value, est.value * math.exp(-half), est.value * math.exp(half), est.n, est.paired)


def acceptance_length(accepted: Sequence[float], drafts: Sequence[float]) -> Estimate | None:
    """1 + accepted drafts per drafting step, over rounds."""
    est = ratio_of_sums(accepted, drafts)
    return est.shifted(1.0) if est else None


@dataclass(frozen=True)
class StoppingRule:
    """A window stops once every tracked interval is within `precision` (relative half-width) and at least
    `min_requests` were measured; it never sends more than its prompts. precision None: fixed length."""

    precision: float | None
    min_requests: int

    def done(self, requests: int, estimates: Sequence[Estimate | None]) -> bool:
        if self.precision is None or requests < self.min_requests:
            return False
        return all(e is not None and e.rel_half_width <= self.precision for e in estimates)


def round_spread(
    base_s: Sequence[float],
    base_tokens: Sequence[int],
    var_s: Sequence[float],
    var_tokens: Sequence[int],
    accepted: Sequence[float],
    drafts: Sequence[float],
) -> float | None:
    """The larger relative spread (sd / mean) of a drafter's per-round speedup over the baseline and of its
    per-round AL: what a window's stopping point depends on (expected rounds ~ (t * spread / precision)^2).
    None with fewer than 4 paired rounds."""
    n = min(len(base_s), len(var_s), len(accepted), len(drafts))
    if n < 4:
        return None
    speed = [base_s[i] * var_tokens[i] / base_tokens[i] / var_s[i] for i in range(n) if base_tokens[i] and var_s[i]]
    al = [1 + accepted[i] / drafts[i] for i in range(n) if drafts[i]]
    spreads = [_cv(x) for x in (speed, al) if len(x) >= 4]
    return max(spreads) if spreads else None


def _cv(x: list[float]) -> float:
    mean = sum(x) / len(x)
    return math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1)) / mean
