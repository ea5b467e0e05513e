"""The shard format: streamed, plain safetensors, fp8 with scales, and checked before it is read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import eagleflow.drafter.shards as shards
from eagleflow.drafter.data import SequenceStore, read_index
from eagleflow.drafter.errors import DataError
from eagleflow.drafter.shards import (
    ShardError,
    ShardPlan,
    ShardWriter,
    blocks_sha256,
    check_shard,
    quantize_fp8,
    verify_full,
)

H = 32


def write_shard(path: Path, lens: list[int], storage: str = "bfloat16", seed: int = 0, hidden: int = H, **kw):
    g = torch.Generator().manual_seed(seed)
    states = [torch.randn(n, 4, hidden, generator=g) * (1 + i) for i, n in enumerate(lens)]
    writer = ShardWriter(path, ShardPlan(sum(lens), len(lens), hidden, storage), {"split": "train"}, **kw)
    for i, (n, s) in enumerate(zip(lens, states)):
        writer.add(list(range(i, i + n)), [0] + [1] * (n - 1), s)
    return writer.close(), states


def write_index(root: Path, records: dict[str, tuple]) -> Path:
    (root / "data").mkdir(exist_ok=True)
    entries = [
        {"file": f"data/{name}", "split": split, "num_seqs": n_seq, "num_tokens": n_tok, **rec.__dict__}
        for name, (split, n_seq, n_tok, rec) in records.items()
    ]
    path = root / "data" / "index.json"
    path.write_text(json.dumps({"shards": entries, "aux_layer_ids": [1, 2, 3], "final_layer_id": 4, "hidden_size": H}))
    return path


@pytest.mark.parametrize("storage", ["bfloat16", "float8_e4m3fn"])
def test_a_streamed_shard_is_plain_safetensors_with_every_sequence(tmp_path, storage):
    # Chunks of 3 tokens and a pool of 2: sequences cross chunk boundaries and the pool recycles.
    path = tmp_path / "data" / "s.safetensors"
    record, states = write_shard(path, [5, 11, 3], storage, chunk_bytes=3 * 4 * H * 2, pool=2)
    assert record.bytes == path.stat().st_size
    assert record.blocks_sha256 == blocks_sha256(path)
    assert not list(path.parent.glob(".*.tmp")), "the temporary file was renamed, not left"
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"split": "train", "storage_dtype": storage}
        assert f.get_tensor("seq_lens").tolist() == [5, 11, 3]
        assert f.get_tensor("input_ids")[:5].tolist() == [0, 1, 2, 3, 4]
        assert f.get_tensor("loss_mask")[:2].tolist() == [0, 1]
    index = read_index(write_index(tmp_path, {"s.safetensors": ("train", 3, 19, record)}), stage_dir=tmp_path)
    store = SequenceStore(index.split("train"), max_seq_len=64)
    for i, want in enumerate(states):
        got = store.hidden(i).float()  # fp8 shards come back dequantized
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err < (0.07 if storage != "bfloat16" else 0.01), (storage, i, err)


def test_fp8_halves_the_bytes_and_keeps_a_scale_per_token_and_layer(tmp_path):
    bf16, _ = write_shard(tmp_path / "a.safetensors", [40, 24], hidden=1024)
    fp8, _ = write_shard(tmp_path / "b.safetensors", [40, 24], "float8_e4m3fn", hidden=1024)
    states = torch.randn(64, 4, H) * torch.logspace(-2, 3, 64)[:, None, None]  # 5 decades of magnitude
    q, scales = quantize_fp8(states)
    assert scales.shape == (64, 4) and q.dtype == torch.float8_e4m3fn
    rel = ((q.float() * scales[..., None] - states).norm(dim=-1) / states.norm(dim=-1)).max().item()
    assert rel < 0.05, "a per-token scale keeps small and large tokens alike"
    assert 0.5 < fp8.bytes / bf16.bytes < 0.51


def test_hash_blocks_cover_the_whole_file(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "HASH_BLOCK_BYTES", 4096)  # many blocks, a partial last one
    record, _ = write_shard(tmp_path / "s.safetensors", [100, 300, 7], chunk_bytes=8192, sync_bytes=20000)
    assert record.blocks_sha256 == blocks_sha256(tmp_path / "s.safetensors")
    data = bytearray((tmp_path / "s.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last (partial) block
    (tmp_path / "s.safetensors").write_bytes(bytes(data))
    assert record.blocks_sha256 != blocks_sha256(tmp_path / "s.safetensors")


def test_a_truncated_shard_is_refused_before_training_reads_it_naming_the_file(tmp_path):
    record, _ = write_shard(tmp_path / "data" / "shard-00000-train-0000.safetensors", [30, 30])
    path = tmp_path / "data" / "shard-00000-train-0000.safetensors"
    index = write_index(tmp_path, {path.name: ("train", 2, 60, record)})
    os.truncate(path, record.bytes - 100)
    with pytest.raises(
        DataError,
        match=r"shard .*shard-00000-train-0000.safetensors is truncated: "
        r"\d+ bytes on disk, \d+ written; delete the extract stage's manifest.json",
    ):
        read_index(index, stage_dir=tmp_path)
    assert verify_full(index) and "truncated" in verify_full(index)[0]


def test_swapped_shards_are_refused(tmp_path):
    a, _ = write_shard(tmp_path / "data" / "a.safetensors", [30, 30], seed=1)
    b, _ = write_shard(tmp_path / "data" / "b.safetensors", [30, 30], seed=2)  # same size, other states
    assert a.bytes == b.bytes
    index = write_index(tmp_path, {"a.safetensors": ("train", 2, 60, a), "b.safetensors": ("holdout", 2, 60, b)})
    read_index(index, stage_dir=tmp_path)
    shutil.move(tmp_path / "data" / "a.safetensors", tmp_path / "t")
    shutil.move(tmp_path / "data" / "b.safetensors", tmp_path / "data" / "a.safetensors")
    shutil.move(tmp_path / "t", tmp_path / "data" / "b.safetensors")
    with pytest.raises(DataError, match=r"a.safetensors is not the file extract wrote \(sampled sha256 differs"):
        read_index(index, stage_dir=tmp_path)


def test_a_failed_write_leaves_nothing_that_looks_complete(tmp_path):
    writer = ShardWriter(tmp_path / "s.safetensors", ShardPlan(10, 2, H), {"split": "train"})
    writer.add([1, 2, 3], [1, 1, 1], torch.randn(3, 4, H))
    with pytest.raises(ValueError, match=r"3 tokens / 1 sequences written, 10 / 2 planned"):
        writer.close()
    assert list(tmp_path.iterdir()) == []
    writer = ShardWriter(tmp_path / "s.safetensors", ShardPlan(10, 2, H), {"split": "train"})
    with pytest.raises(ValueError, match=r"states \(4, 4, 32\) for 3 ids"):
        writer.add([1, 2, 3], [1, 1, 1], torch.randn(4, 4, H))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_check_shard_names_a_missing_file(tmp_path):
    with pytest.raises(ShardError, match=r"shard .*gone.safetensors is missing"):
        check_shard(tmp_path / "gone.safetensors", {"bytes": 10})
