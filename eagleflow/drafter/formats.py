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
from dataclasses import dataclass
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


# ------------------------------------------------------------------------ warm start: public drafters

# Where public EAGLE-3 drafters come from and how they name the one decoder layer:
#   vllm         `layers.0.*` (+ optional `model.` prefix); config.json is a Llama config with
#                draft_vocab_size, eagle_aux_hidden_state_layer_ids, norm_before_* (vLLM, RedHatAI).
#   eagle        `midlayer.*`: the EAGLE-3 reference, SpecForge and SGLang (AQ-MedAI and lightseek
#                Kimi drafters); config.json as vLLM's; may carry embed_tokens.
#   speculators  `layers.0.*` beside embed_tokens/verifier_* tensors; config.json has
#                `speculators_model_type: eagle3` and the layer's shape under `transformer_layer_config`.
# All three store d2t as offsets (target_id = draft_id + d2t[draft_id]) and t2d as a mask.
WARM_START_LAYOUTS = ("vllm", "eagle", "speculators")
_DROPPED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight", "d2t", "t2d")


@dataclass
class PublicDrafter:
    """A public EAGLE-3 drafter read for a warm start, its tensors renamed to ours (vLLM names)."""

    path: Path
    layout: str  # one of WARM_START_LAYOUTS
    config: dict  # config.json as written
    layer_config: dict  # the keys of the decoder layer's shape (speculators: transformer_layer_config)
    weights: dict[str, torch.Tensor]  # float32, our names, without embed_tokens/d2t/t2d
    vocab: DraftVocab
    aux_layer_ids: list[int] | None
    weight_files: list[Path]

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def field(self, name: str, default: Any = None) -> Any:
        """A config field, looked up where each layout keeps it."""
        for where in (self.config, self.layer_config, self.config.get("eagle_config") or {}):
            if name in where and where[name] is not None:
                return where[name]
        return default


def _read_weight_files(path: Path) -> tuple[dict[str, torch.Tensor], list[Path]]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out, files
    files = sorted(path.glob("pytorch_model*.bin"))
    if files:
        out = {}
        for f in files:
            out.update(torch.load(f, map_location="cpu", weights_only=True))
        return out, files
    raise FormatError(f"no *.safetensors or pytorch_model*.bin in warm-start drafter {path}")


def detect_layout(names: list[str], config: dict) -> str:
    """vllm / eagle / speculators from the tensor names (and config.json to tell the two `layers.0` ones apart)."""
    bare = [n.removeprefix("model.") for n in names]
    if any(n.startswith("midlayer.") for n in bare):
        return "eagle"
    if any(n.startswith("layers.") for n in bare):
        if "speculators_model_type" in config or "transformer_layer_config" in config:
            return "speculators"
        return "vllm"
    raise FormatError(f"cannot tell the layout: no midlayer.* or layers.0.* tensors among {sorted(names)[:12]}")


def read_public_drafter(path: str | Path) -> PublicDrafter:
    """A public EAGLE-3 drafter in any of WARM_START_LAYOUTS, its names mapped to ours."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise FormatError(f"warm-start drafter {cfg_path} does not exist")
    cfg = json.loads(cfg_path.read_text())
    raw, files = _read_weight_files(path)
    where = ", ".join(str(f) for f in files)
    try:
        layout = detect_layout(list(raw), cfg)
    except FormatError as exc:
        raise FormatError(f"warm-start drafter {where}: {exc}") from None
    layer_cfg = (cfg.get("transformer_layer_config") or {}) if layout == "speculators" else cfg
    weights: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name.removeprefix("midlayer.")
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer some trainers save; the rotary tables are recomputed from rope_theta
        (extra if name in _DROPPED else weights)[name] = t
    deeper = sorted({n.split(".")[1] for n in weights if n.startswith("layers.") and n.split(".")[1] != "0"})
    n_layers = int(layer_cfg.get("num_hidden_layers", 1))
    if deeper or n_layers != 1:
        raise FormatError(
            f"warm-start drafter {cfg_path}: num_hidden_layers is {n_layers}"
            f"{' (tensors of layers ' + ', '.join(deeper) + ' in ' + where + ')' if deeper else ''}, "
            "eagleflow's drafter has 1 decoder layer: start from a one-layer EAGLE-3 drafter"
        )
    vocab_size = layer_cfg.get("vocab_size", cfg.get("vocab_size"))
    if vocab_size is None:
        raise FormatError(f"{cfg_path} has no vocab_size (the target vocabulary the drafter maps into)")
    vocab = _public_vocab(extra, int(vocab_size), weights.get("lm_head.weight"), cfg, cfg_path, where)
    aux = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return PublicDrafter(path=path, layout=layout, config=cfg, layer_config=layer_cfg,
                         weights={n: t.float() for n, t in weights.items()}, vocab=vocab,
                         aux_layer_ids=[int(i) for i in aux] if aux else None, weight_files=files)


def _public_vocab(extra: dict[str, torch.Tensor], vocab_size: int, lm_head: torch.Tensor | None, cfg: dict,
                  cfg_path: Path, where: str) -> DraftVocab:
    """The drafter's own draft vocabulary: from d2t (offsets), else t2d (mask), else the whole vocabulary."""
    d2t, t2d = extra.get("d2t"), extra.get("t2d")
    try:
        if d2t is not None:
            vocab = DraftVocab.from_d2t(d2t, vocab_size)
        elif t2d is not None:
            vocab = DraftVocab(t2d.bool().flatten().nonzero().flatten().to(torch.int64), vocab_size)
        else:
            vocab = DraftVocab.full(vocab_size)
    except ValueError as exc:
        raise FormatError(f"warm-start drafter {where}: d2t/t2d do not map into vocab_size {vocab_size} "
                          f"({cfg_path}): {exc}") from None
    if t2d is not None and d2t is not None and t2d.numel() == vocab_size:
        if not torch.equal(t2d.bool().flatten().nonzero().flatten(), vocab.draft_to_target):
            raise FormatError(f"warm-start drafter {where}: d2t and t2d disagree on the draft vocabulary")
    declared = cfg.get("draft_vocab_size")
    if declared is not None and int(declared) != vocab.size:
        raise FormatError(f"warm-start drafter {cfg_path}: draft_vocab_size is {declared}, but d2t/t2d in {where} "
                          f"give {vocab.size} draft ids")
    if lm_head is not None and lm_head.shape[0] != vocab.size:
        raise FormatError(f"warm-start drafter {where}: lm_head.weight has {lm_head.shape[0]} rows, the draft "
                          f"vocabulary (d2t/t2d, or vocab_size {vocab_size} without them) has {vocab.size}")
    return vocab


def check_warm_start(drafter: PublicDrafter, target: TargetHead, aux_layer_ids: list[int],
                     target_name: str = "the target") -> list[str]:
    """FormatError on a hidden-size, vocabulary or layer-count mismatch with the target; returns warnings."""
    cfg_path = drafter.config_path
    h = drafter.field("hidden_size")
    if h is None:
        raise FormatError(f"warm-start drafter {cfg_path} has no hidden_size")
    for name, value in (("hidden_size", h), ("target_hidden_size", drafter.field("target_hidden_size", h))):
        if int(value) != target.hidden_size:
            raise FormatError(f"warm-start drafter {cfg_path}: {name} is {value}, {target_name} has hidden_size "
                              f"{target.hidden_size}: the drafter belongs to another model")
    if drafter.vocab.target_vocab_size != target.vocab_size:
        raise FormatError(f"warm-start drafter {cfg_path}: vocab_size is {drafter.vocab.target_vocab_size}, "
                          f"{target_name} has vocab_size {target.vocab_size}: the drafter belongs to another model")
    fc = drafter.weights.get("fc.weight")
    if fc is not None and fc.shape[1] != 3 * target.hidden_size:
        raise FormatError(f"warm-start drafter {drafter.weight_files[0]}: fc.weight takes {fc.shape[1]} inputs, "
                          f"3 target states of {target_name} are {3 * target.hidden_size}")
    warnings = []
    ids = drafter.aux_layer_ids
    target_layers = target.config.get("num_hidden_layers")
    if ids is not None:
        if len(ids) != 3:
            raise FormatError(f"warm-start drafter {cfg_path}: eagle_aux_hidden_state_layer_ids is {ids}, "
                              f"this run feeds 3 target states {list(aux_layer_ids)}")
        if target_layers is not None and max(ids) > int(target_layers):
            raise FormatError(
                f"warm-start drafter {cfg_path}: eagle_aux_hidden_state_layer_ids is {ids}, {target_name} has "
                f"num_hidden_layers {target_layers}: the drafter was made for a deeper model")
        if list(ids) != list(aux_layer_ids):
            warnings.append(
                f"warm-start drafter {cfg_path} was trained on aux layers {ids}, this run feeds {list(aux_layer_ids)} "
                "(target.aux_layer_ids); fine-tuning adapts, but check the convention (vLLM: input of layer k; "
                "SGLang/SpecForge configs: output of layer i, one less)")
    rope = drafter.field("rope_scaling") or drafter.field("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in ("default", None):
        warnings.append(f"warm-start drafter {cfg_path} uses rope type {rope_type!r}; eagleflow trains and exports "
                        "the default rotary embedding")
    return warnings


def warm_start_arch(drafter: PublicDrafter, arch: DrafterArch) -> DrafterArch:
    """`arch` (the target's shape) with the warm-start drafter's own layer shape and norms."""
    f = drafter.field
    heads = int(f("num_attention_heads", arch.num_attention_heads))
    rope = f("rope_parameters") or {}
    return DrafterArch(**{
        **arch.to_dict(),
        "intermediate_size": int(f("intermediate_size", arch.intermediate_size)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f("num_key_value_heads") or heads),
        "head_dim": int(f("head_dim") or arch.hidden_size // heads),
        "rms_norm_eps": float(f("rms_norm_eps", arch.rms_norm_eps)),
        "rope_theta": float(f("rope_theta", rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0)),
        "draft_vocab_size": drafter.vocab.size,
        # The input norm is there iff its weight is; norm_before_residual has no weight: the config
        # says, else vLLM's and the EAGLE reference's default (False).
        "norm_before_fc": "input_norm.weight" in drafter.weights,
        "norm_before_residual": bool(f("norm_before_residual", False)),
    })


def load_vllm_drafter(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], DraftVocab]:
    """(config.json, weights in our names, vocab) of a public EAGLE-3 drafter in any layout (see
    `read_public_drafter`; kept for callers of the first version)."""
    d = read_public_drafter(path)
    return {**d.layer_config, **d.config}, d.weights, d.vocab
