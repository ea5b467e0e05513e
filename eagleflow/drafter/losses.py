"""The per-position losses of the TTT unroll, by name: `LOSSES[train.loss]`.

    soft_ce  cross-entropy against the target's distribution over the draft vocabulary
    kl       KL(target || draft): soft_ce less the target's entropy (the same gradient; it reaches 0)
    lk       the LK hybrid (arXiv 2602.23881): KL far from the target, the acceptance rate itself close to it

Each is `fn(logits, target, lk_eta) -> [N]`, over the N labelled positions of one unroll step. The kernels
beside them come in two forms: eager (fp32, any device) and fused (`torch.compile`: one pass over the logits
forward and one backward, no fp32 copy of them), taken on CUDA only, so CPU training needs no C++ compiler.
A new loss is one function and one line in `LOSSES` (and its name in `TrainConfig.loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import torch

from eagleflow.drafter.kernels import CudaCompiled


class TargetDistribution:
    """The target at the labelled positions, over the draft vocabulary; no gradient flows into it."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits  # shape: [N, Vd]
        self.probs = torch.softmax(logits, dim=-1)  # shape: [N, Vd]

    @cached_property
    def entropy(self) -> torch.Tensor:
        """Its entropy, fp32 (shape: [N]): computed for the losses that ask for it."""
        with torch.no_grad():
            logp = torch.log_softmax(self.logits.float(), dim=-1)
            return -(logp.exp() * logp).sum(-1)


LossFn = Callable[[torch.Tensor, TargetDistribution, float], torch.Tensor]


def _soft_ce_eager(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Soft cross-entropy per row in fp32: logsumexp(logits) - sum(probs * logits)."""
    # logits shape: [N, Vd] (bf16 under autocast); probs shape: [N, Vd] fp32
    x = logits.float()
    return torch.logsumexp(x, dim=-1) - (probs * x).sum(-1)  # shape: [N]


_soft_ce_fused = CudaCompiled(_soft_ce_eager, dynamic=True)


def _lk_eager(logits: torch.Tensor, probs: torch.Tensor, entropy: torch.Tensor, eta: float) -> torch.Tensor:
    """The LK hybrid per row: w * KL(p || q) + (1 - w) * (1 - alpha), alpha = sum_v min(p, q), w = exp(-eta alpha).

    alpha is the probability that a token drafted from q is accepted against p: 1 - alpha is the total
    variation distance. w is a constant of the step (no gradient through it), so far from the target the
    loss is KL (whose gradient does not vanish when q misses p's support) and close to it, the acceptance
    rate itself, which KL only bounds.
    """
    # logits shape: [N, Vd]; probs shape: [N, Vd] fp32; entropy shape: [N] fp32 (the target's)
    x = logits.float()
    logq = torch.log_softmax(x, dim=-1)
    kl = -(probs * logq).sum(-1) - entropy  # shape: [N]
    alpha = torch.minimum(logq.exp(), probs).sum(-1)  # shape: [N]
    w = torch.exp(-eta * alpha.detach())
    return w * kl + (1.0 - w) * (1.0 - alpha)


_lk_fused = CudaCompiled(_lk_eager, dynamic=True)


def soft_ce_loss(logits: torch.Tensor, target: TargetDistribution, lk_eta: float = 0.0) -> torch.Tensor:
    return (_soft_ce_fused if logits.is_cuda else _soft_ce_eager)(logits, target.probs)  # shape: [N]


def kl_loss(logits: torch.Tensor, target: TargetDistribution, lk_eta: float = 0.0) -> torch.Tensor:
    return soft_ce_loss(logits, target) - target.entropy  # shape: [N]


def lk_loss(logits: torch.Tensor, target: TargetDistribution, lk_eta: float = 3.0) -> torch.Tensor:
    return (_lk_fused if logits.is_cuda else _lk_eager)(logits, target.probs, target.entropy, lk_eta)  # shape: [N]


LOSSES: dict[str, LossFn] = {"soft_ce": soft_ce_loss, "kl": kl_loss, "lk": lk_loss}


def loss_named(name: str) -> LossFn:
    """The loss `train.loss` names; a ValueError naming the choices for any other."""
    if name not in LOSSES:
        raise ValueError(f"unknown train.loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name]
