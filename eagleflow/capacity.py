"""The capacity plan: each stage's disk, GPU memory and time, from the run config and the host's facts.

Pure (standard library + pydantic, no I/O): `plan(config, facts, progress)` -> `CapacityPlan`;
`render_plan` prints it as a table, `disk_refusal` says why a run will not fit the free disk. The
facts (`HostFacts`: GPUs and free disk as `python -m eagleflow.hostfacts` prints them, plus the
target's shape, the prompts' length and the rates earlier runs on the host measured) are gathered on
the host by `eagleflow.planfacts`, or stated in a JSON file (`configs/hosts/*.json`).

Tokens. Before generate they are an estimate: samples x (mean prompt tokens + mean answer tokens), each conversation
cut at `extract.max_seq_len`. The answer length is the mean that earlier generate runs of the same target measured
on this host, else `DEFAULT_ANSWER_TOKENS` (the seeds'), never more than `generate.max_tokens`; `upper_bound_tokens`
takes every answer at `max_tokens`. After generate the count is exact (`GenerateOutputs.num_tokens`, in `Progress`).

Defaults are the seeds' run of ../shared/DESIGN.md (Kimi-K2.5, INT4, 8 x H200, vLLM): 10,000 samples in 5.3 h,
hidden states at 3,165 tok/s and 828 GB in bf16 (56 KiB a token: 4 x 7168 x 2 B), 5 epochs in 2.6 h, a 30-minute
engine load, 82.5 tok/s per request. Each figure in a plan says whether it was "measured (run <stage>/<key>)" on the
host or is such a "default: ..." (with its source).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.config import RunConfig
from eagleflow.rates import (
    DDP_GPU_EFFICIENCY, DEFAULT_ANSWER_TOKENS, DEFAULT_CHECK_S, DEFAULT_DECODE_TOK_S, DEFAULT_DISK_WRITE_BPS,
    DEFAULT_EXPORT_S, DEFAULT_EXTRACT_TOK_S, DEFAULT_GENERATE_TOK_S, DEFAULT_PROMPT_TOKENS, DEFAULT_TRAIN_TOK_S,
    H200_MUON_NS_TFLOPS, H200_TRAIN_TFLOPS, LK_STEP_COST, NUM_STATES, SOURCES, TRAIN_GPU_FRACTION,
    TRAIN_STAGE_FRACTION, engine_start_s)

# -- bytes of one extracted token (the shard format of eagleflow.drafter.shards, torch-free here) -------

STATE_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}
FP8_SCALE_BYTES = 4  # float8: one f32 scale per token and state
TOKEN_SIDE_BYTES = 8 + 1  # input_ids int64 + loss_mask int8 per token (seq_lens: 8 B per sequence)
PARQUET_BYTES_PER_TOKEN = 9  # generate: input_ids int32 + loss_mask int8 + ~4 B of text per token, uncompressed
# "restore": production's own load when a window closes (the nightly plan counts it; it is no stage of ours)
Stage = Literal["check", "select", "generate", "extract", "pool", "train", "export", "benchmark", "restore"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- facts ------------------------------------------------------------------------------------------


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
    method: str = Field(description="How they were counted: 'tokenizer' (the target's, with its chat template, "
                        "on the check stage) or 'chars/4' (no tokenizer on the control side).")


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
    round_cv: float | None = Field(None, description="benchmark: the new drafter's per-round spread (sd / mean) of "
                                   "paired speedup or AL, the larger (eagleflow.intervals.round_spread).")


class HostFacts(BaseModel):
    """`python -m eagleflow.hostfacts`' object (its other keys are ignored) and what the plan adds."""

    model_config = ConfigDict(extra="ignore")

    hostname: str | None = None
    gpus: list[GpuFacts] = Field(default_factory=list)
    disk: DiskFacts | None = None
    memory: MemoryFacts | None = Field(None, description="Host RAM; None when not read (an older facts file).")
    target: TargetFacts | None = Field(None, description="The target's shape; None when nothing could be read.")
    prompts: PromptFacts | None = Field(None, description="None: the prompts were not at hand (defaults used).")
    history: list[MeasuredRun] = Field(default_factory=list, description="Earlier stage runs on the host.")
    stated: str | None = Field(None, description="Set in a stated facts file: what host it describes and why.")


class Progress(_Model):
    """This run's stages already finished on the host (their manifest exists): they write nothing more."""

    done: list[Stage] = Field(default_factory=list)
    generate_tokens: int | None = Field(None, description="Exact tokens of the finished generate stage.")
    generate_samples: int | None = Field(None, description="Its samples (train + holdout).")


# -- the plan, as recorded -------------------------------------------------------------------------


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


# -- arithmetic -------------------------------------------------------------------------------------


def state_bytes_per_token(hidden_size: int, storage_dtype: str) -> int:
    """The four states of one token: 4 x H x 2 B in bf16 (56 KiB at H 7168); fp8 1 B + a 4-byte scale each."""
    scales = NUM_STATES * FP8_SCALE_BYTES if storage_dtype == "float8_e4m3fn" else 0
    return NUM_STATES * hidden_size * STATE_BYTES[storage_dtype] + scales


def extract_bytes(tokens: int, sequences: int, hidden_size: int, storage_dtype: str) -> int:
    """Shard bytes of `tokens` tokens in `sequences` conversations (safetensors headers aside)."""
    return tokens * (state_bytes_per_token(hidden_size, storage_dtype) + TOKEN_SIDE_BYTES) + 8 * sequences


def drafter_params(t: TargetFacts, cfg: RunConfig) -> tuple[int, int]:
    """(all, trainable) parameters of the EAGLE-3 drafter for this target (eagleflow.drafter.model):
    fc 3H->H, one decoder layer whose q/k/v read 2H, an MLP of the target's width, norms, lm_head over
    the draft vocabulary (frozen with train.freeze_lm_head)."""
    h = t.hidden_size
    heads = t.num_attention_heads or max(1, h // 64)
    hd, kv = t.head_dim or h // heads, t.num_key_value_heads or heads
    inter = cfg.train.intermediate_size or t.intermediate_size or 4 * h
    vd = min(cfg.train.draft_vocab_size, t.vocab_size or cfg.train.draft_vocab_size)
    attn = 2 * h * (heads * hd + 2 * kv * hd) + heads * hd * h
    norms = 3 * h + 3 * h + h  # input_norm over 3H, three layer norms, the final norm
    lm_head = h * vd
    total = 3 * h * h + attn + 3 * h * inter + norms + lm_head
    return total, total - (lm_head if cfg.train.freeze_lm_head else 0)


def train_flops_per_token(t: TargetFacts, cfg: RunConfig) -> float:
    """Model FLOPs of a training token as benchmarks/train_gpu.py counts them: 3x the forward (fc; per TTT step
    q/k/v from 2H, o, MLP, draft-vocabulary head, causal attention over train.max_seq_len) + the target's logits."""
    h, a, g, inter = _drafter_dims(t, cfg)
    k = cfg.train.ttt_steps
    vd = min(cfg.train.draft_vocab_size, t.vocab_size or cfg.train.draft_vocab_size)
    attn = sum(4 * a * ((cfg.train.max_seq_len + 1) / 2 + i) for i in range(k))
    forward = 6 * h * h + k * (4 * h * (a + 2 * g) + 2 * a * h + 6 * h * inter + 2 * h * vd) + attn
    return 3 * forward + 2 * h * vd


def _drafter_dims(t: TargetFacts, cfg: RunConfig) -> tuple[int, int, int, int]:
    """(hidden, attention width, KV width, MLP width) of the drafter layer, as the plan assumes them."""
    h = t.hidden_size
    heads = t.num_attention_heads or max(1, h // 64)
    head_dim = t.head_dim or h // heads
    inter = cfg.train.intermediate_size or t.intermediate_size or 4 * h
    return h, heads * head_dim, (t.num_key_value_heads or heads) * head_dim, inter


def muon_flops_per_step(t: TargetFacts, cfg: RunConfig, ns_steps: int = 5) -> float:
    """FLOPs of one Muon step's Newton-Schulz iterations over the drafter's weight matrices (fc, q, k, v, o and
    the MLP's three): per iteration on an m x n matrix (m <= n), X X^T, (bA + cA^2) and that times X, 4 m^2 n +
    2 m^3. Independent of the tokens a step; under DDP every rank repeats it whole."""
    h, a, g, inter = _drafter_dims(t, cfg)
    shapes = [(h, 3 * h), (a, 2 * h), (g, 2 * h), (g, 2 * h), (h, a), (inter, h), (inter, h), (h, inter)]
    return ns_steps * sum(4 * min(m, n) ** 2 * max(m, n) + 2 * min(m, n) ** 3 for m, n in shapes)


def default_train_rate(t: TargetFacts, cfg: RunConfig, gpus: list[GpuFacts]) -> tuple[float, str]:
    """Training tok/s where the host measured none: on H200s our measured FLOP rate at this drafter's FLOPs, scaled
    to train.nproc GPUs (and saying so); elsewhere the seeds' figure (their RTX PRO 6000s: no rate of ours there)."""
    other, nodes = sorted({g.name for g in gpus if "H200" not in g.name}), 1 + len(cfg.train_nodes.hosts)
    across = f"; host's GPUs only, not train_nodes' other {nodes - 1}: unmeasured across hosts" if nodes > 1 else ""
    if cfg.train.device == "cpu" or not gpus or other:
        return DEFAULT_TRAIN_TOK_S, SOURCES["train"] + across + (f"; this host's GPUs ({', '.join(other)}) are no "
                                                                 "H200s, where eagleflow's rate was measured" if other else "")
    flops, n = train_flops_per_token(t, cfg), cfg.train.nproc
    lk, eff = LK_STEP_COST if cfg.train.loss == "lk" else 1.0, DDP_GPU_EFFICIENCY if n > 1 else 1.0
    one = H200_TRAIN_TFLOPS * 1e12 / flops * TRAIN_STAGE_FRACTION / lk  # LK: its acceptance term, in every step
    step_costs = f"; the LK loss's {lk - 1:.1%} a step (measured at that shape)" if lk > 1 else ""
    if cfg.train.optimizer == "muon":  # a fixed cost a step on each rank: fewer tokens a step pay more of it
        rank_tokens = cfg.train.batch_tokens / n
        ns_s = muon_flops_per_step(t, cfg) / (H200_MUON_NS_TFLOPS * 1e12)
        one = rank_tokens / (rank_tokens / one + ns_s)
        step_costs += (f"; Muon's Newton-Schulz {ns_s * 1e3:.0f} ms a step on every rank ({rank_tokens:,.0f} tokens "
                       f"a rank a step, at the {H200_MUON_NS_TFLOPS:.0f} TFLOP/s measured at Kimi-K2.5's drafter shape)")
    return one * n * eff, (
        f"scaled: an H200 trained at {H200_TRAIN_TFLOPS:.0f} TFLOP/s (Kimi-K2.5's drafter shape, docs/benchmarks.md), "
        f"{one:,.0f} tok/s at this drafter's {flops / 1e9:.1f} GFLOP a token and the stage's own "
        f"{TRAIN_STAGE_FRACTION:.0%}{step_costs}" + (f", x {n} GPUs x {eff:.2f} (per-GPU data-parallel efficiency measured "
                                               "on 2 H200s)" if n > 1 else "") + across)


# float32 optimizer state a trainable weight: AdamW's two moments, Muon's one (its norms' AdamW: a rounding error)
OPTIMIZER_STATE_BYTES = {"adamw": 8, "muon": 4}


def train_gpu_bytes(t: TargetFacts, cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes on each training rank, and how they add up. Weights, gradients and the optimizer's
    states (AdamW's two, Muon's one) are float32 (autocast computes in bf16); the target's embedding
    and lm_head and the drafter's embedding copy are float32 V x H each. Activations are a rough per-token figure: per
    TTT step ~(14 H + 4 I) bf16 values of the layer and two float32 rows of draft-vocabulary logits."""
    total, trainable = drafter_params(t, cfg)
    h, _, _, inter = _drafter_dims(t, cfg)
    v = t.vocab_size or cfg.train.draft_vocab_size
    vd = min(cfg.train.draft_vocab_size, v)
    states = 4 * total + (4 + OPTIMIZER_STATE_BYTES[cfg.train.optimizer]) * trainable + 3 * 4 * v * h
    micro = math.ceil(cfg.train.batch_tokens / (cfg.train.nproc * cfg.train.grad_accum_steps))
    per_token = cfg.train.ttt_steps * ((14 * h + 4 * inter) * 2 + 2 * vd * 4) + 4 * h * 2 + vd * 4
    act = micro * per_token
    return states + act, (f"weights+grads+{'Muon' if cfg.train.optimizer == 'muon' else 'AdamW'}+frozen heads "
                          f"{size_text(states)}, activations {size_text(act)} "
                          f"({micro:,} tokens a micro-batch x {cfg.train.ttt_steps} TTT steps)")


def checkpoint_bytes(t: TargetFacts, cfg: RunConfig) -> int:
    """One checkpoint: float32 weights + the optimizer's float32 states of the trainable ones."""
    total, trainable = drafter_params(t, cfg)
    return 4 * total + OPTIMIZER_STATE_BYTES[cfg.train.optimizer] * trainable


def size_text(n: float | None) -> str:
    """Bytes in decimal units, as disks are sold: 828.0 GB."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def duration_text(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def measured_runs(history: list[MeasuredRun], stage: str, **match: object) -> list[MeasuredRun]:
    """Runs of `stage` whose fields equal `match`, newest first."""
    runs = [r for r in history if r.stage == stage and all(getattr(r, k) == v for k, v in match.items())]
    return sorted(runs, key=lambda r: r.created, reverse=True)


def estimate_tokens(cfg: RunConfig, facts: HostFacts, progress: Progress) -> TokenEstimate:
    g, cut = cfg.generate, cfg.extract.max_seq_len
    if facts.prompts is not None:
        prompt, prompt_src = facts.prompts.mean_tokens, f"{facts.prompts.method} over {facts.prompts.count:,} prompts"
    else:
        prompt, prompt_src = float(DEFAULT_PROMPT_TOKENS), SOURCES["prompt"]
    measured = [r for r in measured_runs(facts.history, "generate", target=cfg.target.model_path) if r.answer_tokens]
    if measured:
        answer = sum(r.answer_tokens for r in measured) / len(measured)
        answer_src = f"measured (mean of {len(measured)} run(s): {', '.join(r.run for r in measured[:3])})"
    else:
        answer, answer_src = float(DEFAULT_ANSWER_TOKENS), SOURCES["answer"]
    room = max(cfg.engine.max_model_len - prompt, 1)  # the engine ends an answer at its context length
    if answer > min(g.max_tokens, room):
        answer, answer_src = float(min(g.max_tokens, room)), f"{answer_src}, cut at generate.max_tokens"
    upper = g.num_samples * int(min(prompt + min(g.max_tokens, room), cut))
    if progress.generate_tokens is not None:
        return TokenEstimate(samples=progress.generate_samples or g.num_samples, prompt_tokens=prompt,
                             prompt_source=prompt_src, answer_tokens=answer, answer_source=answer_src,
                             tokens=progress.generate_tokens, upper_bound_tokens=progress.generate_tokens, exact=True)
    return TokenEstimate(samples=g.num_samples, prompt_tokens=round(prompt, 1), prompt_source=prompt_src,
                         answer_tokens=round(answer, 1), answer_source=answer_src,
                         tokens=int(g.num_samples * min(prompt + answer, cut)), upper_bound_tokens=upper, exact=False)


def measured_rate(history: list[MeasuredRun], stage: str, default: float, source: str, **match: object) -> tuple[float, str]:
    for r in measured_runs(history, stage, **match):
        if r.tok_s:
            return r.tok_s, f"measured (run {r.run})"
    return default, source


def generate_rate(hist: list[MeasuredRun], cfg: RunConfig, target: str) -> tuple[float, str]:
    """Generate's output tok/s: measured on the host, else the seeds' one server's x production's replicas."""
    rate, src = measured_rate(hist, "generate", DEFAULT_GENERATE_TOK_S, SOURCES["generate"], target=target)
    n = max(1, len(cfg.production.replicas)) if cfg.generate.server == "production" and src == SOURCES["generate"] else 1
    return rate * n, src + (f", x {n} production replicas (one server's rate each)" if n > 1 else "")


def plan(cfg: RunConfig, facts: HostFacts, progress: Progress | None = None) -> CapacityPlan:
    """Each stage's disk, GPU memory and time for `cfg` on the host `facts` describe."""
    progress = progress or Progress()
    t = facts.target
    if t is None:
        raise ValueError(f"no facts of the target {cfg.target.model_path}: its config.json was not readable on the "
                         "host; state its shape in the facts file's 'target' section")
    tok = estimate_tokens(cfg, facts, progress)
    h, dtype, hist, target = t.hidden_size, cfg.extract.storage_dtype, facts.history, cfg.target.model_path
    findings: list[str] = []
    gpus = facts.gpus
    util = cfg.engine.gpu_memory_utilization or 0.9
    one_gpu = min(g.memory_total_mib for g in gpus) * 2**20 if gpus else None
    budget = int(one_gpu * util) if one_gpu else None
    weights, tp = t.weights_bytes, cfg.engine.tensor_parallel_size
    start = engine_start_s(weights)
    start_note = f"; + {duration_text(start)} engine start, {SOURCES['engine']}"
    stages: list[StagePlan] = []

    def add(stage: Stage, disk: int, seconds: float, rate: str, source: str, gpu: int | None = None,
            ngpu: int = 0, gpu_detail: str = "") -> None:
        done = stage in progress.done
        stages.append(StagePlan(stage=stage, status="done" if done else "to run", disk_bytes=0 if done else disk,
                                gpu_bytes=gpu, gpus=ngpu, gpu_detail=gpu_detail, seconds=0.0 if done else seconds,
                                rate=rate, source=source))
        limit = budget if stage != "train" else (int(one_gpu * TRAIN_GPU_FRACTION) if one_gpu else None)
        if not done and gpu is not None and limit is not None and gpu > limit:
            fix = (f"raise train.grad_accum_steps or train.nproc about {math.ceil(gpu / limit)}x (activations shrink "
                   "with the micro-batch; a rough estimate)" if stage == "train" else
                   "raise engine.tensor_parallel_size or use a host with bigger GPUs")
            findings.append(f"{stage}: needs ~{size_text(gpu)} on each GPU but one holds {size_text(limit)} usable; {fix}")

    add("check", 0, DEFAULT_CHECK_S, "", SOURCES["check"])
    # generate: answers from the target's own server (the production one when generate.server says so)
    own = cfg.generate.server != "production"
    out_tok_s, src = generate_rate(hist, cfg, target)
    secs = tok.samples * tok.answer_tokens / out_tok_s + (start if own else 0)
    add("generate", int(tok.tokens * PARQUET_BYTES_PER_TOKEN), secs, f"{out_tok_s:,.0f} output tok/s",
        src + (start_note if own else ""),
        *((_per_gpu(weights, tp), tp, f"weights / TP {tp}") if own and weights and gpus else ()))
    # extract
    backend = cfg.extract.backend
    x_bytes = {d: extract_bytes(tok.tokens, tok.samples, h, d) for d in STATE_BYTES}
    x_tok_s, src = measured_rate(hist, "extract", DEFAULT_EXTRACT_TOK_S[backend], SOURCES[backend], target=target,
                         backend=backend)
    if src.startswith("default"):
        disk_bound = DEFAULT_DISK_WRITE_BPS / (state_bytes_per_token(h, dtype) + TOKEN_SIDE_BYTES)
        if disk_bound < x_tok_s:
            x_tok_s, src = disk_bound, f"default: the disk writes {size_text(DEFAULT_DISK_WRITE_BPS)}/s (an H200 host, DESIGN.md)"
    if backend == "vllm":
        x_gpu, x_n, x_detail = _per_gpu(weights, tp), tp, f"weights / TP {tp}"
        secs, src = tok.tokens / x_tok_s + start, src + start_note
    else:
        spread = len(gpus) if (gpus and weights and budget and weights > budget and cfg.extract.spread != "never") else 1
        x_gpu, x_n, x_detail = _per_gpu(weights, spread), spread, f"weights over {spread} GPU(s) (extract.spread)"
        secs = tok.tokens / x_tok_s
    add("extract", x_bytes[dtype], secs, f"{x_tok_s:,.0f} tok/s ({backend})", src,
        *((x_gpu, x_n, x_detail) if weights and gpus else ()))
    # train
    train_tokens = tok.tokens * (tok.samples - cfg.generate.holdout) / tok.samples
    train_tokens = min(train_tokens, tok.samples * cfg.train.max_seq_len)
    trained = cfg.train.epochs * train_tokens
    if cfg.train.max_steps:
        trained = min(trained, cfg.train.max_steps * cfg.train.batch_tokens)
    tr_tok_s, src = measured_rate(hist, "train", *default_train_rate(t, cfg, gpus), target=target)
    tr_gpu, tr_detail = train_gpu_bytes(t, cfg)
    kept = cfg.train.epochs + (1 if cfg.train.checkpoint_every_steps else 0)
    on_gpu = cfg.train.device != "cpu" and bool(gpus)
    add("train", kept * checkpoint_bytes(t, cfg), trained / tr_tok_s, f"{tr_tok_s:,.0f} tok/s x {trained / 1e6:,.1f} M",
        src, *((tr_gpu, cfg.train.nproc, tr_detail) if on_gpu else ()))
    # export: the drafter in bf16
    ex = [r for r in measured_runs(hist, "export") if r.seconds]
    add("export", 2 * drafter_params(t, cfg)[0], ex[0].seconds if ex else DEFAULT_EXPORT_S, "",
        f"measured (run {ex[0].run})" if ex else SOURCES["export"])
    # benchmark: each variant's engine start, then every window at the decode rate
    settings = cfg.benchmark.model_dump(mode="json")
    same = [r for r in measured_runs(hist, "benchmark", target=target) if r.seconds and r.settings == settings]
    variants = 2 + (1 if cfg.benchmark.current_drafter else 0)
    b = cfg.benchmark
    if same:
        secs, rate, src = same[0].seconds, "", f"measured (run {same[0].run}, the same benchmark settings)"
    else:
        per_variant = sum((b.num_prompts + b.warmup_requests) * b.max_tokens / (DEFAULT_DECODE_TOK_S * c)
                          for c in b.concurrencies) * len(b.temperatures)
        secs, rate = variants * (per_variant + start), f"{DEFAULT_DECODE_TOK_S} tok/s a request, {variants} variants"
        src = SOURCES["benchmark"] + start_note
    # the triage: one engine load per probe (each alternative backend its own), a few short requests on each
    tri = b.triage
    loads = int("verify" in tri.probes) + int("plumbing" in tri.probes) + (
        tri.max_backend_runs if "backends" in tri.probes else 0)
    tri_secs = loads * (start + 2 * tri.num_prompts * tri.max_tokens / DEFAULT_DECODE_TOK_S)
    if tri.when == "always" and loads and not same:
        secs, rate = secs + tri_secs, rate + f", triage: up to {loads} engine loads"
    elif tri.when == "auto" and loads:
        findings.append(f"benchmark: should the triage run (a drafter far below its offline estimate), it adds up "
                        f"to {loads} engine loads, about {duration_text(tri_secs)} (benchmark.triage)")
    bench_gpu = _per_gpu(weights + 2 * drafter_params(t, cfg)[0], tp) if weights else None
    add("benchmark", 0, secs, rate, src, *((bench_gpu, tp, f"(weights + bf16 drafter) / TP {tp}") if weights and gpus
                                           else ()))

    reserve = int(cfg.engine.min_free_disk_gib * 2**30)
    needed = sum(s.disk_bytes for s in stages) + reserve
    free = facts.disk.free_bytes if facts.disk else None
    upper = extract_bytes(tok.upper_bound_tokens, tok.samples, h, dtype)
    if not tok.exact and free is not None and needed - x_bytes[dtype] + upper > free >= needed:
        findings.append(f"extract: if every answer ran to generate.max_tokens ({cfg.generate.max_tokens:,}) the "
                        f"states would take {size_text(upper)}, more than the {size_text(free)} free")
    if tp > len(gpus) and gpus:
        findings.append(f"engine.tensor_parallel_size is {tp} but the host has {len(gpus)} GPU(s)")
    if not gpus:
        findings.append("no GPUs on the host: GPU memory is not planned (CPU stages use host memory)")
    if weights is None:
        findings.append("the target's weight bytes are unknown: its engine's GPU memory is not planned")
    result = CapacityPlan(
        host=facts.hostname or cfg.host.name, target=target, hidden_size=h, storage_dtype=dtype,
        bytes_per_token=state_bytes_per_token(h, dtype) + TOKEN_SIDE_BYTES, tokens=tok, stages=stages,
        extract_bytes=x_bytes, disk_needed_bytes=needed, disk_reserve_bytes=reserve, disk_free_bytes=free,
        disk_path=facts.disk.path if facts.disk else None, gpu_budget_bytes=budget,
        total_seconds=sum(s.seconds for s in stages), findings=findings)
    result.refusal = disk_refusal(result, cfg)
    return result


def _per_gpu(weights: int | None, n: int) -> int | None:
    return None if weights is None else math.ceil(weights / max(n, 1))


def disk_refusal(p: CapacityPlan, cfg: RunConfig) -> str | None:
    """Why this run will not fit the free disk, naming both numbers and what to do; None when it fits."""
    if p.disk_free_bytes is None or p.disk_needed_bytes <= p.disk_free_bytes:
        return None
    x = next(s for s in p.stages if s.stage == "extract")
    others = p.disk_needed_bytes - x.disk_bytes - p.disk_reserve_bytes
    what = "exact, from the generate stage" if p.tokens.exact else "estimated"
    fixes = []
    if p.storage_dtype != "float8_e4m3fn":
        fp8 = p.disk_needed_bytes - x.disk_bytes + p.extract_bytes["float8_e4m3fn"]
        fixes.append(f"set extract.storage_dtype: float8_e4m3fn (the run then needs {size_text(fp8)})")
    fixes.append(f"put host.work_root on a bigger disk (or free {size_text(p.disk_needed_bytes - p.disk_free_bytes)} "
                 f"at {p.disk_path})")
    spare = p.disk_free_bytes - p.disk_reserve_bytes - others
    fit = int(p.tokens.samples * spare / x.disk_bytes) if x.disk_bytes and spare > 0 else 0
    fixes.append(f"lower generate.num_samples (about {fit:,} of {p.tokens.samples:,} fit)")
    return (f"the extraction will not fit the free disk: this run needs {size_text(p.disk_needed_bytes)} "
            f"({p.disk_needed_bytes:,} bytes) under {cfg.host.work_root} but {size_text(p.disk_free_bytes)} "
            f"({p.disk_free_bytes:,} bytes) is free at {p.disk_path}. The states of {p.tokens.tokens:,} tokens "
            f"({what}) x {p.bytes_per_token:,} B in {p.storage_dtype} are {size_text(x.disk_bytes)}; the other stages "
            f"{size_text(others)}; {size_text(p.disk_reserve_bytes)} stays free (engine.min_free_disk_gib). To fix: "
            + "; or ".join(fixes) + ".")


def states_refusal(tokens: int, sequences: int, hidden_size: int, storage_dtype: str, written: int, free: int,
                   path: str, reserve: int) -> str | None:
    """The extract stage's own check before it writes: the exact tokens (cut at extract.max_seq_len)
    against the free disk, less what finished shards already hold. None when they fit."""
    needed = extract_bytes(tokens, sequences, hidden_size, storage_dtype) - written + reserve
    if needed <= free:
        return None
    fixes = ["put host.work_root on a bigger disk", "lower generate.num_samples"]
    if storage_dtype != "float8_e4m3fn":
        fp8 = extract_bytes(tokens, sequences, hidden_size, "float8_e4m3fn") - written + reserve
        fixes.insert(0, f"set extract.storage_dtype: float8_e4m3fn (needs {size_text(fp8)})")
    return (f"the extraction will not fit the free disk: {tokens:,} tokens (exact, from the generate stage) x "
            f"{state_bytes_per_token(hidden_size, storage_dtype) + TOKEN_SIDE_BYTES:,} B in {storage_dtype} need "
            f"{size_text(needed)} ({needed:,} bytes, with {size_text(written)} already written and {size_text(reserve)} kept free) but "
            f"{size_text(free)} ({free:,} bytes) is free at {path}. To fix: " + "; or ".join(fixes) + ".")


def render_plan(p: CapacityPlan) -> str:
    """The plan as a terminal table (the check stage's log, `python -m flows.plan`, the report)."""
    t = p.tokens
    kind = "exact (the generate stage's manifest)" if t.exact else "estimated"
    lines = [
        f"capacity plan: {p.target} on {p.host}",
        f"tokens: {t.tokens:,} {kind} = {t.samples:,} samples x ({t.prompt_tokens:,.0f} prompt [{t.prompt_source}] "
        f"+ {t.answer_tokens:,.0f} answer [{t.answer_source}])"
        + ("" if t.exact else f"; at most {t.upper_bound_tokens:,} (every answer at generate.max_tokens)"),
        f"states: {p.bytes_per_token:,} B a token (4 x {p.hidden_size} in {p.storage_dtype}); bf16 "
        f"{size_text(p.extract_bytes['bfloat16'])}, fp8 {size_text(p.extract_bytes['float8_e4m3fn'])}",
        "",
        f"{'stage':10}{'status':>8}{'disk':>11}{'GPU each':>11}{'GPUs':>5}{'time':>9}  rate / source",
    ]
    for s in p.stages:
        gpu = size_text(s.gpu_bytes) if s.gpu_bytes is not None else "-"
        lines.append(f"{s.stage:10}{s.status:>8}{size_text(s.disk_bytes):>11}{gpu:>11}{s.gpus or '-':>5}{duration_text(s.seconds):>9}  "
                     + "; ".join(x for x in (s.rate, s.source) if x))
    free = size_text(p.disk_free_bytes) if p.disk_free_bytes is not None else "unknown"
    lines += ["", f"disk: needs {size_text(p.disk_needed_bytes)} (with {size_text(p.disk_reserve_bytes)} kept free), "
              f"free {free} at {p.disk_path or '?'}" + (" - DOES NOT FIT" if p.refusal else ""),
              f"GPU: {size_text(p.gpu_budget_bytes)} usable a GPU" if p.gpu_budget_bytes else "GPU: none on the host",
              f"time: {duration_text(p.total_seconds)} for the stages to run, one after the other"]
    lines += [f"  ! {f}" for f in p.findings]
    if p.refusal:
        lines.append(f"refused: {p.refusal}")
    return "\n".join(lines)
