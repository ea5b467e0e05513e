"""The preflight's pure rules: the old vLLM eagle3 whitelist read from source text, the layer-id
conventions, the shape checks and the proposer's image-token field. No engine is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleflow.engines.preflight import (
    Finding,
    check_aux_layer_ids,
    check_dimensions,
    check_whitelist,
    drafter_fields,
    find_eagle3_whitelist,
    find_image_token_rule,
    format_findings,
    whitelist_admits,
)

# SpeculativeConfig._verify_args of vLLM ~0.11 (vllm/config/speculative.py), as the Kimi-K2 report met it.
OLD_SPECULATIVE_SOURCE = '''
class SpeculativeConfig:
    def _verify_args(self) -> Self:
        if self.num_speculative_tokens <= 0:
            raise ValueError("Expected num_speculative_tokens to be greater than zero.")
        eagle3_target_supported = ["llama", "qwen", "minicpm", "gpt_oss"]
        if (
            self.method == "eagle3"
            and self.target_model_config
            and not any(
                supported_model in self.target_model_config.hf_text_config.model_type
                for supported_model in eagle3_target_supported
            )
        ):
            raise ValueError(
                f"Eagle3 is only supported for {eagle3_target_supported} models. "  # noqa: E501
                f"Got {self.target_model_config.hf_text_config.model_type=}"
            )
        return self
'''

# vLLM ~0.10 (vllm/config.py): "qwen" admitted only beside a speculators-format drafter.
OLDER_CONFIG_SOURCE = '''
class SpeculativeConfig:
    def _verify_args(self):
        eagle3_target_supported = ["llama"]
        if self.draft_model_config and isinstance(
                self.draft_model_config.hf_config, SpeculatorsConfig):
            eagle3_target_supported.append("qwen")
        if self.method == "eagle3" and not any(m in t for m in eagle3_target_supported):
            raise ValueError(f"Eagle3 is only supported for {eagle3_target_supported} models.")
'''


def test_old_whitelist_is_found_in_source_text():
    wl = find_eagle3_whitelist(OLD_SPECULATIVE_SOURCE)
    assert wl is not None and wl.model_types == ["llama", "qwen", "minicpm", "gpt_oss"] and wl.conditional == []
    finding = check_whitelist(OLD_SPECULATIVE_SOURCE, "vllm/config/speculative.py", "kimi_k2", "0.11.0")
    assert finding.level == "error"
    assert "'kimi_k2'" in finding.message and "gpt_oss" in finding.message and "Eagle3 is only supported" in finding.message
    # The old rule is a substring match: qwen3_moe and llama4 passed it.
    assert check_whitelist(OLD_SPECULATIVE_SOURCE, "x", "qwen3_moe", "0.11.0").level == "ok"
    assert whitelist_admits(["llama"], "llama4") and not whitelist_admits(["llama"], "deepseek_v3")


def test_conditional_whitelist_entry_is_a_warning():
    wl = find_eagle3_whitelist(OLDER_CONFIG_SOURCE)
    assert wl is not None and wl.model_types == ["llama"] and wl.conditional == ["qwen"]
    assert check_whitelist(OLDER_CONFIG_SOURCE, "vllm/config.py", "qwen2", "0.10.0").level == "warning"
    assert check_whitelist(OLDER_CONFIG_SOURCE, "vllm/config.py", "mistral", "0.10.0").level == "error"


def test_no_whitelist_passes():
    assert find_eagle3_whitelist("class SpeculativeConfig:\n    pass\n") is None
    assert check_whitelist("x = 1\n", "vllm/config/speculative.py", "kimi_k2", "0.32.0").level == "ok"
    installed = Path(__file__).resolve().parents[2] / ".hostenv/lib/python3.11/site-packages/vllm/config/speculative.py"
    if installed.is_file():  # the vLLM this project serves with (0.32) has none
        assert find_eagle3_whitelist(installed.read_text()) is None


def _levels(findings: list[Finding]) -> list[str]:
    return [f.level for f in findings]


def test_layer_ids_shift_between_conventions():
    (f,) = check_aux_layer_ids("new", [1, 30, 57], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and "one below" in f.message and "[2, 31, 58]" in f.message
    (f,) = check_aux_layer_ids("new", [3, 32, 59], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and "one above" in f.message
    (f,) = check_aux_layer_ids("new", [2, 31, 58], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "ok"
    # SGLang adds 1 itself: there the config must hold the training ids minus one.
    (f,) = check_aux_layer_ids("new", [1, 30, 57], 61, None, [2, 31, 58], 3, engine_kind="sglang")
    assert f.level == "ok"
    (f,) = check_aux_layer_ids("new", [2, 31, 58], 61, None, [2, 31, 58], 3, engine_kind="sglang")
    assert f.level == "error" and "one above" in f.message and "[1, 30, 57]" in f.message


def test_layer_ids_without_training_ids():
    (f,) = check_aux_layer_ids("new", [1, 29, 57], 61, [2, 30, 58], None, 3)  # SpecForge [1, L/2-1, L-4]
    assert f.level == "warning" and "other convention" in f.message and "[2, 30, 58]" in f.message
    assert _levels(check_aux_layer_ids("new", [2, 30, 58], 61, [2, 30, 58], None, 3)) == ["ok"]
    errs = check_aux_layer_ids("new", [2, 30, 61], 61, [2, 30, 58], None, 3)
    assert _levels(errs) == ["error"] and "final state" in errs[0].message
    errs = check_aux_layer_ids("new", [2, 30, 70], 61, [2, 30, 58], None, 3)
    assert _levels(errs) == ["error"] and "never captured" in errs[0].message
    errs = check_aux_layer_ids("new", [2, 30], 61, [2, 30, 58], None, 3)
    assert "error" in _levels(errs) and "fc takes 3" in errs[0].message
    assert "warning" in _levels(check_aux_layer_ids("new", [30, 2, 58], 61, [2, 30, 58], None, 3))


def test_missing_layer_ids_name_the_engine_default():
    (f,) = check_aux_layer_ids("new", None, 61, [2, 30, 58], None, 3)
    assert f.level == "warning" and "[2, 30, 58]" in f.message
    (f,) = check_aux_layer_ids("new", None, 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and '"eagle_aux_hidden_state_layer_ids": [2, 31, 58]' in f.message


def test_drafter_fields_read_every_layout():
    assert drafter_fields({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})[
        "eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    spec = drafter_fields({"speculators_model_type": "eagle3", "draft_vocab_size": 32000,
                           "transformer_layer_config": {"hidden_size": 7168, "vocab_size": 163840},
                           "eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    assert (spec["hidden_size"], spec["vocab_size"], spec["draft_vocab_size"]) == (7168, 163840, 32000)
    assert drafter_fields({"hidden_size": 8})["eagle_aux_hidden_state_layer_ids"] is None


def test_dimension_checks():
    target = {"hidden_size": 192, "vocab_size": 2048}
    good = {"hidden_size": 192, "vocab_size": 2048, "draft_vocab_size": 1024, "target_hidden_size": 192}
    shapes = {"lm_head.weight": [1024, 192], "d2t": [1024], "fc.weight": [192, 576]}
    assert _levels(check_dimensions("new", target, good, shapes, "d")) == ["ok"]
    no_d2t = check_dimensions("new", target, good, {k: v for k, v in shapes.items() if k != "d2t"}, "d")
    assert _levels(no_d2t) == ["error"] and "no d2t" in no_d2t[0].message
    full = check_dimensions("new", target, {**good, "draft_vocab_size": 2048},
                            {**shapes, "lm_head.weight": [2048, 192]}, "d")
    assert _levels(full) == ["error"] and "unexpected" in full[0].message
    wrong_vocab = check_dimensions("new", {**target, "vocab_size": 4096}, good, shapes, "d")
    assert "vocab_size is 2048, the target's is 4096" in wrong_vocab[0].message


PROPOSER_SNIPPET = '''
class SpecDecodeBaseProposer:
    def load_model(self, target_model):
        if supports_multimodal(target_model):
            if self.get_model_name(target_model) in ["Qwen2_5_VLForConditionalGeneration"]:
                self.model.config.image_token_index = target_model.config.image_token_id
            elif self.get_model_name(target_model) == "PixtralForConditionalGeneration":
                self.model.config.image_token_index = (
                    target_model.config.vision_config.image_token_id
                )
            elif self.get_model_name(target_model) in ("KimiK25ForConditionalGeneration",):
                self.model.config.image_token_index = target_model.config.media_placeholder_token_id
            else:
                self.model.config.image_token_index = target_model.config.image_token_index
'''


def test_image_token_rule_from_proposer_source():
    rule = find_image_token_rule(PROPOSER_SNIPPET)
    assert rule is not None
    assert rule.by_class == {"Qwen2_5_VLForConditionalGeneration": "config.image_token_id",
                             "PixtralForConditionalGeneration": "config.vision_config.image_token_id",
                             "KimiK25ForConditionalGeneration": "config.media_placeholder_token_id"}
    assert rule.default == "config.image_token_index"
    assert find_image_token_rule("def load_model(self):\n    pass\n") is None


@pytest.mark.parametrize("level", ["ok", "warning", "error"])
def test_format_findings_puts_errors_first(level):
    text = format_findings([Finding("a", "ok", "fine"), Finding("b", level, "x")])
    assert text.splitlines()[0].startswith("ERROR" if level == "error" else ("WARNING" if level == "warning" else "OK"))
