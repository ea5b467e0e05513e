"""Warm starts from drafters laid out as the public projects lay them out, written here from the loaders' own
source, not from eagleflow's writer (tests/helpers/drafter.py's `write_public_drafter` is eagleflow's reading of
those layouts; these files are the projects'). What each file holds, and where it was read (2026-12-03):

- vLLM `llama_eagle3.py` (0.26 and 0.32, `Eagle3LlamaForCausalLM.load_weights` and `LlamaModel.hf_to_vllm_mapper`):
  `layers.0.*` or `midlayer.*`, q/k/v [heads*hd, 2H], fc [H, 3 Ht], optional `fc_norm.{i}` [Ht] (config `fc_norm`,
  EAGLE 3.1) and `input_norm` [3 Ht] (`norm_before_fc`), `lm_head` [Vd, H], d2t int64 offsets [Vd], t2d bool [V]
  (skipped); config: `draft_vocab_size`, `target_hidden_size`, `norm_before_residual`, `norm_output`, `fc_norm`,
  `eagle_config.eagle_aux_hidden_state_layer_ids` (vLLM's count: the input of layer k).
- SpecForge `specforge/modeling/draft/llama3_eagle.py` (`LlamaForCausalLMEagle3`), as SGLang's `llama_eagle3.py`
  loads it: `midlayer.*`, `embed_tokens` [V, H], d2t and t2d always, fc [H, 3 Ht], `fc_norm.{0,1,2}` with
  `fc_norm`; config `eagle_config.eagle_aux_hidden_state_layer_ids` counting the output of layer k (SGLang adds 1),
  no `norm_before_residual` (the residual is the raw hidden state), `norm_output` meaning only that the logits
  come from the normed state (its next step is fed the pre-norm one; configs/qwen3-30B-A3B-eagle3.1.json sets it).
- speculators 0.9.0 (`speculators/models/eagle3/core.py`, the saved state_dict of `Eagle3DraftModel`):
  `layers.0.*`, `embed_tokens` [V, H] saved, fc [H, 3 H], `lm_head` [Vd, H], d2t/t2d only when Vd < V; config:
  `speculators_model_type: eagle3`, `speculators_config`, the layer's shape in `transformer_layer_config`, and at
  the top `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids` (vLLM's count), the norm flags.
- vLLM `deepseek_eagle3.py` (`Eagle3DeepseekV2ForCausalLM`): `self_attn.{q_a_proj [rq, 2H], q_a_layernorm,
  q_b_proj [heads*(dn+dr), rq], kv_a_proj_with_mqa [rkv+dr, 2H], kv_a_layernorm, kv_b_proj [heads*(dn+dv), rkv],
  o_proj [H, heads*dv]}`, a dense MLP, `fc_norm.{i}`; config `model_type: deepseek_v3`, the MLA dims. SGLang's
  `deepseek_eagle3.py` also loads a drafter without q_lora_rank (`q_proj`), which vLLM cannot load.

Each is read through the warm start (the trainer's setup) onto eagleflow's drafter: its tensors land where its
loader would put them, its draft vocabulary is kept, its norms and aux layers mean what its project meant.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from eagleflow.config.train import TrainConfig  # noqa: E402
from eagleflow.drafter.data import read_index  # noqa: E402
from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.target import read_target_head  # noqa: E402
from eagleflow.drafter.warm_start import check_warm_start, read_public_drafter  # noqa: E402
from tests.helpers.drafter import H, V, write_synthetic  # noqa: E402

AUX = [1, 2, 3]  # the run's target states (vLLM's count) on write_synthetic's 4-layer target
VD = 16
DRAFT_IDS = torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 33, 35, 37, 39])  # [Vd] target ids
HEADS, KV_HEADS, HD, INTER = 4, 2, 8, 40
MLA_DIMS = dict(q_lora_rank=10, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)


def rnd(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)  # published in bf16


def vocab_tensors() -> dict[str, torch.Tensor]:
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[DRAFT_IDS] = True
    return {"d2t": DRAFT_IDS - torch.arange(VD), "t2d": t2d}  # offsets: target id = draft id + d2t[draft id]


def llama_layer(prefix: str) -> dict[str, torch.Tensor]:
    t = {
        f"{prefix}self_attn.q_proj.weight": rnd(HEADS * HD, 2 * H),
        f"{prefix}self_attn.k_proj.weight": rnd(KV_HEADS * HD, 2 * H),
        f"{prefix}self_attn.v_proj.weight": rnd(KV_HEADS * HD, 2 * H),
        f"{prefix}self_attn.o_proj.weight": rnd(H, HEADS * HD),
    }
    return {**t, **mlp_and_norms(prefix)}


def mlp_and_norms(prefix: str) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}mlp.gate_proj.weight": rnd(INTER, H),
        f"{prefix}mlp.up_proj.weight": rnd(INTER, H),
        f"{prefix}mlp.down_proj.weight": rnd(H, INTER),
        **{f"{prefix}{n}.weight": rnd(H) + 1 for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")},
    }


def heads(fc_norm: bool = False, input_norm: bool = False) -> dict[str, torch.Tensor]:
    t = {"fc.weight": rnd(H, 3 * H), "norm.weight": rnd(H) + 1, "lm_head.weight": rnd(VD, H)}
    if fc_norm:
        t.update({f"fc_norm.{i}.weight": rnd(H) + 1 for i in range(3)})
    if input_norm:
        t["input_norm.weight"] = rnd(3 * H) + 1
    return t


LLAMA_CONFIG = {
    "hidden_size": H,
    "intermediate_size": INTER,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HD,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "num_hidden_layers": 1,
    "vocab_size": V,
    "tie_word_embeddings": False,
}


def vllm_llama(fc_norm: bool) -> tuple[dict, dict]:
    """As vLLM's llama_eagle3 loads it (RedHatAI's speculator exports, eagleflow's own)."""
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **LLAMA_CONFIG,
        "draft_vocab_size": VD,
        "target_hidden_size": H,
        "norm_before_residual": True,
        "norm_before_fc": not fc_norm,
        "fc_norm": fc_norm,
        "norm_output": fc_norm,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True},
    }
    return cfg, {**llama_layer("layers.0."), **heads(fc_norm=fc_norm, input_norm=not fc_norm), **vocab_tensors()}


def specforge_midlayer(eagle31: bool) -> tuple[dict, dict]:
    """As SpecForge saves it (configs/llama3-8B-eagle3.json; with eagle31, configs/qwen3-30B-A3B-eagle3.1.json's
    fc_norm and norm_output)."""
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **LLAMA_CONFIG,
        "draft_vocab_size": VD,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in AUX], "use_aux_hidden_state": True},
    }
    if eagle31:
        cfg.update(fc_norm=True, norm_output=True)
    return cfg, {
        **llama_layer("midlayer."),
        **heads(fc_norm=eagle31),
        "embed_tokens.weight": rnd(V, H),
        **vocab_tensors(),
    }


def speculators_eagle3(full_vocab: bool) -> tuple[dict, dict]:
    """As speculators 0.9.0 saves an Eagle3DraftModel (its config.json made by the class itself)."""
    layer = {
        "model_type": "llama",
        **LLAMA_CONFIG,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": V if full_vocab else VD,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": AUX,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "verifier": {"name_or_path": "demo/target", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
    }
    tensors = {**llama_layer("layers.0."), **heads(), "embed_tokens.weight": rnd(V, H)}
    if full_vocab:
        tensors["lm_head.weight"] = rnd(V, H)
    else:
        tensors.update(vocab_tensors())
    return cfg, tensors


def vllm_mla(q_lora: bool) -> tuple[dict, dict]:
    """As vLLM's deepseek_eagle3 loads it (q_lora) or SGLang's deepseek_eagle3 also would (no q_lora)."""
    d = MLA_DIMS
    cfg = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
        "num_hidden_layers": 1,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "target_hidden_size": H,
        "fc_norm": True,
        "norm_before_residual": False,
        **{**d, "q_lora_rank": d["q_lora_rank"] if q_lora else None},
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True},
    }
    p = "layers.0.self_attn."
    attn = {
        f"{p}kv_a_proj_with_mqa.weight": rnd(d["kv_lora_rank"] + d["qk_rope_head_dim"], 2 * H),
        f"{p}kv_a_layernorm.weight": rnd(d["kv_lora_rank"]) + 1,
        f"{p}kv_b_proj.weight": rnd(HEADS * (d["qk_nope_head_dim"] + d["v_head_dim"]), d["kv_lora_rank"]),
        f"{p}o_proj.weight": rnd(H, HEADS * d["v_head_dim"]),
    }
    qk = HEADS * (d["qk_nope_head_dim"] + d["qk_rope_head_dim"])
    if q_lora:
        attn.update(
            {
                f"{p}q_a_proj.weight": rnd(d["q_lora_rank"], 2 * H),
                f"{p}q_a_layernorm.weight": rnd(d["q_lora_rank"]) + 1,
                f"{p}q_b_proj.weight": rnd(qk, d["q_lora_rank"]),
            }
        )
    else:
        attn[f"{p}q_proj.weight"] = rnd(qk, 2 * H)
    return cfg, {**attn, **mlp_and_norms("layers.0."), **heads(fc_norm=True), **vocab_tensors()}


def write(path: Path, cfg: dict, tensors: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("syn"))


def warm_started(synthetic: Path, public: Path, tmp_path: Path):
    from eagleflow.drafter.trainer import Trainer

    index = read_index(synthetic / "data" / "index.json", stage_dir=synthetic)
    cfg = TrainConfig(warm_start=str(public), draft_vocab_size=24, num_threads=1)
    return Trainer(cfg, read_target_head(synthetic / "target"), index, tmp_path / "train", AUX).setup()


LAYOUTS = {
    "vllm llama": (lambda: vllm_llama(False), "vllm"),
    "vllm llama, EAGLE 3.1 (fc_norm, norm_output)": (lambda: vllm_llama(True), "vllm"),
    "specforge midlayer": (lambda: specforge_midlayer(False), "eagle"),
    "specforge midlayer, EAGLE 3.1": (lambda: specforge_midlayer(True), "eagle"),
    "speculators 0.9.0": (lambda: speculators_eagle3(False), "speculators"),
    "speculators 0.9.0, the whole vocabulary (no d2t)": (lambda: speculators_eagle3(True), "speculators"),
    "vllm deepseek_eagle3 (MLA)": (lambda: vllm_mla(True), "vllm"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_published_layout_warm_starts_onto_the_drafter_its_loader_would_build(synthetic, tmp_path, name):
    make, layout = LAYOUTS[name]
    cfg, tensors = make()
    public = write(tmp_path / "public", cfg, tensors)
    drafter = read_public_drafter(public)
    assert drafter.layout == layout
    assert drafter.aux_layer_ids == AUX  # SpecForge's output-of-layer ids read in vLLM's count
    warnings = check_warm_start(drafter, read_target_head(synthetic / "target"), AUX)
    assert not [w for w in warnings if "aux layers" in w], warnings
    trainer = warm_started(synthetic, public, tmp_path)
    arch, got = trainer.model.arch, trainer.model.state_dict()
    # The norms mean what the project meant.
    assert arch.fc_norm == ("fc_norm.0.weight" in tensors)
    assert arch.norm_before_fc == ("input_norm.weight" in tensors)
    assert arch.norm_before_residual == bool(cfg.get("norm_before_residual", False))
    # vLLM and speculators: norm_output feeds the normed state on; SpecForge's never does (its flag is the logits')
    assert arch.norm_output == (bool(cfg.get("norm_output")) and layout != "eagle")
    if layout == "eagle" and cfg.get("norm_output"):
        assert any("SpecForge's sense" in w for w in warnings)
    assert arch.attention == ("mla" if "MLA" in name else "llama")
    # Every tensor of the file, under its loader's name for it, is the parameter of the same name here.
    expected = {}
    for n, t in tensors.items():
        n = n.replace("midlayer.", "layers.0.")
        if n in ("d2t", "t2d", "embed_tokens.weight"):
            continue
        expected[n] = t.float()
    assert set(expected) == set(got) - {"embed_weight"}, set(expected) ^ (set(got) - {"embed_weight"})
    for n, t in expected.items():
        torch.testing.assert_close(got[n], t, msg=n)
    # The draft vocabulary is the file's: d2t offsets (or the whole vocabulary without them).
    want = torch.arange(V) if "whole vocabulary" in name else DRAFT_IDS
    assert torch.equal(trainer.vocab.draft_to_target, want)


def test_an_mla_drafter_without_q_lora_is_refused_naming_what_vllm_cannot_load(tmp_path, synthetic):
    cfg, tensors = vllm_mla(False)  # SGLang's deepseek_eagle3 loads it, vLLM's does not
    public = write(tmp_path / "public", cfg, tensors)
    with pytest.raises(
        FormatError, match="without q_a_proj / q_lora_rank .* vLLM 0.32 loads MLA drafters only with q_lora_rank"
    ):
        warm_started(synthetic, public, tmp_path)


def test_a_model_prefix_is_read_as_sglang_reads_it(tmp_path, synthetic):
    """SGLang's llama loader takes `model.midlayer.*` (vLLM would fail on the prefix): read here as the same layer."""
    cfg, tensors = specforge_midlayer(False)
    public = write(
        tmp_path / "public", cfg, {(f"model.{k}" if k.startswith("midlayer.") else k): v for k, v in tensors.items()}
    )
    trainer = warm_started(synthetic, public, tmp_path)
    torch.testing.assert_close(
        trainer.model.state_dict()["layers.0.self_attn.q_proj.weight"],
        tensors["midlayer.self_attn.q_proj.weight"].float(),
    )
