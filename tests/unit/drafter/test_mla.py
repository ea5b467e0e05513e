"""The MLA drafter (DrafterArch.attention == "mla", vLLM's Eagle3DeepseekV2ForCausalLM): its attention
against transformers' DeepSeek-V3 MLA, the TTT unroll against KV-cache drafting, train.drafter_arch
resolution, and the exported checkpoint against the names and shapes vLLM 0.32's loader expects.
Host environment (torch, transformers; vllm where installed)."""

from __future__ import annotations

import importlib
import json

import pytest

torch = pytest.importorskip("torch")

from eagleflow.config.train import TrainConfig  # noqa: E402
from eagleflow.drafter.arch import DrafterArch  # noqa: E402
from eagleflow.drafter.attention import MLAAttention  # noqa: E402
from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.target import arch_for_target, resolve_drafter_arch  # noqa: E402
from eagleflow.drafter.vllm_export import VLLM_MLA_ARCHITECTURE, vllm_config, vllm_weight_names  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from tests.helpers.drafter import H, V, assert_unroll_matches_kv_cache, make_model, target_head  # noqa: E402

# A tiny MLA layer: 4 heads, latent 16, rotary 4 of 12 query/key dims, values 6 wide.
MLA = dict(
    attention="mla",
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=12,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    norm_before_fc=False,
    fc_norm=True,
    rms_norm_eps=1e-6,
)


def mla_model(q_lora_rank=10, **kw):
    return make_model(**{**MLA, "q_lora_rank": q_lora_rank, **kw})


@pytest.mark.parametrize("q_lora_rank", [3, 10])
def test_mla_ttt_unroll_equals_kv_cache_drafting(q_lora_rank):
    """As test_model's GQA test: the parallel unroll over a batch equals one-sequence KV-cache drafting."""
    model = mla_model(q_lora_rank)
    t, steps = 14, 3
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    with torch.no_grad():
        outs, _ = model.ttt_forward(aux, ids, steps)
        assert_unroll_matches_kv_cache(model, aux, ids, steps, outs, [t, t])


@pytest.mark.parametrize("q_lora_rank", [3, 10])
def test_mla_attention_matches_transformers_deepseek_v3(q_lora_rank):
    """Our MLA (interleaved RoPE on the rope dims, scale 1/sqrt(nope+rope), split order) is transformers'
    DeepseekV3Attention (rope_interleave) over a 2H-wide input: the module vLLM's loader fills from the same names."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    model = mla_model(q_lora_rank)
    ours: MLAAttention = model.layers[0].self_attn
    cfg = DeepseekV3Config(
        hidden_size=2 * H,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
        rope_interleave=True,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        vocab_size=V,
        num_hidden_layers=1,
    )
    cfg._attn_implementation = "eager"
    ref = DeepseekV3Attention(cfg, layer_idx=0).eval()
    sd = {k: v for k, v in ours.state_dict().items() if k != "o_proj.weight"}
    sd["o_proj.weight"] = torch.cat([ours.o_proj.weight, torch.zeros_like(ours.o_proj.weight)])  # 2H wide out
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if "bias" not in m]
    t = 9
    x = torch.randn(1, t, 2 * H)
    pos = torch.arange(t)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        cos, sin = model._rope(pos)
        got = ours.attend_all(x, cos, sin, [])
        pe = DeepseekV3RotaryEmbedding(cfg)(x, pos[None])
        want = ref(x, pe, mask)[0][..., :H]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mla_arch_checks():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        DrafterArch(**{**mla_model().arch.to_dict(), "kv_lora_rank": 0})
    with pytest.raises(ValueError, match="q_lora_rank"):
        DrafterArch(**{**mla_model().arch.to_dict(), "q_lora_rank": None})  # vLLM 0.32 cannot load q_proj
    with pytest.raises(ValueError, match="input_norm"):
        DrafterArch(**{**mla_model().arch.to_dict(), "norm_before_fc": True})
    with pytest.raises(ValueError, match="fc_norm"):
        make_model(fc_norm=True)  # a llama drafter


DEEPSEEK = {
    "kv_lora_rank": 512,
    "q_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "num_attention_heads": 4,
    "intermediate_size": 48,
}


def test_drafter_arch_resolution():
    assert resolve_drafter_arch(DEEPSEEK, "auto") == "mla"
    assert resolve_drafter_arch({"num_key_value_heads": 2}, "auto") == "llama"
    assert resolve_drafter_arch(DEEPSEEK, "llama") == "llama"
    with pytest.raises(FormatError, match="kv_lora_rank"):
        resolve_drafter_arch({"num_attention_heads": 4}, "mla")
    target = target_head()
    target.config = dict(DEEPSEEK)
    arch = arch_for_target(target, TrainConfig(), V)
    assert (
        arch.attention,
        arch.kv_lora_rank,
        arch.qk_rope_head_dim,
        arch.qk_nope_head_dim,
        arch.v_head_dim,
        arch.q_lora_rank,
        arch.num_key_value_heads,
    ) == ("mla", 512, 64, 32, 32, 64, 4)
    assert arch.fc_norm and not arch.norm_before_fc  # train.norm_before_fc -> per-state norms
    assert arch_for_target(target, TrainConfig(drafter_arch="llama"), V).attention == "llama"
    target.config = {**DEEPSEEK, "q_lora_rank": None}  # DeepSeek-V2-Lite: vLLM needs one, 3 * kv_lora_rank
    assert arch_for_target(target, TrainConfig(), V).q_lora_rank == 1536


def _target_mla_arch(q_lora_rank):
    target = target_head()
    target.config = {**DEEPSEEK, "q_lora_rank": q_lora_rank}
    return arch_for_target(target, TrainConfig(), 24)


# vLLM 0.32, model_executor/models/deepseek_eagle3.py + deepseek_v2.DeepseekV2MLAAttention(input_size=2H):
# the parameters of Eagle3DeepseekV2ForCausalLM below `model.` (lm_head and draft_id_to_target_id beside it)
# that a drafter checkpoint fills, after the loader's renames (midlayer. -> layers.0., q_a_proj +
# kv_a_proj_with_mqa -> fused_qkv_a_proj, gate/up_proj -> gate_up_proj), and their shapes. embed_tokens is
# shared with the target when the checkpoint has none.
def vllm_expected(a: DrafterArch) -> dict[str, tuple[int, ...]]:
    h, nh, qk = a.hidden_size, a.num_attention_heads, a.qk_nope_head_dim + a.qk_rope_head_dim
    attn = "model.layers.0.self_attn."
    out = {
        "model.fc.weight": (h, 3 * a.target_hidden_size),
        **{f"model.fc_norm.{i}.weight": (a.target_hidden_size,) for i in range(3)},
        "model.norm.weight": (h,),
        "model.layers.0.input_layernorm.weight": (h,),
        "model.layers.0.hidden_norm.weight": (h,),
        "model.layers.0.post_attention_layernorm.weight": (h,),
        "model.layers.0.mlp.gate_up_proj.weight": (2 * a.intermediate_size, h),
        "model.layers.0.mlp.down_proj.weight": (h, a.intermediate_size),
        attn + "kv_a_layernorm.weight": (a.kv_lora_rank,),
        attn + "kv_b_proj.weight": (nh * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank),
        attn + "o_proj.weight": (h, nh * a.v_head_dim),
        "lm_head.weight": (a.draft_vocab_size, h),
        "draft_id_to_target_id": (a.draft_vocab_size,),
    }
    # DeepseekV2MLAAttention with q_lora_rank (without one vLLM 0.32 has q_proj + kv_a_proj_with_mqa, but
    # its mapper still renames kv_a_proj_with_mqa to fused_qkv_a_proj and the load fails).
    out[attn + "fused_qkv_a_proj.weight"] = (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim, 2 * h)
    out[attn + "q_a_layernorm.weight"] = (a.q_lora_rank,)
    out[attn + "q_b_proj.weight"] = (nh * qk, a.q_lora_rank)
    return out


@pytest.mark.parametrize("q_lora_rank", [None, 64])
def test_exported_mla_names_and_shapes_are_what_vllm_loads(q_lora_rank):  # None: the target has none
    """Our checkpoint names, through vLLM's own name mapper, land on exactly the parameters vLLM's
    Eagle3DeepseekV2ForCausalLM has, with their shapes (stacked shards concatenated)."""
    pytest.importorskip("vllm")  # the control environment has no engine; with vLLM, a renamed module fails
    deepseek_eagle3 = importlib.import_module("vllm.model_executor.models.deepseek_eagle3")
    arch = _target_mla_arch(q_lora_rank)
    vocab = DraftVocab(torch.arange(24), V)
    from eagleflow.drafter.model import Eagle3Drafter

    model = Eagle3Drafter(arch, torch.randn(V, H))
    names = vllm_weight_names(arch, vocab)
    assert sorted([*model.state_dict(), "d2t", "t2d"]) == names
    shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    shapes["d2t"] = (24,)
    mapper = deepseek_eagle3.DeepseekV2Eagle3Model.hf_to_vllm_mapper
    got: dict[str, list] = {}
    for name in names:
        if name == "t2d":
            continue  # skipped by Eagle3DeepseekV2ForCausalLM.load_weights
        if name == "d2t":
            got.setdefault("draft_id_to_target_id", []).append((None, shapes[name]))
            continue
        if name.startswith("lm_head"):
            got.setdefault(name, []).append((None, shapes[name]))
            continue
        mapped, shard = mapper._map_name_with_shard(name)
        got.setdefault("model." + mapped, []).append((shard, shapes[name]))
    merged = {}
    for name, parts in got.items():
        parts.sort(key=lambda p: -1 if p[0] is None else p[0])
        first = parts[0][1]
        merged[name] = first if len(parts) == 1 else (sum(p[1][0] for p in parts), *first[1:])
    assert merged == vllm_expected(arch)


def test_mla_vllm_config_is_a_deepseek_v2_config():
    from transformers import DeepseekV2Config

    arch = _target_mla_arch(64)
    cfg = vllm_config(arch, [1, 2, 3])
    assert cfg["architectures"] == [VLLM_MLA_ARCHITECTURE] and cfg["model_type"] == "deepseek_v2"
    assert cfg["fc_norm"] is True and "norm_before_fc" not in cfg
    hf = DeepseekV2Config(**{k: v for k, v in json.loads(json.dumps(cfg)).items() if k != "model_type"})
    for key in (
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_attention_heads",
        "hidden_size",
        "intermediate_size",
    ):
        assert getattr(hf, key) == cfg[key], key
    # the default rotation, as YaRN with factor 1 (the only rope config vLLM 0.26's MLA drafter loads)
    assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] == 1.0
    assert hf.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


@pytest.mark.parametrize("layout", ["vllm", "eagle"])
def test_mla_warm_start_round_trip(tmp_path, layout):
    """An exported MLA drafter (vLLM layout, or renamed to SGLang/SpecForge `midlayer.*` as lightseek's
    *-eagle3-mla drafters are) warm-starts an MLA drafter of the same shape and weights."""
    from safetensors.torch import load_file, save_file

    from eagleflow.drafter.checkpoint import save_checkpoint
    from eagleflow.drafter.model import Eagle3Drafter
    from eagleflow.drafter.vllm_export import export_vllm
    from eagleflow.drafter.warm_start import read_public_drafter, warm_start_arch

    arch = _target_mla_arch(64)
    vocab = DraftVocab(torch.arange(24), V)
    model = Eagle3Drafter(arch, torch.randn(V, H))
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"aux_layer_ids": [1, 2, 3]})
    out = export_vllm(tmp_path / "ckpt", tmp_path / "vllm", [1, 2, 3], dtype="float32")
    if layout == "eagle":
        tensors = load_file(str(out / "model.safetensors"))
        save_file({k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}, str(out / "model.safetensors"))
    warm = read_public_drafter(out)
    assert warm.layout == layout
    llama_shaped = arch_for_target(target_head(), TrainConfig(), 24)  # a non-MLA target: the drafter's own kind wins
    assert warm_start_arch(warm, llama_shaped) == arch
    again = Eagle3Drafter(arch, torch.randn(V, H))
    missing, unexpected = again.load_state_dict(warm.weights, strict=False)
    assert not missing and not unexpected
    for name, p in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], p)


def test_trainer_trains_and_exports_an_mla_drafter_for_an_mla_target(tmp_path):
    """train.drafter_arch 'auto' on a target whose config.json has MLA dims: the Trainer builds, trains and
    checkpoints an MLA drafter, and the export is vLLM's Eagle3DeepseekV2ForCausalLM layout."""
    from eagleflow.drafter.vllm_export import export_vllm
    from tests.helpers.drafter import tiny_trainer, write_synthetic

    root = write_synthetic(tmp_path / "syn", n_train=12, n_hold=4)
    cfg_path = root / "target" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    cfg_path.write_text(json.dumps(cfg))
    trainer = tiny_trainer(tmp_path / "out", root)
    assert trainer.model.arch.attention == "mla" and trainer.model.arch.q_lora_rank == 48  # 3 * kv_lora_rank
    result = trainer.train()
    assert result.arch["attention"] == "mla"
    ckpt = sorted(p.parent for p in (tmp_path / "out").rglob("drafter.json"))[-1]
    out = export_vllm(ckpt, tmp_path / "vllm", [1, 2, 3])
    exported = json.loads((out / "config.json").read_text())
    assert exported["architectures"] == [VLLM_MLA_ARCHITECTURE] and exported["kv_lora_rank"] == 16
