"""The training data: generated answers, the target's hidden states, the nightly pool that grows."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagleflow.config.base import _Strict


class GenerateConfig(_Strict):
    """Synthetic data from the target's own server."""

    server: Literal["own", "production"] = Field(
        "own",
        description="'production': send the prompts to production's running server (production.url, its API key "
        "from production.api_key_env or production.api_key_secret), at most `concurrency` requests in flight; "
        "production keeps serving and is never stopped for it. 'own': launch the target with engine.* (its tensor "
        "parallel size) on the host's free GPUs.",
    )
    prompts_path: str = Field(description='JSONL on the host; each line {"messages": [...]} or {"prompt": "..."}.')
    split: Literal["seeded", "train", "holdout"] = Field(
        "seeded",
        description="'seeded': num_samples prompts drawn with `seed`, the first `holdout` of them held out. 'train' / "
        "'holdout': every prompt of prompts_path, all in that split: the nightly pool's batches (flows.retrain sets "
        "it; num_samples and holdout are then not used).",
    )
    num_samples: int = Field(ge=2, description="Prompts to answer, held-out ones included.")
    holdout: int = Field(ge=1, description="Samples held out of training: validation and benchmark prompts.")
    max_tokens: int = Field(512, ge=1, description="max_tokens of each answer.")
    temperature: float = Field(
        0.0,
        ge=0,
        le=2,
        description="Sampling temperature of the answers. Production's own (production.traffic) trains the drafter on "
        "the trajectories production samples; a sampled answer is seeded by generate.seed and its prompt, so the "
        "stage's output is a function of its inputs.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling's top_p of sampled answers (1: off).")
    concurrency: int = Field(
        16,
        ge=1,
        le=4096,
        description="Requests in flight (against production: what it may take beside its traffic; "
        "with production.replicas, on each replica).",
    )
    shard_size: int = Field(1000, ge=1, description="Samples per Parquet shard (the unit of resume).")
    seed: int = Field(0, description="Seed of the train/holdout split, and of sampled answers.")
    max_failed_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Fraction of answers allowed to fail (an error, or neither reasoning nor content) before the "
        "stage fails. An answer cut at max_tokens is data, not a failure: kept, marked truncated and counted.",
    )
    server_wait_s: float = Field(
        1800,
        gt=0,
        description="server 'production': how long a dropped connection or a restarting server is waited for (its "
        "health URL answering again) before the stage fails; the unanswered requests are then sent again.",
    )

    @model_validator(mode="after")
    def _split(self) -> GenerateConfig:
        if self.split == "seeded" and self.holdout >= self.num_samples:
            raise ValueError(f"holdout ({self.holdout}) must be smaller than num_samples ({self.num_samples})")
        return self


class ExtractConfig(_Strict):
    """The target's hidden states for every generated conversation, streamed to shards on the host."""

    backend: Literal["hf", "vllm", "sglang", "production"] = Field(
        "hf",
        description="'vllm': the serving engine (engine.*: its tensor parallel size, quantized kernels, the same "
        "checkpoint) captures the states with its extract_hidden_states method; what production serves is what the "
        "drafter learns from (needs engine.kind vllm). 'sglang': the same with SGLang (needs engine.kind sglang): an "
        "SGLang engine of ours runs eagleflow's capture plugin, prefill without CUDA graphs. 'production': "
        "production itself computes them while it "
        "serves: each conversation is one prefill-only request to production.url, whose engine runs eagleflow's "
        "capture plugin (launched with EAGLEFLOW_CAPTURE_DIR = extract.capture_dir and EAGLEFLOW_CAPTURE_LAYERS = "
        "the aux and final layer ids; docs/production.md); no production window, no engine of our own. 'hf': a "
        "transformers forward, for small targets and CPU; on CUDA it spreads the layers over the host's GPUs when "
        "the weights do not fit one.",
    )
    max_seq_len: int = Field(2048, ge=16, description="Longer sequences are cut to this many tokens.")
    batch_tokens: int = Field(8192, ge=16, description="hf: tokens per forward pass (padded batch size x length).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="hf: 'auto' takes CUDA when present.")
    spread: Literal["auto", "never", "always"] = Field(
        "auto",
        description="hf on CUDA: place the decoder layers over every visible GPU when the weights do not fit in "
        "one GPU's free memory ('auto'), always, or never.",
    )
    storage_dtype: Literal["bfloat16", "float8_e4m3fn"] = Field(
        "bfloat16",
        description="How states are stored: float8_e4m3fn with a per-token, per-layer scale halves the bytes "
        "(speculators saw no loss of acceptance: HumanEval AL 3.21 fp8 vs 3.19 bf16). The trainer reads both.",
    )
    shard_bytes: int = Field(
        2 << 30,
        ge=1 << 16,
        description="A shard is cut at about this many bytes of states (never mid-sequence). Memory does not grow "
        "with it: states stream to disk as they come.",
    )
    concurrency: int = Field(
        16,
        ge=1,
        description="vllm, production: requests in flight (each one conversation, max_tokens 1, prompt tokens saved). "
        "On production it bounds what capture takes of it: at most this many prefills of ours beside its traffic "
        "(concurrency x max_seq_len prompt tokens in flight).",
    )
    capture_dir: str | None = Field(
        None,
        description="production: the directory production's capture plugin writes each request's states to (its "
        "launch's EAGLEFLOW_CAPTURE_DIR), on the host the stages run on; the stage reads and deletes each file.",
    )
    fallback: Literal["vllm", "sglang", "hf", "none"] = Field(
        "vllm",
        description="production: what extracts the states when production cannot capture (the check stage asks it "
        "with one capture request before the night's work, and names the cause): 'vllm', an engine of our own in a "
        "production window, the path without capture ('sglang' with SGLang); 'hf'; 'none': the check fails "
        "instead. States already extracted are kept either way.",
    )
    spool_dir: str | None = Field(
        None,
        description="vllm: where the engine writes one file per request before the stage packs it into a shard and "
        "deletes it. None: /dev/shm when it exists (the states touch the disk once), else the stage directory.",
    )


class NightlyConfig(_Strict):
    """The nightly retrain (flow `retrain`, deployment NAME-nightly): a data pool that grows every night
    and a drafter that continues from the promoted one (eagleflow.nightly.pool).

    The first night (an empty pool) holds out `holdout` prompts for good and generates generate.num_samples
    less those; it trains with train.* as a full run does. Every later night adds `new_samples` prompts never
    used before, trains from the promoted drafter's weights (a fresh optimizer and schedule) on them and a
    replay sample of older nights' data, for `train_steps` steps, and benchmarks only the new drafter."""

    source: str | None = Field(
        None,
        description="Prompts on the host: a JSONL file, or a directory of JSONL files the team appends to "
        "(read in name order; repeats dropped by content). None: generate.prompts_path.",
    )
    new_samples: int = Field(
        1000,
        ge=1,
        description="New prompts a night after the first (fewer when the source "
        "has fewer unused ones; none: the night trains nothing).",
    )
    holdout: int | None = Field(
        None,
        ge=1,
        description="Held-out prompts, chosen on the first night (seeded by generate.seed) and fixed "
        "across nights: the validation split and the benchmark's prompts. None: generate.holdout.",
    )
    replay: float = Field(
        1.0,
        ge=0,
        description="Older nights' sequences replayed per new sequence (a seeded sample): old data keeps "
        "the drafter from drifting to the newest night's prompts. 0: the new batch only.",
    )
    whole_pool: bool = Field(
        False,
        description="Train on the whole pool (every batch it keeps, the held-out split excepted) instead of tonight's "
        "batch and a replay sample. The nightly sets it on a night with no promoted drafter to continue: such a night "
        "trains as a full run does, so it sees all the data a full run would.",
    )
    decision_reruns: int = Field(
        1,
        ge=0,
        le=3,
        description="Measurements of the new drafter the promotion gate may ask for beyond the night's first when its "
        "95% intervals neither clear nor miss its bars (each with every held-out prompt, no early stop). Still "
        "undecided after them: production keeps what it serves.",
    )
    train_steps: int = Field(
        200,
        ge=1,
        description="Optimizer steps of a night that continues from the promoted drafter (a night "
        "without one trains as train.* says). About a third of the first night's steps: on the demo that reached "
        "and passed the first night's AL every night (a sixth fell short on the second night: docs/benchmarks.md).",
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="Peak learning rate of a continuing night. None: a quarter of train.learning_rate "
        "(on the demo, x1/4 beat x1 and x1/10 at a third of the first night's steps: docs/benchmarks.md).",
    )
    rebuild_vocab: bool = Field(
        False,
        description="Build the draft vocabulary (d2t/t2d) from tonight's data instead of keeping the promoted "
        "drafter's.",
    )
    pool_budget_gib: float | None = Field(
        None,
        gt=0,
        description="Disk for the pool's states (extracted batches); beyond it the oldest nights' states "
        "are deleted (their prompts stay used). None: no budget.",
    )
