"""The benchmark's verdict: how much faster, and whether to trust the engine's acceptance figures.

The story this exists for: a drafter that scored well offline served at 15% acceptance; it looked
like a bad drafter but was the engine integration (the public drafter served equally badly). So
serving acceptance is compared with the drafter's offline estimate (the simulated acceptance
length the trainer measured on held-out data), in accepted drafts per step (AL - 1), at
temperature 0 where the offline figure applies; a drafter far below its estimate makes the engine
suspect, and a second drafter that scores the same low figure is the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from eagleflow.contracts.benchmark_records import (
    EngineSpread,
    Measurement,
    ProductionResult,
    SpeedupRow,
    Triage,
    Verdict,
)
from eagleflow.measure.intervals import Estimate, acceptance_length, paired_speedup, unpaired_speedup, widened
from eagleflow.measure.mix import TrafficPart, mix_markdown, mix_summary, weigh


def _windows(windows: list[Measurement], variant: str) -> list[Measurement]:
    return [w for w in windows if w.variant == variant]


def _at(windows: list[Measurement], variant: str, temperature: float, concurrency: int) -> Measurement | None:
    return next(
        (w for w in windows if w.variant == variant and w.temperature == temperature and w.concurrency == concurrency),
        None,
    )


def _served_al_interval(windows: list[Measurement], variant: str, temperature: float) -> Estimate | None:
    """The 95% interval of `variant`'s acceptance length at `temperature` over the rounds of its windows there
    (every concurrency's rounds pooled: a round's accepted drafts over its drafting steps); None where a window
    kept no rounds (an older record)."""
    ws = [w for w in _windows(windows, variant) if w.temperature == temperature]
    if not ws or any(not (w.round_accepted and w.round_drafts) for w in ws):
        return None
    return acceptance_length(
        [a for w in ws for a in w.round_accepted or []], [d for w in ws for d in w.round_drafts or []]
    )


def _served_al(windows: list[Measurement], variant: str, temperature: float) -> float | None:
    """Mean acceptance length of `variant` over its windows at `temperature` (all concurrencies)."""
    vals = [
        w.mean_acceptance_length
        for w in _windows(windows, variant)
        if w.temperature == temperature and w.mean_acceptance_length is not None
    ]
    return sum(vals) / len(vals) if vals else None


def paired(ref: Measurement | None, var: Measurement | None, spread: EngineSpread | None = None) -> Estimate | None:
    """`var`'s throughput over `ref`'s on the rounds both measured, with its 95% interval; None when either
    lacks its rounds (then the windows' throughputs are compared as they are). Two windows measured at different
    times (one reused from an earlier run: `measured` differs) are not paired: their estimate says so
    (`Estimate.paired` False) and its interval carries both windows' spread. `spread`: the engine-to-engine spread,
    when measured: the interval holds it too (each window is an engine of its own)."""
    if not (ref and var and ref.round_seconds and var.round_seconds and ref.round_tokens and var.round_tokens):
        return None
    if ref.measured != var.measured:
        est = unpaired_speedup(ref.round_seconds, ref.round_tokens, var.round_seconds, var.round_tokens)
    else:
        est = paired_speedup(ref.round_seconds, ref.round_tokens, var.round_seconds, var.round_tokens)
    return widened(est, spread.log_sd, spread.df) if est is not None and spread is not None else est


def _ratio(
    ref: Measurement | None, var: Measurement | None, spread: EngineSpread | None = None
) -> tuple[float | None, list[float] | None]:
    if not (ref and var):
        return None, None
    est = paired(ref, var, spread)
    if est is None:
        return var.output_tok_s / ref.output_tok_s, None
    return est.value, ([est.low, est.high] if est.n > 1 else None)


def engine_spread(first: Sequence[Measurement], again: Sequence[Measurement]) -> EngineSpread | None:
    """`first`: the benchmark's windows (its baseline's are read); `again`: no speculation's second windows.
    The spread from one engine to the next, from no speculation served twice on engines of their own (the first
    and the last of a benchmark: benchmark.remeasure_baseline): per setting the second window's throughput over the
    first's, paired round by round; the two engines' offsets differ by log(ratio), whose variance is twice the
    engines' own, so log_sd = sqrt(mean(log(ratio)^2) / 2) with one degree of freedom a setting. None when no
    setting was measured twice."""
    by_setting = {(w.temperature, w.concurrency): w for w in first if w.variant == "baseline"}
    settings, ratios = [], []
    for w in again:
        ref = by_setting.get((w.temperature, w.concurrency))
        est = paired(ref, w)
        ratio = est.value if est is not None else (w.output_tok_s / ref.output_tok_s if ref else None)
        if ratio is not None and ratio > 0:
            settings.append([w.temperature, float(w.concurrency)])
            ratios.append(round(ratio, 4))
    if not ratios:
        return None
    log_sd = math.sqrt(sum(math.log(r) ** 2 for r in ratios) / len(ratios) / 2)
    return EngineSpread(settings=settings, ratios=ratios, log_sd=round(log_sd, 4), df=len(ratios))


def spread_line(spread: EngineSpread) -> str:
    """The verdict's finding: what the second engine read, and that the intervals hold it."""
    each = ", ".join(f"{r:.2f}x at {t:g} / {c:g}" for (t, c), r in zip(spread.settings, spread.ratios))
    return (
        f"engine to engine: no speculation served again on a fresh engine after the others read {each} of its first "
        f"engine (temperature / concurrency): {spread.log_sd:.0%} from one engine to the next, which every speed "
        "interval between engines holds (benchmark.remeasure_baseline)"
    )


def _unpaired(base: Measurement | None, new: Measurement | None) -> str:
    """Why the drafter's speedup over no speculation is not paired: which window was measured when."""
    return "; ".join(f"{w.variant} {w.measured}" for w in (base, new) if w is not None and w.measured) or "?"


def speedups(windows: list[Measurement], spread: EngineSpread | None = None) -> list[SpeedupRow]:
    """Per setting: each drafter's throughput over no speculation and the new drafter's over the current one,
    paired round by round on the prompts both measured (a window that stopped early is compared on its rounds);
    with `spread`, each interval holds the engine-to-engine spread too."""
    out = []
    for t, c in sorted({(w.temperature, w.concurrency) for w in windows}):
        base, cur, new = (_at(windows, v, t, c) for v in ("baseline", "current", "drafter"))
        dvb, dvb_ci = _ratio(base, new, spread)
        cvb, cvb_ci = _ratio(base, cur, spread)
        dvc, dvc_ci = _ratio(cur, new, spread)
        est = paired(base, new)
        out.append(
            SpeedupRow(
                temperature=t,
                concurrency=c,
                drafter_vs_baseline=dvb,
                current_vs_baseline=cvb,
                drafter_vs_current=dvc,
                drafter_vs_baseline_ci=dvb_ci,
                current_vs_baseline_ci=cvb_ci,
                drafter_vs_current_ci=dvc_ci,
                paired_rounds=est.n if est and est.paired else None,
                unpaired=_unpaired(base, new) if est and not est.paired else None,
            )
        )
    return out


def judge(
    windows: list[Measurement],
    offline: dict[str, float | None],
    *,
    suspect_ratio: float,
    sampled_suspect_ratio: float = 0.12,
    triage: Triage | None = None,
    traffic: Sequence[TrafficPart] = (),
    traffic_floor_share: float = 0.1,
    spread: EngineSpread | None = None,
    engines_apart: bool = False,
) -> Verdict:
    """The verdict over every measured window.

    offline: the offline acceptance-length estimate of each drafter variant ('drafter', 'current'),
    None when unknown (a public drafter without one). triage: where the probes found the acceptance lost
    (eagleflow.triage), when they ran: its blame replaces the suspicion with a finding. A drafter whose
    accepted drafts per step fall at a sampled temperature below `sampled_suspect_ratio` of the greedy ones
    is suspect too: the offline estimate is greedy, so there the engine's sampled verify path is the suspect.
    traffic: production's mix (production.traffic): the summary leads with the speedup over it (eagleflow.measure.mix),
    and a cell carrying at least `traffic_floor_share` that serves slower beyond noise is a finding.
    spread: the engine-to-engine spread (`engine_spread`), when measured: every speed interval holds it. Without it,
    `engines_apart` (the variants' engines ran one after another) adds a finding that the intervals do not.
    """
    rows = speedups(windows, spread)
    mix = weigh(rows, traffic, traffic_floor_share)
    head = rows[0] if rows else None
    t0 = min(w.temperature for w in windows)
    findings: list[str] = []
    suspect: dict[str, bool] = {}
    served: dict[str, float | None] = {}
    for v in ("drafter", "current"):
        if not _windows(windows, v):
            continue
        served[v] = _served_al(windows, v, t0)
        est = offline.get(v)
        if served[v] is None or est is None or est <= 1.0:
            continue
        ratio = (served[v] - 1.0) / (est - 1.0)
        # Below the bar beyond the served AL's own interval: a window of a few requests that reads low by chance
        # sets off no triage (each of its probes an engine load: tens of minutes at Kimi-K2.5's size).
        ci = _served_al_interval(windows, v, t0)
        bar = 1.0 + suspect_ratio * (est - 1.0)
        below = ci.high < bar if ci is not None and math.isfinite(ci.high) else ratio < suspect_ratio
        suspect[v] = below
        findings.append(
            f"{v}: served acceptance length {served[v]:.2f}"
            + (f" (95% CI {ci.low:.2f}-{ci.high:.2f})" if ci is not None and math.isfinite(ci.high) else "")
            + f" at temperature {t0:g} against its offline estimate "
            f"{est:.2f}: {served[v] - 1:.2f} vs {est - 1:.2f} accepted drafts per step ({ratio:.0%})"
            + (
                f", below the {suspect_ratio:.0%} that benchmark.suspect_ratio allows"
                + (f" (AL {bar:.2f}) beyond its interval" if ci is not None and math.isfinite(ci.high) else "")
                if suspect[v]
                else (
                    f", below the {suspect_ratio:.0%} that benchmark.suspect_ratio allows (AL {bar:.2f}) but within "
                    "its interval: not suspect on this evidence"
                    if ratio < suspect_ratio
                    else ""
                )
            )
        )

    cliff: dict[str, str] = {}
    for v in ("drafter", "current"):
        al0 = served.get(v)
        if al0 is None or al0 - 1.0 < 0.2:  # too little greedy acceptance to fall from
            continue
        for t in sorted({w.temperature for w in _windows(windows, v)} - {t0}):
            al = _served_al(windows, v, t)
            if al is not None and (al - 1.0) < sampled_suspect_ratio * (al0 - 1.0):
                cliff[v] = (
                    f"{v}: at temperature {t:g} accepted drafts per step fall to {(al - 1) / (al0 - 1):.0%} of "
                    f"temperature {t0:g}'s ({al:.2f} vs {al0:.2f} acceptance length), below the "
                    f"{sampled_suspect_ratio:.0%} that benchmark.sampled_suspect_ratio allows: a drafter keeps "
                    "about the target's own confidence's share, so the engine's sampled verify path is suspect"
                )
                findings.append(cliff[v])
                break

    integration_suspect = bool(cliff)
    new_low = suspect.get("drafter", False)
    if new_low:
        cur_al = served.get("current")
        new_al = served["drafter"]
        assert new_al is not None
        same = cur_al is not None and abs(cur_al - new_al) <= max(0.25 * (new_al - 1.0), 0.1)
        if suspect.get("current") or same:
            integration_suspect = True
            evidence = (
                f"the current drafter scores the same ({cur_al:.2f} vs {new_al:.2f})"
                if same
                else "the current drafter is far below its own offline estimate too"
            )
            findings.append(
                "ENGINE INTEGRATION SUSPECT, not the drafter: " + evidence + ". Two drafters failing alike on "
                "this engine point at how the engine feeds them: the aux layer ids convention (vLLM: input of "
                "layer k; SpecForge/SGLang: output of layer k-1), the target model class's EAGLE-3 support in "
                "this engine version, d2t handling, or the chat template / reasoning parser of the requests."
            )
        elif cur_al is not None and cur_al > new_al:
            findings.append(
                f"the new drafter serves far below its offline estimate while the current drafter serves better "
                f"({cur_al:.2f} vs {new_al:.2f}) on the same engine: suspect the new drafter's export (aux layer "
                "ids and their convention, d2t/t2d, norm_before_residual) rather than the engine."
            )
        else:
            integration_suspect = True
            findings.append(
                "ENGINE INTEGRATION SUSPECT: serving acceptance is far below the offline estimate and there is no "
                "second drafter to tell the engine from the drafter (set benchmark.current_drafter to the public "
                "drafter to get that evidence). Check the aux layer ids convention and the engine's EAGLE-3 support "
                "for this target before retraining."
            )

    if triage is not None:
        if triage.blame != "undetermined":  # the probes answered what the suspicion could only guess at
            findings = [f for f in findings if not f.startswith("ENGINE INTEGRATION SUSPECT")]
        findings.append(f"TRIAGE of {triage.variant}: {triage.culprit}. {triage.advice}")
        findings += [f"triage: {e}" for e in triage.evidence]
        if triage.blame in ("the drafter or its data", "none"):
            integration_suspect = False  # the probes cleared the engine
        elif triage.blame in ("verify step", "hidden-state plumbing", "attention backend"):
            integration_suspect = True

    parts = []
    if head and head.drafter_vs_baseline is not None:
        ci = head.drafter_vs_baseline_ci
        if ci and head.unpaired:
            how = f" (95% CI {ci[0]:.2f}-{ci[1]:.2f}, unpaired: {head.unpaired})"
        else:
            how = f" (95% CI {ci[0]:.2f}-{ci[1]:.2f}, {head.paired_rounds} paired rounds)" if ci else ""
        speed = f"{head.drafter_vs_baseline:.2f}x the output tokens/s of no speculation"
        parts.append(f"the new drafter serves {speed}{how}")
    if head and head.drafter_vs_current is not None:
        ci = head.drafter_vs_current_ci
        parts.append(
            f"{head.drafter_vs_current:.2f}x the current drafter's"
            + (f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        )
    setting = f"(temperature {head.temperature if head else 0:g}, concurrency {head.concurrency if head else 1})"
    summary = ", ".join(parts) + f" {setting}" if parts else "no drafter was measured"
    slower = [r for r in rows if r.drafter_vs_baseline is not None and r.drafter_vs_baseline < 1.0]
    if slower:
        findings.append(
            "slower than no speculation at: "
            + ", ".join(
                f"temperature {r.temperature:g} / concurrency {r.concurrency} ({r.drafter_vs_baseline:.2f}x)"
                for r in slower
            )
        )
    reused = {w.variant: w.measured for w in windows if w.measured}
    if reused:
        findings.append(
            "reused, not measured in this run: "
            + "; ".join(f"{v} (measured {when.removeprefix('measured ')})" for v, when in reused.items())
            + ". A ratio against a reused window is unpaired (another hour's load and clocks): its interval "
            "carries both windows' spread"
        )
    if spread is not None:
        findings.append(spread_line(spread))
    elif engines_apart and parts:
        findings.append(
            "engine to engine: the variants' engines ran one after another, and the speed intervals hold each "
            "window's round-to-round noise, not how far one engine reads from the next (on 2 CPU cores the same "
            "drafter read 1.32x a copy of itself, docs/benchmarks.md): set benchmark.remeasure_baseline to measure "
            "it and widen them"
        )
    if mix is not None:
        summary = f"{mix_summary(mix)}; at the first setting, {summary}" if parts else mix_summary(mix)
        if mix.slower:
            findings.insert(0, "SLOWER where production serves, beyond noise: " + "; ".join(mix.slower))
    if triage is not None and triage.blame not in ("none", "undetermined"):
        summary += f"; triage blames {triage.culprit}"
    elif integration_suspect:
        summary += "; the engine integration is suspect (see findings)"
    elif any(suspect.values()):
        summary += "; acceptance is below the offline estimate (see findings)"
    elif cliff:
        summary += "; acceptance collapses at temperature > 0 (see findings)"
    elif "drafter" in suspect:
        summary += "; serving acceptance agrees with the offline estimate"
    return Verdict(
        summary=summary,
        integration_suspect=integration_suspect,
        findings=findings,
        speedups=rows,
        headline=head,
        suspects=[v for v in ("drafter", "current") if suspect.get(v) or v in cliff],
        triage=triage,
        mix=mix,
        engine_spread=spread,
    )


# What a reader of the report wants to know about production (the full record is in the manifest).
PRODUCTION_KEYS = (
    "summary",
    "ok",
    "was_running",
    "started",
    "healthy_after_s",
    "by",
    "orphaned",
    "ended_engines",
    "error",
)


def headline_setting(verdict: Verdict, settings: Sequence[tuple[float, int]]) -> tuple[float, int]:
    """(temperature, concurrency) of the verdict's headline row, the lowest of each measured, else the first setting
    measured: the one setting the run's summary table, its headline speedup and the promotion gate's AL all read
    (settings that follow production.traffic are measured in the traffic's order, not from the lowest)."""
    h = verdict.headline
    return (h.temperature, h.concurrency) if h is not None else settings[0]


def _f(x: Any, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def render_markdown(
    title: str,
    windows: list[Measurement],
    verdict: Verdict,
    k: int,
    production: ProductionResult | None = None,
    notes: list[str] | None = None,
    plots: dict[str, str] | None = None,
    seconds: dict[str, float] | None = None,
) -> str:
    """The benchmark's table and verdict, for a Prefect artifact and the stage dir. `plots`: name -> PNG
    file beside the markdown (the control side inlines them for Prefect). `seconds`: where the stage's time
    went, part by part (each engine's load, each setting's windows, the triage)."""
    lines = [f"# {title}", "", f"**Verdict:** {verdict.summary}", ""]
    for f in verdict.findings:
        lines.append(f"- {f}")
    lines += [
        "",
        "| variant | temp | conc | requests | output tok/s | vs none | vs none 95% CI | TTFT ms | ITL ms | "
        "TPOT ms | AL | AL 95% CI | accept rate | per position |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = {(w.temperature, w.concurrency): w for w in _windows(windows, "baseline")}
    reused = []
    for w in windows:
        b = base.get((w.temperature, w.concurrency))
        ratio, ci = _ratio(b, w, verdict.engine_spread) if b is not w else (None, None)
        pos = w.per_position_acceptance
        al_ci = w.al_interval
        requests = f"{w.requests}" + (" (stopped: precision)" if w.stopped == "precision" else "") if w.requests else ""
        if w.measured and w.variant not in reused:
            reused.append(w.variant)
        lines.append(
            f"| {w.variant}{' (reused)' if w.measured else ''} | {w.temperature:g} | {w.concurrency} | {requests} | "
            f"{w.output_tok_s:.1f} | {_f(ratio, '.2f') + 'x' if ratio is not None else ''} | "
            f"{f'{ci[0]:.2f}-{ci[1]:.2f}' if ci else ''} | "
            f"{_f(w.ttft_ms, '.0f')} | {_f(w.itl_ms, '.1f')} | "
            f"{_f(w.tpot_ms, '.1f')} | {_f(w.mean_acceptance_length, '.2f')} | "
            f"{f'{al_ci[0]:.2f}-{al_ci[1]:.2f}' if al_ci else ''} | "
            f"{_f(w.acceptance_rate, '.1%')} | {' / '.join(f'{p:.2f}' for p in pos) if pos else ''} |"
        )
    lines += [
        "",
        f"{k} speculative tokens per step; AL = 1 + accepted drafts per verification step. TTFT, ITL "
        "(inter-token latency) and TPOT (time per output token) are means from the engine's own histograms, "
        "acceptance from its counters, over the measured window (warm-up excluded). 'vs none' pairs the "
        "variant's rounds with the baseline's on the same prompts; the 95% intervals are over rounds"
        + (", and the engine-to-engine spread (findings)." if verdict.engine_spread else "."),
    ]
    for v in reused:
        w = next(x for x in windows if x.variant == v)
        lines.append(f"- {v}: reused, {w.measured}")
    if verdict.mix is not None:
        lines += ["", *mix_markdown(verdict.mix)]
    for name, file in (plots or {}).items():
        lines += ["", f"![{name}]({file})"]
    if verdict.triage:
        lines += ["", *triage_markdown(verdict.triage)]
    if production:
        lines += ["", "## Production", ""]
        shown = production.model_dump(include=set(PRODUCTION_KEYS), exclude_none=True)
        lines += [f"- {key}: {shown[key]}" for key in PRODUCTION_KEYS if key in shown]
    if seconds:
        lines += ["", "## Where the time went", "", "| part | seconds |", "|---|---:|"]
        lines += [f"| {part} | {s:.1f} |" for part, s in seconds.items()]
    for n in notes or []:
        lines += ["", n]
    return "\n".join(lines) + "\n"


def triage_markdown(t: Triage) -> list[str]:
    """The triage's blame, its figures per probe, and what did not run."""
    lines = [
        f"## Triage of {t.variant}: {t.culprit}",
        "",
        f"Why it ran: {t.trigger}.",
        "",
        f"**What to do:** {t.advice}",
        "",
    ]
    for c in t.lossless:
        lines.append(
            f"- lossless at temperature 0 ({c.variant} vs no speculation): {c.identical} of {c.prompts} "
            f"answers identical, median agreement {c.agreement:.0%}"
        )
    if t.verify:
        v = t.verify
        lines.append(
            f"- verify probe ({v.prompts} copy prompts, ngram): agreement {v.agreement:.0%}, acceptance "
            f"{_f(v.acceptance_rate, '.0%')}, copy rate {v.copy_rate:.0%}, AL {_f(v.mean_acceptance_length, '.2f')}"
            f" -> {'healthy' if v.healthy else 'FAULT'}"
        )
    if t.plumbing:
        p = t.plumbing
        lines += [
            f"- plumbing probe ({p.tokens} held-out tokens, against {p.reference}) -> "
            f"{'healthy' if p.healthy else 'FAULT'}",
            "",
            "| layer id | rel err | cosine | closest trained id |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {m.layer_id} | {m.rel_err:.3f} | {m.cosine:.4f} | "
            f"{m.best_id if m.best_id is not None else 'none'} ({m.best_rel_err:.3f}) |"
            for m in p.layers
        ]
        lines.append("")
    if t.backends:
        b = t.backends
        lines.append(f"- backend probe (k = 1): {b.reason}")
    lines += [f"- drafter: {f}" for f in t.drafter]
    lines += [f"- not run: {s}" for s in t.skipped]
    return lines
