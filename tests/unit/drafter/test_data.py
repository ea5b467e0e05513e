"""The extract stage's shards as training data (eagleflow.drafter.data): sequences, seeded length-
bucketed batches, collation into aux/final states, and how a batch is dealt to micro-batches.
Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.data import SequenceStore, collate, make_batches, read_index, split_batch  # noqa: E402
from tests.helpers.drafter import H, write_synthetic  # noqa: E402


def test_data_batches(tmp_path):
    root = write_synthetic(tmp_path)
    index = read_index(root / "data" / "index.json", stage_dir=root)
    store = SequenceStore(index.split("train"), max_seq_len=20)
    assert len(store) == 24 and max(store.lengths()) <= 20
    batches = make_batches(store.lengths(), 64, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(24))
    assert all(len(b) * max(store.lengths()[i] for i in b) <= 64 for b in batches)
    assert batches == make_batches(store.lengths(), 64, seed=3)  # seeded, reproducible
    batch = collate(store, batches[0])
    i = batches[0][0]
    ids, _ = store.tokens(i)
    n = store.refs[i].length
    assert torch.equal(batch.input_ids[0, :n], ids)
    hid = store.hidden(i).float()
    torch.testing.assert_close(batch.aux[0, :n], hid[:, :3].reshape(n, 3 * H))
    torch.testing.assert_close(batch.final[0, :n], hid[:, 3])


def test_split_batch():
    lengths = [5, 9, 3, 7, 8]
    parts = split_batch([0, 1, 2, 3, 4], lengths, 2)
    assert parts == [[1, 3, 2], [4, 0]]
    assert split_batch([2, 0], lengths, 4) == [[0], [2], [], []]
    assert split_batch([2, 0], lengths, 1) == [[2, 0]]
