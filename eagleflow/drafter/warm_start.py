"""Warm start from a public EAGLE-3 drafter: read it in any of the public layouts, check it fits the target."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.errors import FormatError, TrainError
from eagleflow.drafter.model import Eagle3Drafter, TargetHead
from eagleflow.drafter.vocab import DraftVocab

log = logging.getLogger("eagleflow.train")

# ------------------------------------------------------------------------ warm start: public drafters

# Where public EAGLE-3 drafters come from and how they name the one decoder layer:
#   vllm         `layers.0.*` (+ optional `model.` prefix); config.json is a Llama config with
#                draft_vocab_size, eagle_aux_hidden_state_layer_ids, norm_before_* (vLLM, RedHatAI).
#   eagle        `midlayer.*`: the EAGLE-3 reference, SpecForge and SGLang (AQ-MedAI and lightseek
#                Kimi drafters); config.json as vLLM's; may carry embed_tokens.
#   speculators  `layers.0.*` beside embed_tokens/verifier_* tensors; config.json has
#                `speculators_model_type: eagle3` and the layer's shape under `transformer_layer_config`.
# Any of them may hold an MLA layer (vLLM Eagle3DeepseekV2ForCausalLM, lightseek's *-eagle3-mla):
# self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
# o_proj, per-state fc_norm.{i}; its config.json (model_type deepseek_v2 / kimi_k2) has the MLA dims.
# All three store d2t as offsets (target_id = draft_id + d2t[draft_id]) and t2d as a mask.
# Two words mean other things in the midlayer layout (SpecForge's source, SGLang's loader; tests/unit/drafter/
# test_published_layouts.py): `eagle_config.eagle_aux_hidden_state_layer_ids` counts the output of layer k (vLLM
# and eagleflow the input: one more), and `norm_output` only says the logits come from the normed state (vLLM and
# speculators: the next step is fed the normed state, EAGLE 3.1). `fc_norm` (per-state norms) means the same
# everywhere and is kept, llama drafters included.
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
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if (
        aux is None
        and (aux := (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
        and layout == "eagle"
    ):
        # SpecForge and SGLang count the output of layer k (SGLang's set_eagle3_layers_to_capture adds 1);
        # eagleflow and vLLM the input of layer k: the same layers are one more here.
        aux = [int(i) + 1 for i in aux]
    return PublicDrafter(
        path=path,
        layout=layout,
        config=cfg,
        layer_config=layer_cfg,
        weights={n: t.float() for n, t in weights.items()},
        vocab=vocab,
        aux_layer_ids=[int(i) for i in aux] if aux else None,
        weight_files=files,
    )


def _public_vocab(
    extra: dict[str, torch.Tensor], vocab_size: int, lm_head: torch.Tensor | None, cfg: dict, cfg_path: Path, where: str
) -> DraftVocab:
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
        raise FormatError(
            f"warm-start drafter {where}: d2t/t2d do not map into vocab_size {vocab_size} ({cfg_path}): {exc}"
        ) from None
    if t2d is not None and d2t is not None and t2d.numel() == vocab_size:
        if not torch.equal(t2d.bool().flatten().nonzero().flatten(), vocab.draft_to_target):
            raise FormatError(f"warm-start drafter {where}: d2t and t2d disagree on the draft vocabulary")
    declared = cfg.get("draft_vocab_size")
    if declared is not None and int(declared) != vocab.size:
        raise FormatError(
            f"warm-start drafter {cfg_path}: draft_vocab_size is {declared}, but d2t/t2d in {where} "
            f"give {vocab.size} draft ids"
        )
    if lm_head is not None and lm_head.shape[0] != vocab.size:
        raise FormatError(
            f"warm-start drafter {where}: lm_head.weight has {lm_head.shape[0]} rows, the draft "
            f"vocabulary (d2t/t2d, or vocab_size {vocab_size} without them) has {vocab.size}"
        )
    return vocab


def check_warm_start(
    drafter: PublicDrafter, target: TargetHead, aux_layer_ids: list[int], target_name: str = "the target"
) -> list[str]:
    """FormatError on a hidden-size, vocabulary or layer-count mismatch with the target; returns warnings."""
    cfg_path = drafter.config_path
    h = drafter.field("hidden_size")
    if h is None:
        raise FormatError(f"warm-start drafter {cfg_path} has no hidden_size")
    for name, value in (("hidden_size", h), ("target_hidden_size", drafter.field("target_hidden_size", h))):
        if int(value) != target.hidden_size:
            raise FormatError(
                f"warm-start drafter {cfg_path}: {name} is {value}, {target_name} has hidden_size "
                f"{target.hidden_size}: the drafter belongs to another model"
            )
    if drafter.vocab.target_vocab_size != target.vocab_size:
        raise FormatError(
            f"warm-start drafter {cfg_path}: vocab_size is {drafter.vocab.target_vocab_size}, "
            f"{target_name} has vocab_size {target.vocab_size}: the drafter belongs to another model"
        )
    fc = drafter.weights.get("fc.weight")
    if fc is not None and fc.shape[1] != 3 * target.hidden_size:
        raise FormatError(
            f"warm-start drafter {drafter.weight_files[0]}: fc.weight takes {fc.shape[1]} inputs, "
            f"3 target states of {target_name} are {3 * target.hidden_size}"
        )
    warnings = []
    ids = drafter.aux_layer_ids
    target_layers = target.config.get("num_hidden_layers")
    if ids is not None:
        if len(ids) != 3:
            raise FormatError(
                f"warm-start drafter {cfg_path}: eagle_aux_hidden_state_layer_ids is {ids}, "
                f"this run feeds 3 target states {list(aux_layer_ids)}"
            )
        if target_layers is not None and max(ids) > int(target_layers):
            raise FormatError(
                f"warm-start drafter {cfg_path}: eagle_aux_hidden_state_layer_ids is {ids}, {target_name} has "
                f"num_hidden_layers {target_layers}: the drafter was made for a deeper model"
            )
        if list(ids) != list(aux_layer_ids):
            warnings.append(
                f"warm-start drafter {cfg_path} was trained on aux layers {ids}, this run feeds {list(aux_layer_ids)} "
                "(target.aux_layer_ids); fine-tuning adapts, but check the convention (vLLM: input of layer k; "
                "SGLang/SpecForge configs: output of layer i, one less)"
            )
    rope = drafter.field("rope_scaling") or drafter.field("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type == "yarn" and float(rope.get("factor", 0)) == 1.0:
        rope_type = "default"  # YaRN with factor 1 is the default rotation (eagleflow's own MLA export writes it)
    if drafter.layout == "eagle" and drafter.field("norm_output", False):
        warnings.append(
            f"warm-start drafter {cfg_path} says norm_output in SpecForge's sense (its logits come from "
            "the normed state; the next step is fed the pre-norm one): eagleflow keeps that feed and "
            "exports norm_output false, as vLLM, which reads the flag as a post-norm feed, must be told"
        )
    if rope_type not in ("default", None):
        warnings.append(
            f"warm-start drafter {cfg_path} uses rope type {rope_type!r}; eagleflow trains and exports "
            "the default rotary embedding"
        )
    return warnings


def is_mla_drafter(drafter: PublicDrafter) -> bool:
    """An MLA drafter (vLLM Eagle3DeepseekV2ForCausalLM; lightseek's Kimi *-eagle3-mla): its attention has
    kv_a_proj_with_mqa (or the fused q_a/kv_a projection vLLM keeps in memory)."""
    return any(
        n.startswith("layers.0.self_attn.") and n.endswith(("kv_a_proj_with_mqa.weight", "fused_qkv_a_proj.weight"))
        for n in drafter.weights
    )


def _mla_arch_fields(drafter: PublicDrafter, arch: DrafterArch) -> dict:
    """The MLA dims of a public MLA drafter: its config.json, checked against its tensors."""
    f = drafter.field
    if "layers.0.self_attn.fused_qkv_a_proj.weight" in drafter.weights:
        raise FormatError(
            f"warm-start drafter {drafter.weight_files[0]}: a fused fused_qkv_a_proj (vLLM's in-memory "
            "name) instead of q_a_proj + kv_a_proj_with_mqa; start from the HF-layout checkpoint"
        )
    dims = {k: f(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    missing = [k for k, v in dims.items() if not v]
    if missing:
        raise FormatError(
            f"warm-start drafter {drafter.config_path} is an MLA drafter (kv_a_proj_with_mqa) but its "
            f"config has no {', '.join(missing)}"
        )
    dims = {k: int(v) for k, v in dims.items()}
    q_lora = f("q_lora_rank")
    q_a = drafter.weights.get("layers.0.self_attn.q_a_proj.weight")
    if q_a is None or not q_lora:
        raise FormatError(
            f"warm-start drafter {drafter.weight_files[0]}: an MLA drafter without q_a_proj / "
            f"q_lora_rank (config: {q_lora}); vLLM 0.32 loads MLA drafters only with q_lora_rank"
        )
    if q_a.shape[0] != int(q_lora):
        raise FormatError(
            f"warm-start drafter {drafter.weight_files[0]}: q_a_proj has {q_a.shape[0]} rows, "
            f"q_lora_rank in {drafter.config_path} is {q_lora}"
        )
    kv_a = drafter.weights["layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    if kv_a.shape[0] != dims["kv_lora_rank"] + dims["qk_rope_head_dim"]:
        raise FormatError(
            f"warm-start drafter {drafter.weight_files[0]}: kv_a_proj_with_mqa has {kv_a.shape[0]} "
            f"rows, kv_lora_rank + qk_rope_head_dim in {drafter.config_path} is "
            f"{dims['kv_lora_rank'] + dims['qk_rope_head_dim']}"
        )
    heads = int(f("num_attention_heads", arch.num_attention_heads))
    return {
        **dims,
        "attention": "mla",
        "q_lora_rank": int(q_lora),
        "num_key_value_heads": heads,
        "head_dim": dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"],
        "fc_norm": "fc_norm.0.weight" in drafter.weights,
    }


def warm_start_arch(drafter: PublicDrafter, arch: DrafterArch) -> DrafterArch:
    """`arch` (the target's shape) with the warm-start drafter's own layer shape and norms (and its
    attention kind: an MLA drafter stays MLA whatever train.drafter_arch says)."""
    f = drafter.field
    heads = int(f("num_attention_heads", arch.num_attention_heads))
    rope = f("rope_parameters") or {}
    if is_mla_drafter(drafter):
        attn = _mla_arch_fields(drafter, arch)
    else:
        attn = {
            "attention": "llama",
            "fc_norm": "fc_norm.0.weight" in drafter.weights,
            "q_lora_rank": None,
            "kv_lora_rank": 0,
            "qk_nope_head_dim": 0,
            "qk_rope_head_dim": 0,
            "v_head_dim": 0,
            "num_key_value_heads": int(f("num_key_value_heads") or heads),
            "head_dim": int(f("head_dim") or arch.hidden_size // heads),
        }
    return DrafterArch(
        **{
            **arch.to_dict(),
            "intermediate_size": int(f("intermediate_size", arch.intermediate_size)),
            "num_attention_heads": heads,
            **attn,
            "rms_norm_eps": float(f("rms_norm_eps", arch.rms_norm_eps)),
            "rope_theta": float(
                f("rope_theta", rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0)
            ),
            "draft_vocab_size": drafter.vocab.size,
            # The input norm is there iff its weight is; norm_before_residual has no weight: the config
            # says, else vLLM's and the EAGLE reference's default (False).
            "norm_before_fc": "input_norm.weight" in drafter.weights,
            "norm_before_residual": bool(f("norm_before_residual", False)),
            # SpecForge's norm_output (the midlayer layout) normalises the logits' input only, which every
            # drafter here does; its next step is fed the pre-norm state. vLLM's and speculators' feed the normed one.
            "norm_output": bool(f("norm_output", False)) and drafter.layout != "eagle",
        }
    )


def load_warm_start(model: Eagle3Drafter, warm: PublicDrafter, vocab: DraftVocab, rebuilt_vocab: bool) -> None:
    """The public drafter's weights into `model` (built at `warm_start_arch`), or a TrainError naming what does not
    fit. With `rebuilt_vocab` (train.warm_start_vocab 'rebuild') its lm_head rows are carried over for the target
    ids both draft vocabularies hold; the new ids keep the rows `init_from_target` gave them."""
    where = ", ".join(str(f) for f in warm.weight_files)
    weights = warm.weights
    if rebuilt_vocab and "lm_head.weight" in weights:
        weights = dict(weights)
        old_head = weights.pop("lm_head.weight")  # shape: [V_draft_old, H], rows of the old draft vocabulary
        _carry_head_rows(model, warm.vocab, vocab, old_head)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:
        raise TrainError(f"warm-start drafter {where} ({warm.layout} layout) does not fit: {exc}") from None
    missing = [m for m in missing if m != "lm_head.weight"]  # a shared lm_head: keep the target's rows
    if missing or unexpected:
        raise TrainError(
            f"warm-start drafter {where} ({warm.layout} layout) does not fit: missing {missing}, "
            f"unexpected {unexpected}"
        )


def _carry_head_rows(model: Eagle3Drafter, old_vocab: DraftVocab, vocab: DraftVocab, old_head: torch.Tensor) -> None:
    old_row = {int(t): i for i, t in enumerate(old_vocab.draft_to_target.tolist())}
    new_ids = vocab.draft_to_target.tolist()
    pairs = [(i, old_row[int(t)]) for i, t in enumerate(new_ids) if int(t) in old_row]
    if pairs:
        dst, src = (torch.tensor(x) for x in zip(*pairs))
        with torch.no_grad():
            model.lm_head.weight[dst] = old_head[src].to(model.lm_head.weight.dtype)
    log.info(
        "draft vocabulary rebuilt from this run's data: %d of %d ids carried over from the warm start",
        len(pairs),
        len(new_ids),
    )
