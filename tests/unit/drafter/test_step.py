"""One optimizer step as a public entry point (eagleflow.drafter.step): `train_step` is exactly the
step the trainer takes with one micro-batch, and the optimizer leaves norms out of weight decay.
Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.config.train import TrainConfig  # noqa: E402
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
    for (name, p1), p2, p0 in zip(
        ours.model.named_parameters(), theirs.model.parameters(), tiny_trainer(tmp_path / "c", root).model.parameters()
    ):
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


def test_muon_takes_the_layer_matrices_and_adamw_the_rest():
    """optimizer 'muon': torch.optim.Muon over fc's and the layer's weight matrices, AdamW over the norms;
    the frozen lm_head in neither. One schedule reaches both (the trainer sets every group's lr), and a
    step moves the matrices by Muon's orthogonalized update, not Adam's."""
    cfg = TrainConfig(optimizer="muon", weight_decay=0.0)
    model = make_model()
    model.lm_head.weight.requires_grad_(False)
    opt = make_optimizer(model, cfg)
    muon, adamw = opt.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert "fc.weight" in in_muon and any("q_proj" in n for n in in_muon) and any("down_proj" in n for n in in_muon)
    assert all(model.get_parameter(n).dim() == 2 for n in in_muon)
    assert in_adamw and all(model.get_parameter(n).dim() == 1 for n in in_adamw)
    assert "lm_head.weight" not in in_muon | in_adamw
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert in_muon | in_adamw == trainable and not in_muon & in_adamw
    assert muon.param_groups[0]["weight_decay"] == cfg.muon_weight_decay
    for group in opt.param_groups:
        group["lr"] = 1e-2
    assert muon.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] == 1e-2
    before = model.fc.weight.detach().clone()
    model.fc.weight.grad = torch.randn_like(model.fc.weight)
    opt.step()
    update = (before - model.fc.weight.detach()).double()
    # Newton-Schulz leaves the update near-orthogonal: its singular values are close together (an Adam
    # step's first update is sign(g), whose singular values spread like a random matrix's).
    sv = torch.linalg.svdvals(update)
    assert float(sv.max() / sv.min()) < 2.0
    opt.zero_grad()
    assert model.fc.weight.grad is None
