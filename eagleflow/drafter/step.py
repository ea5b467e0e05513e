"""One optimizer step, as public entry points: the optimizer, the autocast and the step `Trainer` takes.

Benchmarks time exactly this (benchmarks/train_gpu.py) without reaching into the trainer's privates.
"""

from __future__ import annotations

import torch
from torch import nn

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.data import Batch
from eagleflow.drafter.objective import StepStats, TTTObjective


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` names over the trainable parameters. AdamW: no weight decay on norms
    (1-D weights). Muon: the weight matrices but lm_head (a vocabulary's rows, not a linear map Muon's
    orthogonalization suits, as speculators and Keller Jordan's Muon keep it out), AdamW for the rest."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.optimizer == "muon":
        is_matrix = {n: p.dim() == 2 and min(p.shape) > 1 and "lm_head" not in n for n, p in named}
        matrices = [p for n, p in named if is_matrix[n]]
        rest = [p for n, p in named if not is_matrix[n]]
        parts: list[torch.optim.Optimizer] = []
        if matrices:
            parts.append(
                torch.optim.Muon(
                    matrices,
                    lr=cfg.learning_rate,
                    momentum=cfg.muon_momentum,
                    weight_decay=cfg.muon_weight_decay,
                    adjust_lr_fn="match_rms_adamw",
                )
            )
        if rest:
            parts.append(_adamw(rest, cfg))
        return parts[0] if len(parts) == 1 else Optimizers(parts)
    return _adamw([p for _, p in named], cfg)


def _adamw(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate,
        betas=(0.9, cfg.adam_beta2),
    )


class Optimizers(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped, zeroed, scheduled and checkpointed as one
    (Muon for the matrices beside AdamW for the rest). `param_groups` are the parts' own groups, read
    anew each time (a part's `load_state_dict` replaces its group dicts), so a schedule that sets each
    group's lr reaches every part, after a resume too."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:  # no super().__init__: no state of its own
        self.parts = parts
        self.defaults: dict = {}
        self.state: dict = {}

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return [g for part in self.parts for g in part.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for part in self.parts:
            part.step()

    def state_dict(self) -> dict:  # type: ignore[override]
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        if len(state_dict.get("parts", ())) != len(self.parts):
            raise ValueError(
                f"the checkpoint's optimizer state has {len(state_dict.get('parts', ()))} parts, this "
                f"optimizer {len(self.parts)}: it was written with another train.optimizer"
            )
        for part, state in zip(self.parts, state_dict["parts"]):
            part.load_state_dict(state)


def autocast_for(device: torch.device, cfg: TrainConfig) -> torch.autocast:
    """bf16 autocast on CUDA for dtype auto/bfloat16 (weights and optimizer stay fp32); off on CPU."""
    enabled = device.type == "cuda" and cfg.dtype in ("auto", "bfloat16")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def train_step(
    objective: TTTObjective, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainConfig
) -> tuple[torch.Tensor, StepStats, torch.Tensor]:
    """One optimizer step on one batch on one rank: (loss, stats, grad norm). The step `Trainer` takes
    when there is one micro-batch, as a public entry point (benchmarks time exactly this)."""
    optimizer.zero_grad(set_to_none=True)
    with autocast_for(batch.aux.device, cfg):
        loss, stats = objective(batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.detach(), stats, grad_norm
