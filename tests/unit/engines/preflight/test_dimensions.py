"""The shape checks (eagleflow.engines.preflight.dimensions): hidden and vocabulary sizes, lm_head,
d2t and fc shapes from safetensors headers, each mismatch named with both values."""

from __future__ import annotations

from eagleflow.engines.preflight.dimensions import check_dimensions


def _levels(findings) -> list[str]:
    return [f.level for f in findings]


def test_dimension_checks():
    target = {"hidden_size": 192, "vocab_size": 2048}
    good = {"hidden_size": 192, "vocab_size": 2048, "draft_vocab_size": 1024, "target_hidden_size": 192}
    shapes = {"lm_head.weight": [1024, 192], "d2t": [1024], "fc.weight": [192, 576]}
    assert _levels(check_dimensions("new", target, good, shapes, "d")) == ["ok"]
    no_d2t = check_dimensions("new", target, good, {k: v for k, v in shapes.items() if k != "d2t"}, "d")
    assert _levels(no_d2t) == ["error"] and "no d2t" in no_d2t[0].message
    full = check_dimensions(
        "new", target, {**good, "draft_vocab_size": 2048}, {**shapes, "lm_head.weight": [2048, 192]}, "d"
    )
    assert _levels(full) == ["error"] and "unexpected" in full[0].message
    wrong_vocab = check_dimensions("new", {**target, "vocab_size": 4096}, good, shapes, "d")
    assert "vocab_size is 2048, the target's is 4096" in wrong_vocab[0].message
