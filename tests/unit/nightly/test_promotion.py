"""The nightly retrain's promotion gate (eagleflow.nightly.promotion.decide): every reason a drafter is not
promoted, promotion when all checks pass, and the record it then writes."""

from __future__ import annotations

import pytest

from eagleflow.contracts.benchmark_records import SpeedupRow
from eagleflow.nightly.promotion import (
    Decision,
    PromotionGate,
    PromotionRecord,
    decide,
    decision_markdown,
    promotion_record_path,
)
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


def with_intervals(r: Report, speedup_ci=None, al_ci=None, vs_current=None, vs_current_ci=None) -> Report:
    r.verdict.headline = SpeedupRow(
        temperature=0.0,
        concurrency=1,
        drafter_vs_baseline=r.speedup,
        drafter_vs_baseline_ci=speedup_ci,
        drafter_vs_current=vs_current,
        drafter_vs_current_ci=vs_current_ci,
    )
    r.drafter.al_interval = al_ci
    return r


def test_a_drafter_better_beyond_noise_is_promoted_with_its_record_and_what_decided():
    d = decide(with_intervals(report(), [1.3, 1.5], [2.8, 3.2]), promoted(2.5), GATE)
    assert d.promote and d.reasons == [] and not d.undecided
    assert d.decided_by == ("mean acceptance length 3.00 (95% interval 2.80-3.20) above the promoted drafter's 2.50")
    rec = d.record
    assert (rec.drafter_dir, rec.mean_acceptance_length, rec.speedup) == ("/runs/export/k/vllm", 3.0, 1.4)
    assert (rec.report, rec.run, rec.created) == (
        "/reports/nightly-20260102T030405Z/report.json",
        "nightly",
        "2026-01-02T03:04:05Z",
    )
    # Nothing promoted yet: better than no speculation beyond noise is what it must be.
    first = decide(with_intervals(report(), [1.3, 1.5], [2.8, 3.2]), None, GATE)
    assert first.promote and first.decided_by.startswith("speedup over no speculation 1.40 (95% interval 1.30-1.50)")


def test_the_issues_two_nights_whose_intervals_straddle_do_not_flip_production():
    """Night 1: 0.96x (0.78-1.13) over no speculation, AL 3.06 (2.85-3.27); night 2: 1.05x (0.93-1.16), AL 2.93
    (2.71-3.15), nothing promoted. Neither is faster than no speculation beyond noise, nor different from the
    other: the gate had refused the first on its point (0.96 < 1.0) and promoted the worse second on its point."""
    night1 = decide(with_intervals(report(al=3.06, speedup=0.96), [0.78, 1.13], [2.85, 3.27]), None, GATE)
    night2 = decide(with_intervals(report(al=2.93, speedup=1.05), [0.93, 1.16], [2.71, 3.15]), None, GATE)
    for d in (night1, night2):
        assert not d.promote and d.undecided and d.record is None
        assert all(r.startswith("undecided: speedup over no speculation") for r in d.reasons), d.reasons
    assert (
        night2.decided_by == "speedup over no speculation 1.05 (95% interval 0.93-1.16) overlaps the gate's floor 1.00"
    )


@pytest.mark.parametrize(
    "kw,prior,reason",
    [
        (
            {"speedup": 0.9},
            None,
            "speedup over no speculation 0.90 (no interval: one round) not above the gate's floor",
        ),
        ({"al": 1.4}, None, "mean acceptance length 1.40 (no interval: one round) not above the gate's floor 1.50"),
        ({"al": None}, None, "mean acceptance length 0.00"),
        ({"suspect": True}, None, "the benchmark found the engine integration suspect"),
        ({"current_tok_s": 150.0}, None, "140.0 output tok/s against the current drafter's 150.0"),
        (
            {"al": 3.0},
            3.5,
            "mean acceptance length 3.00 (no interval: one round) not above the promoted drafter's 3.50",
        ),
        ({"drafter_dir": None}, None, "the report names no drafter directory"),
    ],
)
def test_each_reason_alone_keeps_the_drafter_out(kw, prior, reason):
    d = decide(report(**kw), promoted(prior) if prior else None, GATE)
    assert not d.promote and d.record is None and not d.undecided
    assert len(d.reasons) == 1 and d.reasons[0].startswith(reason), d.reasons


def test_every_failing_check_is_given():
    d = decide(report(al=1.2, speedup=0.8, suspect=True, current_tok_s=200.0), promoted(2.0), GATE)
    assert not d.promote and len(d.reasons) == 4
    assert d == Decision.model_validate(d.model_dump())  # a plain record the task can log


def test_the_floors_are_on_the_intervals_lower_end():
    strict = PromotionGate(min_speedup=1.5, min_acceptance_length=3.5)
    assert decide(report(), None, strict).reasons == [
        "speedup over no speculation 1.40 (no interval: one round) not above the gate's floor 1.50",
        "mean acceptance length 3.00 (no interval: one round) not above the gate's floor 3.50",
    ]
    # the point clears the floor, the interval does not: undecided, not promoted
    d = decide(with_intervals(report(speedup=1.6, al=3.6), [1.45, 1.75], [3.55, 3.65]), None, strict)
    assert (
        not d.promote
        and d.undecided
        and d.reasons
        == ["undecided: speedup over no speculation 1.60 (95% interval 1.45-1.75) overlaps the gate's floor 1.50"]
    )


def test_an_undecided_gate_over_too_few_rounds_says_what_to_raise():
    """The GPU host's nights: 24 held-out prompts at concurrency 8 made 3 rounds, an interval of 0.00-5.42 around
    1.98x, undecided every night. The decision then says how many prompts would let it decide."""
    r = with_intervals(report(speedup=1.98), [0.0, 5.42], [2.9, 3.1])
    r.windows = [window("drafter", 140.0, 3.0, c=8), window("baseline", 70.0, c=8)]
    r.windows[0].round_seconds = [1.0, 1.1, 0.9]
    d = decide(r, None, GATE)
    assert d.undecided and d.reasons[-1] == (
        "the drafter's windows had as few as 3 round(s) (concurrency 8: a round is 8 prompts), too few for a "
        "95% interval to decide: raise benchmark.num_prompts (and generate.holdout) to 64 or more"
    )
    r.windows[0].round_seconds = [1.0] * 12  # enough rounds: no such line
    assert all("round(s)" not in why for why in decide(r, None, GATE).reasons)


def test_promotion_record_path():
    assert promotion_record_path("/w/runs/", "demo") == "/w/runs/promoted/demo.json"
    assert promotion_record_path("/w/runs", "demo") == "/w/runs/promoted/demo.json"


def test_the_current_drafter_is_compared_on_the_paired_rounds_beyond_noise():
    """The same prompts, round by round, in the same benchmark: faster than the current drafter beyond noise
    promotes; slower beyond noise keeps it; an interval across parity is undecided (measure more, or keep it)."""
    r = with_intervals(report(current_tok_s=150.0), [1.3, 1.5], None, 1.08, [1.03, 1.13])
    assert decide(r, None, GATE).promote
    r = with_intervals(report(current_tok_s=150.0), [1.3, 1.5], None, 0.95, [0.91, 0.99])
    d = decide(r, None, GATE)
    assert (
        not d.promote
        and not d.undecided
        and d.reasons == ["speedup over the current drafter 0.95 (95% interval 0.91-0.99) not above parity 1.00"]
    )
    r = with_intervals(report(current_tok_s=141.0), [1.3, 1.5], None, 0.98, [0.95, 1.01])
    d = decide(r, None, GATE)
    assert not d.promote and d.undecided


def test_a_current_drafter_measured_another_night_is_compared_on_acceptance_not_speed():
    """Its speed was that night's load (production's traffic, a busy machine): 0.65x in tok/s is no reason.
    Its acceptance length is the drafter's own: higher beyond noise promotes, lower beyond noise keeps it."""
    r = with_intervals(report(al=2.90, current_tok_s=80.0), [1.3, 1.5], [2.80, 3.00], 0.65, [0.62, 0.69])
    r.current.measured = "measured 2026-01-01T03:00:00Z on production"
    r.current.mean_acceptance_length, r.current.al_interval = 2.55, [2.45, 2.65]
    assert decide(r, None, GATE).promote
    r.drafter.al_interval = [2.30, 2.50]
    r.drafter.mean_acceptance_length = 2.40
    d = decide(r, None, GATE)
    assert not d.promote and d.reasons == [
        "mean acceptance length 2.40 (95% interval 2.30-2.50) not above the current drafter's (measured "
        "2026-01-01T03:00:00Z on production) 2.65"
    ]


def test_the_decision_artifact_names_the_drafter_by_its_run_and_figures_not_its_path():
    # issue 40: the heading was "# Promoted: <a 100-character path>"
    r = with_intervals(report(), [1.3, 1.5], [2.8, 3.2])
    d = decide(r, promoted(2.5), GATE)
    md = decision_markdown(r, promoted(2.5), GATE, d, "/runs/promoted/nightly.json").splitlines()
    assert md[0] == "# Promoted: the drafter of run nightly (AL 3.00, 1.40x over no speculation)"
    assert "/runs/export/k/vllm" in md[2] and md[3] == f"- decided by: {d.decided_by}"
    assert "the promoted drafter's 2.50 (run nightly, `/old`)" in md[4]
    kept = decide(with_intervals(report(al=1.2), [1.3, 1.5], [1.1, 1.3]), None, GATE)
    md = decision_markdown(r, None, GATE, kept, "/runs/promoted/nightly.json").splitlines()
    assert md[0].startswith("# Not promoted: the drafter of run nightly")
    assert any(line.startswith("- why not: mean acceptance length 1.20") for line in md) and "(unchanged)." in md[-1]
    open_ = decide(with_intervals(report(), [0.9, 1.9], [2.8, 3.2]), None, GATE)
    assert open_.undecided
    assert decision_markdown(r, None, GATE, open_, "p").startswith("# Not promoted (undecided): the drafter of run")
