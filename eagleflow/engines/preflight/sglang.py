"""The SGLang checks: import, version, model registry, EAGLE-3 support of the target class."""

from __future__ import annotations

import sys
from typing import Any

from eagleflow.engines.preflight.findings import Finding


def sglang_checks(cfg: dict[str, Any], target_path: str) -> list[Finding]:
    """Import + version + registry. Relies on SGLang's `sglang.srt.models.registry.ModelRegistry.models`
    (arch -> class) and on its EAGLE-3 targets defining `set_eagle3_layers_to_capture` (llama.py,
    qwen2.py, deepseek_v2.py ...). The checks on layer ids and shapes are shared with vLLM."""
    try:
        import sglang
    except Exception as exc:  # noqa: BLE001
        return [
            Finding(
                "engine",
                "error",
                f"sglang is not importable in {sys.executable}: {type(exc).__name__}: "
                f"{exc}. Fix: install SGLang in the host environment, or set engine.kind: vllm",
            )
        ]
    out = [Finding("engine", "ok", f"sglang {getattr(sglang, '__version__', '?')} in {sys.executable}")]
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
