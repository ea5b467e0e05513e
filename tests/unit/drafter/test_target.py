"""The target's head as the trainer reads it (eagleflow.drafter.target): embedding, final norm and
lm_head from config.json and safetensors, tied embeddings, and a missing tensor named with its file.
Host environment (torch)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.target import read_target_head  # noqa: E402
from tests.helpers.drafter import H, V  # noqa: E402


def test_read_target_head(tmp_path):
    cfg = {
        "hidden_size": H,
        "vocab_size": V,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    emb = torch.randn(V, H).to(torch.bfloat16)
    save_file(
        {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(H)}, str(tmp_path / "model.safetensors")
    )
    head = read_target_head(tmp_path)
    assert torch.equal(head.lm_head, emb.float()) and head.rms_norm_eps == 1e-6  # tied: lm_head is the embedding
    cfg["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"'lm_head.weight' not found in .*model.safetensors"):
        read_target_head(tmp_path)
