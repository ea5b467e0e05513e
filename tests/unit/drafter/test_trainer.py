"""The training recipe (eagleflow.drafter.trainer.Trainer) on a tiny synthetic target: gradient
accumulation gives the one-batch step, a step checkpoint restores the RNG and the data position,
epoch checkpoints supersede step checkpoints, and training is bounded by steps, never by the clock:
`max_steps` stops at exactly that step, and `time_limit_s` (a safety cap) fails with a step
checkpoint from which a rerun reaches the uninterrupted run's weights. Host environment (torch).
Killing and resuming a real stage process, and torchrun, are in tests/integration/stages/test_train.py."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.errors import TrainError  # noqa: E402
from eagleflow.drafter.objective import StepStats  # noqa: E402
from tests.helpers.drafter import tiny_trainer, write_synthetic  # noqa: E402


def _state_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def test_grad_accumulation_gives_the_one_batch_step(tmp_path):
    """Micro-batches (some empty) with the whole step's label counts add up to the step's gradient."""
    root = write_synthetic(tmp_path / "syn", n_train=40)
    one = tiny_trainer(tmp_path / "one", root)
    acc = tiny_trainer(tmp_path / "acc", root, grad_accum_steps=4)
    idx = [0, 1, 2]  # 3 sequences in 4 micro-batches: one is a zero-weight pass
    for trainer in (one, acc):
        for group in trainer.optimizer.param_groups:
            group["lr"] = 1e-2
        stats, _ = trainer._optimizer_step(idx)
        trainer.stats = stats.summary(0.8)
    assert one.stats["positions"] == acc.stats["positions"] and one.stats["tokens"] == acc.stats["tokens"]
    assert one.stats["loss"] == pytest.approx(acc.stats["loss"], rel=1e-6)
    for (name, p1), p2 in zip(one.model.named_parameters(), acc.model.parameters()):
        if p1.requires_grad:  # the gradients (Adam's first step is sign-like: compare before it)
            torch.testing.assert_close(p1.grad, p2.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_resume_restores_rng_and_continues_mid_epoch(tmp_path):
    """A step checkpoint restores the CPU and Python generators, the data position and the epoch's
    statistics so far (not the freshly seeded state of a new process)."""
    root = write_synthetic(tmp_path / "syn", n_train=40)
    first = tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=3)
    torch.rand(7), random.random()  # the generators move on during training
    stats = StepStats(3, tokens=123)
    first._save_step(epoch=1, batch_index=3, step=3, train_s=1.5, epoch_s=1.5, epoch_stats=stats, lr=1e-3)
    expected = (torch.rand(5), random.random())
    second = tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=3)  # seeds again
    at = second.checkpoints.resume(second.model, second.optimizer)
    assert (torch.rand(5).tolist(), random.random()) == (expected[0].tolist(), expected[1])
    assert (at.epoch, at.batch_index, at.step, at.train_seconds) == (1, 3, 3, 1.5)
    assert StepStats.from_vector(3, at.epoch_stats).tokens == 123
    restored, saved = second.optimizer.state_dict(), first.optimizer.state_dict()
    assert restored["param_groups"][0]["lr"] == saved["param_groups"][0]["lr"]


def test_step_checkpoints_are_superseded_by_the_epoch_checkpoint(tmp_path):
    root = write_synthetic(tmp_path / "syn", n_train=40)
    trainer = tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=2, epochs=2)
    result = trainer.train()
    names = sorted(d.name for d in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["epoch-1", "epoch-2"]  # no step-* left, no temp dirs
    assert [e.step for e in result.epochs][-1] > 2
    assert result.bounded_by == "epochs" and all(e.complete for e in result.epochs)
    assert result.steps == result.epochs[-1].step == trainer.planned_steps()


def test_max_steps_stops_at_exactly_that_step_and_marks_the_epoch_incomplete(tmp_path):
    root = write_synthetic(tmp_path / "syn", n_train=40)
    trainer = tiny_trainer(tmp_path / "run", root, epochs=3, max_steps=3)
    assert len(trainer._epoch_batches(1)) > 3  # the bound falls inside epoch 1
    assert trainer.planned_steps() == 3  # the cosine schedule ends there
    result = trainer.train()
    assert (result.steps, result.bounded_by) == (3, "max_steps")
    (epoch,) = result.epochs
    assert (epoch.epoch, epoch.step, epoch.complete) == (1, 3, False)
    assert epoch.checkpoint == "checkpoints/epoch-1"
    assert sorted(d.name for d in (tmp_path / "run" / "checkpoints").iterdir()) == ["epoch-1"]
    # A rerun of the same stage dir is over too: it trains nothing more and says why it ended.
    again = tiny_trainer(tmp_path / "run", root, epochs=3, max_steps=3).train()
    assert (again.steps, again.bounded_by, len(again.epochs)) == (3, "max_steps", 1)
    assert again.epochs[0].complete is False


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_time_limit_fails_after_a_step_checkpoint_and_a_rerun_reaches_the_uninterrupted_weights(tmp_path, optimizer):
    """train.time_limit_s is a safety cap: reached (1e-9 s: right after the first step), the trainer
    writes a step checkpoint and raises TrainError naming the limit. The same stage dir rerun without
    the cap resumes there and ends with the weights of a run that was never interrupted: with Muon
    beside AdamW too (both optimizers' states are in the checkpoint: Muon's momentum lost would move
    every later step)."""
    root = write_synthetic(tmp_path / "syn", n_train=40)
    whole = tiny_trainer(tmp_path / "whole", root, epochs=2, optimizer=optimizer)
    expected = whole.train()

    capped = tiny_trainer(tmp_path / "cut", root, epochs=2, time_limit_s=1e-9, optimizer=optimizer)
    with pytest.raises(TrainError) as err:
        capped.train()
    msg = str(err.value)
    assert "train.time_limit_s" in msg and "reached at step 1 of" in msg and "checkpoints/step-1" in msg
    assert "raise train.time_limit_s" in msg
    assert sorted(d.name for d in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step-1"]

    rerun = tiny_trainer(tmp_path / "cut", root, epochs=2, optimizer=optimizer)
    result = rerun.train()
    assert (result.steps, result.bounded_by) == (expected.steps, "epochs")
    assert [(e.epoch, e.step, e.complete, e.train["tokens"]) for e in result.epochs] == [
        (e.epoch, e.step, e.complete, e.train["tokens"]) for e in expected.epochs
    ]
    for got, want in zip(result.epochs, expected.epochs):
        assert got.train["loss"] == pytest.approx(want.train["loss"], rel=1e-6)
        assert got.validation["acceptance_length"] == pytest.approx(want.validation["acceptance_length"], rel=1e-6)
    assert _state_diff(rerun.model.state_dict(), whole.model.state_dict()) <= 1e-6


def test_time_limit_stop_ends_training_at_the_cap_marked_as_time(tmp_path):
    """on_time_limit 'stop' keeps the old race against the clock, and says so: bounded_by 'time'."""
    root = write_synthetic(tmp_path / "syn", n_train=40)
    result = tiny_trainer(tmp_path / "run", root, epochs=2, time_limit_s=1e-9, on_time_limit="stop").train()
    assert (result.steps, result.bounded_by) == (1, "time")
    (epoch,) = result.epochs
    assert (epoch.step, epoch.complete) == (1, False)
