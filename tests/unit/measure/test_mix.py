"""The verdict over production's traffic (production.traffic, eagleflow.measure.mix; issue 40): each cell's paired
speedup weighted by its share of output tokens, with its interval; a cell carrying a real share that serves slower
beyond noise is a finding, and the nightly's gate keeps such a drafter out though it is faster at the benchmark's
first setting."""

from __future__ import annotations

import pytest
import yaml

from eagleflow.config import ConfigError, ProductionConfig, parse_config
from eagleflow.contracts.benchmark_records import SpeedupRow
from eagleflow.measure.mix import weigh
from eagleflow.measure.verdict import judge
from eagleflow.nightly.promotion import PromotionGate, decide
from eagleflow.reporting.report import Report
from tests.conftest import ROOT
from tests.helpers.records import window

# Kimi-K2.5's serving, as Moonshot's platform fixes it: thinking (1.0 / 0.95) most, instant (0.6 / 0.95) the rest.
KIMI = [
    {"name": "thinking", "temperature": 1.0, "top_p": 0.95, "concurrency": 8, "share": 0.7},
    {"name": "instant", "temperature": 0.6, "top_p": 0.95, "concurrency": 8, "share": 0.3},
]


def traffic(cells=KIMI) -> list:
    return ProductionConfig(traffic=cells).traffic


def row(t: float, c: int, s: float, ci: list[float]) -> SpeedupRow:
    return SpeedupRow(temperature=t, concurrency=c, drafter_vs_baseline=s, drafter_vs_baseline_ci=ci, paired_rounds=8)


def test_the_mix_is_the_share_weighted_time_to_serve_the_same_tokens():
    rows = [row(1.0, 8, 0.8, [0.75, 0.85]), row(0.6, 8, 2.0, [1.9, 2.1]), row(0.0, 1, 3.0, [2.9, 3.1])]
    mix = weigh(rows, traffic(), 0.1)
    # 1 / (0.7 / 0.8 + 0.3 / 2.0): slower where 70% is served outweighs 2x on the rest; (0, 1) is not production's
    assert mix.speedup == pytest.approx(1 / (0.7 / 0.8 + 0.3 / 2.0))
    # each cell's standard error from its interval (t at 7 degrees of freedom), by the delta method
    se = [0.05 / 2.365, 0.1 / 2.365]
    half = 1.96 * (0.7**2 * se[0] ** 2 / 0.8**4 + 0.3**2 * se[1] ** 2 / 2.0**4) ** 0.5 * mix.speedup**2
    assert mix.speedup_ci == pytest.approx([mix.speedup - half, mix.speedup + half])
    assert [c.name for c in mix.cells] == ["thinking", "instant"]  # largest share first
    assert mix.decided_by.startswith("thinking: temperature 1, top_p 0.95 / concurrency 8 (70% of the traffic)")
    assert (
        len(mix.slower) == 1 and mix.slower[0].startswith("thinking:") and "0.80x (95% CI 0.75-0.85)" in mix.slower[0]
    )
    # within noise of parity, or under the floor share: no finding of its own
    assert weigh([row(1.0, 8, 0.97, [0.9, 1.04]), rows[1]], traffic(), 0.1).slower == []
    assert weigh(rows, traffic(), 0.75).slower == []


def test_a_cell_the_benchmark_did_not_measure_leaves_the_mix_unknown():
    mix = weigh([row(1.0, 8, 1.2, [1.1, 1.3])], traffic(), 0.1)
    assert mix.speedup is None and mix.cells[1].speedup is None
    assert weigh([row(1.0, 8, 1.2, [1.1, 1.3])], [], 0.1) is None  # no traffic given: as before


def rounds(variant: str, t: float, c: int, seconds: float, al: float | None = None):
    jitter = [1.0, 1.04, 0.97, 1.02, 0.99, 1.03, 0.98, 1.01]
    return window(variant, 100 / seconds, al, t=t, c=c).model_copy(
        update=dict(round_seconds=[seconds * j for j in jitter], round_tokens=[100] * 8)
    )


def faster_greedy_slower_sampled() -> list:
    """2x at (0, 1); 0.8x at (1.0, 8), where production serves 70% of its tokens; 1.5x at (0.6, 8)."""
    out = []
    for t, c, speed in ((0.0, 1, 2.0), (1.0, 8, 0.8), (0.6, 8, 1.5)):
        out += [rounds("baseline", t, c, 1.0), rounds("drafter", t, c, 1.0 / speed, al=2.5)]
    return out


def report(verdict) -> Report:
    return Report(
        run="nightly-3",
        created="2026-12-05T02:00:00Z",
        baseline=window("baseline", 100.0),
        drafter=window("drafter", 200.0, 2.5).model_copy(update={"al_interval": [2.4, 2.6]}),
        speedup=2.0,
        verdict=verdict,
        drafter_dir="/runs/export/k/vllm",
        stages={},
        path="/reports/r/report.json",
    )


def test_a_drafter_faster_at_the_first_setting_but_slower_where_production_serves_is_not_promoted():
    windows = faster_greedy_slower_sampled()
    gate = PromotionGate(min_speedup=1.0, min_acceptance_length=1.5)
    # Judged at the benchmark's first setting (no traffic given): 2x, promoted.
    plain = judge(windows, {"drafter": None}, suspect_ratio=0.6)
    assert plain.mix is None and decide(report(plain), None, gate).promote
    # Judged over production's traffic: the verdict leads with the mix and names the slow cell; the gate refuses.
    v = judge(windows, {"drafter": None}, suspect_ratio=0.6, traffic=traffic())
    assert v.summary.startswith("the new drafter serves 0.9") and "over production's traffic (95% CI" in v.summary
    assert "weighed most by thinking: temperature 1, top_p 0.95 / concurrency 8 (70% of the traffic)" in v.summary
    assert v.findings[0].startswith("SLOWER where production serves, beyond noise: thinking:")
    d = decide(report(v), None, gate)
    assert not d.promote
    assert any(r.startswith("speedup over production's traffic 0.9") for r in d.reasons), d.reasons
    assert any(r.startswith("slower than no speculation where production serves") for r in d.reasons), d.reasons


def demo_with(traffic_cells, **benchmark) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    for k in ("temperatures", "concurrencies"):
        data["benchmark"].pop(k, None)
    data["benchmark"].update(benchmark)
    data["production"] = {**(data.get("production") or {}), "traffic": traffic_cells}
    return data


def test_the_benchmark_measures_the_traffics_cells_largest_share_first():
    cfg = parse_config(demo_with(KIMI), "demo")
    # temperature 0 besides: where the offline estimate applies (the verdict's acceptance check reads it there)
    b = cfg.benchmark
    assert (b.temperatures, b.concurrencies, b.top_p) == ([1.0, 0.6, 0.0], [8], 0.95)
    # given, the benchmark's settings must cover the traffic; top_p must be the traffic's
    with pytest.raises(ConfigError, match=r"benchmark.temperatures \[0.0, 1.0\] leaves out \[0.6\]"):
        parse_config(demo_with(KIMI, temperatures=[0.0, 1.0]), "demo")
    assert parse_config(demo_with(KIMI, temperatures=[0.6, 1.0]), "demo").benchmark.temperatures == [0.6, 1.0]
    with pytest.raises(ConfigError, match="benchmark.top_p 0.9 is not production.traffic's 0.95"):
        parse_config(demo_with(KIMI, top_p=0.9), "demo")


@pytest.mark.parametrize(
    ("cells", "says"),
    [
        ([{**KIMI[0], "share": 0.5}, KIMI[1]], "shares sum to 0.800"),
        ([KIMI[0], {**KIMI[0], "share": 0.3}], "names one temperature and concurrency twice"),
        ([KIMI[0], {**KIMI[1], "top_p": 0.8}], "eagleflow measures one top_p"),
    ],
)
def test_a_traffic_that_cannot_be_measured_is_refused_by_name(cells, says):
    with pytest.raises(ConfigError, match=says):
        parse_config(demo_with(cells), "demo")


def test_the_report_shows_each_cell_and_the_whole():
    from eagleflow.measure.verdict import render_markdown

    windows = faster_greedy_slower_sampled()
    v = judge(windows, {"drafter": None}, suspect_ratio=0.6, traffic=traffic())
    md = render_markdown("r", windows, v, 3)
    table = md.split("## Production's traffic (production.traffic)")[1]
    assert (
        "| thinking | 1 | 0.95 | 8 | 70% | 0.80x |" in table and "| instant | 0.6 | 0.95 | 8 | 30% | 1.50x |" in table
    )
    assert f"Over the whole mix: **{v.mix.speedup:.2f}x** (95% CI" in table
