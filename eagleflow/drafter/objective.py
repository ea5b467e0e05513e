"""The EAGLE-3 training objective: the training-time-test (TTT) unroll's loss and its statistics.

`ttt_loss` is one forward of the objective over a batch: the drafter unrolled `steps` times (step
i > 0 fed its own previous outputs), each step scored against the target's distribution at the
position it drafts for, restricted to the draft vocabulary. `StepStats` sums what a batch scored;
`engine_walk` replays greedy verification over the teacher-forced drafts, the simulated acceptance
the best epoch is chosen on. `TTTObjective` wraps `ttt_loss` as one module forward, so DDP sees it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.attention import FLEX_BLOCK
from eagleflow.drafter.data import Batch
from eagleflow.drafter.losses import TargetDistribution, loss_named
from eagleflow.drafter.model import Eagle3Drafter, TargetHead

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
    walk_accepted: torch.Tensor = (
        None  # shape: [K] engine-walk rounds whose first k+1 drafts were accepted, of walk_seen
    )
    walk_seen: torch.Tensor = None  # shape: [K] engine-walk rounds whose draft k was judged (see engine_walk)
    walk_drafts: int = 0  # engine-walk drafting rounds
    tokens: int = 0

    def __post_init__(self) -> None:
        for name in self._SUMS:
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.steps, dtype=torch.float64))

    def add(self, other: StepStats) -> None:
        for name in self._SUMS:
            getattr(self, name).add_(getattr(other, name))
        self.chain_count += other.chain_count
        self.walk_drafts += other.walk_drafts
        self.tokens += other.tokens

    _SUMS = ("loss_sum", "correct", "count", "chain_accepted", "walk_accepted", "walk_seen")
    _COUNTS = ("chain_count", "walk_drafts", "tokens")

    def to_vector(self) -> torch.Tensor:
        """All sums in one float64 vector (for all-reduce and checkpoints), shape [6K + 3]."""
        return torch.cat(
            [getattr(self, n).double().cpu() for n in self._SUMS]
            + [torch.tensor([float(getattr(self, n)) for n in self._COUNTS], dtype=torch.float64)]
        )

    @classmethod
    def from_vector(cls, steps: int, vec: torch.Tensor) -> StepStats:
        vec = vec.double().cpu()
        if vec.numel() == 5 * steps + 3:  # a checkpoint written before walk_seen: training steps never walk, so 0s
            vec = torch.cat([vec[: 5 * steps], torch.zeros(steps, dtype=torch.float64), vec[5 * steps :]])
        out = cls(steps)
        for k, n in enumerate(cls._SUMS):
            setattr(out, n, vec[k * steps : (k + 1) * steps].clone())
        for k, n in enumerate(cls._COUNTS):
            setattr(out, n, int(round(float(vec[len(cls._SUMS) * steps + k]))))
        return out

    def summary(self, decay: float) -> dict[str, Any]:
        """loss: decay-weighted mean of the per-step soft CE; acc: per-step argmax agreement (teacher forced).

        accept_pos[k] / acceptance_length: vLLM's num_accepted_tokens_per_pos[k] / num_drafts and
        1 + accepted / drafts under greedy verification, simulated by walking each held-out answer the
        way the engine does (`engine_walk`); this is the number the best epoch is chosen on. Each draft's
        acceptance is the product of per-position rates, each counted where the answer so far is what greedy
        serving would have fed the drafter (all of it when the answers are greedy: then exactly accepted / drafts).
        accept_pos_uniform / acceptance_length_uniform: the same over *every* context end (each
        weighted equally); optimistic, because the engine drafts more often right after a rejection.
        acceptance_length_indep: 1 + sum_k prod_{i<=k} acc[i] (per-step accuracies taken as independent).
        """
        per_step = (self.loss_sum / self.count.clamp(min=1)).tolist()
        w = [decay**i for i in range(self.steps)]
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
            # A draft no round judged on the argmax (answers sampled far off it): its rate along the uniform
            # chain (accepted given the drafts before it, every context end) stands in for 0 / 0.
            before = [float(self.chain_count)] + self.chain_accepted.tolist()[:-1]
            rate = [
                a / s if s else (c / d if d else 0.0)
                for a, s, c, d in zip(
                    self.walk_accepted.tolist(), self.walk_seen.tolist(), self.chain_accepted.tolist(), before
                )
            ]
            walk = [math.prod(rate[: k + 1]) for k in range(self.steps)]
            out.update(
                accept_pos=[round(x, 5) for x in walk],
                acceptance_length=round(1.0 + sum(walk), 5),
                drafts=self.walk_drafts,
                judged=[int(x) for x in self.walk_seen.tolist()],
            )
        return out


def engine_walk(
    correct: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, greedy: torch.Tensor | None = None
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Greedy speculative decoding replayed over teacher-forced drafts: (rounds, accepted [K], judged [K]).

    correct[k, b, p]: draft k made at context end p matches the target's argmax at p+1+k. The target
    verifies through p and samples x[p+1]; the first round is at p = (first answer token) - 1. A round
    accepts the leading run of matches, a, and the target adds one token: the next round is at
    p + a + 1. Rounds run while all K drafted tokens lie inside the answer.

    greedy[b, p]: x[p+1] is the target's argmax (None: every token is, answers generated greedily). Draft k
    is judged only where x[p+1..p+k] are the target's argmax: there, once drafts 0..k-1 are accepted, the
    drafter is fed what greedy serving would feed it. Where the answers were sampled (production's setting
    for a reasoning model) a token off the argmax leads into a context greedy serving never reaches: judging
    the next draft there read a demo drafter trained on answers sampled at 1.0 / 0.95 2.56 against the 2.86 it
    served at temperature 0; judged this way it reads 2.77 (docs/benchmarks.md). judged[k] counts
    the rounds whose draft k was judged with drafts 0..k-1 accepted; accepted[k] those it was accepted in.
    accepted[k] / judged[k] is the rate of draft k given the drafts before it; their running product the
    engine's accept_pos[k] (StepStats.summary). With greedy answers judged[0] = rounds, judged[k] =
    accepted[k-1], and the product is accepted[k] / rounds: exact for greedy verification.
    """
    k_steps = correct.shape[0]
    corr = correct.cpu().numpy()
    lm = loss_mask.cpu().numpy()
    on_argmax = None if greedy is None else greedy.cpu().numpy()
    drafts, accepted, judged = 0, [0] * k_steps, [0] * k_steps
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
            while a < k_steps:
                if a and on_argmax is not None and not on_argmax[b, p + a - 1]:
                    break  # x[p+a] is off the argmax: draft a's context is one greedy serving never feeds
                judged[a] += 1
                if not corr[a, b, p]:
                    break
                accepted[a] += 1
                a += 1
            drafts += 1
            p += a + 1
    return drafts, torch.tensor(accepted, dtype=torch.float64), torch.tensor(judged, dtype=torch.float64)


def label_positions(batch: Batch) -> torch.Tensor:
    """jvalid[b, j]: the target's distribution at position j is a label.

    Position j's distribution is that of token x[j+1]; it is used when x[j] is an assistant token
    (loss_mask 1: the drafter is then drafting during generation) and x[j+1] exists. Drafting step i
    at context end p predicts the distribution at j = p+1+i.
    """
    return label_mask(batch.loss_mask, batch.lengths)


def label_mask(loss_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """`label_positions` from the loss mask [B, T] and the lengths [B] alone."""
    t = loss_mask.shape[1]
    idx = torch.arange(t, device=loss_mask.device)
    return loss_mask & (idx[None, :] <= (lengths[:, None] - 2)) & (idx[None, :] >= 1)  # shape: [B, T]


def label_counts(loss_mask: torch.Tensor, lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """Labels each unroll step scores, shape [K]: step i scores label j only if its context end j-1-i >= 0.

    These are the per-step denominators of the loss; summed over all micro-batches of an optimizer
    step they make accumulation and data parallelism give the gradient of the whole batch.
    """
    jvalid = label_mask(loss_mask, lengths)
    idx = torch.arange(jvalid.shape[1], device=jvalid.device)
    return torch.stack([(jvalid & (idx[None, :] >= 1 + i)).sum() for i in range(steps)]).double()


def shift_left(x: torch.Tensor, n: int, fill=False) -> torch.Tensor:
    """out[:, p] = x[:, p+n] (fill beyond the end)."""
    out = torch.full_like(x, fill)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


def ttt_loss(
    model: Eagle3Drafter,
    target: TargetHead,
    vocab_rows: torch.Tensor,
    batch: Batch,
    steps: int,
    decay: float,
    full_argmax: bool = False,
    walk: bool = False,
    denominators: torch.Tensor | None = None,
    loss_kind: str = "soft_ce",
    lk_eta: float = 3.0,
) -> tuple[torch.Tensor, StepStats]:
    """The decay-weighted soft cross-entropy (or KL, or LK hybrid) of a TTT unroll, and its statistics.

        loss = sum_i decay^i * mean_{labels of step i} ce_i  /  sum_i decay^i

    Soft target: the target's distribution restricted to the draft vocabulary and renormalised
    (softmax over lm_head rows of the draft ids). `loss_kind` "kl" subtracts the target's entropy
    (same gradient); "lk" is the LK hybrid with `lk_eta` (`eagleflow.drafter.losses`). `denominators` [K]: the label
    count of each step over the whole optimizer step
    (`label_counts`), when this batch is one micro-batch of it; default: this batch's own.
    `full_argmax` compares against the argmax over the whole target vocabulary (what greedy
    verification uses) instead of the draft-vocabulary one; `walk` adds the engine-walk acceptance
    simulation (validation).
    """
    jvalid = label_positions(batch)  # shape: [B, T]
    loss_fn = loss_named(loss_kind)
    with torch.no_grad():
        final = batch.final[jvalid]  # shape: [N, H]
        tgt_logits = target.logits(final, vocab_rows)  # shape: [N, Vd]
        tgt = TargetDistribution(tgt_logits)
        if full_argmax and vocab_rows.numel() != target.vocab_size:
            tgt_argmax = torch.cat([target.logits(c).argmax(-1) for c in final.split(4096)])  # target ids
        else:
            tgt_argmax = vocab_rows[tgt_logits.argmax(-1)]

    # Context ends that carry a label for some step: p in [first label - steps, len - 3] per row.
    b, t = jvalid.shape
    first = torch.where(jvalid.any(1), jvalid.float().argmax(1), torch.zeros_like(batch.lengths))
    query_start = (first - steps).clamp(min=0)  # shape: [B]
    query_len = max(int((batch.lengths - 2 - query_start).max()), 1)
    if batch.aux.is_cuda:  # whole flex blocks (model.FLEX_BLOCK); the extra rows carry no label
        query_len = -(-query_len // FLEX_BLOCK) * FLEX_BLOCK
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
        logits = model.logits(moved[jvalid])  # shape: [N, Vd]
        ce = loss_fn(logits, tgt, lk_eta)  # shape: [N]
        has_p = j_index >= 1 + i  # shape: [N]
        n_i = int(has_p.sum())
        denom = n_i if denominators is None else float(denominators[i])
        if n_i and denom:
            total = total + (decay**i) * (ce * has_p).sum() / denom
        hit = (vocab_rows[logits.detach().argmax(-1)] == tgt_argmax) & has_p  # shape: [N]
        stats.loss_sum[i] = (ce.detach() * has_p).sum().double()
        stats.correct[i] = hit.sum().double()
        stats.count[i] = n_i
        c_j = torch.zeros_like(jvalid)
        c_j[jvalid] = hit
        correct_at.append((shift_left(c_j, 1 + i), shift_left(jvalid, 1 + i)))  # back to context ends p
    loss = total / sum(decay**i for i in range(steps))
    # Acceptance chain over context ends where all K drafts are scored.
    all_valid = torch.stack([v for _, v in correct_at]).all(0)  # shape: [B, T]
    chain = all_valid.clone()
    stats.chain_count = int(all_valid.sum())
    for i, (c, _) in enumerate(correct_at):
        chain = chain & c
        stats.chain_accepted[i] = chain.sum().double()
    if walk:
        correct = torch.stack([c for c, _ in correct_at])  # shape: [K, B, T]
        on_argmax = torch.zeros_like(jvalid)  # shape: [B, T] x[p+1] is the target's argmax at p
        on_argmax[jvalid] = shift_left(batch.input_ids, 1)[jvalid] == tgt_argmax
        stats.walk_drafts, stats.walk_accepted, stats.walk_seen = engine_walk(
            correct, batch.loss_mask, batch.lengths, on_argmax
        )
    return loss, stats


class TTTObjective(nn.Module):
    """`ttt_loss` as one module forward, so DistributedDataParallel sees (and syncs) the whole step."""

    def __init__(self, drafter: Eagle3Drafter, target: TargetHead, vocab_rows: torch.Tensor, cfg: TrainConfig):
        super().__init__()
        self.drafter, self.target, self.vocab_rows, self.cfg = drafter, target, vocab_rows, cfg

    def forward(self, batch: Batch, denominators: torch.Tensor | None = None) -> tuple[torch.Tensor, StepStats]:
        return ttt_loss(
            self.drafter,
            self.target,
            self.vocab_rows,
            batch,
            self.cfg.ttt_steps,
            self.cfg.step_loss_decay,
            denominators=denominators,
            loss_kind=self.cfg.loss,
            lk_eta=self.cfg.lk_eta,
        )
