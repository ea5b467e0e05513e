"""The preflight's rules read from vLLM's source text (eagleflow.engines.preflight.vllm_source): the
old EAGLE-3 target whitelist of SpeculativeConfig, and the proposer's image-token field for
multimodal targets, and the drafter options a drafter's model module reads. No engine is imported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eagleflow.engines.preflight.vllm_source import (
    check_drafter_options,
    check_whitelist,
    find_eagle3_whitelist,
    find_image_token_rule,
    whitelist_admits,
)

# SpeculativeConfig._verify_args of vLLM ~0.11 (vllm/config/speculative.py), as the Kimi-K2 report met it.
OLD_SPECULATIVE_SOURCE = """
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
"""

# vLLM ~0.10 (vllm/config.py): "qwen" admitted only beside a speculators-format drafter.
OLDER_CONFIG_SOURCE = """
class SpeculativeConfig:
    def _verify_args(self):
        eagle3_target_supported = ["llama"]
        if self.draft_model_config and isinstance(
                self.draft_model_config.hf_config, SpeculatorsConfig):
            eagle3_target_supported.append("qwen")
        if self.method == "eagle3" and not any(m in t for m in eagle3_target_supported):
            raise ValueError(f"Eagle3 is only supported for {eagle3_target_supported} models.")
"""

PROPOSER_SNIPPET = """
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
"""


def test_old_whitelist_is_found_in_source_text():
    wl = find_eagle3_whitelist(OLD_SPECULATIVE_SOURCE)
    assert wl is not None and wl.model_types == ["llama", "qwen", "minicpm", "gpt_oss"] and wl.conditional == []
    finding = check_whitelist(OLD_SPECULATIVE_SOURCE, "vllm/config/speculative.py", "kimi_k2", "0.11.0")
    assert finding.level == "error"
    assert (
        "'kimi_k2'" in finding.message
        and "gpt_oss" in finding.message
        and "Eagle3 is only supported" in finding.message
    )
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
    spec = importlib.util.find_spec("vllm")  # where this environment's vLLM is, on any Python (not imported)
    if spec is not None:  # the vLLM this project serves with (0.32) has none
        installed = Path(spec.origin).parent / "config" / "speculative.py"
        assert installed.is_file(), installed
        assert find_eagle3_whitelist(installed.read_text()) is None


def test_image_token_rule_from_proposer_source():
    rule = find_image_token_rule(PROPOSER_SNIPPET)
    assert rule is not None
    assert rule.by_class == {
        "Qwen2_5_VLForConditionalGeneration": "config.image_token_id",
        "PixtralForConditionalGeneration": "config.vision_config.image_token_id",
        "KimiK25ForConditionalGeneration": "config.media_placeholder_token_id",
    }
    assert rule.default == "config.image_token_index"
    assert find_image_token_rule("def load_model(self):\n    pass\n") is None


# The EAGLE-3 drafter layer before and after EAGLE 3.1's options reached vLLM (llama_eagle3.py, abridged).
DRAFTER_BEFORE = """
class LlamaModel(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        self.norm_before_fc = getattr(self.config, "norm_before_fc", False)
"""
DRAFTER_AFTER = (
    DRAFTER_BEFORE
    + """
        self.norm_output = getattr(self.config, "norm_output", False)
        self.fc_norm = getattr(self.config, "fc_norm", False)
"""
)


def test_a_drafter_option_the_engine_never_reads_is_an_error_naming_it_and_the_fix():
    cfg = {"norm_output": True, "norm_before_fc": True}
    bad = check_drafter_options("new", cfg, "d/config.json", DRAFTER_BEFORE, "vllm/x.py", "0.20.0")
    assert bad.level == "error" and "norm_output" in bad.message and "train.norm_output: false" in bad.message
    good = check_drafter_options("new", cfg, "d/config.json", DRAFTER_AFTER, "vllm/x.py", "0.32.0")
    assert good.level == "ok" and "vllm/x.py" in good.message
    assert check_drafter_options("new", {"norm_output": False}, "d/config.json", DRAFTER_BEFORE, "x", "0") is None
