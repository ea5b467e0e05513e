"""The nightly retrain's promotion gate: a new drafter replaces what production serves only if it is better
beyond noise.

Pure: `decide(report, promoted, gate)` says yes or no, with every reason; the Prefect task only reads
the record on the host, calls it and writes the new record. The promoted record lives at
`<work_root>/promoted/<run name>.json`; the benchmark stage serves it as production's current
drafter when `benchmark.current_drafter` is not set.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.reporting.report import Report


class PromotionGate(BaseModel):
    """The bar a nightly drafter must clear (besides beating the promoted one)."""

    min_speedup: float = Field(1.0, ge=0, description="Promote only at or above this speedup over no speculation.")
    min_acceptance_length: float = Field(1.5, ge=1, description="Promote only at or above this mean acceptance length.")


class PromotionRecord(BaseModel):
    """`<work_root>/promoted/<run>.json`: the drafter production should serve, and why it was promoted."""

    model_config = ConfigDict(extra="ignore")

    drafter_dir: str = Field(description="The promoted drafter's directory on the host.")
    mean_acceptance_length: float = Field(description="Its served AL at the benchmark's first setting.")
    speedup: float = Field(description="Its speedup over no speculation at the first setting.")
    report: str | None = Field(None, description="The report.json of the run that promoted it.")
    run: str
    created: str


class Decision(BaseModel):
    promote: bool
    reasons: list[str] = Field(description="Why not (empty when promoted).")
    record: PromotionRecord | None = Field(None, description="The record to write when promoted.")
    undecided: bool = Field(
        False, description="No test failed beyond noise but one did not pass beyond it either: the intervals overlap."
    )
    decided_by: str = Field("", description="The comparison and interval that decided, as a person reads it.")


def promotion_record_path(work_root: str, run_name: str) -> str:
    return f"{work_root.rstrip('/')}/promoted/{run_name}.json"


def promotion_history_path(work_root: str, run_name: str) -> str:
    """Every promotion of the run config, oldest first (a JSON list of records): what a rollback reads."""
    return f"{work_root.rstrip('/')}/promoted/{run_name}.history.json"


Outcome = Literal["pass", "fail", "undecided"]


def _against(name: str, value: float, ci: list[float] | None, bar: float, bar_name: str) -> tuple[Outcome, str]:
    """`value` (its 95% interval `ci`) against `bar`: beyond noise above it (the interval's lower end above), below
    it (the upper end at or below), or neither. Without an interval the point decides, and says so."""
    lo, hi = (ci[0], ci[1]) if ci else (value, value)
    shown = f"{name} {value:.2f}" + (f" (95% interval {lo:.2f}-{hi:.2f})" if ci else " (no interval: one round)")
    if lo > bar or (lo >= bar and not ci):
        return "pass", f"{shown} above {bar_name} {bar:.2f}"
    if hi <= bar and not (ci and lo == hi == bar):
        return "fail", f"{shown} not above {bar_name} {bar:.2f}"
    return "undecided", f"{shown} overlaps {bar_name} {bar:.2f}"


# An interval over fewer rounds than this seldom decides: Student's t for 95% is 4.30 at 3 rounds, 2.36 at 8. On a GPU
# host the nightly's 24 held-out prompts at concurrency 8 made 3 rounds, and the gate stayed undecided every night.
MIN_DECIDING_ROUNDS = 8


def _few_rounds(report: Report) -> str | None:
    """What to change when the drafter's windows had too few rounds for their intervals to decide."""
    few = [
        (len(w.round_seconds), w.concurrency)
        for w in report.windows
        if w.variant == "drafter" and w.round_seconds is not None and len(w.round_seconds) < MIN_DECIDING_ROUNDS
    ]
    if not few:
        return None
    n, c = min(few)
    enough = MIN_DECIDING_ROUNDS * c
    return (
        f"the drafter's windows had as few as {n} round(s) (concurrency {c}: a round is {c} prompts), too few for a "
        f"95% interval to decide: raise benchmark.num_prompts (and generate.holdout) to {enough} or more"
    )


def _first_setting_speedup(report: Report) -> tuple[float, list[float] | None]:
    """The drafter's speedup over no speculation at the benchmark's first setting, with its interval (the verdict's
    paired figure where it has one, else the report's)."""
    head = report.verdict.headline if report.verdict is not None else None
    if head is not None and head.drafter_vs_baseline is not None:
        return head.drafter_vs_baseline, head.drafter_vs_baseline_ci
    return report.speedup, head.drafter_vs_baseline_ci if head is not None else None


def decide(report: Report, promoted: PromotionRecord | None, gate: PromotionGate) -> Decision:
    """Promote the report's drafter only on evidence: it is better than what production serves beyond the 95%
    interval (faster than the current drafter on the same prompts in the same benchmark; when the current drafter
    was measured at another time, a higher acceptance length, the figure that does not move with the load; with
    no current drafter, faster than no speculation), its interval's lower end clears the floors (the gate's speedup
    and acceptance length), and the engine side is not suspect. A comparison whose interval overlaps its bar
    makes the decision undecided: the night measures again (nightly.decision_reruns) or keeps what production
    serves. `decided_by` names the interval that decided."""
    d = report.drafter
    al, al_ci = d.mean_acceptance_length or 0.0, d.al_interval
    head = report.verdict.headline if report.verdict is not None else None
    mix = report.verdict.mix if report.verdict is not None else None
    speedup, speedup_ci = _first_setting_speedup(report)
    speed_name = "speedup over no speculation"
    if mix is not None:  # production.traffic: the whole of what production serves, not the first setting
        speedup, speedup_ci, speed_name = mix.speedup or 0.0, mix.speedup_ci, "speedup over production's traffic"
    checks: list[tuple[Outcome, str]] = [
        _against(speed_name, speedup, speedup_ci, gate.min_speedup, "the gate's floor"),
        _against("mean acceptance length", al, al_ci, gate.min_acceptance_length, "the gate's floor"),
    ]
    if mix is not None:
        if mix.speedup is None:
            checks.append(("fail", "the benchmark did not measure every cell of production's traffic"))
        # a real share of production slower beyond noise keeps it out, whatever the mix's figure
        checks += [
            ("fail", f"slower than no speculation where production serves, beyond noise: {c}") for c in mix.slower
        ]
    if report.verdict is not None and report.verdict.integration_suspect:
        checks.append(
            (
                "fail",
                "the benchmark found the engine integration suspect (serving acceptance far below "
                "the offline estimate): fix the engine side before promoting",
            )
        )
    current = report.current  # production's drafter, in this benchmark (measured now, or reused from a night before)
    paired = head.drafter_vs_current if head is not None else None
    if current is not None and current.measured is not None and current.mean_acceptance_length is not None:
        # Measured at another time (reused from a night before): its speed was that hour's load, production's own
        # traffic included. Acceptance length depends on the drafter and the prompts only: the drafters compare on
        # that, the current drafter's interval's upper end the bar.
        cur_ci = current.al_interval
        bar = cur_ci[1] if cur_ci else current.mean_acceptance_length
        checks.append(_against("mean acceptance length", al, al_ci, bar, f"the current drafter's ({current.measured})"))
    elif current is not None and paired is not None:
        # the same prompts, round by round, in the same benchmark: the figure production's users feel
        checks.append(_against("speedup over the current drafter", paired, head.drafter_vs_current_ci, 1.0, "parity"))
    elif current is not None:
        outcome: Outcome = "pass" if d.output_tok_s > current.output_tok_s else "fail"
        checks.append(
            (
                outcome,
                f"{d.output_tok_s:.1f} output tok/s against the current drafter's "
                f"{current.output_tok_s:.1f} in the same benchmark (no rounds to pair)",
            )
        )
    elif promoted is not None:
        checks.append(
            _against("mean acceptance length", al, al_ci, promoted.mean_acceptance_length, "the promoted drafter's")
        )
    elif gate.min_speedup < 1.0:  # production serves no speculation: faster than that, beyond noise
        checks.append(_against(speed_name, speedup, speedup_ci, 1.0, "parity"))
    failed = [why for outcome, why in checks if outcome == "fail"]
    open_ = [why for outcome, why in checks if outcome == "undecided"]
    if failed or report.drafter_dir is None:
        reasons = failed or ["the report names no drafter directory"]
        return Decision(promote=False, reasons=reasons, decided_by=reasons[0])
    if open_:
        hint = _few_rounds(report)
        return Decision(
            promote=False,
            reasons=[f"undecided: {why}" for why in open_] + ([hint] if hint else []),
            undecided=True,
            decided_by=open_[0],
        )
    record = PromotionRecord(
        drafter_dir=report.drafter_dir,
        mean_acceptance_length=al,
        speedup=report.speedup,
        report=report.path,
        run=report.run,
        created=report.created,
    )
    # what decided: the comparison with what production serves (no speculation: the speedup floor, checks[0])
    return Decision(promote=True, reasons=[], record=record, decided_by=checks[-1 if len(checks) > 2 else 0][1])


def judge_canary(
    canary: dict, previous: dict | None, gate: PromotionGate, tolerance: float, speed: bool = True
) -> list[str]:
    """Why production serves the deployed drafter worse than the bar (empty: it stays).

    `canary`: production's figures with it (eagleflow.production.canary); `previous`: the last good drafter's
    canary on the same production, when there is one. Acceptance is judged first: it is production's own count,
    hardly touched by other traffic; speed (unless `speed` is off) only beyond `tolerance`, since other traffic
    moves it."""
    reasons = []
    if canary.get("errors"):
        reasons.append(
            f"{canary['errors']} of {canary.get('requests')} canary requests failed: {canary.get('first_error')}"
        )
    al = float(canary.get("mean_acceptance_length") or 0.0)
    if al < gate.min_acceptance_length:
        reasons.append(
            f"production's acceptance length {al:.2f} < the bar {gate.min_acceptance_length}"
            + (" (acceptance 0: the drafter's weights are not in use)" if al <= 1.0 else "")
        )
    if previous:
        prev_al, prev_tok = float(previous.get("mean_acceptance_length") or 0), float(previous.get("output_tok_s") or 0)
        if al < prev_al * (1 - tolerance):
            reasons.append(
                f"production's acceptance length {al:.2f} < the last good drafter's {prev_al:.2f} "
                f"(tolerance {tolerance:.0%})"
            )
        tok = float(canary.get("output_tok_s") or 0)
        if speed and tok < prev_tok * (1 - tolerance):
            reasons.append(
                f"production's {tok:.1f} output tok/s < the last good drafter's {prev_tok:.1f} "
                f"(tolerance {tolerance:.0%})"
            )
    return reasons


def judge_restored(canary: dict, earlier: dict | None, tolerance: float) -> list[str]:
    """Why production serves the drafter it was rolled back to worse than before (empty: the restore holds).

    That drafter is one production served already: it is held to its own last canary on this production (`earlier`),
    not to the gate's floor for a new drafter. An adopted drafter that was never measured has no figure to be held
    to: its canary now is its first, whatever it reads (a weak drafter production had is still what it had).
    Its acceptance against then says whether the engine has its weights; its speed against a canary taken at
    another time says how busy the host was (the same drafter read AL 2.70 both times, 118 and then 43 output
    tok/s on a 2-core host running three suites), so speed does not judge a restore."""
    if earlier is None:
        return (
            [f"{canary['errors']} of {canary.get('requests')} canary requests failed"] if canary.get("errors") else []
        )
    gate = PromotionGate(min_speedup=0.0, min_acceptance_length=1.0)
    return judge_canary(canary, earlier, gate, tolerance, speed=False)


def decision_markdown(
    report: Report, promoted: PromotionRecord | None, gate: PromotionGate, decision: Decision, path: str
) -> str:
    """The decision as the run page shows it (the promotion artifact): its heading names the drafter by its run and
    its figures (its directory is a line below: a path is no name a person reads), then what decided, the bars, and
    every reason it was kept out."""
    d = report.drafter
    mix = report.verdict.mix if report.verdict is not None else None
    speedup, _ = _first_setting_speedup(report)
    over = "no speculation"
    if mix is not None and mix.speedup is not None:
        speedup, over = mix.speedup, "no speculation over production's traffic"
    figures = f"AL {d.mean_acceptance_length or 0:.2f}, {speedup:.2f}x over {over}"
    verb = "Promoted" if decision.promote else ("Not promoted (undecided)" if decision.undecided else "Not promoted")
    lines = [
        f"# {verb}: the drafter of run {report.run} ({figures})",
        "",
        f"- the new drafter: {figures} ({d.output_tok_s:.1f} output tok/s), in `{report.drafter_dir}` on the host",
    ]
    if decision.decided_by:
        lines.append(f"- decided by: {decision.decided_by}")
    lines.append(
        f"- the bars: speedup >= {gate.min_speedup}, AL >= {gate.min_acceptance_length}"
        + (
            f", AL >= the promoted drafter's {promoted.mean_acceptance_length:.2f} (run {promoted.run}, "
            f"`{promoted.drafter_dir}`)"
            if promoted
            else ", no drafter promoted before"
        )
    )
    lines += [f"- why not: {r}" for r in decision.reasons]
    lines += [
        "",
        f"The promoted record: `{path}` on the host" + (" (written now)." if decision.promote else " (unchanged)."),
    ]
    return "\n".join(lines)
