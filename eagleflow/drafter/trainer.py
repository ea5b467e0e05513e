"""The EAGLE-3 training recipe: setup, then epochs of TTT-unrolled steps, a checkpoint and a
validation pass per epoch, the best epoch chosen on simulated acceptance length.

Reads top to bottom: `Trainer.setup()` builds the vocabulary, the model, the optimizer and the
data in that order; `Trainer.train()` loops epochs; `Trainer._optimizer_step` is one optimizer step
(its micro-batches on this rank); `ttt_loss` is one forward of the objective.

Resumable mid-epoch: when and what it checkpoints, and where a rerun continues, is
`eagleflow.drafter.checkpointer`'s. Data parallel under torchrun (`eagleflow.drafter.ranks`: the process
group, DDP and the few collectives): each optimizer step's batch (`batch_tokens`) is dealt to nproc x
grad_accum_steps micro-batches whose losses are shares of the whole batch's (`label_counts`), so
the step, and the curve, do not depend on how it is split. A warm start's weights are loaded by
`eagleflow.drafter.warm_start`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eagleflow.config.train import TrainConfig
from eagleflow.contracts.progress import Progress
from eagleflow.drafter.checkpointer import Checkpointer, EpochResult
from eagleflow.drafter.data import ExtractIndex, SequenceStore, collate, make_batches, split_batch, token_masks
from eagleflow.drafter.devices import pick_device
from eagleflow.drafter.errors import TrainError
from eagleflow.drafter.model import Eagle3Drafter, TargetHead
from eagleflow.drafter.objective import StepStats, TTTObjective, label_counts, ttt_loss
from eagleflow.drafter.ranks import (
    DistEnv,
    barrier,
    epoch_total,
    init_ranks,
    slowest_rank,
    sum_over_ranks,
    wrap_data_parallel,
)
from eagleflow.drafter.schedule import lr_at
from eagleflow.drafter.step import autocast_for, make_optimizer
from eagleflow.drafter.target import arch_for_target
from eagleflow.drafter.vocab import DraftVocab, count_tokens
from eagleflow.drafter.warm_start import (
    PublicDrafter,
    check_warm_start,
    load_warm_start,
    read_public_drafter,
    warm_start_arch,
)

log = logging.getLogger("eagleflow.train")


# -------------------------------------------------------------------------------------- recipe


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


class Trainer:
    """One training run in `out_dir`: checkpoints/epoch-<n>/ per epoch and checkpoints/step-<n>/ every
    `checkpoint_every_steps`; a rerun resumes from the newest, mid-epoch included.

    Under torchrun (WORLD_SIZE > 1) each rank runs this same recipe: every optimizer step's batch is
    dealt to nproc x grad_accum_steps micro-batches, DDP sums the gradients, and rank 0 alone
    validates, logs and writes checkpoints.
    """

    def __init__(
        self, cfg: TrainConfig, target: TargetHead, index: ExtractIndex, out_dir: str | Path, aux_layer_ids: list[int]
    ) -> None:
        self.cfg, self.target, self.index, self.out_dir = cfg, target, index, Path(out_dir)
        self.aux_layer_ids, self.dist = list(aux_layer_ids), DistEnv.from_env()
        try:
            self.device = pick_device(cfg.device, "train.device", self.dist.local_rank)
        except ValueError as exc:
            raise TrainError(str(exc)) from None

    # --- setup -----------------------------------------------------------------------------------

    def setup(self) -> Trainer:
        init_ranks(self.dist, self.device, self.cfg.num_threads)
        if not self.dist.is_main:
            log.setLevel(logging.WARNING)
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
        self.target = TargetHead(
            **{k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self.target).items()}
        )
        self.objective = self._setup_objective()
        self.checkpoints = Checkpointer(self.out_dir, self.cfg, self.aux_layer_ids, self.dist, self.device)
        return self

    def _setup_data(self) -> tuple[SequenceStore, SequenceStore]:
        if self.index.hidden_size != self.target.hidden_size:
            raise TrainError(
                f"extracted hidden size {self.index.hidden_size} != target hidden size "
                f"{self.target.hidden_size}: the data belongs to another model"
            )
        train = SequenceStore(self.index.split("train"), self.cfg.max_seq_len)
        val = SequenceStore(self.index.split("holdout"), self.cfg.max_seq_len, max_seqs=self.cfg.val_max_seqs)
        if len(train) == 0:
            raise TrainError("the train split holds no sequence of 3 or more tokens")
        log.info(
            "data: %d train sequences (%d tokens), %d holdout sequences (%d tokens)",
            len(train),
            train.num_tokens,
            len(val),
            val.num_tokens,
        )
        return train, val

    def _setup_vocab(self, train: SequenceStore) -> DraftVocab:
        ids, mask = train.all_tokens()
        counts = count_tokens(ids, mask, self.target.vocab_size)
        vocab = DraftVocab.from_counts(counts, self.cfg.draft_vocab_size)
        covered = counts[vocab.draft_to_target].sum().item() / max(1, counts.sum().item())
        log.info(
            "draft vocabulary: %d of %d target ids, covering %.2f%% of assistant tokens",
            vocab.size,
            vocab.target_vocab_size,
            100 * covered,
        )
        return vocab

    def _read_warm_start(self) -> PublicDrafter | None:
        if not self.cfg.warm_start:
            return None
        drafter = read_public_drafter(self.cfg.warm_start)
        for warning in check_warm_start(drafter, self.target, self.aux_layer_ids, "the target (target.model_path)"):
            log.warning("%s", warning)
        log.info(
            "warm start: %s drafter in %s layout, draft vocabulary of %d kept",
            self.cfg.warm_start,
            drafter.layout,
            drafter.vocab.size,
        )
        return drafter

    def _setup_model(self, warm: PublicDrafter | None) -> Eagle3Drafter:
        arch = arch_for_target(self.target, self.cfg, self.vocab.size)
        if warm:
            arch = warm_start_arch(warm, arch)
        model = Eagle3Drafter(arch, self.target.embed_tokens)
        model.init_from_target(self.target, self.vocab.draft_to_target)
        if warm:
            load_warm_start(model, warm, self.vocab, rebuilt_vocab=self.cfg.warm_start_vocab == "rebuild")
        model.lm_head.weight.requires_grad_(not self.cfg.freeze_lm_head)
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info(
            "drafter: %s, %d trainable parameters, device %s, %d torch threads, %d rank(s)",
            arch,
            n,
            self.device,
            torch.get_num_threads(),
            self.dist.world_size,
        )
        return model.to(self.device)

    def _setup_optimizer(self, model: Eagle3Drafter) -> torch.optim.Optimizer:
        return make_optimizer(model, self.cfg)

    def _setup_objective(self) -> nn.Module:
        objective = TTTObjective(self.model, self.target, self.vocab_rows, self.cfg)
        return wrap_data_parallel(objective, self.dist, self.device)

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
        at = self.checkpoints.resume(self.model, self.optimizer)
        step, train_s, results = at.step, at.train_seconds, at.results
        total_steps = self.planned_steps()
        # A run that ended inside an epoch (max_steps, a race against the clock) is over, also on a rerun.
        ended_by = next(
            (
                "max_steps" if r.step is not None and cfg.max_steps and r.step >= cfg.max_steps else "time"
                for r in results
                if not r.complete
            ),
            None,
        )
        log.info(
            "training: %d epochs, %d optimizer steps, %d TTT steps, %d tokens per step in %d rank(s) x %d "
            "micro-batches",
            cfg.epochs,
            total_steps,
            cfg.ttt_steps,
            cfg.batch_tokens,
            self.dist.world_size,
            cfg.grad_accum_steps,
        )
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
            resumed_stats = (
                StepStats.from_vector(cfg.ttt_steps, at.epoch_stats)
                if epoch == at.epoch and at.epoch_stats is not None
                else None
            )
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
                        log.warning(
                            "train.time_limit_s (%.0f s) reached in epoch %d after %d of its steps: stopping "
                            "here (on_time_limit 'stop'; this drafter depends on the machine's speed)",
                            cfg.time_limit_s,
                            epoch,
                            bi,
                        )
                        break
                    self._save_step(
                        epoch,
                        bi,
                        step,
                        train_s,
                        epoch_s,
                        epoch_total(self.dist, self.device, epoch_stats, resumed_stats),
                        lr,
                    )
                    raise TrainError(
                        f"train.time_limit_s ({cfg.time_limit_s:.0f} s of optimizer steps) reached at step {step} of "
                        f"{total_steps} (epoch {epoch}, batch {bi} of {len(batches)}), a safety cap, not a bound. "
                        f"Step checkpoint checkpoints/step-{step} is written: raise train.time_limit_s (or unset it) "
                        "and rerun; the same stage directory resumes there and trains the drafter an uninterrupted "
                        "run would. To bound training, set train.epochs or train.max_steps"
                    )
                t0 = time.perf_counter()
                lr = lr_at(self.cfg, step, total_steps, train_s)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                stats, grad_norm = self._optimizer_step(batches[bi])
                if self.device.type == "cuda":
                    torch.cuda.synchronize()  # honest step timing
                dt = time.perf_counter() - t0
                step += 1
                train_s = slowest_rank(train_s + dt, self.dist, self.device) if cfg.time_limit_s else train_s + dt
                epoch_s += dt
                window_s += dt
                epoch_stats.add(stats)
                window.add(stats)
                if progress is not None and progress.due():
                    now = epoch_stats.summary(cfg.step_loss_decay)
                    progress.update(
                        step,
                        {
                            "epoch": f"{epoch}/{cfg.epochs}",
                            "loss": round(now["loss"], 4),
                            "acc": now["acc"],
                            "tok/s": round(now["tokens"] / max(epoch_s, 1e-9)),
                        },
                    )
                if step % cfg.log_every_steps == 0:
                    s = sum_over_ranks(window, self.dist, self.device).summary(cfg.step_loss_decay)
                    log.info(
                        "epoch %d step %d/%d lr %.2e loss %.4f acc %s grad_norm %.3f %.0f tok/s",
                        epoch,
                        bi + 1,
                        len(batches),
                        lr,
                        s["loss"],
                        s["acc"],
                        float(grad_norm),
                        s["tokens"] / max(window_s, 1e-9),
                    )
                    window, window_s = StepStats(cfg.ttt_steps), 0.0
                if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 and bi + 1 < len(batches):
                    self._save_step(
                        epoch,
                        bi + 1,
                        step,
                        train_s,
                        epoch_s,
                        epoch_total(self.dist, self.device, epoch_stats, resumed_stats),
                        lr,
                    )
            total = epoch_total(self.dist, self.device, epoch_stats, resumed_stats)
            if total.tokens == 0:
                break
            result = self._finish_epoch(epoch, total, epoch_s, step, train_s, lr, complete=not ended_by)
            results.append(result)
            if progress is not None:
                val = result.validation
                progress.update(
                    step,
                    {
                        "epoch": f"{epoch}/{cfg.epochs}",
                        "loss": round(result.train["loss"], 4),
                        "acc": result.train["acc"],
                        "holdout accept/pos": val.get("accept_pos"),
                        "simulated AL": val.get("acceptance_length"),
                        "AL by epoch": [r.validation.get("acceptance_length", 0.0) for r in results],
                    },
                    force=True,
                )
        if not results:
            raise TrainError("no training step ran: train.max_steps or the data left nothing to train on")
        # Highest simulated acceptance length; without a holdout split, the last epoch.
        best = max(results, key=lambda r: (r.validation.get("acceptance_length", 0.0), r.epoch))
        if progress is not None:
            progress.finish(step)
        log.info(
            "best epoch %d: simulated acceptance length %s (%s)",
            best.epoch,
            best.validation.get("acceptance_length"),
            best.checkpoint,
        )
        return TrainResult(
            results, best.epoch, self.vocab.size, self.model.arch.to_dict(), steps=step, bounded_by=ended_by or "epochs"
        )

    def _optimizer_step(self, batch_idx: list[int]) -> tuple[StepStats, torch.Tensor]:
        """One optimizer step over `batch_idx`: this rank's micro-batches, gradients summed over all."""
        cfg, world = self.cfg, self.dist.world_size
        parts = split_batch(batch_idx, self._train_lengths, world * cfg.grad_accum_steps)
        mine = parts[self.dist.rank * cfg.grad_accum_steps : (self.dist.rank + 1) * cfg.grad_accum_steps]
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

    def _save_step(
        self, epoch: int, batch_index: int, step: int, train_s: float, epoch_s: float, epoch_stats: StepStats, lr: float
    ) -> None:
        self.checkpoints.save_step(
            self.model, self.vocab, self.optimizer, epoch, batch_index, step, train_s, epoch_s, epoch_stats, lr
        )
        barrier(self.dist)

    def _finish_epoch(
        self, epoch: int, stats: StepStats, epoch_s: float, step: int, train_s: float, lr: float, complete: bool
    ) -> EpochResult:
        train = stats.summary(self.cfg.step_loss_decay)
        val = self.validate() if len(self.val_data) and self.dist.is_main else {}
        rel = f"checkpoints/epoch-{epoch}"
        tokens_per_s = round(stats.tokens / max(epoch_s, 1e-9), 1)  # all ranks' tokens over rank 0's time
        result = EpochResult(
            epoch=epoch,
            checkpoint=rel,
            complete=complete,
            train=train,
            validation=val,
            tokens_per_s=tokens_per_s,
            seconds=round(epoch_s, 2),
            step=step,
            lr=lr,
        )
        self.checkpoints.save_epoch(self.model, self.vocab, self.optimizer, result, stats, train_s, epoch_s)
        if self.dist.is_main:
            log.info(
                "epoch %d%s: train loss %.4f acc %s | holdout loss %s acc %s accept_pos %s AL %s | %.0f tok/s, %.1f s",
                epoch,
                "" if complete else " (partial)",
                train["loss"],
                train["acc"],
                val.get("loss") and round(val["loss"], 4),
                val.get("acc"),
                val.get("accept_pos"),
                val.get("acceptance_length"),
                result.tokens_per_s,
                epoch_s,
            )
            print(
                "EPOCH_METRICS "
                + json.dumps(
                    {
                        "epoch": epoch,
                        "complete": complete,
                        "step": step,
                        "lr": lr,
                        "train": train,
                        "validation": val,
                        "tokens_per_s": result.tokens_per_s,
                        "seconds": result.seconds,
                    }
                ),
                flush=True,
            )
        barrier(self.dist)
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
                _, stats = ttt_loss(
                    self.model,
                    self.target,
                    self.vocab_rows,
                    batch,
                    self.cfg.ttt_steps,
                    self.cfg.step_loss_decay,
                    full_argmax=True,
                    walk=True,
                    loss_kind=self.cfg.loss,
                    lk_eta=self.cfg.lk_eta,
                )
            total.add(stats)
        self.model.train()
        out = total.summary(self.cfg.step_loss_decay)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        return out
