"""The nightly retrain's promotion gate: a new drafter replaces the promoted one only if it is better.

Pure: `decide(report, promoted, gate)` says yes or no, with every reason; the Prefect task only reads
the record on the host, calls it and writes the new record. The promoted record lives at
`<work_root>/promoted/<run name>.json`; the benchmark stage serves it as production's current
drafter when `benchmark.current_drafter` is not set.
"""

from __future__ import annotations

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


def promotion_record_path(work_root: str, run_name: str) -> str:
    return f"{work_root.rstrip('/')}/promoted/{run_name}.json"


def promotion_history_path(work_root: str, run_name: str) -> str:
    """Every promotion of the run config, oldest first (a JSON list of records): what a rollback reads."""
    return f"{work_root.rstrip('/')}/promoted/{run_name}.history.json"


def decide(report: Report, promoted: PromotionRecord | None, gate: PromotionGate) -> Decision:
    """Promote the report's drafter iff it clears the gate, the engine side is not suspect, it serves at
    least as fast as production's current drafter in the same benchmark (when that one was measured at
    another time: accepts at least as much), and its acceptance is not below the promoted drafter's (all
    beyond noise, where the benchmark's rounds give a 95% interval)."""
    al = report.drafter.mean_acceptance_length or 0.0
    reasons = []
    if report.speedup < gate.min_speedup:
        reasons.append(f"speedup {report.speedup:.2f} < {gate.min_speedup}")
    if al < gate.min_acceptance_length:
        reasons.append(f"mean acceptance length {al:.2f} < {gate.min_acceptance_length}")
    if report.verdict is not None and report.verdict.integration_suspect:
        reasons.append(
            "the benchmark found the engine integration suspect (serving acceptance far below the "
            "offline estimate): fix the engine side before promoting"
        )
    current = report.current  # production's drafter, in this benchmark (measured now, or reused from a night before)
    head = report.verdict.headline if report.verdict is not None else None
    paired = head.drafter_vs_current if head is not None else None
    paired_ci = head.drafter_vs_current_ci if head is not None else None
    if current is not None and current.measured is not None:
        # Measured at another time (reused from a night before): its speed was that hour's load, production's own
        # traffic included, and a ratio of two hours' speeds is the load's, not the drafters'. Acceptance length
        # depends on the drafter and the prompts only: the drafters compare on that.
        cur_al = current.mean_acceptance_length
        if cur_al is not None and (al_ci[1] if (al_ci := report.drafter.al_interval) else al) < cur_al:
            reasons.append(
                f"mean acceptance length {al:.2f} < the current drafter's {cur_al:.2f} ({current.measured})"
                + (f" (95% interval {al_ci[0]:.2f}-{al_ci[1]:.2f})" if al_ci else "")
            )
    elif current is not None and paired is not None and (paired_ci[1] < 1.0 if paired_ci else paired < 1.0):
        # the same prompts, round by round: a window that stopped early compares on the rounds both measured.
        # Slower beyond noise (its 95% interval below 1) when the rounds give one: with production.promote 'serve'
        # a drafter that loses costs a rollback, an engine load, so a tie is not a loss.
        reasons.append(
            f"{paired:.2f}x the current drafter's output tok/s on the same prompts in the same benchmark"
            + (f" (95% interval {paired_ci[0]:.2f}-{paired_ci[1]:.2f})" if paired_ci else "")
        )
    elif current is not None and paired is None and report.drafter.output_tok_s < current.output_tok_s:
        reasons.append(
            f"{report.drafter.output_tok_s:.1f} output tok/s < the current drafter's "
            f"{current.output_tok_s:.1f} in the same benchmark"
        )
    al_ci = report.drafter.al_interval
    if promoted is not None and (al_ci[1] if al_ci else al) < promoted.mean_acceptance_length:
        reasons.append(
            f"mean acceptance length {al:.2f} < the promoted drafter's {promoted.mean_acceptance_length:.2f}"
            + (f" (95% interval {al_ci[0]:.2f}-{al_ci[1]:.2f})" if al_ci else "")
        )
    if reasons or report.drafter_dir is None:
        return Decision(promote=False, reasons=reasons or ["the report names no drafter directory"])
    record = PromotionRecord(
        drafter_dir=report.drafter_dir,
        mean_acceptance_length=al,
        speedup=report.speedup,
        report=report.path,
        run=report.run,
        created=report.created,
    )
    return Decision(promote=True, reasons=[], record=record)


def judge_canary(canary: dict, previous: dict | None, gate: PromotionGate, tolerance: float) -> list[str]:
    """Why production serves the deployed drafter worse than the bar (empty: it stays).

    `canary`: production's figures with it (eagleflow.production.canary); `previous`: the last good drafter's
    canary on the same production, when there is one. Acceptance is judged first: it is production's own count,
    hardly touched by other traffic; speed only beyond `tolerance`, since other traffic moves it."""
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
        if tok < prev_tok * (1 - tolerance):
            reasons.append(
                f"production's {tok:.1f} output tok/s < the last good drafter's {prev_tok:.1f} "
                f"(tolerance {tolerance:.0%})"
            )
    return reasons
