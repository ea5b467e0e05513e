"""The target's hidden states for the drafter to learn from: shard plans (`plan`), the backends' registry
(`backends`), the transformers forward (`hf`), the serving engine's own capture (`vllm`; on SGLang `sglang`),
production's own engine while it serves (`production`). The extract stage opens the backend its config names
(`open_capture`) and wires it to the shard writer (`eagleflow.drafter.shards`).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from eagleflow.config import RunConfig
from eagleflow.extraction.backends import backend_of

if TYPE_CHECKING:
    from eagleflow.drafter.shards import ShardWriter
    from eagleflow.extraction.plan import PlannedShard


class Capture(Protocol):
    """An opened backend: the states of one planned shard into its writer."""

    where: str  # what computes, as the manifest records it: 'cpu', 'cuda:0', 'engine'

    def extract(self, shard: PlannedShard, writer: ShardWriter) -> None: ...


def _open_hf(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> Capture:
    from eagleflow.extraction.hf import open_hf

    return open_hf(cfg)


def _open_vllm(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> Capture:
    from eagleflow.extraction.vllm import open_vllm

    return open_vllm(cfg, stage_dir, stack, hidden_size)


def _open_sglang(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> Capture:
    from eagleflow.extraction.sglang import open_sglang

    return open_sglang(cfg, stage_dir, stack, hidden_size)


def _open_production(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> Capture:
    from eagleflow.extraction.production import open_production

    return open_production(cfg, stack)


# one per entry of backends.BACKENDS
OPENERS = {"hf": _open_hf, "vllm": _open_vllm, "sglang": _open_sglang, "production": _open_production}


def open_capture(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> Capture:
    """The backend `extract.backend` names, opened for the stage (its heavy imports happen here, on the host);
    `stack` closes it."""
    return OPENERS[backend_of(cfg).name](cfg, stage_dir, stack, hidden_size)
