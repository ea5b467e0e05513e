"""The draft vocabulary (eagleflow.drafter.vocab): top-k of the answer tokens, d2t offsets and the
t2d mask as vLLM and SGLang read them, the full vocabulary, token counting. Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.vocab import DraftVocab, count_tokens  # noqa: E402


def test_draft_vocab_top_k_and_offsets():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    vocab = DraftVocab.from_counts(counts, 4)
    assert vocab.draft_to_target.tolist() == [0, 2, 3, 5]
    draft_ids = torch.arange(vocab.size)
    assert (draft_ids + vocab.d2t).tolist() == [0, 2, 3, 5]  # target_id = draft_id + d2t[draft_id]
    assert vocab.t2d.tolist() == [True, False, True, True, False, True, False, False]
    back = DraftVocab.from_d2t(vocab.d2t, 8)
    assert torch.equal(back.draft_to_target, vocab.draft_to_target)
    assert torch.equal(vocab.t2d.nonzero().flatten(), vocab.draft_to_target)
    assert not vocab.is_full


def test_draft_vocab_full_and_fill():
    full = DraftVocab.from_counts(torch.tensor([1, 2, 3]), 10)
    assert full.is_full and full.size == 3 and full.d2t.tolist() == [0, 0, 0]
    sparse = DraftVocab.from_counts(torch.tensor([0, 0, 4, 0, 0, 0]), 3)  # unseen ids fill, lowest first
    assert sparse.draft_to_target.tolist() == [0, 1, 2]
    ids = torch.tensor([1, 2, 2, 7])
    assert count_tokens(ids, torch.tensor([0, 1, 1, 1]), 8).tolist() == [0, 0, 2, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        count_tokens(ids, torch.ones(4), 5)
