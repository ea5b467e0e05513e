"""Which torch device a host-side stage computes on."""

from __future__ import annotations

import torch


def pick_device(choice: str, field: str, local_rank: int = 0) -> torch.device:
    """'auto' takes CUDA (this rank's GPU) when torch sees one, else the CPU; 'cuda' without a GPU is an
    error naming `field` (e.g. 'train.device')."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{field} is 'cuda' but torch sees no CUDA device on this host; set it to 'auto' or 'cpu'")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
