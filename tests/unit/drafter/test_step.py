"""One optimizer step as a public entry point (eagleflow.drafter.step): `train_step` is exactly the
step the trainer takes with one micro-batch, and the optimizer leaves norms out of weight decay.
Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.config import TrainConfig  # noqa: E402
from eagleflow.drafter.data import collate  # noqa: E402
from eagleflow.drafter.step import autocast_for, make_optimizer, train_step  # noqa: E402
from tests.helpers.drafter import make_model, tiny_trainer, write_synthetic  # noqa: E402


def test_train_step_is_the_trainers_step(tmp_path):
    root = write_synthetic(tmp_path / "syn", n_train=40)
    ours, theirs = tiny_trainer(tmp_path / "a", root), tiny_trainer(tmp_path / "b", root)
    idx = [3, 1, 4]
    for t in (ours, theirs):
        for group in t.optimizer.param_groups:
            group["lr"] = 1e-2
    stats_trainer, norm_trainer = theirs._optimizer_step(idx)
    loss, stats, norm = train_step(ours.objective, ours.optimizer, collate(ours.train_data, idx), ours.cfg)
    assert stats.tokens == stats_trainer.tokens > 0
    assert loss.item() == pytest.approx(stats.summary(0.8)["loss"], rel=1e-5)
    assert stats.summary(0.8)["loss"] == pytest.approx(stats_trainer.summary(0.8)["loss"], rel=1e-6)
    assert float(norm) == pytest.approx(float(norm_trainer), rel=1e-6)
    moved = 0
    for (name, p1), p2, p0 in zip(ours.model.named_parameters(), theirs.model.parameters(),
                                  tiny_trainer(tmp_path / "c", root).model.parameters()):
        torch.testing.assert_close(p1, p2, atol=1e-7, rtol=1e-6, msg=name)
        moved += int(not torch.equal(p1, p0))
    assert moved > 0  # the step did change the weights


def test_optimizer_groups_and_autocast():
    cfg = TrainConfig(weight_decay=0.1)
    model = make_model()
    model.lm_head.weight.requires_grad_(False)
    decay, no_decay = make_optimizer(model, cfg).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert not any(p is model.lm_head.weight for p in decay["params"])  # frozen: not optimized
    with autocast_for(torch.device("cpu"), cfg):
        assert not torch.is_autocast_enabled("cpu")  # the CPU computes in float32
