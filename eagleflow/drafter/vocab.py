"""The draft vocabulary: which target tokens the drafter's lm_head can propose.

EAGLE-3 drafts over a subset of the target vocabulary (the most frequent tokens of the training
answers) to make its lm_head cheap. The engines map a draft id back with an offset table:

    target_id = draft_id + d2t[draft_id]        # d2t: int64 [draft_vocab_size]   (vLLM, SGLang)
    t2d[target_id] is True iff target_id is in the draft vocabulary   # bool [target_vocab_size]

When the target vocabulary is no larger than `draft_vocab_size` the draft vocabulary is the whole
target vocabulary in its own order (d2t all zeros); vLLM then needs no d2t at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftVocab:
    """draft_to_target[d] is the target id of draft id d (strictly increasing)."""

    draft_to_target: torch.Tensor  # shape: [Vd] int64
    target_vocab_size: int

    def __post_init__(self) -> None:
        ids = self.draft_to_target
        if ids.dtype != torch.int64 or ids.dim() != 1 or ids.numel() == 0:
            raise ValueError("draft_to_target must be a non-empty 1-D int64 tensor")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft_to_target must be strictly increasing (sorted, no duplicates)")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.target_vocab_size:
            raise ValueError(f"draft_to_target ids must lie in [0, {self.target_vocab_size})")

    @property
    def size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def is_full(self) -> bool:
        """The identity mapping over the whole target vocabulary."""
        return self.size == self.target_vocab_size

    @property
    def d2t(self) -> torch.Tensor:
        """Offsets as vLLM/SGLang load them: target_id = draft_id + d2t[draft_id]."""
        return self.draft_to_target - torch.arange(self.size, dtype=torch.int64)  # shape: [Vd]

    @property
    def t2d(self) -> torch.Tensor:
        """Membership mask over the target vocabulary."""
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool)  # shape: [V]
        mask[self.draft_to_target] = True
        return mask

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft_to_target.to(draft_ids.device)[draft_ids]

    @classmethod
    def full(cls, target_vocab_size: int) -> DraftVocab:
        return cls(torch.arange(target_vocab_size, dtype=torch.int64), target_vocab_size)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> DraftVocab:
        d2t = d2t.to(torch.int64).flatten()
        return cls(torch.arange(d2t.numel(), dtype=torch.int64) + d2t, target_vocab_size)

    @classmethod
    def from_counts(cls, counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
        """The `draft_vocab_size` most frequent ids (ties: lower id first); the full vocabulary if it is smaller.

        Ids never seen still fill the vocabulary up to its size (lowest ids first), so the draft
        vocabulary always has exactly min(draft_vocab_size, V) entries.
        """
        counts = counts.to(torch.int64).flatten()  # shape: [V]
        vocab_size = counts.numel()
        if draft_vocab_size >= vocab_size:
            return cls.full(vocab_size)
        # Stable sort on -count keeps lower ids first among equal counts.
        order = torch.sort(-counts, stable=True).indices
        chosen = torch.sort(order[:draft_vocab_size]).values
        return cls(chosen, vocab_size)


def count_tokens(input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Frequencies of the loss-masked (assistant) tokens; ids outside [0, vocab_size) are an error."""
    ids = input_ids[loss_mask.bool()].to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"token ids in [{int(ids.min())}, {int(ids.max())}] fall outside the target vocabulary of {vocab_size}: "
            "the extracted data does not belong to this target"
        )
    return torch.bincount(ids, minlength=vocab_size)  # shape: [V]
