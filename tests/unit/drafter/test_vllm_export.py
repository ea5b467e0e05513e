"""The vLLM export (eagleflow.drafter.vllm_export): the drafter directory vLLM loads as EAGLE-3,
its tensor names, dtypes and shapes, d2t/t2d, config.json, and the names landing exactly on the
parameters of vLLM 0.32's Eagle3LlamaForCausalLM. Host environment (torch)."""

from __future__ import annotations

import importlib
import json

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402

from eagleflow.drafter.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.vllm_export import export_vllm, vllm_weight_names  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from tests.helpers.drafter import H, V, make_model  # noqa: E402


def test_vllm_export_layout(tmp_path):
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(0, 32, 2), V)
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"aux_layer_ids": [1, 2, 3], "epoch": 1})
    arch = load_checkpoint(tmp_path / "ckpt")[0]

    out = export_vllm(tmp_path / "ckpt", tmp_path / "vllm", [1, 2, 3])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert tuple(f.get_tensor("layers.0.self_attn.q_proj.weight").shape) == (4 * 8, 2 * H)
        assert tuple(f.get_tensor("lm_head.weight").shape) == (16, H)
    assert names == vllm_weight_names(arch, vocab)
    assert "embed_tokens.weight" not in names  # vLLM shares the target's embedding
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (V,)
    assert (torch.arange(16) + d2t).tolist() == list(range(0, 32, 2))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["num_hidden_layers"]) == (V, 16, 1)
    assert cfg["target_hidden_size"] == H and cfg["norm_before_fc"] is True
    with pytest.raises(FormatError, match="trained on aux layers"):
        export_vllm(tmp_path / "ckpt", tmp_path / "vllm2", [2, 3, 4])


def test_export_names_land_on_vllm_parameters(tmp_path):
    """Our names, renamed the way vLLM 0.32's Eagle3LlamaForCausalLM.load_weights and its
    LlamaModel.hf_to_vllm_mapper rename them, are exactly the drafter's vLLM parameters."""
    pytest.importorskip("vllm")  # the control environment has no engine; with vLLM, a renamed module fails
    llama_eagle3 = importlib.import_module("vllm.model_executor.models.llama_eagle3")
    model = make_model(draft_vocab_size=16)
    names = vllm_weight_names(model.arch, DraftVocab(torch.arange(16), V))
    assert set(names) == set(model.state_dict()) | {"d2t", "t2d"}
    mapped = set()
    for name in names:
        if "t2d" in name:
            continue  # skipped by vLLM
        if "d2t" in name:
            mapped.add("draft_id_to_target_id")
        elif "lm_head" in name:
            mapped.add(name)
        else:
            mapped.update("model." + n for n in llama_eagle3.LlamaModel.hf_to_vllm_mapper.apply_list([name]))
    layer = "model.layers.0."
    vllm_params = {
        "model.fc.weight",
        "model.input_norm.weight",
        "model.norm.weight",
        "lm_head.weight",
        "draft_id_to_target_id",
        layer + "self_attn.qkv_proj.weight",
        layer + "self_attn.o_proj.weight",
        layer + "mlp.gate_up_proj.weight",
        layer + "mlp.down_proj.weight",
        layer + "input_layernorm.weight",
        layer + "hidden_norm.weight",
        layer + "post_attention_layernorm.weight",
    }
    assert mapped == vllm_params
