"""Training settings (eagleflow.config.train.TrainConfig): the removed wall-clock budget is refused
with the fix named; training is bounded by epochs and max_steps, time_limit_s is a safety cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eagleflow.config.train import TrainConfig


def test_time_budget_s_is_refused_naming_the_fix():
    with pytest.raises(ValidationError) as err:
        TrainConfig(epochs=4, time_budget_s=150)
    msg = str(err.value)
    assert "train.time_budget_s is gone" in msg
    assert "epochs or max_steps" in msg and "time_limit_s" in msg and "on_time_limit: stop" in msg


def test_bounds_and_the_safety_cap():
    cfg = TrainConfig()
    assert (cfg.max_steps, cfg.time_limit_s, cfg.on_time_limit) == (None, None, "fail")
    cfg = TrainConfig(max_steps=7, time_limit_s=3600, on_time_limit="stop")
    assert (cfg.max_steps, cfg.time_limit_s, cfg.on_time_limit) == (7, 3600, "stop")
    for bad in ({"max_steps": 0}, {"time_limit_s": 0}, {"on_time_limit": "continue"}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            TrainConfig(**bad)


def test_bfloat16_on_cpu_is_refused():
    with pytest.raises(ValidationError, match="set dtype: float32"):
        TrainConfig(device="cpu", dtype="bfloat16")
