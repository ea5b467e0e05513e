"""The EAGLE-3 training recipe: setup, then epochs of TTT-unrolled steps, a checkpoint and a
validation pass per epoch, the best epoch chosen on simulated acceptance length.

Reads top to bottom: `Trainer.setup()` builds the vocabulary, the model, the optimizer and the
data in that order; `Trainer.train()` loops epochs; `Trainer._optimizer_step` is one optimizer step
(its micro-batches on this rank); `ttt_loss` is one forward of the objective.

Resumable mid-epoch: a step checkpoint holds the weights, AdamW's state, the step and training
seconds (the learning rate is a function of them), the epoch and its next batch (an epoch's
batches are a function of seed and epoch), the epoch's statistics so far, and the RNG states.
Data parallel under torchrun: each optimizer step's batch (`batch_tokens`) is dealt to nproc x
grad_accum_steps micro-batches whose losses are shares of the whole batch's (`label_counts`), so
the step, and the curve, do not depend on how it is split.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import inspect
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from eagleflow.devices import pick_device
from eagleflow.drafter.checkpoint import CHECKPOINT_META, CHECKPOINT_STATE, load_checkpoint, save_checkpoint
from eagleflow.drafter.config import TrainConfig
from eagleflow.drafter.data import ExtractIndex, SequenceStore, collate, make_batches, split_batch, token_masks
from eagleflow.drafter.errors import TrainError
from eagleflow.drafter.model import Eagle3Drafter, TargetHead
from eagleflow.drafter.objective import StepStats, TTTObjective, label_counts, ttt_loss
from eagleflow.drafter.ranks import DistEnv
from eagleflow.drafter.schedule import lr_at
from eagleflow.drafter.step import autocast_for, make_optimizer
from eagleflow.drafter.target import arch_for_target
from eagleflow.drafter.vocab import DraftVocab, count_tokens
from eagleflow.drafter.warm_start import PublicDrafter, check_warm_start, read_public_drafter, warm_start_arch
from eagleflow.progress import Progress

log = logging.getLogger("eagleflow.train")


# -------------------------------------------------------------------------------------- recipe

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
class TrainResult:
    epochs: list[EpochResult] = field(default_factory=list)
    best_epoch: int = 0
    vocab_size: int = 0
    arch: dict[str, Any] = field(default_factory=dict)
    steps: int = 0  # optimizer steps in all
    bounded_by: str = "epochs"  # what ended training: "epochs", "max_steps" or "time" (on_time_limit 'stop')

    @property
    def best(self) -> EpochResult:
        return next(e for e in self.epochs if e.epoch == self.best_epoch)


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
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng_state(state: Any, device: torch.device) -> None:
    if isinstance(state, torch.Tensor):  # checkpoints of the first version: the CPU generator only
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    """One training run in `out_dir`: checkpoints/epoch-<n>/ per epoch and checkpoints/step-<n>/ every
    `checkpoint_every_steps`; a rerun resumes from the newest, mid-epoch included.

    Under torchrun (WORLD_SIZE > 1) each rank runs this same recipe: every optimizer step's batch is
    dealt to nproc x grad_accum_steps micro-batches, DDP sums the gradients, and rank 0 alone
    validates, logs and writes checkpoints.
    """

    def __init__(self, cfg: TrainConfig, target: TargetHead, index: ExtractIndex, out_dir: str | Path,
                 aux_layer_ids: list[int]) -> None:
        self.cfg, self.target, self.index, self.out_dir = cfg, target, index, Path(out_dir)
        self.aux_layer_ids, self.dist = list(aux_layer_ids), DistEnv.from_env()
        try:
            self.device = pick_device(cfg.device, "train.device", self.dist.local_rank)
        except ValueError as exc:
            raise TrainError(str(exc)) from None

    # --- setup -----------------------------------------------------------------------------------

    def setup(self) -> "Trainer":
        self._setup_distributed()
        torch.manual_seed(self.cfg.seed)
        random.seed(self.cfg.seed)
        self.train_data, self.val_data = self._setup_data()
        self._train_lengths = self.train_data.lengths()
        warm = self._read_warm_start()
        keep = warm is not None and self.cfg.warm_start_vocab == "keep"
        self.vocab = warm.vocab if keep else self._setup_vocab(self.train_data)
        self.model = self._setup_model(warm)
        self.optimizer = self._setup_optimizer(self.model)
        self.vocab_rows = self.vocab.draft_to_target.to(self.device)
        self.target = TargetHead(**{k: (v.to(self.device) if isinstance(v, torch.Tensor) else v)
                                    for k, v in vars(self.target).items()})
        self.objective = self._setup_objective()
        return self

    def _setup_distributed(self) -> None:
        threads = self.cfg.num_threads
        if threads is None and self.dist.distributed and self.device.type == "cpu":
            threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size)))
        if threads:
            torch.set_num_threads(threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.dist.distributed and not dist.is_initialized():
            # Rank 0 validates and writes checkpoints while the others wait at a barrier.
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(hours=2))
        if not self.dist.is_main:
            log.setLevel(logging.WARNING)

    def _setup_data(self) -> tuple[SequenceStore, SequenceStore]:
        if self.index.hidden_size != self.target.hidden_size:
            raise TrainError(f"extracted hidden size {self.index.hidden_size} != target hidden size "
                             f"{self.target.hidden_size}: the data belongs to another model")
        train = SequenceStore(self.index.split("train"), self.cfg.max_seq_len)
        val = SequenceStore(self.index.split("holdout"), self.cfg.max_seq_len, max_seqs=self.cfg.val_max_seqs)
        if len(train) == 0:
            raise TrainError("the train split holds no sequence of 3 or more tokens")
        log.info("data: %d train sequences (%d tokens), %d holdout sequences (%d tokens)",
                 len(train), train.num_tokens, len(val), val.num_tokens)
        return train, val

    def _setup_vocab(self, train: SequenceStore) -> DraftVocab:
        ids, mask = train.all_tokens()
        counts = count_tokens(ids, mask, self.target.vocab_size)
        vocab = DraftVocab.from_counts(counts, self.cfg.draft_vocab_size)
        covered = counts[vocab.draft_to_target].sum().item() / max(1, counts.sum().item())
        log.info("draft vocabulary: %d of %d target ids, covering %.2f%% of assistant tokens",
                 vocab.size, vocab.target_vocab_size, 100 * covered)
        return vocab

    def _read_warm_start(self) -> PublicDrafter | None:
        if not self.cfg.warm_start:
            return None
        drafter = read_public_drafter(self.cfg.warm_start)
        for warning in check_warm_start(drafter, self.target, self.aux_layer_ids, "the target (target.model_path)"):
            log.warning("%s", warning)
        log.info("warm start: %s drafter in %s layout, draft vocabulary of %d kept",
                 self.cfg.warm_start, drafter.layout, drafter.vocab.size)
        return drafter

    def _setup_model(self, warm: PublicDrafter | None) -> Eagle3Drafter:
        arch = arch_for_target(self.target, self.cfg, self.vocab.size)
        if warm:
            arch = warm_start_arch(warm, arch)
        model = Eagle3Drafter(arch, self.target.embed_tokens)
        model.init_from_target(self.target, self.vocab.draft_to_target)
        if warm:
            where = ", ".join(str(f) for f in warm.weight_files)
            weights = warm.weights
            if self.cfg.warm_start_vocab == "rebuild" and "lm_head.weight" in weights:
                weights = dict(weights)
                old_head = weights.pop("lm_head.weight")  # [V_draft_old, H]: rows of the old draft vocabulary
                self._carry_head_rows(model, warm.vocab, old_head)
            try:
                missing, unexpected = model.load_state_dict(weights, strict=False)
            except RuntimeError as exc:
                raise TrainError(f"warm-start drafter {where} ({warm.layout} layout) does not fit: {exc}") from None
            missing = [m for m in missing if m != "lm_head.weight"]  # a shared lm_head: keep the target's rows
            if missing or unexpected:
                raise TrainError(f"warm-start drafter {where} ({warm.layout} layout) does not fit: missing "
                                 f"{missing}, unexpected {unexpected}")
        model.lm_head.weight.requires_grad_(not self.cfg.freeze_lm_head)
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("drafter: %s, %d trainable parameters, device %s, %d torch threads, %d rank(s)", arch, n,
                 self.device, torch.get_num_threads(), self.dist.world_size)
        return model.to(self.device)

    def _carry_head_rows(self, model: Eagle3Drafter, old_vocab: DraftVocab, old_head: torch.Tensor) -> None:
        """A rebuilt draft vocabulary keeps the warm start's lm_head rows for the target ids both vocabularies
        hold; the new ids keep the rows `init_from_target` gave them."""
        old_row = {int(t): i for i, t in enumerate(old_vocab.draft_to_target.tolist())}
        new_ids = self.vocab.draft_to_target.tolist()
        pairs = [(i, old_row[int(t)]) for i, t in enumerate(new_ids) if int(t) in old_row]
        if pairs:
            dst, src = (torch.tensor(x) for x in zip(*pairs))
            with torch.no_grad():
                model.lm_head.weight[dst] = old_head[src].to(model.lm_head.weight.dtype)
        log.info("draft vocabulary rebuilt from this run's data: %d of %d ids carried over from the warm start",
                 len(pairs), len(new_ids))

    def _setup_optimizer(self, model: Eagle3Drafter) -> torch.optim.Optimizer:
        return make_optimizer(model, self.cfg)

    def _setup_objective(self) -> nn.Module:
        objective = TTTObjective(self.model, self.target, self.vocab_rows, self.cfg)
        if not self.dist.distributed:
            return objective
        # The frozen target embedding (a buffer) never changes: sync buffers once at init, not every
        # forward (`forward_sync_buffers` from torch 2.13, `broadcast_buffers` before).
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                          else {"broadcast_buffers": False})
        return DistributedDataParallel(objective, device_ids=[self.device.index] if self.device.type == "cuda"
                                       else None, **no_buffer_sync)

    def close(self) -> None:
        """Let go of the DDP wrapper while the process group lives (why: stages/train.py `_train`)."""
        self.objective = None
        gc.collect()

    # --- schedule --------------------------------------------------------------------------------

    def planned_steps(self) -> int:
        """Optimizer steps of the whole run: every epoch's batches (their count varies by epoch), capped
        at max_steps. A function of the data and the config only."""
        planned = sum(len(self._epoch_batches(e)) for e in range(1, self.cfg.epochs + 1))
        return min(planned, self.cfg.max_steps) if self.cfg.max_steps else planned

    # --- loop ------------------------------------------------------------------------------------

    def _autocast(self) -> torch.autocast:
        return autocast_for(self.device, self.cfg)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """The epoch's optimizer steps, each a list of sequences (the same on every rank)."""
        return make_batches(self._train_lengths, self.cfg.batch_tokens, seed=self.cfg.seed * 100_003 + epoch)

    def train(self) -> TrainResult:
        cfg = self.cfg
        at = self._resume()
        step, train_s, results = at.step, at.train_seconds, at.results
        total_steps = self.planned_steps()
        # A run that ended inside an epoch (max_steps, a race against the clock) is over, also on a rerun.
        ended_by = next(("max_steps" if r.step is not None and cfg.max_steps and r.step >= cfg.max_steps else "time"
                         for r in results if not r.complete), None)
        log.info("training: %d epochs, %d optimizer steps, %d TTT steps, %d tokens per step in %d rank(s) x %d "
                 "micro-batches", cfg.epochs, total_steps, cfg.ttt_steps, cfg.batch_tokens, self.dist.world_size,
                 cfg.grad_accum_steps)
        lr = lr_at(self.cfg, step, total_steps, train_s)
        # Rank 0 reports (its own statistics: no collective may hang on a clock one rank reads alone).
        progress = Progress("train", "steps", total_steps, "steps", start=step) if self.dist.is_main else None
        for epoch in range(at.epoch, cfg.epochs + 1):
            if ended_by:
                break
            self.model.train()
            first = at.batch_index if epoch == at.epoch else 0
            epoch_stats = StepStats(cfg.ttt_steps)  # this rank's, since the epoch's start or the resume point
            # All ranks' sums before the resume point (every rank adds them after its all-reduce).
            resumed_stats = (StepStats.from_vector(cfg.ttt_steps, at.epoch_stats)
                             if epoch == at.epoch and at.epoch_stats is not None else None)
            window, window_s = StepStats(cfg.ttt_steps), 0.0
            epoch_s = at.epoch_seconds if epoch == at.epoch else 0.0
            batches = self._epoch_batches(epoch)  # the packing, and so the count, varies by epoch
            for bi in range(first, len(batches)):
                if cfg.max_steps and step >= cfg.max_steps:
                    ended_by = "max_steps"
                    log.info("train.max_steps (%d) reached in epoch %d after %d of its steps", cfg.max_steps, epoch, bi)
                    break
                if cfg.time_limit_s and train_s >= cfg.time_limit_s:
                    if cfg.on_time_limit == "stop":
                        ended_by = "time"
                        log.warning("train.time_limit_s (%.0f s) reached in epoch %d after %d of its steps: stopping "
                                    "here (on_time_limit 'stop'; this drafter depends on the machine's speed)",
                                    cfg.time_limit_s, epoch, bi)
                        break
                    self._save_step_checkpoint(epoch, bi, step, train_s, epoch_s,
                                               self._epoch_total(epoch_stats, resumed_stats), lr)
                    raise TrainError(
                        f"train.time_limit_s ({cfg.time_limit_s:.0f} s of optimizer steps) reached at step {step} of "
                        f"{total_steps} (epoch {epoch}, batch {bi} of {len(batches)}), a safety cap, not a bound. "
                        f"Step checkpoint checkpoints/step-{step} is written: raise train.time_limit_s (or unset it) "
                        "and rerun; the same stage directory resumes there and trains the drafter an uninterrupted "
                        "run would. To bound training, set train.epochs or train.max_steps")
                t0 = time.perf_counter()
                lr = lr_at(self.cfg, step, total_steps, train_s)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                stats, grad_norm = self._optimizer_step(batches[bi])
                if self.device.type == "cuda":
                    torch.cuda.synchronize()  # honest step timing
                dt = time.perf_counter() - t0
                step += 1
                train_s = self._agreed_seconds(train_s + dt)
                epoch_s += dt
                window_s += dt
                epoch_stats.add(stats)
                window.add(stats)
                if progress is not None and progress.due():
                    now = epoch_stats.summary(cfg.step_loss_decay)
                    progress.update(step, {"epoch": f"{epoch}/{cfg.epochs}", "loss": round(now["loss"], 4),
                                           "acc": now["acc"], "tok/s": round(now["tokens"] / max(epoch_s, 1e-9))})
                if step % cfg.log_every_steps == 0:
                    s = self._reduce(window).summary(cfg.step_loss_decay)
                    log.info("epoch %d step %d/%d lr %.2e loss %.4f acc %s grad_norm %.3f %.0f tok/s",
                             epoch, bi + 1, len(batches), lr, s["loss"], s["acc"], float(grad_norm),
                             s["tokens"] / max(window_s, 1e-9))
                    window, window_s = StepStats(cfg.ttt_steps), 0.0
                if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 and bi + 1 < len(batches):
                    self._save_step_checkpoint(epoch, bi + 1, step, train_s, epoch_s,
                                               self._epoch_total(epoch_stats, resumed_stats), lr)
            total = self._epoch_total(epoch_stats, resumed_stats)
            if total.tokens == 0:
                break
            result = self._finish_epoch(epoch, total, epoch_s, step, train_s, lr, complete=not ended_by)
            results.append(result)
            if progress is not None:
                val = result.validation
                progress.update(step, {"epoch": f"{epoch}/{cfg.epochs}", "loss": round(result.train["loss"], 4),
                                       "acc": result.train["acc"], "holdout accept/pos": val.get("accept_pos"),
                                       "simulated AL": val.get("acceptance_length"),
                                       "AL by epoch": [r.validation.get("acceptance_length", 0.0) for r in results]},
                                force=True)
        if not results:
            raise TrainError("no training step ran: train.max_steps or the data left nothing to train on")
        # Highest simulated acceptance length; without a holdout split, the last epoch.
        best = max(results, key=lambda r: (r.validation.get("acceptance_length", 0.0), r.epoch))
        if progress is not None:
            progress.finish(step)
        log.info("best epoch %d: simulated acceptance length %s (%s)", best.epoch,
                 best.validation.get("acceptance_length"), best.checkpoint)
        return TrainResult(results, best.epoch, self.vocab.size, self.model.arch.to_dict(), steps=step,
                           bounded_by=ended_by or "epochs")

    def _optimizer_step(self, batch_idx: list[int]) -> tuple[StepStats, torch.Tensor]:
        """One optimizer step over `batch_idx`: this rank's micro-batches, gradients summed over all."""
        cfg, world = self.cfg, self.dist.world_size
        parts = split_batch(batch_idx, self._train_lengths, world * cfg.grad_accum_steps)
        mine = parts[self.dist.rank * cfg.grad_accum_steps:(self.dist.rank + 1) * cfg.grad_accum_steps]
        denominators = None
        if len(parts) > 1:  # per-step label counts of the whole step, so micro-batch losses add up to its loss
            mask, lengths = token_masks(self.train_data, batch_idx)
            denominators = label_counts(mask, lengths, cfg.ttt_steps)
        stats = StepStats(cfg.ttt_steps)
        self.optimizer.zero_grad(set_to_none=True)
        for m, idx in enumerate(mine):
            weight = 1.0
            if not idx:  # fewer sequences than micro-batches: a zero-weight pass keeps the ranks in step
                idx, weight = batch_idx[:1], 0.0
            batch = collate(self.train_data, idx).to(self.device)
            last = m == len(mine) - 1
            sync = contextlib.nullcontext() if last or not self.dist.distributed else self.objective.no_sync()
            with sync:
                with self._autocast():
                    loss, s = self.objective(batch, denominators)
                # DDP averages gradients over ranks; the losses are already shares of the whole step's.
                (loss * (weight * world)).backward()
            if weight:
                stats.add(s)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return stats, grad_norm

    # --- ranks -------------------------------------------------------------------------------------

    def _reduce(self, stats: StepStats) -> StepStats:
        """The sum of `stats` over ranks (`stats` itself when there is one rank)."""
        if not self.dist.distributed:
            return stats
        vec = stats.to_vector().to(self.device)
        dist.all_reduce(vec)
        return StepStats.from_vector(stats.steps, vec)

    def _epoch_total(self, local: StepStats, resumed: StepStats | None) -> StepStats:
        """The epoch's statistics so far, all ranks, the steps before a resume included (a collective)."""
        total = self._reduce(local)
        if resumed is not None:
            total = StepStats.from_vector(total.steps, total.to_vector() + resumed.to_vector())
        return total

    def _agreed_seconds(self, seconds: float) -> float:
        """Every rank takes the slowest rank's training time: the budget and the schedule must agree."""
        if not (self.dist.distributed and self.cfg.time_limit_s):
            return seconds
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def _barrier(self) -> None:
        if self.dist.distributed:
            dist.barrier()

    # --- checkpoints -------------------------------------------------------------------------------

    def _trainer_state(self, epoch: int, batch_index: int, step: int, train_s: float, epoch_s: float,
                       epoch_stats: StepStats, lr: float) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "step": step, "train_seconds": train_s,
                "epoch": epoch, "batch_index": batch_index, "epoch_seconds": epoch_s,
                "epoch_stats": epoch_stats.to_vector(), "lr": lr, "rng": _rng_state(self.device),
                "batch_tokens": self.cfg.batch_tokens, "seed": self.cfg.seed, "world_size": self.dist.world_size}

    def _save_step_checkpoint(self, epoch: int, batch_index: int, step: int, train_s: float, epoch_s: float,
                              epoch_stats: StepStats, lr: float) -> None:
        """checkpoints/step-<n>/ (temp dir, then rename); the older ones go once it is in place."""
        if self.dist.is_main:
            root = self.out_dir / "checkpoints"
            meta = {"epoch": epoch, "kind": "step", "step": step, "aux_layer_ids": self.aux_layer_ids,
                    "train_config": self.cfg.model_dump(mode="json")}
            state = self._trainer_state(epoch, batch_index, step, train_s, epoch_s, epoch_stats, lr)
            save_checkpoint(root / f"step-{step}", self.model, self.vocab, meta, state)
            self._drop_step_checkpoints(keep_after=step - 1)
            log.info("checkpoint at step %d (epoch %d, batch %d)", step, epoch, batch_index)
        self._barrier()

    def _drop_step_checkpoints(self, keep_after: int) -> None:
        for d in (self.out_dir / "checkpoints").glob("step-*"):
            m = re.fullmatch(r"step-(\d+)", d.name)
            if m and int(m.group(1)) <= keep_after:
                shutil.rmtree(d, ignore_errors=True)

    def _resume(self) -> ResumePoint:
        """The newest complete checkpoint: after the last finished epoch, or mid-epoch from a step checkpoint."""
        ckpt_root = self.out_dir / "checkpoints"
        found: dict[str, list[tuple[int, Path]]] = {"epoch": [], "step": []}
        for d in ckpt_root.iterdir() if ckpt_root.is_dir() else []:
            m = re.fullmatch(r"(epoch|step)-(\d+)", d.name)
            if m and (d / CHECKPOINT_STATE).is_file() and (d / CHECKPOINT_META).is_file():
                found[m.group(1)].append((int(m.group(2)), d))
        results = [EpochResult(**json.loads((d / CHECKPOINT_META).read_text())["result"])
                   for _, d in sorted(found["epoch"])]
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
            raise TrainError(f"checkpoint {path} was written with batch_tokens {state['batch_tokens']}, the config "
                             f"has {self.cfg.batch_tokens}: resuming needs the same batches; restore it or start "
                             "a fresh stage directory")
        _, weights, _, _ = load_checkpoint(path)
        self.model.load_state_dict({k: v.to(self.device) for k, v in weights.items()})
        self.optimizer.load_state_dict(state["optimizer"])
        _set_rng_state(state["rng"], self.device)
        if path.name.startswith("epoch-"):  # after a finished (or budget-cut) epoch
            log.info("resuming after epoch %d (step %d)", at_epoch[0], state["step"])
            return ResumePoint(epoch=at_epoch[0] + 1, step=state["step"], train_seconds=state["train_seconds"],
                               results=results)
        log.info("resuming mid-epoch from %s: epoch %d at batch %d (step %d)", path.name, state["epoch"],
                 state["batch_index"], state["step"])
        return ResumePoint(epoch=state["epoch"], batch_index=state["batch_index"], step=state["step"],
                           train_seconds=state["train_seconds"], epoch_seconds=state["epoch_seconds"],
                           epoch_stats=state["epoch_stats"], results=results)

    def _finish_epoch(self, epoch: int, stats: StepStats, epoch_s: float, step: int, train_s: float, lr: float,
                      complete: bool) -> EpochResult:
        train = stats.summary(self.cfg.step_loss_decay)
        val = self.validate() if len(self.val_data) and self.dist.is_main else {}
        rel = f"checkpoints/epoch-{epoch}"
        tokens_per_s = round(stats.tokens / max(epoch_s, 1e-9), 1)  # all ranks' tokens over rank 0's time
        result = EpochResult(epoch=epoch, checkpoint=rel, complete=complete, train=train, validation=val,
                             tokens_per_s=tokens_per_s, seconds=round(epoch_s, 2), step=step, lr=lr)
        if self.dist.is_main:
            meta = {"epoch": epoch, "kind": "epoch", "aux_layer_ids": self.aux_layer_ids, "validation": val,
                    "train_config": self.cfg.model_dump(mode="json"), "result": vars(result)}
            state = self._trainer_state(epoch, -1, step, train_s, epoch_s, stats, lr)
            save_checkpoint(self.out_dir / rel, self.model, self.vocab, meta, state)
            self._drop_step_checkpoints(keep_after=step)
            log.info("epoch %d%s: train loss %.4f acc %s | holdout loss %s acc %s accept_pos %s AL %s | "
                     "%.0f tok/s, %.1f s", epoch, "" if complete else " (partial)", train["loss"], train["acc"],
                     val.get("loss") and round(val["loss"], 4), val.get("acc"), val.get("accept_pos"),
                     val.get("acceptance_length"), result.tokens_per_s, epoch_s)
            print("EPOCH_METRICS " + json.dumps({"epoch": epoch, "complete": complete, "step": step, "lr": lr,
                                                 "train": train, "validation": val,
                                                 "tokens_per_s": result.tokens_per_s, "seconds": result.seconds}),
                  flush=True)
        self._barrier()
        return result

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Holdout loss, per-step accuracy and simulated acceptance (see StepStats.summary, engine_walk)."""
        self.model.eval()
        total = StepStats(self.cfg.ttt_steps)
        t0 = time.perf_counter()
        micro_tokens = max(64, self.cfg.batch_tokens // (self.dist.world_size * self.cfg.grad_accum_steps))
        for idx in make_batches(self.val_data.lengths(), micro_tokens, seed=None):
            batch = collate(self.val_data, idx).to(self.device)
            with self._autocast():
                _, stats = ttt_loss(self.model, self.target, self.vocab_rows, batch, self.cfg.ttt_steps,
                                    self.cfg.step_loss_decay, full_argmax=True, walk=True, loss_kind=self.cfg.loss,
                                    lk_eta=self.cfg.lk_eta)
            total.add(stats)
        self.model.train()
        out = total.summary(self.cfg.step_loss_decay)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        return out
