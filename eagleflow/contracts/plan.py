"""The capacity plan as recorded: the facts it is made from and the plan it makes (schema only).

A run's plan is computed by `eagleflow.capacity.planner` (a full run) and `eagleflow.capacity.nightly` (one
night), from `HostFacts` gathered on the host (`python -m eagleflow.capacity.facts`) or stated in a JSON file
(`configs/hosts/*.json`). The check stage records it in its manifest (`CheckMetrics.plan`) and the report
prints it, which is why it lives with the other contracts and not beside the arithmetic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# "restore": production's own load when a window closes (the nightly plan counts it; it is no stage of ours)
Stage = Literal["check", "select", "generate", "extract", "pool", "train", "export", "benchmark", "restore"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: int = Field(0, description="nvidia-smi index.")
    name: str = Field("", description="The GPU's name.")
    memory_total_mib: int = Field(description="Memory of the GPU, MiB.")
    memory_free_mib: int | None = Field(None, description="Free memory when measured, MiB.")


class DiskFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    path: str = Field(description="The filesystem's nearest existing directory to host.work_root.")
    free_bytes: int = Field(description="Bytes an unprivileged user may still write there.")
    total_bytes: int | None = Field(None, description="Size of the filesystem.")


class MemoryFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    total_bytes: int = Field(description="Host RAM.")
    available_bytes: int | None = Field(None, description="RAM available when the facts were read.")


class TargetFacts(_Model):
    """The target's shape: read from its config.json (text_config for multimodal targets) and the size
    of its weight files on disk, or stated in a facts file where the checkpoint is not at hand."""

    model_path: str | None = Field(None, description="The checkpoint directory the facts were read from.")
    hidden_size: int = Field(gt=0, description="Hidden size: the width of every extracted state.")
    num_hidden_layers: int | None = Field(None, description="Decoder layers.")
    intermediate_size: int | None = Field(None, description="MLP width (the drafter layer copies it).")
    num_attention_heads: int | None = Field(None, description="Attention heads (the drafter layer copies them).")
    num_key_value_heads: int | None = Field(None, description="Key/value heads.")
    head_dim: int | None = Field(None, description="Head dim; default hidden_size / num_attention_heads.")
    vocab_size: int | None = Field(None, description="The target's vocabulary (the drafter's frozen embedding).")
    weights_bytes: int | None = Field(None, description="Bytes of the weight files (*.safetensors) as served.")
    source: str = Field("config.json", description="Where these facts come from.")


class PromptFacts(_Model):
    path: str | None = Field(None, description="generate.prompts_path.")
    count: int = Field(ge=0, description="Prompts in the file.")
    mean_tokens: float = Field(ge=0, description="Mean tokens of a prompt.")
    method: str = Field(
        description="How they were counted: 'tokenizer' (the target's, with its chat template, "
        "on the host and on the check stage alike) or 'chars/4' (no transformers where the facts were read)."
    )


class MeasuredRun(_Model):
    """What one earlier stage run on the host measured (read from its manifest and request)."""

    stage: Stage
    run: str = Field(description="<stage>/<key>: the stage directory under host.work_root.")
    created: float = Field(0.0, description="Unix time its manifest was written.")
    target: str | None = Field(None, description="The run's target.model_path.")
    backend: str | None = Field(None, description="extract: its backend.")
    tok_s: float | None = Field(None, description="generate: output tok/s; extract: tok/s; train: training tok/s.")
    answer_tokens: float | None = Field(None, description="generate: mean output tokens of an answer.")
    seconds: float | None = Field(None, description="Wall time of the stage.")
    settings: dict | None = Field(None, description="benchmark: its settings (a rerun with equal ones is comparable).")
    round_cv: float | None = Field(
        None,
        description="benchmark: the new drafter's per-round spread (sd / mean) of "
        "paired speedup or AL, the larger (eagleflow.measure.intervals.round_spread).",
    )


class HostFacts(BaseModel):
    """`python -m eagleflow.hosts.facts`' object (its other keys are ignored) and what the plan adds."""

    model_config = ConfigDict(extra="ignore")

    hostname: str | None = None
    cpus: int | None = Field(None, description="CPU cores the host's Python sees; None in an older facts file.")
    gpus: list[GpuFacts] = Field(default_factory=list)
    disk: DiskFacts | None = None
    memory: MemoryFacts | None = Field(None, description="Host RAM; None when not read (an older facts file).")
    target: TargetFacts | None = Field(None, description="The target's shape; None when nothing could be read.")
    prompts: PromptFacts | None = Field(None, description="None: the prompts were not at hand (defaults used).")
    history: list[MeasuredRun] = Field(default_factory=list, description="Earlier stage runs on the host.")
    stated: str | None = Field(None, description="Set in a stated facts file: what host it describes and why.")


class FinishedStages(_Model):
    """This run's stages already finished on the host (their manifest exists): they write nothing more."""

    done: list[Stage] = Field(default_factory=list)
    generate_tokens: int | None = Field(None, description="Exact tokens of the finished generate stage.")
    generate_samples: int | None = Field(None, description="Its samples (train + holdout).")


class TokenEstimate(_Model):
    samples: int
    prompt_tokens: float = Field(description="Mean prompt tokens.")
    prompt_source: str
    answer_tokens: float = Field(description="Mean answer tokens.")
    answer_source: str
    tokens: int = Field(description="Tokens to extract (each conversation cut at extract.max_seq_len).")
    upper_bound_tokens: int = Field(description="Every answer at generate.max_tokens (within the cuts).")
    exact: bool = Field(description="True after generate: its manifest's token count.")


class StagePlan(_Model):
    stage: Stage
    status: Literal["to run", "done"] = Field(description="'done': finished on the host, served from cache.")
    disk_bytes: int = Field(description="Bytes it writes under host.work_root (0 when done).")
    gpu_bytes: int | None = Field(None, description="Peak bytes on each GPU it uses; None: no GPU.")
    gpus: int = Field(0, description="GPUs it uses.")
    gpu_detail: str = ""
    seconds: float = Field(description="Estimated wall time (0 when done).")
    rate: str = Field("", description="The rate the time comes from.")
    source: str = Field("", description="'measured (run <stage>/<key>)' or 'default: ...' with its source.")


class CapacityPlan(_Model):
    """A run's capacity plan: recorded in the check manifest (`CheckMetrics.plan`) and the report."""

    host: str
    target: str
    hidden_size: int
    storage_dtype: str
    bytes_per_token: int = Field(description="Shard bytes of one token: states (+ fp8 scales), ids, mask.")
    tokens: TokenEstimate
    stages: list[StagePlan]
    extract_bytes: dict[str, int] = Field(description="The extraction's bytes in each storage dtype.")
    disk_needed_bytes: int = Field(description="Bytes the stages still to run write, + disk_reserve_bytes.")
    disk_reserve_bytes: int = Field(description="Kept free (engine.min_free_disk_gib).")
    disk_free_bytes: int | None
    disk_path: str | None
    gpu_budget_bytes: int | None = Field(None, description="Usable bytes of one GPU (x gpu_memory_utilization).")
    total_seconds: float = Field(description="Wall time of the stages still to run, one after the other.")
    findings: list[str] = Field(default_factory=list, description="Warnings: what may not fit, what was assumed.")
    refusal: str | None = Field(None, description="Why the run will not fit the free disk; None when it fits.")


class NightlyPlan(BaseModel):
    """One night after the first, stage by stage, and the pool it grows."""

    model_config = ConfigDict(extra="forbid")

    new_samples: int
    new_tokens: int = Field(description="Tokens of tonight's new samples (prompts and answers, cut).")
    stages: list[StagePlan]
    total_seconds: float
    down_seconds: float = Field(description="Production down: the stages that need its GPUs, one after the other.")
    down_stages: list[str]
    window_requests: int = Field(description="Expected requests of each benchmark window (the stopping rule).")
    round_cv: float
    round_cv_source: str
    night_bytes: int = Field(description="States one night adds to the pool.")
    first_night_bytes: int
    budget_bytes: int | None
    nights_to_budget: int | None = Field(None, description="Nights after the first until the budget evicts.")
    baseline: str = Field(description="How often the baseline (and a current drafter) is measured again.")
    loads: list[str] = Field(description="The engine loads of a night, each with its page cache (cold or warm).")
    pause: str = Field(description="How production leaves the GPUs: stopped, or paused by sleep mode, and why.")
    capture: str | None = Field(
        None,
        description="extract.backend 'production': how long the night's capture prefills on production beside its "
        "own traffic, what it holds in flight at most, and what capture measured of production's throughput.",
    )
