"""The target's frozen pieces the drafter needs (embedding, final norm, lm_head) and the drafter's shape.

Read with safetensors from the target checkpoint: no model is built, so a 1T-parameter target costs
only the three tensors (the embedding and lm_head of a 160k vocabulary) and its config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.errors import FormatError
from eagleflow.drafter.model import TargetHead


def target_text_config(model_path: str | Path) -> dict:
    """The target's config.json (its `text_config` for multimodal wrappers, top-level keys kept)."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise FormatError(f"target config {path} does not exist: target.model_path must be an HF checkpoint directory")
    cfg = json.loads(path.read_text())
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        merged.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        return merged
    return cfg


def _tensor_files(model_path: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: model_path / f for name, f in weight_map.items()}
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise FormatError(f"no *.safetensors in target directory {model_path}")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                out[name] = f
    return out


def _read_tensor(model_path: Path, files: dict[str, Path], name: str) -> torch.Tensor:
    """The tensor `name`, or the one tensor whose name ends with `.name` (e.g. `language_model.` prefixes)."""
    hit = name if name in files else None
    if hit is None:
        cands = [n for n in files if n.endswith("." + name)]
        if len(cands) == 1:
            hit = cands[0]
        elif len(cands) > 1:
            raise FormatError(f"tensor {name!r} is ambiguous in {model_path}: {sorted(cands)}")
    if hit is None:
        where = model_path / "model.safetensors.index.json"
        where = where if where.is_file() else ", ".join(sorted({str(p) for p in files.values()}))
        raise FormatError(f"tensor {name!r} not found in {where}; the drafter needs it from the target checkpoint")
    with safe_open(str(files[hit]), framework="pt") as h:
        return h.get_tensor(hit).float()


def read_target_head(model_path: str | Path) -> TargetHead:
    """Embedding, final norm and lm_head of the target, read with safetensors (no model is built)."""
    model_path = Path(model_path)
    cfg = target_text_config(model_path)
    files = _tensor_files(model_path)
    embed = _read_tensor(model_path, files, "model.embed_tokens.weight")
    norm = _read_tensor(model_path, files, "model.norm.weight")
    if cfg.get("tie_word_embeddings", False):
        lm_head = embed
    else:
        lm_head = _read_tensor(model_path, files, "lm_head.weight")
    if "rms_norm_eps" not in cfg:
        raise FormatError(f"{model_path / 'config.json'} has no rms_norm_eps (needed for the target's final norm)")
    if embed.shape[1] != norm.shape[0] or lm_head.shape[1] != norm.shape[0]:
        raise FormatError(
            f"inconsistent target shapes in {model_path}: embed {tuple(embed.shape)}, norm {tuple(norm.shape)}, "
            f"lm_head {tuple(lm_head.shape)}"
        )
    return TargetHead(
        embed_tokens=embed, norm_weight=norm, rms_norm_eps=float(cfg["rms_norm_eps"]), lm_head=lm_head, config=cfg
    )


def _rope_theta(cfg: dict) -> float:
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", 10000.0))


def is_mla_config(cfg: dict) -> bool:
    """A DeepSeek-V2/V3 / Kimi-K2 style config: multi-head latent attention (kv_lora_rank set)."""
    return bool(cfg.get("kv_lora_rank"))


def resolve_drafter_arch(cfg: dict, choice: str) -> str:
    """train.drafter_arch against the target's config: 'llama' or 'mla' ('auto': mla iff the target is MLA)."""
    if choice == "auto":
        return "mla" if is_mla_config(cfg) else "llama"
    if choice == "mla":
        missing = [k for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if not cfg.get(k)]
        if missing:
            raise FormatError(
                f"train.drafter_arch is 'mla' but the target's config.json has no {', '.join(missing)}: the MLA "
                "drafter takes its attention dims from an MLA target (DeepSeek-V2/V3, Kimi-K2); use 'llama' or 'auto'"
            )
    return choice


def arch_for_target(target: TargetHead, train: TrainConfig, draft_vocab_size: int) -> DrafterArch:
    """The drafter's shape: the target's attention/MLP shape, one layer, default RoPE.

    With MLA (train.drafter_arch, resolved by `resolve_drafter_arch`) the attention dims are the
    target's (kv_lora_rank, q_lora_rank, qk_nope/qk_rope/v head dims, heads): vLLM's MLA kernels need
    kv_lora_rank + qk_rope_head_dim it supports (576 on CPU), and the drafter's KV cache blocks sit
    beside the target's."""
    cfg = target.config
    h = target.hidden_size
    heads = int(cfg.get("num_attention_heads", max(1, h // 64)))
    if resolve_drafter_arch(cfg, train.drafter_arch) == "mla":
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        rank = int(cfg["kv_lora_rank"])
        # vLLM loads MLA drafters only with a q_lora_rank; a target without one (DeepSeek-V2-Lite) gets
        # 3 * kv_lora_rank, DeepSeek-V2/V3's own ratio (1536 / 512).
        q_lora = int(cfg.get("q_lora_rank") or 3 * rank)
        attn = dict(
            attention="mla",
            num_key_value_heads=heads,
            head_dim=nope + rope,
            q_lora_rank=q_lora,
            kv_lora_rank=rank,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=int(cfg["v_head_dim"]),
            norm_before_fc=False,
            fc_norm=train.norm_before_fc,
        )
    else:
        attn = dict(
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads),
            norm_before_fc=train.norm_before_fc,
        )
    return DrafterArch(
        hidden_size=h,
        intermediate_size=int(train.intermediate_size or cfg.get("intermediate_size", 4 * h)),
        num_attention_heads=heads,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=_rope_theta(cfg),
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=h,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        norm_before_residual=train.norm_before_residual,
        norm_output=train.norm_output,
        **attn,
    )
