"""A trainer checkpoint -> the drafter directory vLLM loads as EAGLE-3.

vLLM layout (`LlamaForCausalLMEagle3`, vllm/model_executor/models/llama_eagle3.py, vLLM 0.32):
checkpoint names are the module names below `model.` (the loader prefixes `model.` to every name
without `lm_head`, maps `q/k/v_proj` -> `qkv_proj` and `gate/up_proj` -> `gate_up_proj`):

    fc.weight                                   [H, 3*H_target]
    input_norm.weight                           [3*H_target]     only with norm_before_fc
    layers.0.input_layernorm.weight             [H]              normalises the token embedding
    layers.0.hidden_norm.weight                 [H]              normalises the fed hidden state
    layers.0.self_attn.{q,k,v}_proj.weight      [heads*hd, 2*H]
    layers.0.self_attn.o_proj.weight            [H, heads*hd]
    layers.0.post_attention_layernorm.weight    [H]
    layers.0.mlp.{gate,up}_proj.weight          [I, H];  layers.0.mlp.down_proj.weight [H, I]
    norm.weight                                 [H]
    lm_head.weight                              [draft_vocab_size, H]
    d2t                                         int64 [draft_vocab_size]: target_id = draft_id + d2t[draft_id]
    t2d                                         bool [vocab_size] (vLLM and SGLang 0.5.15 skip it)
                                                both only when the draft vocabulary is smaller than
                                                the target's: vLLM allocates draft_id_to_target_id
                                                only then, and an unexpected d2t fails its loader

No `embed_tokens`: vLLM then shares the target's embedding. The config.json is a Llama config with
`architectures: ["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `vocab_size` = the target's,
`draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` (vLLM convention: the
input to decoder layer k; read by the target's model runner to pick the states), `norm_before_fc`,
`norm_before_residual`.

MLA drafters (`DrafterArch.attention == "mla"`) are vLLM's `Eagle3DeepseekV2ForCausalLM`
(vllm/model_executor/models/deepseek_eagle3.py, vLLM 0.32): `model_type: deepseek_v2` (not
`deepseek_v3`: vLLM's speculative config turns a deepseek_v3 draft into MTP). The loader prefixes
`model.`, renames `midlayer.` -> `layers.0.` and stacks `q_a_proj` + `kv_a_proj_with_mqa` ->
`fused_qkv_a_proj`, `gate/up_proj` -> `gate_up_proj`. In place of the attention names above:

    layers.0.self_attn.q_a_proj.weight              [q_lora_rank, 2*H]       (no q_proj: vLLM 0.32's loader
    layers.0.self_attn.q_a_layernorm.weight         [q_lora_rank]             stacks kv_a_proj_with_mqa into
                                                                              fused_qkv_a_proj, which exists
                                                                              only with q_lora_rank)
    layers.0.self_attn.q_b_proj.weight              [nh*(nope+rope), q_lora_rank]
    layers.0.self_attn.kv_a_proj_with_mqa.weight    [kv_lora_rank+rope, 2*H]
    layers.0.self_attn.kv_a_layernorm.weight        [kv_lora_rank]
    layers.0.self_attn.kv_b_proj.weight             [nh*(nope+v_head_dim), kv_lora_rank]
    layers.0.self_attn.o_proj.weight                [H, nh*v_head_dim]
    fc_norm.{0,1,2}.weight                          [H_target]  per-state norms (config `fc_norm: true`);
                                                    there is no input_norm in vLLM's MLA drafter

The config carries the MLA dims (kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
v_head_dim) and the default rotary on the rope dims (interleaved), written as YaRN with factor 1 (`NEUTRAL_YARN`:
the same rotation, and the only rope config vLLM 0.26's MLA drafter loads); the MoE fields are left at
DeepseekV2Config's defaults (vLLM's drafter layer is always a dense MLP).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.checkpoint import load_checkpoint, vocab_tensors
from eagleflow.drafter.errors import FormatError
from eagleflow.drafter.vocab import DraftVocab
from eagleflow.util.files import fresh_temp_dir, replace_dir

VLLM_ARCHITECTURE = "LlamaForCausalLMEagle3"
VLLM_MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"


def attention_weight_names(arch: DrafterArch) -> list[str]:
    """The attention's projections and norms, under `layers.0.self_attn.`."""
    if arch.attention != "mla":
        return ["q_proj", "k_proj", "v_proj", "o_proj"]
    return ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"]


def vllm_weight_names(arch: DrafterArch, vocab: DraftVocab) -> list[str]:
    names = ["fc.weight", "norm.weight", "lm_head.weight"]
    if arch.norm_before_fc:
        names.append("input_norm.weight")
    if arch.fc_norm:
        names += [f"fc_norm.{i}.weight" for i in range(arch.num_aux_hidden_states)]
    layer = "layers.0."
    names += [layer + n + ".weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
    names += [f"{layer}self_attn.{p}.weight" for p in attention_weight_names(arch)]
    names += [f"{layer}mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    if not vocab.is_full:
        names += ["d2t", "t2d"]
    return sorted(names)


def neutral_yarn(arch: DrafterArch) -> dict:
    """The default rotary embedding written as DeepSeek YaRN with factor 1: the same cos/sin cache and an mscale of
    1, so the same rotation (checked against vLLM's own DeepseekScalingRotaryEmbedding: identical outputs). vLLM
    0.26's MLA EAGLE-3 drafter (models/deepseek_eagle3.py) reads `rope_scaling`, which transformers 5 aliases to
    `rope_parameters` and so is never empty: it takes any rope config for DeepSeek YaRN and failed on the H200
    with "KeyError: 'factor'" at engine start for `{rope_type: default}`."""
    return {
        "rope_type": "yarn",
        "factor": 1.0,
        "original_max_position_embeddings": arch.max_position_embeddings,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "rope_theta": arch.rope_theta,
    }


def vllm_config(
    arch: DrafterArch,
    aux_layer_ids: list[int],
    dtype: str = "bfloat16",
    extra: dict[str, Any] | None = None,
    eagle_config_ids: list[int] | None = None,
) -> dict[str, Any]:
    """config.json of the drafter as vLLM 0.32 reads it: a LlamaConfig (or, for MLA, a DeepseekV2Config) plus the
    EAGLE-3 keys. `eagle_config_ids`: the ids eagle_config names when they differ from the top level's (SGLang reads
    only eagle_config's, in its own convention; vLLM reads the top level first), else the same ids."""
    if len(aux_layer_ids) != arch.num_aux_hidden_states:
        raise FormatError(
            f"{len(aux_layer_ids)} aux layer ids {aux_layer_ids} for a drafter trained on "
            f"{arch.num_aux_hidden_states} target states"
        )
    common = {  # what vLLM's EAGLE-3 loader reads from either layout
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": arch.num_attention_heads,
        "hidden_act": "silu",
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "max_position_embeddings": arch.max_position_embeddings,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": arch.vocab_size,
        "draft_vocab_size": arch.draft_vocab_size,
        "target_hidden_size": arch.target_hidden_size,
        "num_aux_hidden_states": arch.num_aux_hidden_states,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "norm_before_residual": arch.norm_before_residual,
        "norm_output": arch.norm_output,
        "torch_dtype": dtype,
        "dtype": dtype,
        **({"eagleflow": extra} if extra else {}),
    }
    eagle = {"eagle_aux_hidden_state_layer_ids": list(eagle_config_ids or aux_layer_ids), "use_aux_hidden_state": True}
    if arch.attention == "mla":
        # a DeepseekV2Config as vLLM 0.32's Eagle3DeepseekV2ForCausalLM reads it
        return {
            "architectures": [VLLM_MLA_ARCHITECTURE],
            "model_type": "deepseek_v2",  # deepseek_v3 would make vLLM treat the draft as MTP
            **common,
            "rope_parameters": neutral_yarn(arch),
            "rope_scaling": neutral_yarn(arch),
            "moe_intermediate_size": arch.intermediate_size,
            "num_key_value_heads": arch.num_attention_heads,
            "q_lora_rank": arch.q_lora_rank,
            "kv_lora_rank": arch.kv_lora_rank,
            "qk_nope_head_dim": arch.qk_nope_head_dim,
            "qk_rope_head_dim": arch.qk_rope_head_dim,
            "v_head_dim": arch.v_head_dim,
            "head_dim": arch.qk_rope_head_dim,  # DeepseekV2Config's meaning: the rotary dims
            "fc_norm": arch.fc_norm,
            "eagle_config": eagle,
        }
    return {
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "llama",
        **common,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "mlp_bias": False,
        "norm_before_fc": arch.norm_before_fc,
        "fc_norm": arch.fc_norm,  # EAGLE 3.1's per-state norms (a warm start from such a drafter keeps them)
        "eagle_config": {**eagle, "norm_before_fc": arch.norm_before_fc},
    }


def export_vllm(
    checkpoint: str | Path,
    out_dir: str | Path,
    aux_layer_ids: list[int],
    dtype: str = "bfloat16",
    eagle_config_ids: list[int] | None = None,
) -> Path:
    """Write `out_dir/` (config.json + model.safetensors) from a trainer checkpoint; temp dir, then rename."""
    arch, weights, vocab, meta = load_checkpoint(checkpoint)
    trained_on = meta.get("aux_layer_ids")
    if trained_on is not None and list(trained_on) != list(aux_layer_ids):
        raise FormatError(
            f"the drafter in {checkpoint} was trained on aux layers {trained_on} but the export asks for "
            f"{aux_layer_ids}: serving it with other layers collapses acceptance; retrain or fix target.aux_layer_ids"
        )
    torch_dtype = getattr(torch, dtype)
    tensors = {n: w.to(torch_dtype).contiguous() for n, w in weights.items()}
    tensors.update(vocab_tensors(vocab))
    expected = vllm_weight_names(arch, vocab)
    if sorted(tensors) != expected:
        raise FormatError(f"checkpoint {checkpoint} has tensors {sorted(tensors)}, expected {expected}")
    final = Path(out_dir)
    tmp = fresh_temp_dir(final)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    extra = {
        "checkpoint": str(checkpoint),
        "epoch": meta.get("epoch"),
        "provenance": meta.get("provenance"),
        "validation": meta.get("validation"),
    }
    config = vllm_config(arch, aux_layer_ids, dtype, extra, eagle_config_ids)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    replace_dir(tmp, final)
    return final
