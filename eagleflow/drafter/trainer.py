"""The EAGLE-3 training recipe: setup, then epochs of TTT-unrolled steps, a checkpoint and a
validation pass per epoch, the best epoch chosen on simulated acceptance length.

Reads top to bottom: `Trainer.setup()` builds the vocabulary, the model, the optimizer and the
data in that order; `Trainer.train()` loops epochs; `ttt_loss` is one forward of the objective.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagleflow.drafter.config import TrainConfig
from eagleflow.drafter.data import Batch, ExtractIndex, SequenceStore, collate, make_batches
from eagleflow.drafter.formats import (
    CHECKPOINT_META, CHECKPOINT_STATE, arch_for_target, load_checkpoint, load_vllm_drafter, save_checkpoint,
)
from eagleflow.drafter.model import DrafterArch, Eagle3Drafter, TargetHead
from eagleflow.drafter.vocab import DraftVocab, count_tokens

log = logging.getLogger("eagleflow.train")


class TrainError(RuntimeError):
    """Training cannot proceed; the message says why and what to change."""


# ----------------------------------------------------------------------------------- objective

@dataclass
class StepStats:
    """Sums over one or more batches, per unroll step i (and two acceptance simulations)."""

    steps: int
    loss_sum: torch.Tensor = None  # shape: [K] sum of per-position soft CE
    correct: torch.Tensor = None  # shape: [K] positions whose draft argmax == target argmax
    count: torch.Tensor = None  # shape: [K] positions scored
    chain_accepted: torch.Tensor = None  # shape: [K] context ends whose first k+1 drafts all match
    chain_count: int = 0  # context ends where all K drafts are scored
    walk_accepted: torch.Tensor = None  # shape: [K] engine-walk drafts whose first k+1 tokens were accepted
    walk_drafts: int = 0  # engine-walk drafting rounds
    tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("loss_sum", "correct", "count", "chain_accepted", "walk_accepted"):
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.steps, dtype=torch.float64))

    def add(self, other: "StepStats") -> None:
        for name in ("loss_sum", "correct", "count", "chain_accepted", "walk_accepted"):
            getattr(self, name).add_(getattr(other, name))
        self.chain_count += other.chain_count
        self.walk_drafts += other.walk_drafts
        self.tokens += other.tokens

    def summary(self, decay: float) -> dict[str, Any]:
        """loss: decay-weighted mean of the per-step soft CE; acc: per-step argmax agreement (teacher forced).

        accept_pos[k] / acceptance_length: vLLM's num_accepted_tokens_per_pos[k] / num_drafts and
        1 + accepted / drafts under greedy verification, simulated by walking each held-out answer the
        way the engine does (`engine_walk`); this is the number the best epoch is chosen on.
        accept_pos_uniform / acceptance_length_uniform: the same over *every* context end (each
        weighted equally); optimistic, because the engine drafts more often right after a rejection.
        acceptance_length_indep: 1 + sum_k prod_{i<=k} acc[i] (per-step accuracies taken as independent).
        """
        per_step = (self.loss_sum / self.count.clamp(min=1)).tolist()
        w = [decay ** i for i in range(self.steps)]
        acc = (self.correct / self.count.clamp(min=1)).tolist()
        uniform = (self.chain_accepted / max(self.chain_count, 1)).tolist()
        out = {
            "loss": sum(wi * li for wi, li in zip(w, per_step)) / sum(w),
            "loss_per_step": [round(x, 5) for x in per_step],
            "acc": [round(x, 5) for x in acc],
            "accept_pos_uniform": [round(x, 5) for x in uniform],
            "acceptance_length_uniform": round(1.0 + sum(uniform), 5),
            "acceptance_length_indep": round(1.0 + sum(math.prod(acc[: k + 1]) for k in range(self.steps)), 5),
            "positions": int(self.count[0].item()),
            "tokens": self.tokens,
        }
        if self.walk_drafts:
            walk = (self.walk_accepted / self.walk_drafts).tolist()
            out.update(accept_pos=[round(x, 5) for x in walk], acceptance_length=round(1.0 + sum(walk), 5),
                       drafts=self.walk_drafts)
        return out


def engine_walk(correct: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Greedy speculative decoding replayed over teacher-forced drafts: (drafting rounds, accepted per pos).

    correct[k, b, p]: draft k made at context end p matches the target's argmax at p+1+k. The target
    verifies through p and samples x[p+1]; the first round is at p = (first answer token) - 1. A round
    accepts the leading run of matches, a, and the target adds one token: the next round is at
    p + a + 1. Rounds run while all K drafted tokens lie inside the answer. Exact for greedy
    verification when the answers are the target's own greedy output.
    """
    k_steps = correct.shape[0]
    corr = correct.cpu().numpy()
    lm = loss_mask.cpu().numpy()
    drafts, accepted = 0, [0] * k_steps
    for b, n in enumerate(lengths.tolist()):
        answer = lm[b, :n].nonzero()[0]
        if answer.size == 0:
            continue
        p = int(answer[0]) - 1
        while p + 1 + k_steps <= n - 1:
            if not lm[b, p + 1]:
                p += 1  # a prompt token (a later turn): the engine is not drafting here
                continue
            a = 0
            while a < k_steps and corr[a, b, p]:
                accepted[a] += 1
                a += 1
            drafts += 1
            p += a + 1
    return drafts, torch.tensor(accepted, dtype=torch.float64)


def label_positions(batch: Batch) -> torch.Tensor:
    """jvalid[b, j]: the target's distribution at position j is a label.

    Position j's distribution is that of token x[j+1]; it is used when x[j] is an assistant token
    (loss_mask 1: the drafter is then drafting during generation) and x[j+1] exists. Drafting step i
    at context end p predicts the distribution at j = p+1+i.
    """
    b, t = batch.input_ids.shape
    idx = torch.arange(t, device=batch.input_ids.device)
    return batch.loss_mask & (idx[None, :] <= (batch.lengths[:, None] - 2)) & (idx[None, :] >= 1)  # shape: [B, T]


def shift_left(x: torch.Tensor, n: int, fill=False) -> torch.Tensor:
    """out[:, p] = x[:, p+n] (fill beyond the end)."""
    out = torch.full_like(x, fill)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


def ttt_loss(model: Eagle3Drafter, target: TargetHead, vocab_rows: torch.Tensor, batch: Batch, steps: int,
             decay: float, full_argmax: bool = False, walk: bool = False) -> tuple[torch.Tensor, StepStats]:
    """The decay-weighted soft cross-entropy of a TTT unroll, and its statistics.

    Soft target: the target's distribution restricted to the draft vocabulary and renormalised
    (softmax over lm_head rows of the draft ids). `full_argmax` compares against the argmax over the
    whole target vocabulary (what greedy verification uses) instead of the draft-vocabulary one;
    `walk` adds the engine-walk acceptance simulation (validation).
    """
    jvalid = label_positions(batch)  # shape: [B, T]
    with torch.no_grad():
        final = batch.final[jvalid]  # shape: [N, H]
        tgt_logits = target.logits(final, vocab_rows)  # shape: [N, Vd]
        tgt_probs = torch.softmax(tgt_logits, dim=-1)
        if full_argmax and vocab_rows.numel() != target.vocab_size:
            tgt_argmax = torch.cat([target.logits(c).argmax(-1) for c in final.split(4096)])  # target ids
        else:
            tgt_argmax = vocab_rows[tgt_logits.argmax(-1)]

    # Context ends that carry a label for some step: p in [first label - steps, len - 3] per row.
    b, t = jvalid.shape
    first = torch.where(jvalid.any(1), jvalid.float().argmax(1), torch.zeros_like(batch.lengths))
    query_start = (first - steps).clamp(min=0)  # shape: [B]
    query_len = max(int((batch.lengths - 2 - query_start).max()), 1)
    outs, qpos = model.ttt_forward(batch.aux, batch.input_ids, steps, query_start, query_len)
    stats = StepStats(steps, tokens=batch.num_tokens)
    total = torch.zeros((), device=batch.aux.device)
    j_index = torch.arange(t, device=jvalid.device)[None, :].expand_as(jvalid)[jvalid]  # shape: [N] position j
    correct_at = []  # per step: [B, T] bool over context ends p, the draft matches
    for i, normed in enumerate(outs):
        # Step i at context end p predicts the label at j = p+1+i: move its outputs to index j, so every
        # step gathers the same label rows (no [N, V] gathers); rows with j < 1+i have no such p.
        h = normed.shape[-1]
        moved = torch.zeros(b, t + query_len + steps, h, device=normed.device, dtype=normed.dtype)
        moved = moved.scatter(1, (qpos + 1 + i)[..., None].expand(-1, -1, h), normed)[:, :t]  # shape: [B, T, H]
        logits = model.logits(moved[jvalid]).float()  # shape: [N, Vd]
        ce = torch.logsumexp(logits, dim=-1) - (tgt_probs * logits).sum(-1)  # soft CE, shape: [N]
        has_p = j_index >= 1 + i  # shape: [N]
        n_i = int(has_p.sum())
        if n_i:
            total = total + (decay ** i) * (ce * has_p).sum() / n_i
        hit = (vocab_rows[logits.detach().argmax(-1)] == tgt_argmax) & has_p  # shape: [N]
        stats.loss_sum[i] = (ce.detach() * has_p).sum().double()
        stats.correct[i] = hit.sum().double()
        stats.count[i] = n_i
        c_j = torch.zeros_like(jvalid)
        c_j[jvalid] = hit
        correct_at.append((shift_left(c_j, 1 + i), shift_left(jvalid, 1 + i)))  # back to context ends p
    loss = total / sum(decay ** i for i in range(steps))
    # Acceptance chain over context ends where all K drafts are scored.
    all_valid = torch.stack([v for _, v in correct_at]).all(0)  # shape: [B, T]
    chain = all_valid.clone()
    stats.chain_count = int(all_valid.sum())
    for i, (c, _) in enumerate(correct_at):
        chain = chain & c
        stats.chain_accepted[i] = chain.sum().double()
    if walk:
        correct = torch.stack([c for c, _ in correct_at])  # shape: [K, B, T]
        stats.walk_drafts, stats.walk_accepted = engine_walk(correct, batch.loss_mask, batch.lengths)
    return loss, stats


# -------------------------------------------------------------------------------------- recipe

@dataclass
class EpochResult:
    epoch: int
    checkpoint: str  # relative to the train stage directory
    complete: bool  # False when the time budget cut the epoch short
    train: dict[str, Any]
    validation: dict[str, Any]
    tokens_per_s: float
    seconds: float


@dataclass
class TrainResult:
    epochs: list[EpochResult] = field(default_factory=list)
    best_epoch: int = 0
    vocab_size: int = 0
    arch: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> EpochResult:
        return next(e for e in self.epochs if e.epoch == self.best_epoch)


def pick_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainError("train.device is 'cuda' but torch sees no CUDA device; set device: auto or cpu")
        return torch.device("cuda")
    return torch.device("cpu")


class Trainer:
    """One training run in `out_dir` (checkpoints/epoch-<n>/); resumes after the last finished epoch."""

    def __init__(self, cfg: TrainConfig, target: TargetHead, index: ExtractIndex, out_dir: str | Path,
                 aux_layer_ids: list[int]) -> None:
        self.cfg, self.target, self.index = cfg, target, index
        self.out_dir = Path(out_dir)
        self.aux_layer_ids = list(aux_layer_ids)
        self.device = pick_device(cfg)

    # --- setup -----------------------------------------------------------------------------------

    def setup(self) -> "Trainer":
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)
        torch.manual_seed(self.cfg.seed)
        random.seed(self.cfg.seed)
        self.train_data, self.val_data = self._setup_data()
        warm = self._read_warm_start()
        self.vocab = warm[2] if warm else self._setup_vocab(self.train_data)
        self.model = self._setup_model(warm)
        self.optimizer = self._setup_optimizer(self.model)
        self.vocab_rows = self.vocab.draft_to_target.to(self.device)
        self.target = TargetHead(**{k: (v.to(self.device) if isinstance(v, torch.Tensor) else v)
                                    for k, v in vars(self.target).items()})
        return self

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

    def _read_warm_start(self):
        if not self.cfg.warm_start:
            return None
        cfg, weights, vocab = load_vllm_drafter(self.cfg.warm_start)
        if vocab.target_vocab_size != self.target.vocab_size:
            raise TrainError(f"warm-start drafter {self.cfg.warm_start} has vocab_size {vocab.target_vocab_size}, "
                             f"the target {self.target.vocab_size}")
        return cfg, weights, vocab

    def _setup_model(self, warm) -> Eagle3Drafter:
        arch = arch_for_target(self.target, self.cfg, self.vocab.size)
        if warm:
            arch = self._warm_arch(arch, warm[0])
        model = Eagle3Drafter(arch, self.target.embed_tokens)
        model.init_from_target(self.target, self.vocab.draft_to_target)
        if warm:
            weights = warm[1]
            try:
                missing, unexpected = model.load_state_dict(weights, strict=False)
            except RuntimeError as exc:
                raise TrainError(f"warm-start drafter {self.cfg.warm_start} does not fit: {exc}") from None
            missing = [m for m in missing if m != "lm_head.weight"]  # a shared lm_head: keep the target's rows
            if missing or unexpected:
                raise TrainError(f"warm-start drafter {self.cfg.warm_start} does not fit: missing {missing}, "
                                 f"unexpected {unexpected}")
            log.info("warm start from %s", self.cfg.warm_start)
        model.lm_head.weight.requires_grad_(not self.cfg.freeze_lm_head)
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("drafter: %s, %d trainable parameters, device %s, %d torch threads", arch, n, self.device,
                 torch.get_num_threads())
        return model.to(self.device)

    def _warm_arch(self, arch: DrafterArch, cfg: dict) -> DrafterArch:
        """The warm-start drafter's own shape, read the way vLLM reads its config.json."""
        if int(cfg.get("hidden_size", -1)) != arch.hidden_size:
            raise TrainError(f"warm-start drafter {self.cfg.warm_start} has hidden_size {cfg.get('hidden_size')}, "
                             f"the target {arch.hidden_size}")
        eagle = cfg.get("eagle_config") or {}
        heads = int(cfg.get("num_attention_heads", arch.num_attention_heads))
        rope = cfg.get("rope_parameters") or {}
        return DrafterArch(**{
            **arch.to_dict(),
            "intermediate_size": int(cfg.get("intermediate_size", arch.intermediate_size)),
            "num_attention_heads": heads,
            "num_key_value_heads": int(cfg.get("num_key_value_heads") or heads),
            "head_dim": int(cfg.get("head_dim") or arch.hidden_size // heads),
            "rms_norm_eps": float(cfg.get("rms_norm_eps", arch.rms_norm_eps)),
            "rope_theta": float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            # vLLM's defaults when the keys are absent: no input norm, norm after the residual.
            "norm_before_fc": bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False))),
            "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
        })

    def _setup_optimizer(self, model: Eagle3Drafter) -> torch.optim.Optimizer:
        decay, no_decay = [], []
        for p in model.parameters():
            if p.requires_grad:
                (no_decay if p.dim() < 2 else decay).append(p)
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.cfg.learning_rate, betas=(0.9, self.cfg.adam_beta2),
        )

    # --- schedule --------------------------------------------------------------------------------

    def lr_at(self, step: int, total_steps: int, elapsed_s: float) -> float:
        """Linear warm-up, then cosine to min_lr; progress follows wall time when the budget binds."""
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.learning_rate * (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        if cfg.time_budget_s:
            progress = max(progress, elapsed_s / cfg.time_budget_s)
        progress = min(progress, 1.0)
        floor = cfg.learning_rate * cfg.min_lr_ratio
        return floor + (cfg.learning_rate - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    # --- loop ------------------------------------------------------------------------------------

    def _autocast(self):
        enabled = self.device.type == "cuda" and self.cfg.dtype == "bfloat16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        return make_batches(self.train_data.lengths(), self.cfg.batch_tokens, seed=self.cfg.seed * 100_003 + epoch)

    def _resume(self) -> tuple[int, int, float, list[EpochResult]]:
        """(last finished epoch, optimizer step, training seconds, earlier results) from checkpoints/."""
        ckpt_root = self.out_dir / "checkpoints"
        done = []
        for d in ckpt_root.glob("epoch-*") if ckpt_root.is_dir() else []:
            m = re.fullmatch(r"epoch-(\d+)", d.name)
            if m and (d / CHECKPOINT_STATE).is_file() and (d / CHECKPOINT_META).is_file():
                done.append(int(m.group(1)))
        if not done:
            return 0, 0, 0.0, []
        last = max(done)
        results = []
        for n in sorted(done):
            meta = json.loads((ckpt_root / f"epoch-{n}" / CHECKPOINT_META).read_text())
            results.append(EpochResult(**meta["result"]))
        _, weights, _, _ = load_checkpoint(ckpt_root / f"epoch-{last}")
        self.model.load_state_dict({k: v.to(self.device) for k, v in weights.items()})
        state = torch.load(ckpt_root / f"epoch-{last}" / CHECKPOINT_STATE, map_location=self.device,
                           weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        log.info("resuming after epoch %d (step %d)", last, state["step"])
        return last, state["step"], state["train_seconds"], results

    def train(self) -> TrainResult:
        cfg = self.cfg
        start_epoch, step, train_s, results = self._resume()
        steps_per_epoch = len(self._epoch_batches(1))
        total_steps = steps_per_epoch * cfg.epochs
        out_of_time = any(not r.complete for r in results)
        log.info("training: %d epochs x ~%d steps, %d TTT steps, batch_tokens %d",
                 cfg.epochs, steps_per_epoch, cfg.ttt_steps, cfg.batch_tokens)
        for epoch in range(start_epoch + 1, cfg.epochs + 1):
            if out_of_time:
                break
            self.model.train()
            epoch_stats = StepStats(cfg.ttt_steps)
            window = StepStats(cfg.ttt_steps)
            epoch_s = 0.0
            batches = self._epoch_batches(epoch)  # the packing, and so the count, varies by epoch
            for bi, idx in enumerate(batches):
                if cfg.time_budget_s and train_s >= cfg.time_budget_s:
                    out_of_time = True
                    log.info("time budget of %.0f s reached in epoch %d after %d of its steps",
                             cfg.time_budget_s, epoch, bi)
                    break
                t0 = time.perf_counter()
                lr = self.lr_at(step, total_steps, train_s)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                batch = collate(self.train_data, idx).to(self.device)
                with self._autocast():
                    loss, stats = ttt_loss(self.model, self.target, self.vocab_rows, batch, cfg.ttt_steps,
                                           cfg.step_loss_decay)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                self.optimizer.step()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()  # honest step timing
                dt = time.perf_counter() - t0
                step += 1
                train_s += dt
                epoch_s += dt
                epoch_stats.add(stats)
                window.add(stats)
                if step % cfg.log_every_steps == 0:
                    s = window.summary(cfg.step_loss_decay)
                    log.info("epoch %d step %d/%d lr %.2e loss %.4f acc %s grad_norm %.3f %.0f tok/s",
                             epoch, bi + 1, len(batches), lr, s["loss"], s["acc"], float(grad_norm),
                             epoch_stats.tokens / max(epoch_s, 1e-9))
                    window = StepStats(cfg.ttt_steps)
            if epoch_stats.tokens == 0:
                break
            result = self._finish_epoch(epoch, epoch_stats, epoch_s, step, train_s, complete=not out_of_time)
            results.append(result)
        if not results:
            raise TrainError("no training step ran (time budget too small?)")
        # Highest simulated acceptance length; without a holdout split, the last epoch.
        best = max(results, key=lambda r: (r.validation.get("acceptance_length", 0.0), r.epoch))
        return TrainResult(results, best.epoch, self.vocab.size, self.model.arch.to_dict())

    def _finish_epoch(self, epoch: int, stats: StepStats, epoch_s: float, step: int, train_s: float,
                      complete: bool) -> EpochResult:
        train = stats.summary(self.cfg.step_loss_decay)
        val = self.validate() if len(self.val_data) else {}
        rel = f"checkpoints/epoch-{epoch}"
        result = EpochResult(epoch=epoch, checkpoint=rel, complete=complete, train=train, validation=val,
                             tokens_per_s=round(stats.tokens / max(epoch_s, 1e-9), 1), seconds=round(epoch_s, 2))
        meta = {"epoch": epoch, "aux_layer_ids": self.aux_layer_ids, "validation": val,
                "train_config": self.cfg.model_dump(mode="json"), "result": vars(result)}
        state = {"optimizer": self.optimizer.state_dict(), "step": step, "train_seconds": train_s,
                 "rng": torch.get_rng_state()}
        save_checkpoint(self.out_dir / rel, self.model, self.vocab, meta, state)
        log.info("epoch %d%s: train loss %.4f acc %s | holdout loss %s acc %s accept_pos %s AL %s | "
                 "%.0f tok/s, %.1f s", epoch, "" if complete else " (partial)", train["loss"], train["acc"],
                 val.get("loss") and round(val["loss"], 4), val.get("acc"), val.get("accept_pos"),
                 val.get("acceptance_length"), result.tokens_per_s, epoch_s)
        print("EPOCH_METRICS " + json.dumps({"epoch": epoch, "train": train, "validation": val,
                                             "tokens_per_s": result.tokens_per_s}), flush=True)
        return result

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Holdout loss, per-step accuracy and simulated acceptance (see StepStats.summary, engine_walk)."""
        self.model.eval()
        total = StepStats(self.cfg.ttt_steps)
        t0 = time.perf_counter()
        for idx in make_batches(self.val_data.lengths(), self.cfg.batch_tokens, seed=None):
            batch = collate(self.val_data, idx).to(self.device)
            with self._autocast():
                _, stats = ttt_loss(self.model, self.target, self.vocab_rows, batch, self.cfg.ttt_steps,
                                    self.cfg.step_loss_decay, full_argmax=True, walk=True)
            total.add(stats)
        self.model.train()
        out = total.summary(self.cfg.step_loss_decay)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        return out
