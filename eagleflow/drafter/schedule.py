"""The learning rate at each optimizer step: linear warm-up, then a decay to `learning_rate * min_lr_ratio`."""

from __future__ import annotations

import math

from eagleflow.config.train import TrainConfig


def lr_at(cfg: TrainConfig, step: int, total_steps: int, elapsed_s: float) -> float:
    """Linear warm-up over `warmup_steps`, then `lr_schedule` ('cosine', or speculators' 'linear') down to the floor
    over `total_steps`. Only in a race against the clock (on_time_limit 'stop') does progress follow wall time, so
    the race still ends at the floor."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    if cfg.time_limit_s and cfg.on_time_limit == "stop":
        progress = max(progress, elapsed_s / cfg.time_limit_s)
    progress = min(progress, 1.0)
    floor = cfg.learning_rate * cfg.min_lr_ratio
    left = 1.0 - progress if cfg.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (cfg.learning_rate - floor) * left
