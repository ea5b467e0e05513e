"""Resume bookkeeping: what the trainer writes at each epoch's end and every few steps, and where a rerun
continues. The files of one checkpoint are eagleflow.drafter.checkpoint's; this module decides when they are
written, what the trainer's state holds and which checkpoint a rerun starts from.

    <train stage dir>/checkpoints/
        epoch-<n>/            after epoch n: the weights, drafter.json (with the epoch's result), trainer_state.pt
        step-<n>/             after optimizer step n, mid-epoch; only the newest is kept, the next epoch's removes it

    trainer_state.pt: the optimizer's state, the step and training seconds (the learning rate is a function of
    them), the epoch and the index of its next batch (an epoch's batches are a function of seed and epoch), the
    epoch's statistics so far, and the CPU/CUDA/Python generators.

A rerun continues from the newest of all of them and reaches the checkpoint an uninterrupted run reaches.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.checkpoint import CHECKPOINT_META, CHECKPOINT_STATE, load_checkpoint, save_checkpoint
from eagleflow.drafter.errors import TrainError
from eagleflow.drafter.model import Eagle3Drafter
from eagleflow.drafter.objective import StepStats
from eagleflow.drafter.ranks import DistEnv
from eagleflow.drafter.vocab import DraftVocab

log = logging.getLogger("eagleflow.train")


@dataclass
class EpochResult:
    epoch: int
    checkpoint: str  # relative to the train stage directory
    complete: bool  # False when training ended inside the epoch (max_steps, or on_time_limit 'stop')
    train: dict[str, Any]
    validation: dict[str, Any]
    tokens_per_s: float
    seconds: float
    step: int | None = None  # optimizer steps at the end of the epoch (None: a checkpoint of the first version)
    lr: float | None = None  # learning rate of the epoch's last step


@dataclass
class ResumePoint:
    """Where training continues: `epoch` from its batch `batch_index` (0: the epoch's start)."""

    epoch: int = 1
    batch_index: int = 0
    step: int = 0
    train_seconds: float = 0.0
    epoch_seconds: float = 0.0
    epoch_stats: torch.Tensor | None = None  # StepStats.to_vector() of the epoch so far
    results: list[EpochResult] = field(default_factory=list)


def _rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _set_rng_state(state: Any, device: torch.device) -> None:
    if isinstance(state, torch.Tensor):  # checkpoints of the first version: the CPU generator only
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


class Checkpointer:
    """Writes and reads `out_dir/checkpoints/`: an epoch's checkpoint at its end, a step's every
    `train.checkpoint_every_steps` (only the newest kept; the next epoch's removes it), and the resume point:
    the newest complete one of all, mid-epoch included. Rank 0 alone writes; every rank reads."""

    def __init__(
        self, out_dir: Path, cfg: TrainConfig, aux_layer_ids: list[int], ranks: DistEnv, device: torch.device
    ) -> None:
        self.root, self.cfg, self.aux_layer_ids, self.ranks, self.device = (
            out_dir / "checkpoints",
            cfg,
            aux_layer_ids,
            ranks,
            device,
        )

    def trainer_state(
        self,
        optimizer: torch.optim.Optimizer,
        epoch: int,
        batch_index: int,
        step: int,
        train_s: float,
        epoch_s: float,
        epoch_stats: StepStats,
        lr: float,
    ) -> dict[str, Any]:
        """What `trainer_state.pt` holds: the optimizer, the position in the data, the clocks, the RNGs."""
        return {
            "optimizer": optimizer.state_dict(),
            "step": step,
            "train_seconds": train_s,
            "epoch": epoch,
            "batch_index": batch_index,
            "epoch_seconds": epoch_s,
            "epoch_stats": epoch_stats.to_vector(),
            "lr": lr,
            "rng": _rng_state(self.device),
            "batch_tokens": self.cfg.batch_tokens,
            "seed": self.cfg.seed,
            "world_size": self.ranks.world_size,
        }

    def save_step(
        self,
        model: Eagle3Drafter,
        vocab: DraftVocab,
        optimizer: torch.optim.Optimizer,
        epoch: int,
        batch_index: int,
        step: int,
        train_s: float,
        epoch_s: float,
        epoch_stats: StepStats,
        lr: float,
    ) -> None:
        """checkpoints/step-<n>/ (temp dir, then rename); the older ones go once it is in place."""
        if not self.ranks.is_main:
            return
        meta = {
            "epoch": epoch,
            "kind": "step",
            "step": step,
            "aux_layer_ids": self.aux_layer_ids,
            "train_config": self.cfg.model_dump(mode="json"),
        }
        state = self.trainer_state(optimizer, epoch, batch_index, step, train_s, epoch_s, epoch_stats, lr)
        save_checkpoint(self.root / f"step-{step}", model, vocab, meta, state)
        self.drop_steps(keep_after=step - 1)
        log.info("checkpoint at step %d (epoch %d, batch %d)", step, epoch, batch_index)

    def save_epoch(
        self,
        model: Eagle3Drafter,
        vocab: DraftVocab,
        optimizer: torch.optim.Optimizer,
        result: EpochResult,
        stats: StepStats,
        train_s: float,
        epoch_s: float,
    ) -> None:
        """checkpoints/epoch-<n>/ with the epoch's result in its metadata; the step checkpoints before it go."""
        if not self.ranks.is_main:
            return
        meta = {
            "epoch": result.epoch,
            "kind": "epoch",
            "aux_layer_ids": self.aux_layer_ids,
            "validation": result.validation,
            "train_config": self.cfg.model_dump(mode="json"),
            "result": vars(result),
        }
        state = self.trainer_state(optimizer, result.epoch, -1, result.step, train_s, epoch_s, stats, result.lr)
        save_checkpoint(self.root.parent / result.checkpoint, model, vocab, meta, state)
        self.drop_steps(keep_after=result.step)

    def drop_steps(self, keep_after: int) -> None:
        for d in self.root.glob("step-*"):
            m = re.fullmatch(r"step-(\d+)", d.name)
            if m and int(m.group(1)) <= keep_after:
                shutil.rmtree(d, ignore_errors=True)

    def resume(self, model: Eagle3Drafter, optimizer: torch.optim.Optimizer) -> ResumePoint:
        """The newest complete checkpoint loaded into `model` and `optimizer` (and the RNGs): after the last
        finished epoch, or mid-epoch from a step checkpoint. A fresh run's start when there is none."""
        found: dict[str, list[tuple[int, Path]]] = {"epoch": [], "step": []}
        for d in self.root.iterdir() if self.root.is_dir() else []:
            m = re.fullmatch(r"(epoch|step)-(\d+)", d.name)
            if m and (d / CHECKPOINT_STATE).is_file() and (d / CHECKPOINT_META).is_file():
                found[m.group(1)].append((int(m.group(2)), d))
        results = [
            EpochResult(**json.loads((d / CHECKPOINT_META).read_text())["result"]) for _, d in sorted(found["epoch"])
        ]
        at_epoch = max(found["epoch"], default=None)
        at_step = max(found["step"], default=None)
        path, state = None, None
        if at_epoch is not None:
            path = at_epoch[1]
            state = torch.load(path / CHECKPOINT_STATE, map_location="cpu", weights_only=False)
        if at_step is not None:
            step_state = torch.load(at_step[1] / CHECKPOINT_STATE, map_location="cpu", weights_only=False)
            if state is None or step_state["step"] > state["step"]:
                path, state = at_step[1], step_state
        if state is None:
            return ResumePoint()
        if state.get("batch_tokens", self.cfg.batch_tokens) != self.cfg.batch_tokens:
            raise TrainError(
                f"checkpoint {path} was written with batch_tokens {state['batch_tokens']}, the config "
                f"has {self.cfg.batch_tokens}: resuming needs the same batches; restore it or start "
                "a fresh stage directory"
            )
        _, weights, _, _ = load_checkpoint(path)
        model.load_state_dict({k: v.to(self.device) for k, v in weights.items()})
        optimizer.load_state_dict(state["optimizer"])
        _set_rng_state(state["rng"], self.device)
        if path.name.startswith("epoch-"):  # after a finished (or budget-cut) epoch
            log.info("resuming after epoch %d (step %d)", at_epoch[0], state["step"])
            return ResumePoint(
                epoch=at_epoch[0] + 1, step=state["step"], train_seconds=state["train_seconds"], results=results
            )
        log.info(
            "resuming mid-epoch from %s: epoch %d at batch %d (step %d)",
            path.name,
            state["epoch"],
            state["batch_index"],
            state["step"],
        )
        return ResumePoint(
            epoch=state["epoch"],
            batch_index=state["batch_index"],
            step=state["step"],
            train_seconds=state["train_seconds"],
            epoch_seconds=state["epoch_seconds"],
            epoch_stats=state["epoch_stats"],
            results=results,
        )
