"""One optimizer step, as public entry points: the optimizer, the autocast and the step `Trainer` takes.

Benchmarks time exactly this (benchmarks/train_gpu.py) without reaching into the trainer's privates.
"""

from __future__ import annotations

import torch
from torch import nn

from eagleflow.drafter.config import TrainConfig
from eagleflow.drafter.data import Batch
from eagleflow.drafter.objective import StepStats, TTTObjective


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; no weight decay on norms (1-D weights)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.dim() < 2 else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate, betas=(0.9, cfg.adam_beta2),
    )


def autocast_for(device: torch.device, cfg: TrainConfig) -> torch.autocast:
    """bf16 autocast on CUDA for dtype auto/bfloat16 (weights and optimizer stay fp32); off on CPU."""
    enabled = device.type == "cuda" and cfg.dtype in ("auto", "bfloat16")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def train_step(objective: TTTObjective, optimizer: torch.optim.Optimizer, batch: Batch,
               cfg: TrainConfig) -> tuple[torch.Tensor, StepStats, torch.Tensor]:
    """One optimizer step on one batch on one rank: (loss, stats, grad norm). The step `Trainer` takes
    when there is one micro-batch, as a public entry point (benchmarks time exactly this)."""
    optimizer.zero_grad(set_to_none=True)
    with autocast_for(batch.aux.device, cfg):
        loss, stats = objective(batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.detach(), stats, grad_norm
