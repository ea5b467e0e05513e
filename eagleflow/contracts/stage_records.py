"""What each stage records in its manifest, typed: one `*Outputs` (paths, counts) and one `*Metrics` per stage.

A stage builds these and `StageRequest.manifest` writes them as the manifest's `outputs` and
`metrics`; a reader (the next stage, the report, the promotion gate) parses them back with
`Model.of(manifest)` instead of reading keys of a dict. Paths are relative to the stage directory.
Pydantic only (no torch): the control side reads them too.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.plan import CapacityPlan


class Record(BaseModel):
    """A manifest part. Unknown keys are an error: a renamed field fails where it is read, not later."""

    model_config = ConfigDict(extra="forbid")
    part: ClassVar[Literal["outputs", "metrics"]] = "outputs"  # which part of the manifest it describes

    @classmethod
    def of(cls, manifest: Manifest):  # -> Self
        """This part of `manifest`, validated."""
        return cls.model_validate(getattr(manifest, cls.part))


class MetricsRecord(Record):
    part: ClassVar[Literal["outputs", "metrics"]] = "metrics"


# -- check ----------------------------------------------------------------------------------------


class ObservedTraffic(Record):
    """Production's traffic as its own engine counted it (its /metrics page, since the engine started): the load and
    lengths the benchmark's cells should stand for, beside what production.traffic states."""

    seconds: float | None = Field(
        description="Seconds the counts span: since the engine's process started (None: unknown)."
    )
    requests: int = Field(description="Requests the engine finished in that span.")
    in_flight: float | None = Field(
        description="Mean requests in flight over the span: the sum of the requests' latencies over its seconds "
        "(Little's law; idle hours count as zero, so a diurnal peak is above it)."
    )
    requests_per_s: float | None = Field(description="Finished requests per second over the span.")
    prompt_tokens: float | None = Field(description="Mean prompt tokens per request.")
    answer_tokens: float | None = Field(description="Mean generated tokens per request.")
    output_tok_s: float | None = Field(description="Generated tokens per second over the span.")
    disagreements: list[str] = Field(
        default_factory=list,
        description="Where production.traffic or the benchmark's settings stand for another load than this.",
    )

    def describe(self) -> str:
        """One line for a person: the load and lengths production's engine counted."""
        span = (
            f"over {self.seconds / 3600:.1f} h since its engine started" if self.seconds else "since its engine started"
        )
        parts = [f"{self.requests:,} requests {span}"]
        if self.in_flight is not None:
            parts.append(f"{self.in_flight:.2f} in flight on average")
        if self.prompt_tokens is not None and self.answer_tokens is not None:
            parts.append(
                f"prompts of {self.prompt_tokens:.0f} tokens and answers of {self.answer_tokens:.0f} on average"
            )
        if self.output_tok_s is not None:
            parts.append(f"{self.output_tok_s:.1f} output tok/s")
        return "production's traffic, as its engine counted it: " + ", ".join(parts)


CAPTURES = "captures"  # CheckMetrics.production_capture when production captures


class CheckMetrics(MetricsRecord):
    """What the host check saw of the target, the prompts and the engine."""

    architectures: list[str] | None = Field(None, description="config.json architectures of the target.")
    num_hidden_layers: int | None = Field(None, description="Decoder layers of the target (text model).")
    hidden_size: int | None = Field(None, description="Hidden size of the target (text model).")
    prompts: int | None = Field(None, description="Prompts in generate.prompts_path.")
    engine: str | None = Field(None, description="The engine's distribution and version on the host.")
    plan: CapacityPlan | None = Field(None, description="Each stage's disk, GPU memory and time (eagleflow.capacity).")
    production_traffic: ObservedTraffic | None = Field(
        None, description="Production's traffic as its engine counted it, where production.url answers /metrics."
    )
    production_capture: str | None = Field(
        None,
        description=f"extract.backend 'production': {CAPTURES!r} when production answered a capture request with "
        "the run's layers, else why it did not (what, cause, fix); the flow then extracts with extract.fallback.",
    )


# -- generate -------------------------------------------------------------------------------------


class GenerateOutputs(Record):
    shards: list[str] = Field(description="Parquet shards, in sample order (data/shard-<n>.parquet).")
    num_train: int = Field(description="Samples in the train split.")
    num_holdout: int = Field(description="Samples held out (validation and benchmark prompts).")
    num_tokens: int = Field(description="Tokens of all conversations, prompts included.")


class GenerateMetrics(MetricsRecord):
    failed: int = Field(description="Answers that failed or came back with neither reasoning nor content.")
    output_tok_s: float | None = Field(description="Output tokens per second of the serving engine, None if cached.")
    completion_tokens: int = Field(description="Output tokens generated by this run of the stage.")
    truncated: int = Field(0, description="Answers cut at generate.max_tokens (kept, marked truncated in the shards).")
    server: str = Field("own", description="Which server answered: 'own' (launched by the stage) or 'production'.")
    server_waits: int = Field(
        0, description="Times the stage waited for a dropped or restarting server to answer again."
    )
    replicas: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="production.replicas: by URL, requests sent, answered, moved (found it gone, sent to another), "
        "times it was left and taken back.",
    )


# -- extract --------------------------------------------------------------------------------------


class ExtractOutputs(Record):
    index: str = Field(description="data/index.json: the shards, their split and sizes, layer ids, hidden size.")
    shards: list[str] = Field(
        description="safetensors shards (data/shard-<generate shard>-<split>-<part>.safetensors)."
    )
    hidden_size: int | None = Field(description="Hidden size of the states.")
    storage_dtype: str = Field("bfloat16", description="How states are stored: bfloat16 or float8_e4m3fn (+ scales).")
    num_bytes: int = Field(0, description="Bytes of all shards.")
    num_tokens: dict[str, int] = Field(description="Tokens per split (train, holdout).")


class ExtractMetrics(MetricsRecord):
    tok_s: float | None = Field(description="Tokens per second of the shards extracted by this run; None if none.")
    device: str = Field(description="The torch device of the forward ('engine' for the vllm backend).")
    backend: str = Field("hf", description="extract.backend that computed the states.")
    tokens_extracted: int = Field(0, description="Tokens this run extracted (0 when every shard was finished before).")
    peak_rss_mib: float | None = Field(None, description="Peak resident memory of the stage process, MiB.")


# -- train ----------------------------------------------------------------------------------------


class EvalSummary(BaseModel):
    """A drafter scored over a split (see eagleflow.drafter.objective.StepStats.summary)."""

    model_config = ConfigDict(extra="forbid")

    loss: float = Field(description="Decay-weighted mean soft cross-entropy (or KL) over the unroll steps.")
    loss_per_step: list[float] = Field(description="Mean loss of each unroll step.")
    acc: list[float] = Field(description="Per unroll step: draft argmax == target argmax (teacher forced).")
    accept_pos_uniform: list[float] = Field(description="Acceptance per position over every context end.")
    acceptance_length_uniform: float = Field(description="1 + sum of accept_pos_uniform (optimistic).")
    acceptance_length_indep: float = Field(description="1 + sum_k prod_{i<=k} acc[i].")
    positions: int = Field(description="Positions scored at the first unroll step.")
    tokens: int = Field(description="Tokens in the batches scored.")
    accept_pos: list[float] | None = Field(None, description="Engine-walk acceptance per position (validation).")
    acceptance_length: float | None = Field(None, description="Simulated serving AL: 1 + sum of accept_pos.")
    drafts: int | None = Field(None, description="Engine-walk drafting rounds.")
    judged: list[int] | None = Field(
        None,
        description="Per position: engine-walk rounds that judged its draft, the answer so far on the target's "
        "argmax (all rounds' accepted drafts when the answers are greedy; fewer when they were sampled).",
    )
    seconds: float | None = Field(None, description="Seconds the validation pass took.")


class EpochMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int
    complete: bool = Field(
        description="False when training stopped inside this epoch (train.max_steps or train.on_time_limit 'stop')."
    )
    step: int = Field(description="Optimizer steps at the end of the epoch.")
    lr: float = Field(description="Learning rate of the epoch's last step.")
    tokens_per_s: float = Field(description="Training tokens per second (all ranks).")
    seconds: float = Field(description="Seconds of optimizer steps in the epoch.")
    train: EvalSummary = Field(description="Scores over the epoch's training batches.")
    validation: EvalSummary | None = Field(None, description="Scores on the holdout split after the epoch.")


class BestEpoch(EvalSummary):
    epoch: int = Field(description="The epoch the scores belong to.")


class TrainOutputs(Record):
    checkpoints: list[str] = Field(description="checkpoints/epoch-<n>, one per epoch.")
    best: str = Field(description="The checkpoint with the highest simulated acceptance length on the holdout.")
    best_epoch: int
    aux_layer_ids: list[int] = Field(description="The layer ids (vLLM convention) the drafter was trained on.")
    arch: dict[str, Any] = Field(description="The drafter's shape (eagleflow.drafter.model.DrafterArch).")
    plots: dict[str, str] = Field(
        default_factory=dict,
        description="Pictures in the stage dir (PNG): "
        "name -> relative path; 'curves': loss and simulated AL per epoch.",
    )


class TrainMetrics(MetricsRecord):
    best_epoch: int
    best: BestEpoch = Field(description="The best epoch's holdout scores (its training scores without a holdout).")
    epochs: list[EpochMetrics]
    tokens_per_s: float = Field(description="Training tokens per second over all epochs.")
    steps: int = Field(description="Optimizer steps taken in all.")
    bounded_by: Literal["epochs", "max_steps", "time"] = Field(
        description="What ended training: the epoch count, train.max_steps, or the clock (train.on_time_limit "
        "'stop': the drafter then depends on the machine's speed)."
    )
    draft_vocab_size: int
    nproc: int


# -- export ---------------------------------------------------------------------------------------


class ExportOutputs(Record):
    vllm: str | None = Field(None, description="The drafter directory vLLM loads (config.json + model.safetensors).")


class ExportMetrics(MetricsRecord):
    source_checkpoint: str = Field(description="The train stage's checkpoint that was exported.")
    best_epoch: int | None = None
    acceptance_length_sim: float | None = Field(None, description="Its simulated acceptance length on the holdout.")


# -- the nightly pool (eagleflow.nightly.pool) --------------------------------------------------------------


class SelectOutputs(Record):
    """Tonight's new prompts and the fixed held-out ones (the select stage)."""

    pool_dir: str = Field(description="The pool's directory on the host (<work_root>/nightly/<run name>).")
    holdout_file: str = Field(description="The held-out prompts (absolute path), written on the first night only.")
    holdout_id: str = Field(description="Hash of the held-out prompts: the same every night.")
    holdout_count: int
    batch_file: str | None = Field(None, description="Tonight's new prompts (absolute path); None: no unused prompt.")
    batch_id: str | None = None
    batch_count: int = 0
    first_night: bool = Field(description="The pool held no batch before tonight.")
    reused_batch: bool = Field(False, description="This flow run had already chosen this batch (a retry).")
    source_prompts: int = Field(description="Distinct prompts in the source.")
    repeats: int = Field(description="Repeated prompts dropped (same content).")
    unused_after: int = Field(description="Distinct prompts still unused after tonight.")
    pool_batches: list[str] = Field(description="Batches of earlier nights whose states are still kept.")


class PoolMetrics(MetricsRecord):
    """What the pool stage assembled tonight (its outputs are an extract index: ExtractOutputs)."""

    new_sequences: int = Field(description="Train sequences of tonight's batch.")
    new_tokens: int
    replay_sequences: int = Field(description="Sequences of earlier nights' batches: a sample, or all of them.")
    whole_pool: bool = Field(False, description="Trained on the whole pool (nightly.whole_pool), not a replay sample.")
    replay_tokens: int
    holdout_sequences: int
    batches: int = Field(description="Batches whose states the pool keeps after tonight (tonight's included).")
    samples: int = Field(description="Samples of those batches.")
    pool_bytes: int = Field(description="Bytes of their states.")
    budget_bytes: int | None = Field(None, description="nightly.pool_budget_gib in bytes.")
    evicted: list[str] = Field(default_factory=list, description="Batches whose states were deleted tonight.")


# -- benchmark ------------------------------------------------------------------------------------


class NightRecord(BaseModel):
    """One night of the nightly retrain, as `nights.json` in the pool directory keeps it (the report's AL by
    night). The held-out split is the same every night, so these figures compare across nights."""

    model_config = ConfigDict(extra="forbid")

    night: int = Field(description="1 for the pool's first night.")
    run: str = Field(description="The flow run.")
    date: str = Field(description="UTC, ISO 8601.")
    batch: str | None = Field(None, description="Tonight's batch (None: no new prompt, nothing trained).")
    new_samples: int = Field(0, description="Samples generated tonight (the new batch only).")
    new_tokens: int = Field(0, description="Train tokens extracted tonight.")
    replay_sequences: int = 0
    trained_on: str | None = Field(
        None,
        description="What tonight trained on: 'tonight's batch + replay' (continuing the promoted drafter) or 'the "
        "whole pool' (a full run: no promoted drafter to continue).",
    )
    train_sequences: int | None = Field(None, description="Train sequences tonight's training saw.")
    pool_samples: int = Field(0, description="Samples whose states the pool keeps after tonight.")
    pool_bytes: int = 0
    evicted: list[str] = Field(default_factory=list)
    train_steps: int | None = Field(None, description="Optimizer steps of tonight's training.")
    warm_start: str | None = Field(
        None,
        description="The promoted drafter tonight continued from (None: from "
        "train.warm_start or scratch, as a full run).",
    )
    holdout_al: float | None = Field(None, description="The trainer's simulated AL on the held-out split.")
    served_al: float | None = Field(None, description="The engine's AL at the benchmark's first setting.")
    served_al_ci: list[float] | None = None
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    benchmark_requests: int | None = Field(None, description="Requests tonight's benchmark sent (all variants).")
    baseline: str | None = Field(None, description="How the baseline was had: measured tonight, or reused (when).")
    promoted: bool | None = None
    decided_by: str | None = Field(None, description="The interval that decided the promotion (or why not).")
