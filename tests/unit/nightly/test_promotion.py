"""The nightly retrain's promotion gate (eagleflow.nightly.promotion.decide): every reason a drafter is not
promoted, promotion when all checks pass, and the record it then writes."""

from __future__ import annotations

import pytest

from eagleflow.contracts.benchmark_records import SpeedupRow
from eagleflow.nightly.promotion import Decision, PromotionGate, PromotionRecord, decide, promotion_record_path
from eagleflow.reporting.report import Report
from tests.helpers.records import window

GATE = PromotionGate(min_speedup=1.0, min_acceptance_length=1.5)


def report(
    al: float | None = 3.0,
    speedup: float = 1.4,
    suspect: bool = False,
    current_tok_s: float | None = None,
    drafter_dir: str | None = "/runs/export/k/vllm",
) -> Report:
    drafter = window("drafter", 140.0, al) if al is not None else window("drafter", 140.0)
    return Report(
        run="nightly",
        created="2026-01-02T03:04:05Z",
        baseline=window("baseline", 140.0 / speedup),
        drafter=drafter,
        current=window("current", current_tok_s, 2.0) if current_tok_s is not None else None,
        speedup=speedup,
        verdict={"summary": "s", "integration_suspect": suspect, "findings": [], "speedups": []},
        drafter_dir=drafter_dir,
        stages={},
        path="/reports/nightly-20260102T030405Z/report.json",
    )


def promoted(al: float) -> PromotionRecord:
    return PromotionRecord(
        drafter_dir="/old", mean_acceptance_length=al, speedup=1.2, run="nightly", created="2026-01-01T00:00:00Z"
    )


def test_a_drafter_that_clears_every_check_is_promoted_with_its_record():
    d = decide(report(), promoted(2.5), GATE)
    assert d.promote and d.reasons == []
    rec = d.record
    assert (rec.drafter_dir, rec.mean_acceptance_length, rec.speedup) == ("/runs/export/k/vllm", 3.0, 1.4)
    assert (rec.report, rec.run, rec.created) == (
        "/reports/nightly-20260102T030405Z/report.json",
        "nightly",
        "2026-01-02T03:04:05Z",
    )
    # Nothing promoted yet, and a tie with the promoted drafter, both promote.
    assert decide(report(), None, GATE).promote and decide(report(al=2.5), promoted(2.5), GATE).promote
    # Faster than production's current drafter in the same benchmark: promoted.
    assert decide(report(current_tok_s=139.0), None, GATE).promote


@pytest.mark.parametrize(
    "kw,prior,reason",
    [
        ({"speedup": 0.9}, None, "speedup 0.90 < 1.0"),
        ({"al": 1.4}, None, "mean acceptance length 1.40 < 1.5"),
        ({"al": None}, None, "mean acceptance length 0.00 < 1.5"),
        ({"suspect": True}, None, "the benchmark found the engine integration suspect"),
        ({"current_tok_s": 150.0}, None, "140.0 output tok/s < the current drafter's 150.0 in the same benchmark"),
        ({"al": 3.0}, 3.5, "mean acceptance length 3.00 < the promoted drafter's 3.50"),
        ({"drafter_dir": None}, None, "the report names no drafter directory"),
    ],
)
def test_each_reason_alone_keeps_the_drafter_out(kw, prior, reason):
    d = decide(report(**kw), promoted(prior) if prior else None, GATE)
    assert not d.promote and d.record is None
    assert len(d.reasons) == 1 and d.reasons[0].startswith(reason), d.reasons


def test_every_failing_check_is_given():
    d = decide(report(al=1.2, speedup=0.8, suspect=True, current_tok_s=200.0), promoted(2.0), GATE)
    assert not d.promote and len(d.reasons) == 5
    assert d == Decision.model_validate(d.model_dump())  # a plain record the task can log


def test_the_gate_itself_is_configurable():
    strict = PromotionGate(min_speedup=1.5, min_acceptance_length=3.5)
    assert decide(report(), None, strict).reasons == ["speedup 1.40 < 1.5", "mean acceptance length 3.00 < 3.5"]


def test_promotion_record_path():
    assert promotion_record_path("/w/runs/", "demo") == "/w/runs/promoted/demo.json"
    assert promotion_record_path("/w/runs", "demo") == "/w/runs/promoted/demo.json"


def test_the_current_drafter_is_compared_on_the_paired_rounds_when_the_verdict_has_them():
    # The drafter's window stopped early; its own throughput is over fewer prompts than the current drafter's
    # (reused from an earlier night). The verdict's paired ratio decides, not the two windows' throughputs.
    r = report(current_tok_s=150.0)
    r.verdict.headline = SpeedupRow(temperature=0.0, concurrency=1, drafter_vs_current=1.03)
    assert decide(r, None, GATE).promote
    r.verdict.headline = SpeedupRow(temperature=0.0, concurrency=1, drafter_vs_current=0.97)
    d = decide(r, None, GATE)
    assert not d.promote and d.reasons == [
        "0.97x the current drafter's output tok/s on the same prompts in the same benchmark"
    ]


def test_worse_only_beyond_noise_when_the_rounds_give_an_interval():
    """With production.promote 'serve' a loser costs a rollback (an engine load): a drafter is held worse than
    the promoted one, or slower than the current one, only when its 95% interval says so."""
    r = report(al=2.48)
    r.drafter.al_interval = [2.40, 2.56]
    assert decide(r, promoted(2.51), GATE).promote  # inside the noise
    r.drafter.al_interval = [2.40, 2.49]
    assert "(95% interval 2.40-2.49)" in decide(r, promoted(2.51), GATE).reasons[0]
    r = report(current_tok_s=141.0)
    r.verdict.headline = SpeedupRow(
        temperature=0.0, concurrency=1, drafter_vs_current=0.98, drafter_vs_current_ci=[0.95, 1.01]
    )
    assert decide(r, None, GATE).promote
    r.verdict.headline.drafter_vs_current_ci = [0.94, 0.99]
    assert "0.98x the current drafter's" in decide(r, None, GATE).reasons[0]


def test_a_current_drafter_measured_another_night_is_compared_on_acceptance_not_speed():
    """Its speed was that night's load (production's traffic, a busy machine): 0.65x in tok/s is no reason.
    Its acceptance length is the drafter's own: a lower one beyond noise is."""
    r = report(al=2.61, current_tok_s=80.0)
    r.current.measured = "measured 2026-01-01T03:00:00Z on production"
    r.verdict.headline = SpeedupRow(
        temperature=0.0, concurrency=1, drafter_vs_current=0.65, drafter_vs_current_ci=[0.62, 0.69]
    )
    r.current.mean_acceptance_length = 2.55
    assert decide(r, None, GATE).promote
    r.drafter.al_interval = [2.30, 2.50]
    d = decide(r, None, GATE)
    assert not d.promote and d.reasons == [
        "mean acceptance length 2.61 < the current drafter's 2.55 (measured "
        "2026-01-01T03:00:00Z on production) (95% interval 2.30-2.50)"
    ]
