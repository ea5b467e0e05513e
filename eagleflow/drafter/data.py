"""The extract stage's shards, read lazily, batched as padded sequences of similar length.

A shard (safetensors, see `eagleflow.drafter.shards`) packs sequences along the token axis:
    input_ids int64 [T], loss_mask int8 [T], seq_lens int64 [n_seq], hidden_states bf16 or fp8 [T, 4, H]
    (+ hidden_scales f32 [T, 4] for fp8)
where hidden_states[:, 0:3] are the aux states (vLLM convention) and hidden_states[:, 3] is the
final layer's output before the final norm. `index.json` lists the shards, their split and what
was written (size, sampled and full sha256): every shard is checked against it (size and sampled
hash) before training reads it. An entry's `file` may be absolute (the nightly pool's index names the
shards of several extract stages) and may carry `select`, the sequence indices of a replay sample.

Sequences are read from the memory-mapped shard on demand (the OS page cache keeps a small
dataset in memory), so a dataset larger than RAM trains too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eagleflow.drafter.errors import DataError
from eagleflow.drafter.shards import ShardError, check_shard, dequantize_fp8

SPLITS = ("train", "holdout")


@dataclass(frozen=True)
class ShardInfo:
    path: Path
    split: str
    num_seqs: int
    num_tokens: int
    select: tuple[int, ...] | None = None  # only these sequences of the shard (a replay sample); None: all


@dataclass(frozen=True)
class ExtractIndex:
    shards: list[ShardInfo]
    aux_layer_ids: list[int]
    final_layer_id: int
    hidden_size: int

    def split(self, name: str) -> list[ShardInfo]:
        return [s for s in self.shards if s.split == name]


def _shard_path(file: str, bases: list[Path]) -> Path:
    for base in bases:
        if (base / file).is_file():
            return base / file
    return bases[0] / file


def read_index(path: str | Path, stage_dir: str | Path | None = None) -> ExtractIndex:
    """Shard `file` entries are relative to the extract stage directory (`stage_dir`) or to index.json's."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"extract index {path} does not exist")
    raw = json.loads(path.read_text())
    bases = ([Path(stage_dir)] if stage_dir is not None else []) + [path.parent]
    try:
        shards = [
            ShardInfo(
                _shard_path(s["file"], bases),
                s["split"],
                int(s["num_seqs"]),
                int(s["num_tokens"]),
                tuple(int(i) for i in s["select"]) if s.get("select") is not None else None,
            )
            for s in raw["shards"]
        ]
        index = ExtractIndex(
            shards, [int(i) for i in raw["aux_layer_ids"]], int(raw["final_layer_id"]), int(raw["hidden_size"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"extract index {path} is malformed ({exc!r}); see docs/architecture.md") from None
    for s, entry in zip(shards, raw["shards"]):
        if s.split not in SPLITS:
            raise DataError(f"{path}: shard {s.path.name} has split {s.split!r}, expected one of {SPLITS}")
        if not s.path.is_file():
            raise DataError(f"{path} lists {s.path}, which does not exist")
        try:
            check_shard(s.path, entry)
        except ShardError as exc:
            raise DataError(str(exc)) from None
    if not index.split("train"):
        raise DataError(f"{path} lists no 'train' shard")
    return index


@dataclass(frozen=True)
class SeqRef:
    shard: int
    start: int
    length: int  # after cutting to max_seq_len


class SequenceStore:
    """Random access to the sequences of some shards."""

    def __init__(self, shards: list[ShardInfo], max_seq_len: int, max_seqs: int | None = None) -> None:
        selects = [set(s.select) if s.select is not None else None for s in shards]
        self.paths = [s.path for s in shards]
        self._handles: dict[int, object] = {}
        self.refs: list[SeqRef] = []
        self.hidden_size = 0
        self._ids: list[torch.Tensor] = []
        self._mask: list[torch.Tensor] = []
        self._scaled: list[bool] = []  # fp8 shard: states carry per-token scales
        for i, path in enumerate(self.paths):
            with safe_open(str(path), framework="pt") as h:
                missing = {"input_ids", "loss_mask", "seq_lens", "hidden_states"} - set(h.keys())
                if missing:
                    raise DataError(f"shard {path} lacks {sorted(missing)}")
                ids, mask, lens = h.get_tensor("input_ids"), h.get_tensor("loss_mask"), h.get_tensor("seq_lens")
                shape = h.get_slice("hidden_states").get_shape()
                self._scaled.append("hidden_scales" in h.keys())
            if int(lens.sum()) != ids.numel() or mask.numel() != ids.numel() or shape[0] != ids.numel():
                raise DataError(
                    f"shard {path}: seq_lens sum {int(lens.sum())}, input_ids {ids.numel()}, "
                    f"loss_mask {mask.numel()}, hidden_states {shape} disagree"
                )
            if len(shape) != 3 or shape[1] != 4:
                raise DataError(f"shard {path}: hidden_states has shape {shape}, expected [T, 4, H]")
            self.hidden_size = int(shape[2])
            self._ids.append(ids.to(torch.int64))
            self._mask.append(mask.to(torch.bool))
            start = 0
            for j, n in enumerate(lens.tolist()):
                # a drafter position needs a next token and a label; a replay sample keeps its sequences only
                if n >= 3 and (selects[i] is None or j in selects[i]):
                    self.refs.append(SeqRef(i, start, min(int(n), max_seq_len)))
                start += int(n)
        if max_seqs is not None:
            self.refs = self.refs[:max_seqs]

    def __len__(self) -> int:
        return len(self.refs)

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.refs)

    def lengths(self) -> list[int]:
        return [r.length for r in self.refs]

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.refs[i]
        return self._ids[r.shard][r.start : r.start + r.length], self._mask[r.shard][r.start : r.start + r.length]

    def hidden(self, i: int) -> torch.Tensor:
        r = self.refs[i]
        h = self._handles.get(r.shard)
        if h is None:
            h = self._handles[r.shard] = safe_open(str(self.paths[r.shard]), framework="pt")
        states = h.get_slice("hidden_states")[r.start : r.start + r.length]  # shape: [L, 4, H] bf16 or fp8
        if self._scaled[r.shard]:
            return dequantize_fp8(states, h.get_slice("hidden_scales")[r.start : r.start + r.length])  # [L, 4, H] f32
        return states

    def all_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids and loss_mask of every sequence, concatenated (for vocabulary counts)."""
        pairs = [self.tokens(i) for i in range(len(self))]
        if not pairs:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool)
        return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


@dataclass
class Batch:
    """Right-padded sequences."""

    input_ids: torch.Tensor  # shape: [B, T] int64 (0 beyond a sequence)
    loss_mask: torch.Tensor  # shape: [B, T] bool  (False beyond a sequence)
    lengths: torch.Tensor  # shape: [B] int64
    aux: torch.Tensor  # shape: [B, T, 3H] float32
    final: torch.Tensor  # shape: [B, T, H] float32, the final layer's output before the final norm

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(
            *(
                t.to(device, non_blocking=True)
                for t in (self.input_ids, self.loss_mask, self.lengths, self.aux, self.final)
            )
        )


def collate(store: SequenceStore, indices: list[int]) -> Batch:
    lengths = [store.refs[i].length for i in indices]
    b, t = len(indices), max(lengths)
    hid = store.hidden(indices[0])
    h = hid.shape[-1]
    ids = torch.zeros(b, t, dtype=torch.int64)
    mask = torch.zeros(b, t, dtype=torch.bool)
    states = torch.zeros(b, t, 4, h, dtype=torch.float32)
    for row, i in enumerate(indices):
        n = lengths[row]
        tok, lm = store.tokens(i)
        ids[row, :n], mask[row, :n] = tok, lm
        states[row, :n] = (hid if row == 0 else store.hidden(i)).float()
    aux = states[:, :, :3].reshape(b, t, 3 * h)  # shape: [B, T, 3H]
    final = states[:, :, 3]  # shape: [B, T, H]
    return Batch(ids, mask, torch.tensor(lengths), aux, final)


def make_batches(lengths: list[int], batch_tokens: int, seed: int | None, window: int = 64) -> list[list[int]]:
    """Batches of sequence indices with B * max_len <= batch_tokens (a longer sequence goes alone).

    With a seed: shuffle, sort by length inside windows of `window` batches' worth of sequences
    (little padding, still random), then shuffle the batches. Without: sorted by length (validation).
    """
    order = sorted(range(len(lengths)), key=lambda j: lengths[j])
    if seed is not None:
        order = list(range(len(lengths)))
        rng = random.Random(seed)
        rng.shuffle(order)
        avg = max(1, sum(lengths) // max(1, len(lengths)))
        chunk = max(1, window * batch_tokens // avg)
        order = [i for k in range(0, len(order), chunk) for i in sorted(order[k : k + chunk], key=lambda j: lengths[j])]
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    if seed is not None:
        random.Random(seed + 1).shuffle(batches)
    return batches


def split_batch(indices: list[int], lengths: list[int], parts: int) -> list[list[int]]:
    """One optimizer step's sequences dealt to `parts` micro-batches (ranks x accumulation steps).

    Longest first, round robin, so each part gets a similar share of the padded tokens; a part is
    empty when the batch has fewer sequences than parts. `parts` 1 returns the batch unchanged.
    """
    if parts == 1:
        return [list(indices)]
    order = sorted(indices, key=lambda i: -lengths[i])
    return [order[k::parts] for k in range(parts)]


def token_masks(store: SequenceStore, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss_mask [B, T] bool, lengths [B]) of some sequences, without reading their hidden states."""
    lengths = [store.refs[i].length for i in indices]
    mask = torch.zeros(len(indices), max(lengths), dtype=torch.bool)
    for row, i in enumerate(indices):
        mask[row, : lengths[row]] = store.tokens(i)[1]
    return mask, torch.tensor(lengths)
