"""The MLA preflight's pure rules (eagleflow.engines.preflight.mla): which vLLM model code can hand out the
final state, the engine version MLA targets need, the attention shape a config is selected for, and the
`--attention-backend` an operator passes. The engine itself is asked in
tests/integration/engines/test_preflight.py."""

from __future__ import annotations

import json

from eagleflow.engines.preflight.mla import (
    attention_head_size,
    captures_final_layer,
    check_engine_version,
    is_mla,
    selected_backend,
)
from tests.conftest import ROOT

KIMI = json.loads((ROOT / "tests" / "data" / "kimi-k25" / "config.json").read_text())

# DeepseekV2Model.forward before vLLM PR 46973: aux states captured only before each layer, inside the loop.
DEEPSEEK_BEFORE_FIX = """
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        aux_hidden_states = []
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            if idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        if len(aux_hidden_states) > 0:
            return hidden_states, aux_hidden_states
        return hidden_states
"""

# The same after the fix (vLLM 0.32 deepseek_v2.py): one more capture after the loop.
DEEPSEEK_AFTER_FIX = DEEPSEEK_BEFORE_FIX.replace(
    "        hidden_states, _ = self.norm(hidden_states, residual)\n",
    "        if self.end_layer in self.aux_hidden_state_layers:\n"
    "            aux_hidden_states.append(hidden_states + residual)\n"
    "        hidden_states, _ = self.norm(hidden_states, residual)\n",
)

# vLLM 0.32 llama.py: captured after each layer as id idx + 1.
LLAMA = """
class LlamaModel(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        aux_hidden_states: list[torch.Tensor] = []
        self._maybe_add_hidden_state(aux_hidden_states, self.start_layer, hidden_states, residual)
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
            self._maybe_add_hidden_state(aux_hidden_states, idx + 1, hidden_states, residual)
        return hidden_states, aux_hidden_states
"""


def test_the_final_state_is_capturable_only_after_the_fix():
    assert captures_final_layer(DEEPSEEK_BEFORE_FIX) is False
    assert captures_final_layer(DEEPSEEK_AFTER_FIX) is True
    assert captures_final_layer(LLAMA) is True
    assert captures_final_layer("def forward(self, x):\n    return x\n") is None  # no capture at all


def test_the_installed_vllm_sources_are_read_the_same_way():
    import importlib.util
    from pathlib import Path

    import pytest

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("no vLLM in this interpreter (the host environment runs this)")

    models = Path(spec.origin).parent / "model_executor" / "models"
    assert captures_final_layer((models / "deepseek_v2.py").read_text()) is True
    assert captures_final_layer((models / "llama.py").read_text()) is True


def test_engine_version_for_mla_targets():
    text = KIMI["text_config"]
    assert is_mla(text) and not is_mla({"hidden_size": 192, "num_attention_heads": 3})
    old = check_engine_version("0.11.2", text, "kimi/config.json")
    assert old.level == "error" and "0.18" in old.message and "kimi/config.json" in old.message
    assert check_engine_version("0.18.0", text, "x").level == "ok"
    assert check_engine_version("0.32.0+cpu", text, "x").level == "ok"


def test_attention_shapes_and_the_operators_backend():
    assert attention_head_size(KIMI["text_config"]) == 576  # kv_lora_rank 512 + qk_rope_head_dim 64
    assert attention_head_size({"hidden_size": 192, "num_attention_heads": 3}) == 64
    assert attention_head_size({"hidden_size": 192, "num_attention_heads": 3, "head_dim": 32}) == 32
    assert selected_backend(["--attention-backend", "TRITON_MLA"]) == "TRITON_MLA"
    assert selected_backend(["--max-num-seqs", "8", "--attention-backend=FLASHMLA"]) == "FLASHMLA"
    assert selected_backend(["--max-num-seqs", "8"]) is None
