"""benchmark.k_sweep: the new drafter served at other num_speculative_tokens, and the k that serves fastest.

More draft tokens a step accept more tokens a step only while the drafter's deeper positions still hit, and each
costs a drafter forward and a longer verify: where the balance lies depends on the drafter, the target's step cost,
the sampling and the batch (a busy batch has less spare compute for drafts). So k is measured, not assumed: each k
is an engine of its own with the same drafter, sent the same held-out prompts at the same settings as the verdict's
windows, and paired round by round with the same baseline. The speedup at each k is read as the verdict reads the
drafter's (eagleflow.measure.verdict.speedups): over production's traffic where production.traffic states it
(eagleflow.measure.mix), else at the benchmark's first setting.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from eagleflow.config import BenchmarkConfig, RunConfig
from eagleflow.contracts.benchmark_records import EngineSpread, KSweep, KSweepRow, Measurement
from eagleflow.measure.mix import TrafficPart, weigh
from eagleflow.measure.session import Session, Variant
from eagleflow.measure.verdict import speedups

log = logging.getLogger("eagleflow.benchmark")


def sweep_name(k: int) -> str:
    return f"drafter-k{k}"


def sweep_variants(b: BenchmarkConfig, variants: Sequence[Variant]) -> list[Variant]:
    """The new drafter at each k of the sweep but the verdict's own: a variant each (its engine's log
    engine-drafter-k<k>.log)."""
    new = next((v for v in variants if v.name == "drafter"), None)
    if new is None:
        return []
    return [Variant(sweep_name(k), new.drafter, new.offline_al, k=k) for k in b.swept_ks()]


def measure_sweep(session: Session, swept: Sequence[Variant], stage_dir: Path, env: dict[str, str] | None) -> None:
    """Each swept k in an engine of its own, one after the other, every setting's windows (after the verdict's
    variants: the same production window, the same baseline to pair with)."""
    for v in swept:
        with ExitStack() as stack:
            session.open([v], stack, stage_dir, False, env)
            for t, c in session.settings:
                session.measure_setting([v], t, c)


def sweep_result(
    cfg: RunConfig, session: Session, swept: Sequence[Variant], spread: EngineSpread | None = None
) -> KSweep | None:
    """The sweep's table from the session's windows; None without a sweep. `spread`: the engine-to-engine spread,
    when measured (every k is an engine of its own: its interval holds it)."""
    if not swept:
        return None
    table = session.table()
    by_k = {cfg.benchmark.num_speculative_tokens: [w for w in table if w.variant == "drafter"]}
    by_k.update({session.k_of(v): [session.rows[(v.name, t, c)] for t, c in session.settings] for v in swept})
    baseline = [w for w in table if w.variant == "baseline"]
    sweep = summarize(cfg.benchmark, baseline, by_k, cfg.production.traffic, cfg.production.traffic_floor_share, spread)
    log.info("k sweep: %s", sweep.summary)
    return sweep


def _speedup(
    table: Sequence[Measurement],
    traffic: Sequence[TrafficPart],
    floor_share: float,
    spread: EngineSpread | None = None,
) -> tuple[float | None, list[float] | None]:
    """The drafter's speedup over no speculation in `table` (baseline and drafter windows): over the traffic's mix,
    else at the first setting."""
    rows = speedups(list(table), spread)
    mix = weigh(rows, traffic, floor_share)
    if mix is not None:
        return mix.speedup, mix.speedup_ci
    first = next(iter(rows), None)
    return (first.drafter_vs_baseline, first.drafter_vs_baseline_ci) if first else (None, None)


def summarize(
    b: BenchmarkConfig,
    baseline: Sequence[Measurement],
    by_k: dict[int, Sequence[Measurement]],
    traffic: Sequence[TrafficPart],
    floor_share: float,
    spread: EngineSpread | None = None,
) -> KSweep:
    """The sweep's table from the baseline's windows and the drafter's windows at each k (named as any variant: each
    is read as 'drafter'), and the k with the highest speedup."""
    t0, c0 = b.temperatures[0], b.concurrencies[0]
    rows = []
    for k in sorted(by_k):
        windows = [w.model_copy(update={"variant": "drafter"}) for w in by_k[k]]
        value, ci = _speedup([*baseline, *windows], traffic, floor_share, spread)
        head = next((w for w in windows if (w.temperature, w.concurrency) == (t0, c0)), None)
        rows.append(
            KSweepRow(
                k=k,
                speedup=round(value, 4) if value is not None else None,
                speedup_ci=[round(x, 4) for x in ci] if ci else None,
                mean_acceptance_length=head.mean_acceptance_length if head else None,
                output_tok_s=head.output_tok_s if head else None,
            )
        )
    over = "production's traffic" if traffic else f"temperature {t0:g}, concurrency {c0}"
    best = max((r for r in rows if r.speedup is not None), key=lambda r: r.speedup or 0.0, default=rows[0])
    configured = next((r for r in rows if r.k == b.num_speculative_tokens), None)

    def shown(r: KSweepRow | None) -> str:
        if r is None or r.speedup is None:
            return "not measured"
        ci = f" (95% CI {r.speedup_ci[0]:.2f}-{r.speedup_ci[1]:.2f})" if r.speedup_ci else ""
        return f"{r.speedup:.2f}x{ci}"

    # Beyond noise: the best k's interval clears the configured k's (without intervals the points decide)
    overlap = bool(
        configured is not None
        and best.speedup_ci
        and configured.speedup_ci
        and best.speedup_ci[0] <= configured.speedup_ci[1]
    )
    # Whether any k pays at all: the fastest k's interval (else its point) above no speculation's 1.0
    pays = best.speedup is not None and (best.speedup_ci[0] if best.speedup_ci else best.speedup) > 1.0
    if not pays:
        summary = (
            f"no k serves faster than no speculation beyond noise over {over}: the fastest, k={best.k}, "
            f"{shown(best)}; the configured k={b.num_speculative_tokens} {shown(configured)}. A faster drafter, "
            "not another k, is what this traffic needs"
        )
    elif configured is not None and best.k == configured.k:
        summary = f"k={best.k} (benchmark.num_speculative_tokens) serves fastest over {over}: {shown(best)}"
    elif overlap:
        summary = (
            f"k={best.k} reads fastest over {over}: {shown(best)}, within noise of {shown(configured)} at the "
            f"configured k={b.num_speculative_tokens}: keep it, or measure again with more prompts"
        )
    else:
        summary = (
            f"k={best.k} serves fastest over {over}: {shown(best)}, against {shown(configured)} at the configured "
            f"k={b.num_speculative_tokens}; launch production with num_speculative_tokens {best.k}"
        )
    return KSweep(
        over=over,
        configured_k=b.num_speculative_tokens,
        best_k=best.k,
        beyond_noise=not overlap,
        rows=rows,
        summary=summary,
    )


def sweep_section(s: KSweep | None) -> str:
    """The sweep's part of the stage's report.md ("" without a sweep)."""
    return "" if s is None else "\n\n" + "\n".join(sweep_markdown(s)) + "\n"


def sweep_markdown(s: KSweep) -> list[str]:
    lines = [
        f"## Draft tokens a step (benchmark.k_sweep), over {s.over}",
        "",
        s.summary,
        "",
        "| k | speedup | 95% CI | AL (first setting) | tok/s (first setting) |",
        "|---:|---:|---|---:|---:|",
    ]
    for r in s.rows:
        ci = f"{r.speedup_ci[0]:.2f}-{r.speedup_ci[1]:.2f}" if r.speedup_ci else "-"
        mark = " (configured)" if r.k == s.configured_k else ""
        al = f"{r.mean_acceptance_length:.2f}" if r.mean_acceptance_length else "-"
        tok = f"{r.output_tok_s:.1f}" if r.output_tok_s else "-"
        sp = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        lines.append(f"| {r.k}{mark} | {sp} | {ci} | {al} | {tok} |")
    return lines
