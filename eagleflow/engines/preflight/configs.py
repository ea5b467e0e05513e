"""Reading checkpoint configs and safetensors headers the way the engines do (no tensor is read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagleflow.engines.preflight.findings import Finding


def read_config(model_dir: str | Path) -> tuple[dict[str, Any] | None, Finding | None]:
    """config.json of a checkpoint directory, or the finding that says why it cannot be read."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None, Finding("config", "error", f"{path} does not exist: pass an HF-format checkpoint directory")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, Finding("config", "error", f"{path} is not valid JSON: {exc}")
    if not isinstance(cfg, dict):
        return None, Finding("config", "error", f"{path} must hold a JSON object")
    return cfg, None


def is_multimodal_config(cfg: dict[str, Any]) -> bool:
    return isinstance(cfg.get("text_config"), dict) or isinstance(cfg.get("vision_config"), dict)


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal wrapper, else the config itself."""
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


def drafter_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The drafter's effective EAGLE-3 fields, whatever the layout.

    Speculators format: the layer shape sits in `transformer_layer_config`, the EAGLE-3 fields at the
    top level (vLLM's SpeculatorsConfig merges them the same way). vLLM reads the layer ids from the
    top level first, then from `eagle_config` (gpu_model_runner._get_eagle3_aux_layers_from_config).
    """
    merged = dict(cfg.get("transformer_layer_config") or {}) if cfg.get("speculators_model_type") else {}
    merged.update({k: v for k, v in cfg.items() if k != "transformer_layer_config"})
    ids = merged.get("eagle_aux_hidden_state_layer_ids")
    if not ids and isinstance(merged.get("eagle_config"), dict):
        ids = merged["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    merged["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids] if ids else None
    return merged


def safetensors_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """tensor name -> shape, from the safetensors headers only (no tensor is read).

    A `model.` prefix is dropped: some exporters write it, vLLM's EAGLE-3 loaders strip it.
    """
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                shapes[name.removeprefix("model.")] = list(h.get_slice(name).get_shape())
    return shapes
