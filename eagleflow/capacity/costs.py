"""What one token, one step and one checkpoint cost: the arithmetic the planner adds up (pure).

Bytes follow the shard format of `eagleflow.drafter.shards` (torch-free here); the drafter's parameters and
FLOPs follow `eagleflow.drafter.model` at the shape `TargetFacts` gives; rates come from
`eagleflow.capacity.rates` where the host measured none.
"""

from __future__ import annotations

import math

from eagleflow.capacity.rates import (
    DDP_GPU_EFFICIENCY,
    DEFAULT_TRAIN_TOK_S,
    H200_MUON_NS_TFLOPS,
    H200_TRAIN_TFLOPS,
    LK_STEP_COST,
    NUM_STATES,
    SOURCES,
    TRAIN_STAGE_FRACTION,
)
from eagleflow.config import RunConfig
from eagleflow.contracts.plan import GpuFacts, TargetFacts
from eagleflow.util.text import size_text

STATE_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}


FP8_SCALE_BYTES = 4  # float8: one f32 scale per token and state


TOKEN_SIDE_BYTES = 8 + 1  # input_ids int64 + loss_mask int8 per token (seq_lens: 8 B per sequence)


PARQUET_BYTES_PER_TOKEN = 9  # generate: input_ids int32 + loss_mask int8 + ~4 B of text per token, uncompressed


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
    to train.nproc GPUs (and saying so); elsewhere the reference run's figure (its RTX PRO 6000s: no rate of ours
    there)."""
    other, nodes = sorted({g.name for g in gpus if "H200" not in g.name}), 1 + len(cfg.train_nodes.hosts)
    across = f"; host's GPUs only, not train_nodes' other {nodes - 1}: unmeasured across hosts" if nodes > 1 else ""
    if cfg.train.device == "cpu" or not gpus or other:
        return DEFAULT_TRAIN_TOK_S, SOURCES["train"] + across + (
            f"; this host's GPUs ({', '.join(other)}) are no H200s, where eagleflow's rate was measured"
            if other
            else ""
        )
    flops, n = train_flops_per_token(t, cfg), cfg.train.nproc
    lk, eff = LK_STEP_COST if cfg.train.loss == "lk" else 1.0, DDP_GPU_EFFICIENCY if n > 1 else 1.0
    one = H200_TRAIN_TFLOPS * 1e12 / flops * TRAIN_STAGE_FRACTION / lk  # LK: its acceptance term, in every step
    step_costs = f"; the LK loss's {lk - 1:.1%} a step (measured at that shape)" if lk > 1 else ""
    if cfg.train.optimizer == "muon":  # a fixed cost a step on each rank: fewer tokens a step pay more of it
        rank_tokens = cfg.train.batch_tokens / n
        ns_s = muon_flops_per_step(t, cfg) / (H200_MUON_NS_TFLOPS * 1e12)
        one = rank_tokens / (rank_tokens / one + ns_s)
        step_costs += (
            f"; Muon's Newton-Schulz {ns_s * 1e3:.0f} ms a step on every rank ({rank_tokens:,.0f} tokens "
            f"a rank a step, at the {H200_MUON_NS_TFLOPS:.0f} TFLOP/s measured at Kimi-K2.5's drafter shape)"
        )
    return one * n * eff, (
        f"scaled: an H200 trained at {H200_TRAIN_TFLOPS:.0f} TFLOP/s (Kimi-K2.5's drafter shape, docs/benchmarks.md), "
        f"{one:,.0f} tok/s at this drafter's {flops / 1e9:.1f} GFLOP a token and the stage's own "
        f"{TRAIN_STAGE_FRACTION:.0%}{step_costs}"
        + (f", x {n} GPUs x {eff:.2f} (per-GPU data-parallel efficiency measured on 2 H200s)" if n > 1 else "")
        + across
    )


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
    return states + act, (
        f"weights+grads+{'Muon' if cfg.train.optimizer == 'muon' else 'AdamW'}+frozen heads "
        f"{size_text(states)}, activations {size_text(act)} "
        f"({micro:,} tokens a micro-batch x {cfg.train.ttt_steps} TTT steps)"
    )


def checkpoint_bytes(t: TargetFacts, cfg: RunConfig) -> int:
    """One checkpoint: float32 weights + the optimizer's float32 states of the trainable ones."""
    total, trainable = drafter_params(t, cfg)
    return 4 * total + OPTIMIZER_STATE_BYTES[cfg.train.optimizer] * trainable
