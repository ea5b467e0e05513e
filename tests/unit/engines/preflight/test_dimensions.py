"""The shape checks (eagleflow.engines.preflight.dimensions): hidden and vocabulary sizes, lm_head,
d2t and fc shapes from safetensors headers, each mismatch named with both values."""

from __future__ import annotations

from eagleflow.engines.preflight.dimensions import check_dimensions, check_state_norms


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


def test_state_norms_match_the_flag_that_builds_them():
    """EAGLE 3.1's per-state norms load only into norms the engine built from config.json's flag: weights
    without the flag, or the flag without (all) the weights, draft from states the drafter was not trained on."""
    cfg = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "fc_norm": True}
    norms = {f"fc_norm.{i}.weight": [192] for i in range(3)}
    shapes = {"fc.weight": [192, 576], **norms}
    assert check_state_norms("new", cfg, shapes, "d", "sglang").level == "ok"
    assert check_state_norms("new", {**cfg, "fc_norm": False}, {"fc.weight": [192, 576]}, "d", "vllm") is None
    dropped = check_state_norms("new", {**cfg, "fc_norm": False}, shapes, "d", "sglang")
    assert dropped.level == "error" and dropped.check == "state_norms[new]"
    assert (
        "fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight" in dropped.message
        and '"fc_norm": true' in dropped.message
    )
    # SGLang also builds them from the legacy flag and renames the legacy weights; vLLM reads only fc_norm
    legacy = {
        "fc.weight": [192, 576],
        "aux_norm_low.weight": [192],
        "aux_norm_mid.weight": [192],
        "aux_norm_high.weight": [192],
    }
    old = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_norm": True}
    assert check_state_norms("new", old, legacy, "d", "sglang").level == "ok"
    assert check_state_norms("new", old, legacy, "d", "vllm").level == "error"
    unset = check_state_norms("new", cfg, {"fc.weight": [192, 576], "fc_norm.0.weight": [192]}, "d", "vllm")
    assert unset.level == "error" and "only fc_norm.0.weight" in unset.message and "3 states" in unset.message
    none = check_state_norms("new", cfg, {"fc.weight": [192, 576]}, "d", "vllm")
    assert none.level == "error" and "no fc_norm" in none.message
    assert check_state_norms("new", {**cfg, "speculators_model_type": "eagle3"}, {}, "d", "vllm") is None
