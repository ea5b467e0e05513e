"""The new drafter over no speculation across production's traffic (production.traffic).

Production serves a mix: Kimi-K2.5 mostly at temperature 1.0 / top_p 0.95, many requests at once; the benchmark's
first setting (greedy, one request) is not where it serves. Each cell of the mix has its paired speedup (the same
prompts round by round, eagleflow.measure.intervals); its share is of production's output tokens. Serving the same
tokens with the drafter takes sum(share_i / speedup_i) of the time without it, so the mix's speedup is

    S = 1 / sum(share_i / s_i)                              (a weighted harmonic mean)

Its interval: the cells are measured apart (independent), each s_i with a standard error se_i read off its 95%
interval (half-width over Student's t at its rounds, 1.96 when unknown); by the delta method
var(sum share_i / s_i) = sum share_i^2 se_i^2 / s_i^4, and se(S) = se(sum) * S^2; 95%: S +- 1.96 se(S).

A drafter fast where little is served and slow where most is served reads slow here. A cell that carries a real share
(production.traffic_floor_share) and serves slower than no speculation beyond noise is named on its own: the gate keeps
such a drafter out whatever the mix's figure (eagleflow.nightly.promotion).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from eagleflow.contracts.benchmark_records import Mix, MixCell, SpeedupRow
from eagleflow.measure.intervals import t975


class TrafficPart(Protocol):
    """What this module reads of eagleflow.config.production.TrafficCell."""

    temperature: float
    top_p: float
    concurrency: int
    share: float
    name: str | None


def _se(ci: list[float] | None, rounds: int | None) -> float | None:
    """The standard error a 95% interval stands for (Student's t over its rounds, normal without them)."""
    if not ci or not all(math.isfinite(x) for x in ci):
        return None
    t = t975(rounds - 1) if rounds and rounds > 1 else 1.96
    return (ci[1] - ci[0]) / 2 / t


def label(cell: MixCell) -> str:
    sampling = f"temperature {cell.temperature:g}" + (f", top_p {cell.top_p:g}" if cell.top_p < 1 else "")
    name = f"{cell.name}: " if cell.name else ""
    return f"{name}{sampling} / concurrency {cell.concurrency} ({cell.share:.0%} of the traffic)"


def weigh(rows: Sequence[SpeedupRow], traffic: Sequence[TrafficPart], floor_share: float) -> Mix | None:
    """The mix's speedup and interval from the verdict's rows (one per measured setting); None without traffic."""
    if not traffic:
        return None
    by_setting = {(r.temperature, r.concurrency): r for r in rows}
    cells, terms, var, complete = [], 0.0, 0.0, True
    for part in sorted(traffic, key=lambda p: -p.share):
        row = by_setting.get((part.temperature, part.concurrency))
        s = row.drafter_vs_baseline if row is not None else None
        ci = row.drafter_vs_baseline_ci if row is not None else None
        cells.append(
            MixCell(
                temperature=part.temperature,
                top_p=part.top_p,
                concurrency=part.concurrency,
                share=part.share,
                name=part.name,
                speedup=s,
                speedup_ci=ci,
            )
        )
        if s is None or s <= 0:
            complete = False
            continue
        terms += part.share / s
        se = _se(ci, row.paired_rounds if row is not None else None)
        var = math.nan if se is None else var + part.share**2 * se**2 / s**4
    total = sum(p.share for p in traffic)
    speedup = total / terms if complete and terms > 0 else None
    ci_out = None
    if speedup is not None and math.isfinite(var):
        half = 1.96 * math.sqrt(var) * speedup**2 / total
        ci_out = [max(speedup - half, 0.0), speedup + half]
    slower = [
        f"{label(c)}: {c.speedup:.2f}x (95% CI {c.speedup_ci[0]:.2f}-{c.speedup_ci[1]:.2f})"
        for c in cells
        if c.share >= floor_share and c.speedup is not None and c.speedup_ci and c.speedup_ci[1] < 1.0
    ]
    weighs = [c for c in cells if c.speedup]
    heaviest = max(weighs, key=lambda c: c.share / c.speedup, default=None)  # type: ignore[operator]
    return Mix(
        speedup=speedup,
        speedup_ci=ci_out,
        cells=cells,
        slower=slower,
        decided_by=f"{label(heaviest)}: {heaviest.speedup:.2f}x" if heaviest is not None else "",
    )


def mix_summary(mix: Mix) -> str:
    """The verdict's first words when production.traffic is given."""
    if mix.speedup is None:
        missing = [label(c) for c in mix.cells if c.speedup is None]
        return "over production's traffic: not measured at " + "; ".join(missing)
    ci = f" (95% CI {mix.speedup_ci[0]:.2f}-{mix.speedup_ci[1]:.2f})" if mix.speedup_ci else ""
    return (
        f"the new drafter serves {mix.speedup:.2f}x the output tokens/s of no speculation over production's "
        f"traffic{ci}, weighed most by {mix.decided_by}"
    )


def mix_markdown(mix: Mix) -> list[str]:
    """The report's section: each cell of production's traffic, its share and speedup, and the whole."""
    lines = [
        "## Production's traffic (production.traffic)",
        "",
        "| part | temperature | top_p | concurrency | share of tokens | vs none | 95% CI |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in mix.cells:
        ci = f"{c.speedup_ci[0]:.2f}-{c.speedup_ci[1]:.2f}" if c.speedup_ci else ""
        speed = f"{c.speedup:.2f}x" if c.speedup is not None else "not measured"
        lines.append(
            f"| {c.name or ''} | {c.temperature:g} | {c.top_p:g} | {c.concurrency} | {c.share:.0%} | {speed} | {ci} |"
        )
    whole = f"{mix.speedup:.2f}x" if mix.speedup is not None else "unknown (a cell not measured)"
    ci = f" (95% CI {mix.speedup_ci[0]:.2f}-{mix.speedup_ci[1]:.2f})" if mix.speedup_ci else ""
    lines += [
        "",
        f"Over the whole mix: **{whole}**{ci}, the time to serve the same tokens (each cell's speedup weighted by its "
        f"share); weighed most by {mix.decided_by or 'no cell'}.",
    ]
    return lines
