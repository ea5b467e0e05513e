"""Which conversations go to which shard, fixed before any state is computed.

A shard holds one split of one generate shard and is cut by bytes of states (`extract.shard_bytes`),
never mid-sequence: at Kimi-K2.5's hidden size (7168) one token's four states are 57 KiB in bf16,
so a count of samples says little about a shard's size. Only token ids are held (a generate shard's
worth), never states.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SPLITS = ("train", "holdout")


@dataclass
class PlannedShard:
    name: str  # shard-<generate shard>-<split>-<part>.safetensors
    split: str
    ids: list[np.ndarray] = field(default_factory=list)  # int64 [n] per conversation
    masks: list[np.ndarray] = field(default_factory=list)  # int8 [n]

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.ids)


def target_hidden_size(model_path: str) -> int:
    """hidden_size from the target's config.json (or its text_config: multimodal targets such as Kimi-K2.5)."""
    cfg_path = Path(model_path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"target.model_path {model_path} has no config.json; point it at an HF checkpoint directory"
        )
    raw = json.loads(cfg_path.read_text())
    for section in (raw, raw.get("text_config") or {}):
        if isinstance(section.get("hidden_size"), int):
            return section["hidden_size"]
    raise ValueError(f"{cfg_path} has no hidden_size (nor text_config.hidden_size)")


def _rows(path: str, max_seq_len: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(split, ids, mask) of a Parquet file, read a record batch at a time (never the whole file)."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256, columns=["split", "input_ids", "loss_mask"]):
        splits = batch.column("split").to_pylist()
        ids, masks = batch.column("input_ids"), batch.column("loss_mask")
        for r, split in enumerate(splits):
            yield (
                split,
                ids[r].values.to_numpy().astype(np.int64)[:max_seq_len],
                masks[r].values.to_numpy().astype(np.int8)[:max_seq_len],
            )


def plan_shards(
    generate_shards: list[str], max_seq_len: int, bytes_per_token: int, shard_bytes: int
) -> Iterator[PlannedShard]:
    """Shards in a fixed order, each generate shard read once, a record batch at a time: what is held
    is the token ids of at most one open shard per split."""
    for g, path in enumerate(generate_shards):
        open_parts: dict[str, PlannedShard] = {}
        counts = dict.fromkeys(SPLITS, 0)
        for split, ids, mask in _rows(path, max_seq_len):
            if split not in counts:
                raise ValueError(f"{path}: split {split!r}, expected one of {SPLITS}")
            part = open_parts.get(split)
            if part is not None and (part.num_tokens + len(ids)) * bytes_per_token > shard_bytes:
                yield open_parts.pop(split)
                part = None
            if part is None:
                part = open_parts[split] = PlannedShard(f"shard-{g:05d}-{split}-{counts[split]:04d}.safetensors", split)
                counts[split] += 1
            part.ids.append(ids)
            part.masks.append(mask)
        for split in SPLITS:
            if split in open_parts:
                yield open_parts[split]
