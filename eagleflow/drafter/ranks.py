"""Rank plumbing of data-parallel training under torchrun: this process's place among the ranks, the process
group, the DDP wrapper, and the few collectives the trainer needs. With one rank every function is a no-op
or the identity, so the recipe reads the same either way."""

from __future__ import annotations

import datetime
import inspect
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from eagleflow.drafter.objective import StepStats


@dataclass(frozen=True)
class DistEnv:
    """This process's place among the data-parallel ranks (torchrun's environment variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> DistEnv:
        return cls(
            int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_ranks(ranks: DistEnv, device: torch.device, num_threads: int | None) -> None:
    """Threads, this rank's GPU and the process group (NCCL on GPUs, gloo on CPU)."""
    threads = num_threads
    if threads is None and ranks.distributed and device.type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size)))
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if ranks.distributed and not dist.is_initialized():
        # Rank 0 validates and writes checkpoints while the others wait at a barrier: hours at Kimi's scale.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=2))


def wrap_data_parallel(module: nn.Module, ranks: DistEnv, device: torch.device) -> nn.Module:
    """`module` under DDP with more than one rank, itself otherwise."""
    if not ranks.distributed:
        return module
    # The frozen target embedding (a buffer) never changes: sync buffers once at init, not every
    # forward (`forward_sync_buffers` from torch 2.13, `broadcast_buffers` before).
    no_buffer_sync = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync
    )


def sum_over_ranks(stats: StepStats, ranks: DistEnv, device: torch.device) -> StepStats:
    """The sum of `stats` over ranks (`stats` itself when there is one rank). A collective."""
    if not ranks.distributed:
        return stats
    vec = stats.to_vector().to(device)
    dist.all_reduce(vec)
    return StepStats.from_vector(stats.steps, vec)


def epoch_total(ranks: DistEnv, device: torch.device, local: StepStats, resumed: StepStats | None) -> StepStats:
    """The epoch's statistics so far, all ranks, the steps before a resume included. A collective."""
    total = sum_over_ranks(local, ranks, device)
    if resumed is not None:
        total = StepStats.from_vector(total.steps, total.to_vector() + resumed.to_vector())
    return total


def slowest_rank(seconds: float, ranks: DistEnv, device: torch.device) -> float:
    """Every rank takes the slowest rank's training time: the time cap and the schedule must agree."""
    if not ranks.distributed:
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def barrier(ranks: DistEnv) -> None:
    if ranks.distributed:
        dist.barrier()
