"""The SGLang checks: import, version, model registry, EAGLE-3 support of the target class."""

from __future__ import annotations

import sys
from typing import Any

from eagleflow.engines.preflight.findings import Finding

# The DeepSeek-family model types SGLang 0.5.15 builds with models/deepseek_v2.py (Kimi-K2.x's text model included).
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def check_moe_layer_freq(cfg: dict[str, Any], target_path: str) -> Finding | None:
    """SGLang 0.5.15's DeepSeek model reads `moe_layer_freq` with no default when it builds the first layer past
    `first_k_dense_replace` (deepseek_v2.py, `_is_layer_sparse`); transformers' DeepseekV3Config has no such field,
    so a checkpoint saved by transformers (a small target made for tests, a converted one) loads in vLLM and
    transformers, and stops SGLang's load with an AttributeError. None for other targets."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    if text.get("model_type") not in DEEPSEEK_TYPES or text.get("n_routed_experts") is None:
        return None
    where = f"{target_path}/config.json" + (" (text_config)" if text is not cfg else "")
    if "moe_layer_freq" in text:
        return Finding("moe_layer_freq", "ok", f"{where}: moe_layer_freq {text['moe_layer_freq']}")
    return Finding(
        "moe_layer_freq",
        "error",
        f"{where} has no moe_layer_freq: SGLang's DeepSeek model reads it without a default and stops while "
        "building the first MoE layer (AttributeError), after the engine has started. Fix: add "
        '"moe_layer_freq": 1 to it (every layer past first_k_dense_replace is MoE, as DeepSeek-V3\'s and '
        "Kimi-K2's own configs say), or serve it with vLLM",
    )


def sglang_checks(cfg: dict[str, Any], target_path: str) -> list[Finding]:
    """Import + version + registry. Relies on SGLang's `sglang.srt.models.registry.ModelRegistry.models`
    (arch -> class) and on its EAGLE-3 targets defining `set_eagle3_layers_to_capture` (llama.py,
    qwen2.py, deepseek_v2.py ...). The checks on layer ids and shapes are shared with vLLM; the target's config
    fields SGLang reads without a default are checked whether SGLang imports here or not."""
    config_findings = [f for f in (check_moe_layer_freq(cfg, target_path),) if f]
    try:
        import sglang
    except Exception as exc:  # noqa: BLE001
        return config_findings + [
            Finding(
                "engine",
                "error",
                f"sglang is not importable in {sys.executable}: {type(exc).__name__}: "
                f"{exc}. Fix: install SGLang in the host environment, or set engine.kind: vllm",
            )
        ]
    out = config_findings + [
        Finding("engine", "ok", f"sglang {getattr(sglang, '__version__', '?')} in {sys.executable}")
    ]
    arch = (cfg.get("architectures") or [None])[0]
    try:
        from sglang.srt.models.registry import ModelRegistry

        cls = ModelRegistry.models.get(arch)
    except Exception as exc:  # noqa: BLE001
        out.append(Finding("target_arch", "warning", f"could not read SGLang's model registry: {exc}"))
        return out
    if cls is None:
        out.append(
            Finding(
                "target_arch",
                "error",
                f"{target_path}/config.json: {arch} is not in SGLang's model "
                "registry. Fix: an SGLang version that supports it",
            )
        )
    elif not hasattr(cls, "set_eagle3_layers_to_capture"):
        out.append(
            Finding(
                "target_arch",
                "error",
                f"{target_path}/config.json: SGLang's {cls.__name__} has no "
                "set_eagle3_layers_to_capture: no EAGLE-3 for this target in this SGLang",
            )
        )
    else:
        out.append(Finding("target_arch", "ok", f"{arch} -> SGLang {cls.__name__} supports EAGLE-3"))
    return out


# The EAGLE-3 drafter classes SGLang 0.5.15 serves: the Llama layer (models/llama_eagle3.py) and the MLA layer for
# Kimi-K2.x targets (models/kimi_k25_eagle3.py), named as vLLM names them.
SGLANG_EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")


def sglang_drafter_checks(
    name: str, drafter_dir: str, cfg: dict[str, Any], shapes: dict[str, list[int]], max_model_len: int
) -> list[Finding]:
    """What SGLang 0.5.15 would serve of this drafter, read from its config and tensor names (SGLang itself is not
    needed). SGLang's loaders skip weights they do not know without a word, so a drafter trained with a norm SGLang's
    layer lacks loads, serves, and drafts wrongly: low acceptance, no error. These checks make that an error."""
    check, where = f"drafter_layout[{name}]", f"{drafter_dir}/config.json"
    arch = (cfg.get("architectures") or [None])[0]
    out: list[Finding] = []
    if cfg.get("speculators_model_type") or arch not in SGLANG_EAGLE3_ARCHS:
        out.append(
            Finding(
                check,
                "error",
                f"{where}: architecture {arch!r}"
                + (" in speculators' format" if cfg.get("speculators_model_type") else "")
                + f": SGLang serves EAGLE-3 drafters of {list(SGLANG_EAGLE3_ARCHS)} in vLLM's plain layout. Fix: "
                "export the drafter with eagleflow (export.formats [vllm]) or serve it with vLLM",
            )
        )
    if cfg.get("norm_before_fc") or "input_norm.weight" in shapes:
        out.append(
            Finding(
                check,
                "error",
                f"{where}: norm_before_fc (input_norm.weight, one RMSNorm over the concatenated target states): "
                "SGLang's EAGLE-3 layer has no such norm and drops the weight, so the drafter would draft from "
                "un-normed states. Fix: train with train.norm_before_fc: false, or serve it with vLLM",
            )
        )
    if cfg.get("norm_before_residual"):
        out.append(
            Finding(
                check,
                "error",
                f"{where}: norm_before_residual: SGLang's EAGLE-3 layer always carries fc's output, before the "
                "norm, as the residual. Fix: train with train.norm_before_residual: false, or serve it with vLLM",
            )
        )
    positions = cfg.get("max_position_embeddings")
    if positions is not None and int(positions) < max_model_len:
        out.append(
            Finding(
                check,
                "error",
                f"{where}: max_position_embeddings {positions} is below engine.max_model_len {max_model_len}: SGLang "
                "refuses to start (the drafter's context is the server's). Fix: lower engine.max_model_len, or "
                "export the drafter with max_position_embeddings >= it",
            )
        )
    if not out:
        out.append(Finding(check, "ok", f"{where}: {arch}, a layout SGLang serves as trained"))
    return out
