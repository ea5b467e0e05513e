"""The learning-rate schedule: warm-up, then cosine or linear down to the floor, ending there."""

from __future__ import annotations

import math

import pytest

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.schedule import lr_at


@pytest.mark.parametrize("shape", ["cosine", "linear"])
def test_warm_up_then_decay_to_the_floor_at_the_last_step(shape):
    cfg = TrainConfig(learning_rate=1e-3, min_lr_ratio=0.1, warmup_steps=10, lr_schedule=shape)
    assert lr_at(cfg, 0, 110, 0.0) == pytest.approx(1e-4)  # the first of 10 warm-up steps
    assert lr_at(cfg, 9, 110, 0.0) == pytest.approx(1e-3)
    assert lr_at(cfg, 10, 110, 0.0) == pytest.approx(1e-3)  # the decay starts at the peak
    assert lr_at(cfg, 110, 110, 0.0) == pytest.approx(1e-4)  # and ends at the floor
    lrs = [lr_at(cfg, s, 110, 0.0) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_linear_is_a_straight_line_and_cosine_is_not():
    linear = TrainConfig(learning_rate=1.0, min_lr_ratio=0.0, warmup_steps=0, lr_schedule="linear")
    cosine = linear.model_copy(update={"lr_schedule": "cosine"})
    assert [lr_at(linear, s, 100, 0.0) for s in (25, 50, 75)] == pytest.approx([0.75, 0.5, 0.25])
    assert [lr_at(cosine, s, 100, 0.0) for s in (25, 50, 75)] == pytest.approx(
        [0.5 * (1 + math.cos(math.pi * p)) for p in (0.25, 0.5, 0.75)]
    )
    assert lr_at(cosine, 25, 100, 0.0) > lr_at(linear, 25, 100, 0.0)


def test_a_race_against_the_clock_follows_the_clock():
    cfg = TrainConfig(
        learning_rate=1.0,
        min_lr_ratio=0.0,
        warmup_steps=0,
        lr_schedule="linear",
        time_limit_s=100,
        on_time_limit="stop",
    )
    assert lr_at(cfg, 10, 1000, 50.0) == pytest.approx(0.5)  # half the time gone, 1% of the steps
