"""Trainer checkpoints (eagleflow.drafter.checkpoint): what is saved loads back (arch, weights, the
draft vocabulary), written to a temp dir and renamed, with its provenance. Host environment (torch)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.checkpoint import (  # noqa: E402
    CHECKPOINT_META,
    CHECKPOINT_STATE,
    CHECKPOINT_WEIGHTS,
    load_checkpoint,
    save_checkpoint,
)
from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from tests.helpers.drafter import V, make_model  # noqa: E402


def test_checkpoint_roundtrip(tmp_path):
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(0, 32, 2), V)
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"aux_layer_ids": [1, 2, 3], "epoch": 1})
    arch, weights, vocab2, meta = load_checkpoint(tmp_path / "ckpt")
    assert arch == model.arch and torch.equal(vocab2.draft_to_target, vocab.draft_to_target)
    torch.testing.assert_close(weights["fc.weight"], model.fc.weight)
    assert "d2t" not in weights and "t2d" not in weights  # the vocabulary comes back as `vocab`
    assert (meta["epoch"], meta["aux_layer_ids"], meta["draft_vocab_size"]) == (1, [1, 2, 3], 16)
    assert meta["provenance"]["eagleflow"] and meta["provenance"]["torch"] == torch.__version__


def test_checkpoint_is_written_whole_or_not_at_all(tmp_path):
    """A rewrite replaces the directory as a unit (no temp dir left), and an incomplete one is named."""
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16), V)
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"epoch": 1}, trainer_state={"step": 3})
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"epoch": 2})  # no trainer state this time
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted([CHECKPOINT_META, CHECKPOINT_WEIGHTS])
    assert json.loads((tmp_path / "ckpt" / CHECKPOINT_META).read_text())["epoch"] == 2
    assert not (tmp_path / "ckpt" / CHECKPOINT_STATE).exists()  # nothing of the old unit survives
    (tmp_path / "ckpt" / CHECKPOINT_WEIGHTS).unlink()
    with pytest.raises(FormatError, match=f"{CHECKPOINT_WEIGHTS} is missing"):
        load_checkpoint(tmp_path / "ckpt")
