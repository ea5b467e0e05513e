"""The vLLM checks: the installed vLLM asked directly (its model registry, interface classes and config
rewrites), importing only the model modules it names."""

from __future__ import annotations

import copy
import inspect
import sys
from pathlib import Path
from typing import Any

from eagleflow.engines.preflight.configs import text_config
from eagleflow.engines.preflight.findings import Finding
from eagleflow.engines.preflight.vllm_source import (
    DRAFTER_OPTIONS,
    check_drafter_options,
    check_whitelist,
    find_image_token_rule,
)


class VllmInstall:
    """The installed vLLM, imported once: its registry, interfaces and config code."""

    def __init__(self) -> None:
        import vllm

        self.version = str(vllm.__version__)
        self.root = Path(vllm.__file__).parent
        # The registry module imports the interface definitions but no model module.
        from vllm.model_executor.models import interfaces, registry

        self.registry = registry.ModelRegistry
        self.interfaces = interfaces

    def source(self, *candidates: str) -> tuple[str, str] | None:
        """(text, path) of the first existing file below the vllm package (moved between versions)."""
        for rel in candidates:
            path = self.root / rel
            if path.is_file():
                return path.read_text(), f"vllm/{rel}"
        return None

    def load_class(self, arch: str) -> tuple[type | None, str]:
        """The registered class of `arch` (its one module imported), or None and why not."""
        entry = self.registry.models.get(arch)
        if entry is None:
            return None, "not registered"
        try:
            return entry.load_model_cls(), ""
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            module = getattr(entry, "module_name", "?")
            return None, f"importing {module} failed: {type(exc).__name__}: {exc}"


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def target_checks(
    v: VllmInstall, target_path: str, cfg: dict[str, Any], trust_remote_code: bool
) -> tuple[list[Finding], type | None, Any]:
    """Registry + SupportsEagle3 of the target class; the whitelist; returns (findings, class, vLLM's hf config)."""
    out: list[Finding] = []
    arch = (cfg.get("architectures") or [None])[0]
    cfg_path = f"{target_path}/config.json"
    cls = None
    if not arch:
        out.append(
            Finding(
                "target_arch",
                "error",
                f"{cfg_path} has no architectures: vLLM cannot pick a model "
                'class; add e.g. "architectures": ["LlamaForCausalLM"]',
            )
        )
    elif arch not in v.registry.models:
        import transformers

        if hasattr(transformers, arch):
            out.append(
                Finding(
                    "target_arch",
                    "warning",
                    f"{cfg_path}: {arch} has no native class in vLLM "
                    f"{v.version}; vLLM falls back to its Transformers backend for it (check that backend "
                    "serves this model with EAGLE-3, or use a vLLM version that registers it)",
                )
            )
        else:
            out.append(
                Finding(
                    "target_arch",
                    "error",
                    f"{cfg_path}: architecture {arch} is not registered in vLLM "
                    f"{v.version} (vllm/model_executor/models/registry.py) nor a Transformers class: vLLM "
                    "cannot load this target. Fix: a vLLM version that supports it",
                )
            )
    else:
        cls, why = v.load_class(arch)
        if cls is None:
            out.append(
                Finding(
                    "target_arch",
                    "error",
                    f"{cfg_path}: vLLM {v.version} registers {arch}, but {why}; "
                    "vLLM would fail the same way at launch. Fix: install the missing package in "
                    f"{sys.executable}'s environment",
                )
            )
        elif not v.interfaces.supports_eagle3(cls):
            out.append(
                Finding(
                    "target_arch",
                    "error",
                    f"{cfg_path}: {arch} -> {_class_path(cls)} does not implement "
                    f"SupportsEagle3 in vLLM {v.version} (vllm/model_executor/models/interfaces.py): the "
                    'launch fails after the weights load with "Model does not support EAGLE3 '
                    'interface". Fix: a vLLM version whose class implements SupportsEagle3 (e.g. '
                    "supports_eagle3 = True and the aux-hidden-state capture), or serve without EAGLE-3",
                )
            )
        else:
            out.append(Finding("target_arch", "ok", f"{arch} -> {_class_path(cls)} implements SupportsEagle3"))

    hf_config = None
    try:
        from vllm.transformers_utils.config import get_config, get_hf_text_config

        hf_config = get_config(target_path, trust_remote_code=trust_remote_code)
        model_type = str(get_hf_text_config(hf_config).model_type)
    except Exception as exc:  # noqa: BLE001 - vLLM's own config loader refusing it is the finding
        out.append(
            Finding("target_config", "error", f"vLLM {v.version} cannot read {cfg_path}: {type(exc).__name__}: {exc}")
        )
        model_type = str(text_config(cfg).get("model_type", ""))
    src = v.source("config/speculative.py", "config.py")
    if src is not None:
        out.append(check_whitelist(src[0], src[1], model_type, v.version))
    return out, cls, hf_config


def default_aux_ids(v: VllmInstall, cls: type | None, num_layers: int) -> list[int] | None:
    """What vLLM feeds when the drafter names no layers: SupportsEagle3's default, run on a stand-in
    that has only `model.layers` (the one thing that default reads). None when the class overrides it."""
    proto = v.interfaces.SupportsEagle3
    method = getattr(proto, "get_eagle3_default_aux_hidden_state_layers", None)
    if method is None:
        return None
    if cls is not None and getattr(cls, "get_eagle3_default_aux_hidden_state_layers", method) is not method:
        return None
    from types import SimpleNamespace

    stand_in = SimpleNamespace(model=SimpleNamespace(layers=[None] * num_layers))
    try:
        return [int(i) for i in method(stand_in)]
    except Exception:  # noqa: BLE001
        return None


def drafter_checks(v: VllmInstall, name: str, drafter_dir: str, cfg: dict[str, Any]) -> list[Finding]:
    """The class vLLM will build for the drafter; and whether it reads the options the config turns on."""
    found, cls = drafter_arch(v, name, drafter_dir, cfg)
    if cls is None or not any(cfg.get(k) for k in DRAFTER_OPTIONS):
        return [found]
    path = Path(inspect.getsourcefile(cls) or "")
    where = f"vllm/{path.relative_to(v.root)}" if path.is_relative_to(v.root) else str(path)
    options = check_drafter_options(name, cfg, f"{drafter_dir}/config.json", path.read_text(), where, v.version)
    return [found] + ([options] if options is not None else [])


def drafter_arch(v: VllmInstall, name: str, drafter_dir: str, cfg: dict[str, Any]) -> tuple[Finding, type | None]:
    """The class vLLM will build for the drafter, through vLLM's own config rewrites (None: the finding says why)."""
    check = f"drafter_arch[{name}]"
    cfg_path = f"{drafter_dir}/config.json"
    declared = (cfg.get("architectures") or ["?"])[0]
    try:
        if cfg.get("speculators_model_type"):
            # Speculators format: vLLM derives architectures from transformer_layer_config's model_type.
            from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

            arch = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(cfg))["architectures"][0]
        else:
            from transformers import AutoConfig
            from vllm.config.speculative import SpeculativeConfig
            from vllm.transformers_utils.configs.eagle import EAGLEConfig

            hf = AutoConfig.for_model(**copy.deepcopy(cfg))
            model_type = hf.model_type
            hf = SpeculativeConfig.hf_config_override(hf)  # what SpeculativeConfig does to every draft config
            if hf.model_type != model_type or hf.architectures[0] != declared:
                return Finding(
                    check,
                    "error",
                    f"{cfg_path}: vLLM {v.version} rewrites this drafter (model_type "
                    f"{model_type!r}) into {hf.architectures[0]} (model_type {hf.model_type!r}): it would "
                    "be loaded as a multi-token-prediction head, not an EAGLE-3 drafter. Fix: set the "
                    "drafter's model_type to one vLLM leaves alone (an MLA drafter: 'deepseek_v2')",
                ), None
            arch = EAGLEConfig(hf, method="eagle3", model_type="eagle").architectures[0]
    except Exception as exc:  # noqa: BLE001 - vLLM refusing the config is the finding
        return Finding(
            check,
            "error",
            f"vLLM {v.version} cannot build an EAGLE-3 drafter config from {cfg_path}: {type(exc).__name__}: {exc}",
        ), None
    cls, why = v.load_class(arch)
    if cls is None:
        return Finding(
            check,
            "error",
            f"{cfg_path}: architectures {declared!r} becomes {arch} in vLLM {v.version}, "
            f"which is {why} (vllm/model_executor/models/registry.py). Fix: export the drafter as a "
            "registered EAGLE-3 architecture such as LlamaForCausalLMEagle3",
        ), None
    return Finding(check, "ok", f"{declared} -> {arch} -> {_class_path(cls)}"), cls


def multimodal_checks(v: VllmInstall, cls: type | None, hf_config: Any, cfg_path: str) -> list[Finding]:
    """What vLLM 0.32's EAGLE proposer reads from a multimodal target (llm_base_proposer.load_model):
    `get_language_model()` (then `.model.embed_tokens` / `.lm_head` to share) and one image-token field
    of the target's config, which it copies into the drafter's config; SupportsEagle3's layer setup
    goes through `get_language_model()` / `language_model` too."""
    if cls is None:
        return []
    out: list[Finding] = []
    arch = cls.__name__
    if not v.interfaces.supports_multimodal(cls):
        out.append(
            Finding(
                "multimodal",
                "warning",
                f"{cfg_path} is a multimodal config, but {_class_path(cls)} is "
                "not SupportsMultiModal: vLLM's proposer treats it as text-only",
            )
        )
        return out
    if not hasattr(cls, "get_language_model"):
        out.append(
            Finding(
                "multimodal",
                "error",
                f"{_class_path(cls)} has no get_language_model(), which vLLM's "
                "EAGLE proposer calls to share the target's embedding and lm_head with the drafter",
            )
        )
    else:
        out.append(
            Finding(
                "multimodal",
                "ok",
                f"{arch} has get_language_model() (the proposer shares its embed_tokens and lm_head)",
            )
        )
    src = v.source("v1/spec_decode/llm_base_proposer.py", "v1/spec_decode/eagle.py")
    rule = find_image_token_rule(src[0]) if src else None
    if rule is None:
        out.append(
            Finding(
                "multimodal",
                "warning",
                "could not find which target config field vLLM's proposer copies "
                "into the drafter's image_token_index (llm_base_proposer.load_model); not checked",
            )
        )
        return out
    path = rule.by_class.get(arch, rule.default)
    if path is None:
        return out
    config_path = path.removeprefix("config.")
    found, value = getattr_path(hf_config, config_path) if hf_config is not None else (False, None)
    if not found:
        out.append(
            Finding(
                "multimodal",
                "error",
                f"{cfg_path} has no {config_path}: vLLM {v.version}'s EAGLE "
                f"proposer reads target_model.{path} for {arch} ({src[1]}, load_model) and fails with an "
                'AttributeError after the target has loaded. Fix: add "'
                + config_path.split(".")[-1]
                + '" (the image placeholder token id) to '
                + cfg_path,
            )
        )
    else:
        out.append(Finding("multimodal", "ok", f"{config_path} = {value} (read by vLLM's proposer for {arch})"))
    return out


def getattr_path(obj: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(obj, dict):
            if part not in obj:
                return False, None
            obj = obj[part]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            return False, None
    return True, obj
