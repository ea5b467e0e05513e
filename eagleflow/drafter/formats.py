"""Reading the target's frozen pieces, the trainer's checkpoints, and the engine formats.

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
    t2d                                         bool [vocab_size] (vLLM skips it; SGLang reads it)
                                                both only when the draft vocabulary is smaller than
                                                the target's: vLLM allocates draft_id_to_target_id
                                                only then, and an unexpected d2t fails its loader

No `embed_tokens`: vLLM then shares the target's embedding. The config.json is a Llama config with
`architectures: ["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `vocab_size` = the target's,
`draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` (vLLM convention: the
input to decoder layer k; read by the target's model runner to pick the states), `norm_before_fc`,
`norm_before_residual`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagleflow import __version__
from eagleflow.drafter.config import TrainConfig
from eagleflow.drafter.model import DrafterArch, Eagle3Drafter, TargetHead
from eagleflow.drafter.vocab import DraftVocab

VLLM_ARCHITECTURE = "LlamaForCausalLMEagle3"
CHECKPOINT_WEIGHTS = "model.safetensors"  # float32 drafter weights + d2t/t2d, names as vLLM's
CHECKPOINT_META = "drafter.json"  # arch, aux layer ids, vocab size, provenance, metrics
CHECKPOINT_STATE = "trainer_state.pt"  # optimizer + step + RNG, for resume


class FormatError(ValueError):
    """A checkpoint or target directory that cannot be used; the message names the file."""


# --------------------------------------------------------------------------------------- target

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
    return TargetHead(embed_tokens=embed, norm_weight=norm, rms_norm_eps=float(cfg["rms_norm_eps"]),
                      lm_head=lm_head, config=cfg)


def _rope_theta(cfg: dict) -> float:
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", 10000.0))


def arch_for_target(target: TargetHead, train: TrainConfig, draft_vocab_size: int) -> DrafterArch:
    """The drafter's shape: the target's attention/MLP shape, one layer, default RoPE."""
    cfg = target.config
    h = target.hidden_size
    heads = int(cfg.get("num_attention_heads", max(1, h // 64)))
    return DrafterArch(
        hidden_size=h,
        intermediate_size=int(train.intermediate_size or cfg.get("intermediate_size", 4 * h)),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or h // heads),
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=_rope_theta(cfg),
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=h,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        norm_before_fc=train.norm_before_fc,
        norm_before_residual=train.norm_before_residual,
    )


# ---------------------------------------------------------------------------------- provenance

def provenance() -> dict[str, Any]:
    """Where a checkpoint came from: code version, git SHA, package versions, argv."""
    sha = None
    try:
        root = Path(__file__).resolve().parents[2]
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    import safetensors
    import transformers

    return {
        "eagleflow": __version__, "git_sha": sha, "torch": torch.__version__,
        "transformers": transformers.__version__, "safetensors": safetensors.__version__,
        "python": sys.version.split()[0], "argv": list(sys.argv), "created": time.time(),
    }


# ------------------------------------------------------------------------------- checkpoints

def _vocab_tensors(vocab: DraftVocab) -> dict[str, torch.Tensor]:
    if vocab.is_full:
        return {}
    return {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}


def drafter_tensors(model: Eagle3Drafter, vocab: DraftVocab, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's checkpoint tensors under vLLM's names (see the module docstring)."""
    tensors = {name: p.detach().to("cpu", dtype).contiguous() for name, p in model.state_dict().items()}
    tensors.update(_vocab_tensors(vocab))
    return tensors


def vllm_weight_names(arch: DrafterArch, vocab: DraftVocab) -> list[str]:
    names = ["fc.weight", "norm.weight", "lm_head.weight"]
    if arch.norm_before_fc:
        names.append("input_norm.weight")
    layer = "layers.0."
    names += [layer + n + ".weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
    names += [f"{layer}self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    names += [f"{layer}mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    if not vocab.is_full:
        names += ["d2t", "t2d"]
    return sorted(names)


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename a completed temp dir into place (an older copy of the unit is dropped first)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _fresh_tmp(final: Path) -> Path:
    tmp = final.parent / f".{final.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def save_checkpoint(path: str | Path, model: Eagle3Drafter, vocab: DraftVocab, meta: dict[str, Any],
                    trainer_state: dict[str, Any] | None = None) -> Path:
    """`path/` = model.safetensors (float32) + drafter.json (+ trainer_state.pt); written to a temp dir, renamed."""
    final = Path(path)
    tmp = _fresh_tmp(final)
    save_file(drafter_tensors(model, vocab, torch.float32), str(tmp / CHECKPOINT_WEIGHTS))
    full_meta = {"arch": model.arch.to_dict(), "target_vocab_size": vocab.target_vocab_size,
                 "draft_vocab_size": vocab.size, "provenance": provenance(), **meta}
    (tmp / CHECKPOINT_META).write_text(json.dumps(full_meta, indent=2, sort_keys=True))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / CHECKPOINT_STATE)
    _replace_dir(tmp, final)
    return final


def load_checkpoint(path: str | Path) -> tuple[DrafterArch, dict[str, torch.Tensor], DraftVocab, dict]:
    """(arch, weights without d2t/t2d, vocab, meta) of a trainer checkpoint directory."""
    path = Path(path)
    meta_path, weights_path = path / CHECKPOINT_META, path / CHECKPOINT_WEIGHTS
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FormatError(f"checkpoint file {p} is missing: {path} is not a complete trainer checkpoint")
    meta = json.loads(meta_path.read_text())
    arch = DrafterArch(**meta["arch"])
    weights = load_file(str(weights_path))
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)
    vocab = DraftVocab.full(arch.vocab_size) if d2t is None else DraftVocab.from_d2t(d2t, arch.vocab_size)
    return arch, weights, vocab, meta


# ------------------------------------------------------------------------------------- vLLM

def vllm_config(arch: DrafterArch, aux_layer_ids: list[int], dtype: str = "bfloat16",
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of the drafter as vLLM 0.32 reads it (a LlamaConfig plus the EAGLE-3 keys)."""
    if len(aux_layer_ids) != arch.num_aux_hidden_states:
        raise FormatError(
            f"{len(aux_layer_ids)} aux layer ids {aux_layer_ids} for a drafter trained on "
            f"{arch.num_aux_hidden_states} target states"
        )
    return {
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "max_position_embeddings": arch.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": arch.vocab_size,
        "draft_vocab_size": arch.draft_vocab_size,
        "target_hidden_size": arch.target_hidden_size,
        "num_aux_hidden_states": arch.num_aux_hidden_states,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "norm_before_fc": arch.norm_before_fc,
        "norm_before_residual": arch.norm_before_residual,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "use_aux_hidden_state": True,
            "norm_before_fc": arch.norm_before_fc,
        },
        "torch_dtype": dtype,
        "dtype": dtype,
        **({"eagleflow": extra} if extra else {}),
    }


def export_vllm(checkpoint: str | Path, out_dir: str | Path, aux_layer_ids: list[int],
                dtype: str = "bfloat16") -> Path:
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
    tensors.update(_vocab_tensors(vocab))
    expected = vllm_weight_names(arch, vocab)
    if sorted(tensors) != expected:
        raise FormatError(f"checkpoint {checkpoint} has tensors {sorted(tensors)}, expected {expected}")
    final = Path(out_dir)
    tmp = _fresh_tmp(final)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    extra = {"checkpoint": str(checkpoint), "epoch": meta.get("epoch"), "provenance": meta.get("provenance"),
             "validation": meta.get("validation")}
    (tmp / "config.json").write_text(json.dumps(vllm_config(arch, aux_layer_ids, dtype, extra), indent=2))
    _replace_dir(tmp, final)
    return final


def load_vllm_drafter(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], DraftVocab]:
    """(config.json, weights in our names, vocab) of an EAGLE-3 drafter in vLLM layout (warm start).

    SGLang/EAGLE-reference checkpoints name the layer `midlayer.`; vLLM maps it to `layers.0.`
    and so do we. Extra tensors (embed_tokens) are dropped: the target's embedding is used.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise FormatError(f"warm-start drafter {cfg_path} does not exist")
    cfg = json.loads(cfg_path.read_text())
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FormatError(f"no *.safetensors in warm-start drafter {path}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            weights[name.replace("midlayer.", "layers.0.").removeprefix("model.")] = t
    weights.pop("embed_tokens.weight", None)
    weights.pop("t2d", None)
    d2t = weights.pop("d2t", None)
    if "vocab_size" not in cfg:
        raise FormatError(f"{cfg_path} has no vocab_size (the target vocabulary the drafter maps into)")
    vocab_size = int(cfg["vocab_size"])
    vocab = DraftVocab.full(vocab_size) if d2t is None else DraftVocab.from_d2t(d2t, vocab_size)
    return cfg, {n: t.float() for n, t in weights.items()}, vocab
