"""The run report: report.json, a terminal table and a markdown table, from the stage manifests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.capacity.render import render_plan
from eagleflow.contracts.benchmark_records import (
    BenchmarkMetrics,
    BenchmarkOutputs,
    KSweep,
    Measurement,
    ProductionResult,
    ProductionWindow,
    Verdict,
)
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.plan import CapacityPlan
from eagleflow.contracts.stage_records import (
    BestEpoch,
    CheckMetrics,
    GenerateMetrics,
    NightRecord,
    ObservedTraffic,
    TrainMetrics,
    TrainOutputs,
)
from eagleflow.util.files import write_bytes_atomic, write_json_atomic, write_text_atomic


class StageSummary(BaseModel):
    """One stage as this run saw it."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(description="Wall time of the task in this run (a cache hit takes about nothing).")
    cached: bool = Field(description="Served from Prefect's cache (its manifest still on the host).")
    key: str
    compute_seconds: float = Field(description="Wall time the stage took on the host when it ran.")
    manifest: str = Field(description="The stage's manifest.json on the host.")


class OfflineEstimate(BaseModel):
    """The train stage's own verdict on its drafter: the best epoch and its holdout scores."""

    model_config = ConfigDict(extra="forbid")

    best_epoch: int
    best: BestEpoch


class Report(BaseModel):
    """report.json: one run's serving figures, verdict and stages."""

    model_config = ConfigDict(extra="forbid")

    run: str
    kind: Literal["pipeline", "benchmark", "nightly"] = Field(
        "pipeline", description="What ran: the full pipeline, the benchmark alone, or a nightly retrain."
    )
    created: str = Field(description="UTC, ISO 8601.")
    baseline: Measurement = Field(description="No speculation at the benchmark's first setting.")
    drafter: Measurement = Field(description="The new drafter at the first setting.")
    current: Measurement | None = Field(None, description="Production's current drafter at the first setting.")
    speedup: float
    verdict: Verdict | None = None
    windows: list[Measurement] = Field(default_factory=list)
    production: ProductionResult | None = None
    production_windows: list[ProductionWindow] = Field(
        default_factory=list,
        description="Production stopped for the GPU stages: for which, how long, how it came back.",
    )
    drafter_dir: str | None = None
    drafters: dict[str, str] = Field(default_factory=dict)
    benchmark_settings: dict = Field(default_factory=dict)
    offline: OfflineEstimate | None = Field(None, description="None when only the benchmark ran.")
    capacity: CapacityPlan | None = Field(None, description="The check stage's capacity plan, when it ran.")
    k_sweep: KSweep | None = Field(None, description="benchmark.k_sweep: the new drafter at every k, the fastest.")
    production_traffic: ObservedTraffic | None = Field(
        None, description="Production's traffic as its engine counted it (the check stage's read of its /metrics)."
    )
    stages: dict[str, StageSummary]
    plots: dict[str, str] = Field(
        default_factory=dict,
        description="The run's pictures on the host: name -> path "
        "(curves from train; acceptance and speedup from the benchmark; the nightly's AL "
        "by night).",
    )
    replicas: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="generate over production.replicas: each replica's requests (sent, "
        "answered, moved to another, left, taken back), from the generate stage's manifest.",
    )
    nights: list[NightRecord] = Field(
        default_factory=list,
        description="The nightly retrain: every night so far, "
        "tonight last (AL by night on the fixed held-out prompts).",
    )
    path: str | None = Field(None, description="Where report.json was written.")


class StageTiming(BaseModel):
    seconds: float
    cached: bool


def build_report(
    run_name: str,
    manifests: dict[str, Manifest],
    timings: dict[str, StageTiming],
    production_windows: list[ProductionWindow] | None = None,
    nights: list[NightRecord] | None = None,
    plots_on_host: dict[str, str] | None = None,
    kind: str = "pipeline",
) -> Report:
    bench = BenchmarkMetrics.of(manifests["benchmark"])
    offline = None
    plots: dict[str, str] = {}
    if "train" in manifests:
        train = TrainMetrics.of(manifests["train"])
        offline = OfflineEstimate(best_epoch=train.best_epoch, best=train.best)
        plots.update({n: manifests["train"].path(f) for n, f in TrainOutputs.of(manifests["train"]).plots.items()})
    plots.update(
        {n: manifests["benchmark"].path(f) for n, f in BenchmarkOutputs.of(manifests["benchmark"]).plots.items()}
    )
    plots.update(plots_on_host or {})
    check = CheckMetrics.of(manifests["check"]) if "check" in manifests else None
    return Report(
        run=run_name,
        kind=kind,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        baseline=bench.baseline,
        drafter=bench.drafter,
        current=bench.current,
        speedup=bench.speedup,
        verdict=bench.verdict,
        k_sweep=bench.k_sweep,
        windows=bench.windows,
        production=bench.production,
        production_windows=production_windows or [],
        drafter_dir=BenchmarkOutputs.of(manifests["benchmark"]).drafter_dir,
        drafters=bench.drafters,
        benchmark_settings=bench.settings.model_dump(mode="json"),
        offline=offline,
        capacity=check.plan if check else None,
        production_traffic=check.production_traffic if check else None,
        stages={
            s: StageSummary(
                seconds=round(t.seconds, 2),
                cached=t.cached,
                key=manifests[s].key,
                compute_seconds=manifests[s].seconds,
                manifest=f"{manifests[s].dir}/manifest.json",
            )
            for s, t in timings.items()
        },
        plots=plots,
        nights=nights or [],
        replicas=GenerateMetrics.of(manifests["generate"]).replicas if "generate" in manifests else {},
    )


def write_report(report: Report, report_dir: str | Path, images: dict[str, bytes] | None = None) -> Path:
    """`<report_dir>/<run>-<UTC stamp>/report.json`, `report.md` beside it with the pictures (`images`:
    name -> PNG bytes, fetched from the host) as `<name>.png`; sets `report.path`. report.json last."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = Path(report_dir) / f"{report.run}-{stamp}" / "report.json"
    report.path = str(path)
    for name, data in (images or {}).items():
        write_bytes_atomic(path.parent / f"{name}.png", data)
    write_text_atomic(path.parent / "report.md", render_markdown(report, {n: f"{n}.png" for n in images or {}}))
    write_json_atomic(path, report.model_dump(mode="json"))
    return path


def _rows(report: Report) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str, str]]]:
    b, d = report.baseline, report.drafter
    per_pos = " / ".join(f"{x:.2f}" for x in d.per_position_acceptance or [])
    serving = [
        ("output tok/s", f"{b.output_tok_s:.1f}", f"{d.output_tok_s:.1f}"),
        ("speedup", "1.00x", f"{report.speedup:.2f}x"),
        ("acceptance rate", "-", f"{d.acceptance_rate or 0:.3f}"),
        ("mean acceptance length", "-", f"{d.mean_acceptance_length or 0:.2f}"),
        ("per-position acceptance", "-", per_pos),
    ]
    stages = [
        (s, f"{t.seconds:.1f}", "yes" if t.cached else "no", f"{t.compute_seconds:.1f}")
        for s, t in report.stages.items()
    ]
    return serving, stages


def _window_lines(report: Report) -> list[str]:
    """Every measured window: variant x temperature x concurrency."""
    if not report.windows:
        return []
    base = {(w.temperature, w.concurrency): w.output_tok_s for w in report.windows if w.variant == "baseline"}
    lines = [f"{'variant':10}{'temp':>6}{'conc':>6}{'tok/s':>9}{'vs none':>9}{'AL':>7}{'TTFT ms':>9}{'TPOT ms':>9}"]
    for w in report.windows:
        b = base.get((w.temperature, w.concurrency))
        al = w.mean_acceptance_length
        lines.append(
            f"{w.variant:10}{w.temperature:>6g}{w.concurrency:>6}{w.output_tok_s:>9.1f}"
            f"{(w.output_tok_s / b if b else 0):>8.2f}x{(f'{al:.2f}' if al else '-'):>7}"
            f"{(w.ttft_ms or 0):>9.0f}{(w.tpot_ms or 0):>9.1f}"
        )
    return lines


def _production_lines(report: Report) -> list[str]:
    """How long production was down, for which stages, and how it came back."""
    lines = []
    for w in report.production_windows:
        down = f"down {w.down_s:.0f} s" if w.down_s is not None else "not running before"
        lines.append(f"production {down} for {', '.join(w.stages)}: {w.summary}")
    if report.production and report.production.kind != "none" and report.production.summary:
        lines.append(f"production (benchmark): {report.production.summary}")
    for url, c in report.replicas.items():
        lines.append(
            f"generate on replica {url}: {c['sent']} requests sent, {c['answered']} answered, {c['moved']} "
            f"sent again elsewhere; left {c['down']}x, taken back {c['back']}x"
        )
    return lines


def _night_lines(report: Report) -> list[str]:
    """The nightly: what tonight added and reused, and the acceptance length night by night."""
    if not report.nights:
        return []
    n = report.nights[-1]
    lines = [
        f"night {n.night}: {n.new_samples:,} new samples generated and extracted ({n.new_tokens:,} train tokens), "
        f"{n.replay_sequences:,} older sequences replayed; the pool keeps {n.pool_samples:,} samples "
        f"({n.pool_bytes / 1e9:.2f} GB of states)"
        + (f", {len(n.evicted)} batch(es) evicted for the budget" if n.evicted else ""),
        f"trained {n.train_steps or 0:,} steps "
        + (
            f"from the promoted drafter {n.warm_start}"
            if n.warm_start
            else "as a full run (no promoted drafter to continue)"
        ),
        f"benchmark: {n.benchmark_requests or 0:,} requests measured; baseline {n.baseline}",
        "",
        f"{'night':>5}  {'date':20}{'new':>7}{'pool':>8}{'steps':>7}{'holdout AL':>12}{'served AL':>11}"
        f"{'95% CI':>13}{'speedup':>9}  promoted",
    ]
    for r in report.nights:
        ci = f"{r.served_al_ci[0]:.2f}-{r.served_al_ci[1]:.2f}" if r.served_al_ci else "-"
        lines.append(
            f"{r.night:>5}  {r.date:20}{r.new_samples:>7,}{r.pool_samples:>8,}{r.train_steps or 0:>7,}"
            f"{_num(r.holdout_al):>12}{_num(r.served_al):>11}{ci:>13}"
            f"{(f'{r.speedup:.2f}x' if r.speedup else '-'):>9}  "
            f"{'-' if r.promoted is None else 'yes' if r.promoted else 'no'}"
        )
    return lines


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _verdict_lines(report: Report) -> list[str]:
    v = report.verdict
    if v is None:
        return []
    return [f"verdict: {v.summary}"] + [f"  - {f}" for f in v.findings]


def _traffic_lines(seen: ObservedTraffic) -> list[str]:
    return [seen.describe()] + [f"ANOTHER LOAD: {d}" for d in seen.disagreements]


TITLES = {
    "pipeline": "eagleflow pipeline run",
    "benchmark": "eagleflow benchmark-only run",
    "nightly": "eagleflow nightly run",
}


def title(report: Report) -> str:
    """What ran, as the report's first line says it."""
    return TITLES[report.kind]


def render_text(report: Report) -> str:
    serving, stages = _rows(report)
    lines = [f"{title(report)} {report.run}", "", f"{'':26}{'baseline':>12}{'drafter':>22}"]
    lines += [f"{name:26}{base:>12}{dr:>22}" for name, base, dr in serving]
    if report.windows:
        lines += [""] + _window_lines(report)
    if report.verdict:
        lines += [""] + _verdict_lines(report)
    if report.k_sweep:
        lines += ["", f"draft tokens a step (benchmark.k_sweep): {report.k_sweep.summary}"]
    if report.production_traffic:
        lines += ["", *_traffic_lines(report.production_traffic)]
    if _production_lines(report):
        lines += [""] + _production_lines(report)
    if report.nights:
        lines += [""] + _night_lines(report)
    if report.capacity:
        lines += ["", render_plan(report.capacity)]
    lines += ["", f"{'stage':12}{'seconds':>10}{'cached':>8}{'compute s':>12}"]
    lines += [f"{s:12}{sec:>10}{c:>8}{comp:>12}" for s, sec, c, comp in stages]
    return "\n".join(lines)


PLOT_TITLES = {
    "acceptance": "Per-position acceptance by variant",
    "speedup": "Speedup by temperature x concurrency",
    "curves": "Training curves",
    "al-by-night": "Acceptance length by night",
}


def render_markdown(report: Report, images: dict[str, str] | None = None) -> str:
    """The report as markdown; `images`: plot name -> what an image link points at (a file beside
    report.md, or a data URI in a Prefect artifact)."""
    serving, stages = _rows(report)
    md = [f"# {title(report)} `{report.run}`", "", "| metric | baseline | drafter |", "|---|---:|---:|"]
    md += [f"| {n} | {b} | {d} |" for n, b, d in serving]
    if report.verdict:
        md += ["", f"**Verdict:** {report.verdict.summary}", ""]
        md += [f"- {f}" for f in report.verdict.findings]
    if report.k_sweep:
        md += ["", f"**Draft tokens a step** (benchmark.k_sweep): {report.k_sweep.summary}"]
    if report.production_traffic:
        md += ["", *(f"- {line}" for line in _traffic_lines(report.production_traffic))]
    if report.windows:
        md += ["", "```", *_window_lines(report), "```"]
    for name, src in (images or {}).items():
        md += ["", f"**{PLOT_TITLES.get(name, name)}**", "", f"![{name}]({src})"]
    if _production_lines(report):
        md += [""] + [f"- {line}" for line in _production_lines(report)]
    if report.nights:
        md += ["", "**AL by night** (the same held-out prompts every night)", "", "```", *_night_lines(report), "```"]
    if report.capacity:
        md += [
            "",
            "**Capacity plan** (the check stage's estimate before the run)",
            "",
            "```",
            render_plan(report.capacity),
            "```",
        ]
    md += ["", "| stage | seconds | cached | compute seconds |", "|---|---:|:-:|---:|"]
    md += [f"| {s} | {sec} | {c} | {comp} |" for s, sec, c, comp in stages]
    return "\n".join(md)
