"""What the benchmark stage records: measured windows, speedups, the triage's probes, the verdict,
production's windows, and the stage's outputs and metrics (read by the report, the promotion gate and status).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.config import BenchmarkConfig
from eagleflow.contracts.stage_records import MetricsRecord, Record


class Measurement(BaseModel):
    """One measured window: a variant at one temperature and concurrency, from the engine's own metrics."""

    model_config = ConfigDict(extra="forbid")

    variant: str = Field(description="baseline (no speculation), current (production's drafter) or drafter (new).")
    temperature: float
    concurrency: int
    output_tok_s: float = Field(description="Output tokens over the window's wall time.")
    output_tokens: int | None = None
    seconds: float | None = None
    requests: int | None = None
    ttft_ms: float | None = Field(None, description="Mean time to first token (engine histogram).")
    itl_ms: float | None = Field(None, description="Mean inter-token latency, per verification step (engine).")
    tpot_ms: float | None = Field(None, description="Mean time per output token (engine).")
    e2e_ms: float | None = Field(None, description="Mean end-to-end request latency (engine).")
    client_latency_ms_p50: float | None = Field(None, description="Median request round trip on the client.")
    # Speculative variants only.
    mean_acceptance_length: float | None = Field(None, description="1 + accepted drafts per verification step.")
    acceptance_rate: float | None = Field(None, description="Accepted draft tokens / draft tokens.")
    per_position_acceptance: list[float] | None = Field(None, description="Accepted at position i / drafts.")
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    source: str | None = Field(None, description="Where acceptance came from when not the engine's counters.")
    # Rounds: the same held-out prompts sent to every variant (one at concurrency 1, c at concurrency c), in
    # order; the unit the paired speedup and the intervals are computed over (eagleflow.measure.intervals).
    round_seconds: list[float] | None = Field(None, description="Wall seconds of each round.")
    round_tokens: list[int] | None = Field(None, description="Output tokens of each round.")
    round_drafts: list[float] | None = Field(None, description="Drafting steps in each round (engine counters).")
    round_accepted: list[float] | None = Field(None, description="Accepted draft tokens in each round.")
    al_interval: list[float] | None = Field(None, description="95% interval of the acceptance length over rounds.")
    stopped: str | None = Field(
        None,
        description="Why the window ended: 'precision' (benchmark.precision reached "
        "after n requests) or 'all prompts'.",
    )
    measured: str | None = Field(
        None, description="Set when reused from an earlier run: when and where it was measured (benchmark.reuse_for_h)."
    )


class SpeedupRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float
    concurrency: int
    drafter_vs_baseline: float | None = None
    current_vs_baseline: float | None = None
    drafter_vs_current: float | None = None
    # 95% intervals of the paired speedups (rounds both variants measured), when their rounds are known
    drafter_vs_baseline_ci: list[float] | None = None
    current_vs_baseline_ci: list[float] | None = None
    drafter_vs_current_ci: list[float] | None = None
    paired_rounds: int | None = Field(None, description="Rounds the drafter's speedup over the baseline pairs.")
    unpaired: str | None = Field(
        None,
        description="Set when the drafter's speedup over the baseline is not paired: a window reused from an earlier "
        "run (when and where it was measured); its interval then carries both windows' spread.",
    )


class LosslessCheck(BaseModel):
    """Speculation at temperature 0 must not change what the target emits: each drafter variant's answers
    against no speculation's, on the same prompts (free: from the measured windows)."""

    model_config = ConfigDict(extra="forbid")

    variant: str
    prompts: int
    identical: int = Field(description="Answers equal to no speculation's, character for character.")
    agreement: float = Field(
        description="Median over prompts of the share of no speculation's answer reproduced "
        "before the first difference (1.0: lossless)."
    )


class VerifyProbe(BaseModel):
    """The verify step alone: speculation with no drafter model (vLLM's ngram prompt lookup) on prompts built to
    be copied (a held-out prompt P, the target's own answer A, then P again), against the same prompts served
    without speculation."""

    model_config = ConfigDict(extra="forbid")

    prompts: int
    method: str = Field(description="The speculative config of the probe engine.")
    acceptance_rate: float | None = Field(description="Accepted / drafted tokens on the copy prompts.")
    mean_acceptance_length: float | None = None
    per_position_acceptance: list[float] | None = None
    copy_rate: float = Field(
        description="Median share of its own earlier answer the target repeats without "
        "speculation: how much of the drafts a correct verify step can accept."
    )
    agreement: float = Field(
        description="Median share of the no-speculation answer reproduced under speculation "
        "before the first difference (1.0: lossless)."
    )
    sampled_temperature: float | None = Field(
        None,
        description="The copy prompts again at this temperature (the "
        "sampled verify path with a distribution as sharp as greedy).",
    )
    sampled_acceptance_rate: float | None = None
    sampled_healthy: bool | None = Field(None, description="The sampled path accepts about as much as greedy.")
    healthy: bool
    reason: str = Field(description="Why it counts as healthy or not, with the figures.")


class LayerMatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer_id: int = Field(description="The id the engine was asked to capture (vLLM convention; L = final).")
    rel_err: float = Field(description="Mean over tokens of |engine - trained| / |trained| at this id.")
    cosine: float = Field(description="Mean cosine of the engine's state and the trained one at this id.")
    best_id: int | None = Field(description="The trained id the engine's state is closest to, if any is close.")
    best_rel_err: float


class PlumbingProbe(BaseModel):
    """The engine's own aux and final states (vLLM extract_hidden_states) for held-out tokens, against the states
    the drafter was trained on."""

    model_config = ConfigDict(extra="forbid")

    reference: str = Field(description="The extract stage whose states were compared.")
    sequences: int
    tokens: int
    layers: list[LayerMatch]
    healthy: bool
    reason: str


class BackendRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_backend: str = Field(description="--attention-backend of the target ('default': the engine's choice).")
    draft_backend: str = Field(description="speculative_config.attention_backend ('default': the engine's choice).")
    first_position_acceptance: float | None = Field(description="Accepted first drafts / drafts, k = 1.")
    error: str | None = Field(None, description="Why the engine did not serve with these backends.")


class BackendProbe(BaseModel):
    """The same drafter under each alternative attention backend the engine offers for target and draft, k = 1."""

    model_config = ConfigDict(extra="forbid")

    default: BackendRun = Field(description="What the measured run used (its first-position acceptance).")
    offered: dict[str, list[str]] = Field(description="Backends the engine offers: {'target': [...], 'draft': [...]}.")
    runs: list[BackendRun]
    restores: BackendRun | None = Field(None, description="The first alternative that restores acceptance, if any.")
    reason: str


class Triage(BaseModel):
    """Where serving acceptance is lost: the probes that separate the engine's verify step, its hidden-state
    plumbing and its attention backend from the drafter (eagleflow.triage)."""

    model_config = ConfigDict(extra="forbid")

    variant: str = Field(description="The drafter variant triaged (the one far below its offline estimate).")
    trigger: str = Field(description="Why the triage ran.")
    lossless: list[LosslessCheck] = Field(default_factory=list)
    verify: VerifyProbe | None = None
    plumbing: PlumbingProbe | None = None
    backends: BackendProbe | None = None
    drafter: list[str] = Field(
        default_factory=list,
        description="What is known of the drafter: its lineage, the other drafter scored in the same run.",
    )
    skipped: list[str] = Field(default_factory=list, description="Probes that did not run, and why.")
    blame: Literal[
        "verify step", "hidden-state plumbing", "attention backend", "the drafter or its data", "none", "undetermined"
    ]
    culprit: str = Field(
        description="The blame as the verdict says it, e.g. 'attention backend FLASHINFER_MLA "
        "(TRITON_MLA restores acceptance)'."
    )
    evidence: list[str] = Field(description="The figures behind the blame.")
    advice: str = Field(description="What to do.")
    seconds: float = 0.0


class MixCell(BaseModel):
    """One cell of production's traffic (production.traffic) as the benchmark measured it."""

    model_config = ConfigDict(extra="forbid")

    temperature: float
    top_p: float = 1.0
    concurrency: int
    share: float = Field(description="Its share of production's output tokens.")
    name: str | None = None
    speedup: float | None = Field(None, description="The new drafter over no speculation there; None: not measured.")
    speedup_ci: list[float] | None = None


class Mix(BaseModel):
    """The new drafter over no speculation across production's traffic: each cell's speedup weighted by its share of
    output tokens (the time to serve the same tokens: sum(share / speedup)), with its 95% interval."""

    model_config = ConfigDict(extra="forbid")

    speedup: float | None = Field(None, description="Over the whole mix; None when a cell was not measured.")
    speedup_ci: list[float] | None = Field(None, description="Its 95% interval; None when a cell has none.")
    cells: list[MixCell]
    slower: list[str] = Field(
        default_factory=list,
        description="Cells carrying at least production.traffic_floor_share that serve slower than no speculation "
        "beyond noise (their interval's upper end below 1), as a person reads them.",
    )
    decided_by: str = Field("", description="The cell that weighs most in the mix's figure, as a person reads it.")


class EngineSpread(BaseModel):
    """No speculation served twice, first and last, each on an engine of its own (benchmark.remeasure_baseline):
    how far one engine's throughput moves from the next's at the same setting, which rounds paired within a
    window cannot show."""

    model_config = ConfigDict(extra="forbid")

    settings: list[list[float]] = Field(description="[temperature, concurrency] of each setting measured twice.")
    ratios: list[float] = Field(description="Per setting: the second engine's throughput over the first's.")
    log_sd: float = Field(
        description="Standard deviation of log throughput from one engine to the next: sqrt(mean(log(ratio)^2) / 2)."
    )
    df: int = Field(description="Degrees of freedom of log_sd: the settings measured twice.")


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    summary: str = Field(description="One line: the headline speedups and whether acceptance is to be trusted.")
    integration_suspect: bool = Field(
        description="Serving acceptance far below the offline estimate, the engine side to blame (see findings)."
    )
    findings: list[str]
    speedups: list[SpeedupRow]
    headline: SpeedupRow | None = Field(None, description="The first setting's speedups.")
    suspects: list[str] = Field(default_factory=list, description="Drafter variants far below their offline estimate.")
    triage: Triage | None = Field(None, description="Where the acceptance is lost, when the triage ran.")
    mix: Mix | None = Field(None, description="Over production's traffic, when production.traffic is given.")
    engine_spread: EngineSpread | None = Field(
        None, description="The engine-to-engine spread every interval between engines holds, when it was measured."
    )


class ProductionWindow(BaseModel):
    """One production window of a pipeline run: production stopped once for these stages and given back."""

    model_config = ConfigDict(extra="ignore")  # the holder records more (times, owner) than the report shows

    stages: list[str] = Field(description="The stages that ran while production was down, in order.")
    ok: bool = Field(description="Production answered healthy again (or was not running before).")
    was_running: bool = Field(False, description="Production was serving when the window opened.")
    down_s: float | None = Field(None, description="Seconds from the stop command to production healthy again.")
    healthy_after_s: float | None = Field(None, description="Seconds from the start command to healthy.")
    summary: str = Field("", description="The guardian's line: restored, never stopped, or why not healthy.")
    dir: str | None = Field(None, description="The window's directory on the host (its logs and records).")
    rolled_back: str | None = Field(
        None,
        description="Production did not come back with the drafter deployed in this "
        "window: the guardian pointed it back at the last good one, and why.",
    )
    resumed: dict[str, Any] | None = Field(
        None,
        description="Paused instead of stopped (production.pause 'sleep'): "
        "the wake's level and seconds, a drafter swapped in, the probe's AL.",
    )
    pause_fallback: str | None = Field(
        None, description="production.pause 'sleep' was asked for, and why production was stopped and started instead."
    )
    wake_probe: dict[str, Any] | None = Field(
        None,
        description="The probe after the wake (eagleflow.production.pause.verdict): its AL with the 95% interval and "
        "the requests it took, the AL the drafter should serve and its source (its canary on production, its "
        "offline estimate, or why none), the bar (production.probe_share of it), the decision and what decided.",
    )


class ProductionResult(BaseModel):
    """How production was given back: the guardian's record (eagleflow.production) plus a summary line."""

    model_config = ConfigDict(extra="ignore")  # the guardian may record more than the report shows

    ok: bool
    was_running: bool = False
    started: bool = False
    summary: str | None = None
    kind: str | None = None
    healthy_after_s: float | None = None
    healthy: bool | None = None
    by: str | None = None
    orphaned: bool | None = None
    ended_engines: list[int] | None = None
    error: str | None = None


class PreflightFinding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    check: str
    level: Literal["ok", "warning", "error"]
    message: str


class KSweepRow(BaseModel):
    """The new drafter served at one num_speculative_tokens."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(description="num_speculative_tokens the engine served it at.")
    speedup: float | None = Field(description="Over no speculation: over production's traffic, else the first setting.")
    speedup_ci: list[float] | None = Field(None, description="Its 95% interval.")
    mean_acceptance_length: float | None = Field(None, description="Served AL at the first setting.")
    output_tok_s: float | None = Field(None, description="Output tokens/s at the first setting.")


class KSweep(BaseModel):
    """benchmark.k_sweep: the same drafter, windows and baseline at every k; the k that serves fastest."""

    model_config = ConfigDict(extra="forbid")
    over: str = Field(description="What each speedup is over: production's traffic or the first setting.")
    configured_k: int = Field(description="benchmark.num_speculative_tokens: the k the verdict measured.")
    best_k: int = Field(description="The k whose speedup is highest.")
    beyond_noise: bool = Field(
        True, description="Whether best_k's interval clears the configured k's (False: within noise, keep it)."
    )
    rows: list[KSweepRow] = Field(description="Every k measured, ascending.")
    summary: str = Field(description="One line for a person: the best k against the configured one.")


class BenchmarkOutputs(Record):
    drafter_dir: str | None = Field(
        description="The new drafter measured (absolute path on the host); None: the "
        "references only (benchmark.drafter_on 'none')."
    )
    num_prompts: int
    report_md: str | None = Field(description="report.md: the table and the verdict (none for the references only).")
    plots: dict[str, str] = Field(
        default_factory=dict,
        description="Pictures in the stage dir (PNG): name -> "
        "relative path; 'acceptance' per position by variant, 'speedup' by setting.",
    )


class BenchmarkMetrics(MetricsRecord):
    baseline: Measurement = Field(description="No speculation, at the first setting.")
    current: Measurement | None = Field(None, description="Production's drafter at the first setting, if measured.")
    drafter: Measurement | None = Field(
        description="The new drafter at the first setting (None: benchmark.drafter_on 'none', the references only)."
    )
    speedup: float | None = Field(description="drafter over baseline output tok/s at the first setting.")
    windows: list[Measurement] = Field(description="Every variant x temperature x concurrency.")
    verdict: Verdict
    production: ProductionResult | None
    offline: dict[str, float | None] = Field(description="Each drafter variant's offline AL estimate, if known.")
    drafters: dict[str, str] = Field(description="Each drafter variant's directory.")
    preflight: list[PreflightFinding]
    settings: BenchmarkConfig
    reused: dict[str, str] = Field(
        default_factory=dict,
        description="Variants taken from an earlier run's "
        "measurement (benchmark.reuse_for_h): when and where they were measured.",
    )
    requests: dict[str, int] = Field(
        default_factory=dict, description="Requests this run measured, per variant (all windows; warm-up excluded)."
    )
    seconds: dict[str, float] = Field(
        default_factory=dict,
        description="Where the stage's time went, part by part: the preflight, each engine's load and warm-up, "
        "each setting's windows, the triage.",
    )
    k_sweep: KSweep | None = Field(None, description="benchmark.k_sweep: the new drafter at every k, the fastest.")
