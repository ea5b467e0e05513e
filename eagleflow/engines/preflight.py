"""Engine preflight: in seconds, before any weights load, does this engine serve this target with these drafters?

A 1T-parameter target takes ~30 minutes to load, and every EAGLE-3 integration failure we have seen
surfaced only after that load (or never, as collapsed acceptance). This module asks the installed
engine itself (its model registry, its interface classes, its config code) in the host environment,
reads only config.json files and safetensors *headers*, and reports each problem with its cause and
its fix. It never builds a model and never reads a tensor.

Checks (vLLM; what each relies on is said beside it):
  engine          the engine imports; its version.
  target_arch     config.json `architectures[0]` is in vLLM's ModelRegistry and its class implements
                  SupportsEagle3 (vllm/model_executor/models/interfaces.py); only that one model
                  module is imported.
  whitelist       older vLLMs refused EAGLE-3 for target model types outside a hard-coded list in
                  SpeculativeConfig (`eagle3_target_supported`); read from the installed source.
  drafter_arch    the architecture vLLM will build for the drafter (after its own config rewrites:
                  speculators format, MTP model types, the Eagle3 name prefix) is registered.
  aux_layer_ids   the drafter's `eagle_aux_hidden_state_layer_ids` fit the target's layers and the
                  engine's convention (vLLM: id k = input of decoder layer k = HF hidden_states[k]).
  dimensions      hidden sizes, vocabulary sizes, lm_head / d2t / fc shapes (safetensors headers).
  multimodal      for wrapper targets: what vLLM's EAGLE-3 proposer reads from the target model.
  disk, gpu       free space under a directory; free memory on each visible GPU.

Runs as `python -m eagleflow.engines.preflight ...` (JSON out, exit 1 on any error) or in-process
via `run_preflight`.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from eagleflow.config import EngineConfig

Level = Literal["ok", "warning", "error"]
_GIB = 1024**3


@dataclass(frozen=True)
class Finding:
    """One check's verdict. Errors name the cause (file, field, values) and the fix."""

    check: str
    level: Level
    message: str


def format_findings(findings: list[Finding]) -> str:
    """One line per finding, errors first, for logs and exception messages."""
    order = {"error": 0, "warning": 1, "ok": 2}
    lines = [f"{f.level.upper():7} {f.check}: {f.message}" for f in sorted(findings, key=lambda f: order[f.level])]
    return "\n".join(lines)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)


# ----------------------------------------------------------------------------------- configs

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


# ------------------------------------------------------------------- old vLLM's eagle3 whitelist

@dataclass(frozen=True)
class Eagle3Whitelist:
    """`eagle3_target_supported` of an older SpeculativeConfig: target model types EAGLE-3 was allowed for."""

    model_types: list[str]
    conditional: list[str]  # appended only under a condition (e.g. "qwen" for speculators-format drafters)


def find_eagle3_whitelist(source: str) -> Eagle3Whitelist | None:
    """The eagle3 target whitelist in SpeculativeConfig's source text, or None when there is none.

    vLLM 0.9-0.13 (vllm/config.py, later vllm/config/speculative.py) had, in `_verify_args`:
        eagle3_target_supported = ["llama", "qwen", "minicpm", "gpt_oss"]
        if self.method == "eagle3" and ... not any(m in hf_text_config.model_type for m in ...):
            raise ValueError(f"Eagle3 is only supported for {eagle3_target_supported} models. ...")
    and one version appended "qwen" only for speculators-format drafters. Read with ast, not imported.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    models: list[str] | None = None
    conditional: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any("eagle3" in n and "supported" in n for n in names):
                models = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
              and isinstance(node.func.value, ast.Name) and "eagle3" in node.func.value.id
              and "supported" in node.func.value.id and node.args and isinstance(node.args[0], ast.Constant)):
            conditional.append(str(node.args[0].value))
    if models is None:
        return None
    return Eagle3Whitelist(model_types=models, conditional=conditional)


def whitelist_admits(model_types: list[str], model_type: str) -> bool:
    """The old check's own rule: a substring match ("qwen" admits "qwen3_moe", "llama" admits "llama4")."""
    return any(m in model_type for m in model_types)


def check_whitelist(source: str, where: str, model_type: str, engine_version: str) -> Finding:
    wl = find_eagle3_whitelist(source)
    if wl is None:
        return Finding("whitelist", "ok", f"vLLM {engine_version} has no EAGLE-3 target model-type whitelist in "
                       f"{where}; the target class's SupportsEagle3 interface decides")
    if whitelist_admits(wl.model_types, model_type):
        return Finding("whitelist", "ok", f"target model_type {model_type!r} is in vLLM {engine_version}'s EAGLE-3 "
                       f"whitelist {wl.model_types} ({where})")
    extra = f" (plus {wl.conditional} for some drafter formats)" if wl.conditional else ""
    admitted_conditionally = whitelist_admits(wl.conditional, model_type)
    return Finding(
        "whitelist", "warning" if admitted_conditionally else "error",
        f"vLLM {engine_version} allows EAGLE-3 only for target model types containing one of {wl.model_types}"
        f"{extra} (eagle3_target_supported in {where}); the target's text model_type is {model_type!r}, so the "
        f"launch fails with \"Eagle3 is only supported for ... models\". Fix: use a vLLM version without this "
        "whitelist (0.32 has none) or one that lists this model type"
        + ("; it is admitted only with a speculators-format drafter" if admitted_conditionally else ""),
    )


# ---------------------------------------------------------------------------------- layer ids

def specforge_default(num_layers: int) -> list[int]:
    """SpecForge/SGLang configs' ids ("output of layer i") for an L-layer target: [1, L//2-1, L-4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def check_aux_layer_ids(name: str, ids: list[int] | None, num_layers: int, default_ids: list[int] | None,
                        expected: list[int] | None, num_aux_states: int | None, engine_kind: str = "vllm",
                        where: str = "config.json") -> list[Finding]:
    """The drafter's layer ids against the target's depth, the engine's convention and the training ids.

    `expected` and the checks are in vLLM's convention: id k = the input of decoder layer k = HF
    hidden_states[k] (vLLM 0.32 llama.py captures id 0 before the first layer and id idx+1 after layer
    idx, so L is the last layer's output, the final state). SGLang adds 1 to the ids in the drafter config
    (`layers_to_capture = [val + 1 for val in layer_ids]`), so there a config id i means vLLM id i+1.
    """
    check = f"aux_layer_ids[{name}]"
    shift = 1 if engine_kind == "sglang" else 0
    field = f"eagle_aux_hidden_state_layer_ids in {where}"

    def to_config(vllm_ids: list[int]) -> list[int]:
        return [i - shift for i in vllm_ids]

    if not ids:
        if default_ids is None:
            return [Finding(check, "warning", f"{field} is not set: the engine picks its default layers, which "
                            "preflight could not determine; write the ids the drafter was trained on")]
        msg = (f"{field} is not set: {engine_kind} then feeds its default layers {default_ids} "
               "(vLLM convention; SupportsEagle3.get_eagle3_default_aux_hidden_state_layers = [2, L//2, L-3])")
        if expected is not None and list(expected) != list(default_ids):
            return [Finding(check, "error", f"{msg}, but the drafter was trained on {list(expected)}: acceptance "
                            f"collapses. Fix: write \"eagle_aux_hidden_state_layer_ids\": {to_config(expected)} "
                            f"into {where}")]
        return [Finding(check, "ok" if expected is not None else "warning", msg)]

    served = [i + shift for i in ids]  # vLLM convention from here on
    findings: list[Finding] = []
    if num_aux_states is not None and len(ids) != num_aux_states:
        findings.append(Finding(check, "error", f"{field} is {ids}: {len(ids)} ids, but the drafter's fc takes "
                                f"{num_aux_states} target states; write {num_aux_states} ids"))
    if sorted(set(ids)) != list(ids):
        findings.append(Finding(check, "warning", f"{field} is {ids}, not strictly increasing: vLLM sorts and "
                                "de-duplicates them (EagleModelMixin._set_aux_hidden_state_layers), so the drafter "
                                "may get its states in another order than it was trained on"))
    beyond = [i for i, s in zip(ids, served) if s > num_layers]
    final = [i for i, s in zip(ids, served) if s == num_layers]
    below = [i for i, s in zip(ids, served) if s < 1]
    if beyond:
        findings.append(Finding(check, "error", f"{field} is {ids}: {beyond} lie beyond the target's "
                                f"{num_layers} layers and are never captured, so the drafter gets fewer states than "
                                f"its fc expects; write ids in [{1 - shift}, {num_layers - 1 - shift}]"))
    if final:
        findings.append(Finding(check, "error", f"{field} is {ids}: {final} is the last layer's output (the final "
                                "state, not an auxiliary layer); EAGLE-3 aux ids lie in "
                                f"[{1 - shift}, {num_layers - 1 - shift}] for a {num_layers}-layer target"))
    if below:
        findings.append(Finding(check, "error", f"{field} is {ids}: {below} is the embedding output, not a decoder "
                                f"layer's state; aux ids lie in [{1 - shift}, {num_layers - 1 - shift}]"))
    if expected is not None:
        exp = list(expected)
        if served == exp:
            findings.append(Finding(check, "ok", f"{field} is {ids}: the layers the drafter was trained on "
                                    f"(vLLM convention {exp})"))
        elif len(served) == len(exp) and all(s == e - 1 for s, e in zip(served, exp)):
            findings.append(Finding(check, "error", f"{field} is {ids}, one below the layers the drafter was trained "
                                    f"on ({exp} in vLLM's convention): these are SpecForge/SGLang-style \"output of "
                                    f"layer i\" ids, and {engine_kind} would feed every state one layer too early "
                                    f"(acceptance collapses). Fix: write \"eagle_aux_hidden_state_layer_ids\": "
                                    f"{to_config(exp)} into {where}"))
        elif len(served) == len(exp) and all(s == e + 1 for s, e in zip(served, exp)):
            findings.append(Finding(check, "error", f"{field} is {ids}, one above the layers the drafter was trained "
                                    f"on ({exp} in vLLM's convention): the ids were shifted twice between "
                                    f"conventions. Fix: write \"eagle_aux_hidden_state_layer_ids\": {to_config(exp)} "
                                    f"into {where}"))
        else:
            findings.append(Finding(check, "error", f"{field} is {ids}, but the drafter was trained on {exp} "
                                    f"(vLLM convention, target.aux_layer_ids). Fix: write {to_config(exp)}, or "
                                    "correct target.aux_layer_ids if the drafter really was trained on these"))
    elif not any(f.level == "error" for f in findings):
        pattern = specforge_default(num_layers)
        if engine_kind == "vllm" and ids == pattern and pattern != (default_ids or []) and len(set(pattern)) == 3 \
                and pattern[0] >= 1:
            findings.append(Finding(check, "warning", f"{field} is {ids}, SpecForge/SGLang's \"output of layer i\" "
                                    f"pattern [1, L/2-1, L-4] for L={num_layers}: probably the other convention. "
                                    f"vLLM reads id k as the input of layer k; the same layers are "
                                    f"{[i + 1 for i in ids]} there"))
        else:
            findings.append(Finding(check, "ok", f"{field} is {ids} (within the target's {num_layers} layers; "
                                    "pass the training ids to check the convention)"))
    return findings


# -------------------------------------------------------------------------------- dimensions

def check_dimensions(name: str, target_text: dict[str, Any], drafter: dict[str, Any],
                     shapes: dict[str, list[int]], drafter_dir: str) -> list[Finding]:
    """Hidden sizes, vocabularies and the d2t / lm_head / fc shapes the engine will load."""
    check = f"dimensions[{name}]"
    cfg_path = f"{drafter_dir}/config.json"
    st_path = f"{drafter_dir}/*.safetensors"
    out: list[Finding] = []
    t_hidden = target_text.get("hidden_size")
    t_vocab = target_text.get("vocab_size")
    d_hidden = drafter.get("hidden_size")
    d_target_hidden = drafter.get("target_hidden_size") or d_hidden
    vocab = drafter.get("vocab_size")
    draft_vocab = drafter.get("draft_vocab_size") or vocab

    if t_hidden is not None and d_hidden is not None and int(d_hidden) != int(t_hidden):
        out.append(Finding(check, "error", f"{cfg_path}: hidden_size is {d_hidden}, the target's is {t_hidden}: the "
                           "drafter shares the target's embedding and takes its states, so it must be as wide. vLLM "
                           "0.32 still loads it and answers healthy, then the engine dies on the first request (\"The "
                           "size of tensor a (3*target) must match the size of tensor b (3*drafter)\"). This drafter "
                           "belongs to another model. Fix: train/export it for this target"))
    if t_hidden is not None and d_target_hidden is not None and int(d_target_hidden) != int(t_hidden):
        out.append(Finding(check, "error", f"{cfg_path}: target_hidden_size is {d_target_hidden}, the target's "
                           f"hidden_size is {t_hidden}: its fc cannot take the target's states"))
    if t_vocab is not None and vocab is not None and int(vocab) != int(t_vocab):
        out.append(Finding(check, "error", f"{cfg_path}: vocab_size is {vocab}, the target's is {t_vocab}: draft "
                           "tokens would map into another vocabulary. Fix: export the drafter for this target"))

    lm_head = shapes.get("lm_head.weight")
    if lm_head is not None and draft_vocab is not None and lm_head[0] != int(draft_vocab):
        out.append(Finding(check, "error", f"{st_path}: lm_head.weight has {lm_head[0]} rows, {cfg_path} says "
                           f"draft_vocab_size {draft_vocab}. Fix: set draft_vocab_size to {lm_head[0]}"))
    if lm_head is not None and d_hidden is not None and lm_head[1] != int(d_hidden):
        out.append(Finding(check, "error", f"{st_path}: lm_head.weight is {lm_head} wide, hidden_size is {d_hidden}"))
    d2t = shapes.get("d2t")
    if draft_vocab is not None and vocab is not None and int(draft_vocab) < int(vocab):
        if d2t is None:
            out.append(Finding(check, "error", f"{st_path} has no d2t, but draft_vocab_size {draft_vocab} < "
                               f"vocab_size {vocab}: vLLM then maps draft id d to target id d (its d2t buffer stays "
                               "zero) and acceptance collapses without any error. Fix: export with the draft "
                               "vocabulary's d2t (eagleflow.drafter.formats.export_vllm writes d2t and t2d)"))
        elif d2t != [int(draft_vocab)]:
            out.append(Finding(check, "error", f"{st_path}: d2t has shape {d2t}, draft_vocab_size is "
                               f"{draft_vocab}: they must agree ([draft_vocab_size] offsets)"))
    elif d2t is not None and vocab is not None and draft_vocab is not None and int(draft_vocab) >= int(vocab):
        out.append(Finding(check, "error", f"{st_path} has d2t {d2t} but draft_vocab_size equals vocab_size "
                           f"({vocab}): vLLM allocates no d2t then and its loader fails on the unexpected tensor. "
                           "Fix: drop d2t/t2d, or set draft_vocab_size to the d2t length"))
    fc = shapes.get("fc.weight")
    if fc is not None and t_hidden is not None:
        n_states = fc[1] / int(t_hidden)
        if n_states != int(n_states):
            out.append(Finding(check, "error", f"{st_path}: fc.weight is {fc}: its input {fc[1]} is no multiple of "
                               f"the target's hidden_size {t_hidden}"))
    if not out:
        out.append(Finding(check, "ok", f"hidden_size {d_hidden} = target's {t_hidden}; vocab_size {vocab} = "
                           f"target's {t_vocab}; draft_vocab_size {draft_vocab}"
                           + (f" with d2t {d2t}" if d2t else "")))
    return out


def fc_num_states(shapes: dict[str, list[int]], target_hidden: int | None) -> int | None:
    """How many target states the drafter's fc takes: fc.weight is [H, n * target_hidden_size], with the
    drafter's own target_hidden_size (a mismatch with the real target is the dimensions check's)."""
    fc = shapes.get("fc.weight")
    if fc is None or not target_hidden or fc[1] % int(target_hidden):
        return None
    return fc[1] // int(target_hidden)


# ---------------------------------------------------------------------- multimodal (vLLM source)

@dataclass(frozen=True)
class ImageTokenRule:
    """Which attribute of the target's config vLLM's EAGLE proposer copies into the drafter's
    `image_token_index`, per target class (llm_base_proposer.load_model in vLLM 0.32)."""

    by_class: dict[str, str]  # class name -> attribute path below `target_model.`, e.g. "config.image_token_id"
    default: str | None


def find_image_token_rule(source: str) -> ImageTokenRule | None:
    """Read the `if get_model_name(target_model) in [...]: ... = target_model.config.X` chain of the
    proposer's `load_model` (pure; the source text is the installed vLLM's)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "load_model":
            for node in ast.walk(fn):
                if isinstance(node, ast.If) and "get_model_name" in ast.unparse(node.test):
                    return _walk_if_chain(node)
    return None


def _assigned_target_attr(body: list[ast.stmt]) -> str | None:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any("image_token_index" in ast.unparse(t) for t in stmt.targets):
            text = ast.unparse(stmt.value)
            if text.startswith("target_model."):
                return text.removeprefix("target_model.")
    return None


def _walk_if_chain(node: ast.If) -> ImageTokenRule:
    by_class: dict[str, str] = {}
    default: str | None = None
    current: ast.stmt | None = node
    while isinstance(current, ast.If):
        attr = _assigned_target_attr(current.body)
        test = current.test
        if isinstance(test, ast.Compare) and attr:
            for comp in test.comparators:
                values = comp.elts if isinstance(comp, (ast.List, ast.Tuple, ast.Set)) else [comp]
                for v in values:
                    if isinstance(v, ast.Constant) and isinstance(v.value, str):
                        by_class[v.value] = attr
        if len(current.orelse) == 1 and isinstance(current.orelse[0], ast.If):
            current = current.orelse[0]
        else:
            default = _assigned_target_attr(current.orelse)
            current = None
    return ImageTokenRule(by_class=by_class, default=default)


def _getattr_path(obj: Any, path: str) -> tuple[bool, Any]:
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


# ---------------------------------------------------------------------------------- resources

def check_disk(path: str, min_free_gib: float) -> Finding:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent  # the directory may not exist yet; its filesystem does
    free = shutil.disk_usage(p).free / _GIB
    if free < min_free_gib:
        return Finding("disk", "error", f"{free:.1f} GiB free under {path}, engine.min_free_disk_gib is "
                       f"{min_free_gib:g}: free space there or lower the limit")
    return Finding("disk", "ok", f"{free:.1f} GiB free under {path} (need {min_free_gib:g})")


def check_gpus(min_free_fraction: float) -> list[Finding]:
    """Free memory per visible GPU (torch.cuda.mem_get_info). Meaningful only once nothing else (e.g.
    production) holds the GPUs. The CPU build has no CUDA: then the check says so and is skipped."""
    import torch

    if not torch.cuda.is_available():
        build = "CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, no visible GPU"
        return [Finding("gpu", "ok", f"torch {torch.__version__} ({build}): the engine runs on CPU; GPU memory "
                        "checks skipped")]
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        frac = free / total
        name = torch.cuda.get_device_name(i)
        if frac < min_free_fraction:
            out.append(Finding("gpu", "error", f"GPU {i} ({name}): {free / _GIB:.1f} of {total / _GIB:.1f} GiB "
                               f"free ({frac:.0%}), the engine needs {min_free_fraction:.0%}: another process holds "
                               "it (nvidia-smi shows which); stop it or lower engine.gpu_memory_utilization"))
        else:
            out.append(Finding("gpu", "ok", f"GPU {i} ({name}): {frac:.0%} free (need {min_free_fraction:.0%})"))
    return out


# -------------------------------------------------------------------------------- vLLM checks

class _Vllm:
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


def _vllm_target_checks(v: _Vllm, target_path: str, cfg: dict[str, Any], trust_remote_code: bool
                        ) -> tuple[list[Finding], type | None, Any]:
    """Registry + SupportsEagle3 of the target class; the whitelist; returns (findings, class, vLLM's hf config)."""
    out: list[Finding] = []
    arch = (cfg.get("architectures") or [None])[0]
    cfg_path = f"{target_path}/config.json"
    cls = None
    if not arch:
        out.append(Finding("target_arch", "error", f"{cfg_path} has no architectures: vLLM cannot pick a model "
                           "class; add e.g. \"architectures\": [\"LlamaForCausalLM\"]"))
    elif arch not in v.registry.models:
        import transformers

        if hasattr(transformers, arch):
            out.append(Finding("target_arch", "warning", f"{cfg_path}: {arch} has no native class in vLLM "
                               f"{v.version}; vLLM falls back to its Transformers backend for it (check that backend "
                               "serves this model with EAGLE-3, or use a vLLM version that registers it)"))
        else:
            out.append(Finding("target_arch", "error", f"{cfg_path}: architecture {arch} is not registered in vLLM "
                               f"{v.version} (vllm/model_executor/models/registry.py) nor a Transformers class: vLLM "
                               "cannot load this target. Fix: a vLLM version that supports it"))
    else:
        cls, why = v.load_class(arch)
        if cls is None:
            out.append(Finding("target_arch", "error", f"{cfg_path}: vLLM {v.version} registers {arch}, but {why}; "
                               "vLLM would fail the same way at launch. Fix: install the missing package in "
                               f"{sys.executable}'s environment"))
        elif not v.interfaces.supports_eagle3(cls):
            out.append(Finding("target_arch", "error", f"{cfg_path}: {arch} -> {_class_path(cls)} does not implement "
                               f"SupportsEagle3 in vLLM {v.version} (vllm/model_executor/models/interfaces.py): the "
                               "launch fails after the weights load with \"Model does not support EAGLE3 "
                               "interface\". Fix: a vLLM version whose class implements SupportsEagle3 (e.g. "
                               "supports_eagle3 = True and the aux-hidden-state capture), or serve without EAGLE-3"))
        else:
            out.append(Finding("target_arch", "ok", f"{arch} -> {_class_path(cls)} implements SupportsEagle3"))

    hf_config = None
    try:
        from vllm.transformers_utils.config import get_config, get_hf_text_config

        hf_config = get_config(target_path, trust_remote_code=trust_remote_code)
        model_type = str(get_hf_text_config(hf_config).model_type)
    except Exception as exc:  # noqa: BLE001 - vLLM's own config loader refusing it is the finding
        out.append(Finding("target_config", "error", f"vLLM {v.version} cannot read {cfg_path}: "
                           f"{type(exc).__name__}: {exc}"))
        model_type = str(text_config(cfg).get("model_type", ""))
    src = v.source("config/speculative.py", "config.py")
    if src is not None:
        out.append(check_whitelist(src[0], src[1], model_type, v.version))
    return out, cls, hf_config


def _default_aux_ids(v: _Vllm, cls: type | None, num_layers: int) -> list[int] | None:
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


def _vllm_drafter_arch(v: _Vllm, name: str, drafter_dir: str, cfg: dict[str, Any]) -> Finding:
    """The class vLLM will build for the drafter, through vLLM's own config rewrites."""
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
                return Finding(check, "error", f"{cfg_path}: vLLM {v.version} rewrites this drafter (model_type "
                               f"{model_type!r}) into {hf.architectures[0]} (model_type {hf.model_type!r}): it would "
                               "be loaded as a multi-token-prediction head, not an EAGLE-3 drafter. Fix: set the "
                               "drafter's model_type to one vLLM leaves alone (an MLA drafter: 'deepseek_v2')")
            arch = EAGLEConfig(hf, method="eagle3", model_type="eagle").architectures[0]
    except Exception as exc:  # noqa: BLE001 - vLLM refusing the config is the finding
        return Finding(check, "error", f"vLLM {v.version} cannot build an EAGLE-3 drafter config from {cfg_path}: "
                       f"{type(exc).__name__}: {exc}")
    cls, why = v.load_class(arch)
    if cls is None:
        return Finding(check, "error", f"{cfg_path}: architectures {declared!r} becomes {arch} in vLLM {v.version}, "
                       f"which is {why} (vllm/model_executor/models/registry.py). Fix: export the drafter as a "
                       "registered EAGLE-3 architecture such as LlamaForCausalLMEagle3")
    return Finding(check, "ok", f"{declared} -> {arch} -> {_class_path(cls)}")


def _vllm_multimodal_checks(v: _Vllm, cls: type | None, hf_config: Any, cfg_path: str) -> list[Finding]:
    """What vLLM 0.32's EAGLE proposer reads from a multimodal target (llm_base_proposer.load_model):
    `get_language_model()` (then `.model.embed_tokens` / `.lm_head` to share) and one image-token field
    of the target's config, which it copies into the drafter's config; SupportsEagle3's layer setup
    goes through `get_language_model()` / `language_model` too."""
    if cls is None:
        return []
    out: list[Finding] = []
    arch = cls.__name__
    if not v.interfaces.supports_multimodal(cls):
        out.append(Finding("multimodal", "warning", f"{cfg_path} is a multimodal config, but {_class_path(cls)} is "
                           "not SupportsMultiModal: vLLM's proposer treats it as text-only"))
        return out
    if not hasattr(cls, "get_language_model"):
        out.append(Finding("multimodal", "error", f"{_class_path(cls)} has no get_language_model(), which vLLM's "
                           "EAGLE proposer calls to share the target's embedding and lm_head with the drafter"))
    else:
        out.append(Finding("multimodal", "ok", f"{arch} has get_language_model() (the proposer shares its "
                           "embed_tokens and lm_head)"))
    src = v.source("v1/spec_decode/llm_base_proposer.py", "v1/spec_decode/eagle.py")
    rule = find_image_token_rule(src[0]) if src else None
    if rule is None:
        out.append(Finding("multimodal", "warning", "could not find which target config field vLLM's proposer copies "
                           "into the drafter's image_token_index (llm_base_proposer.load_model); not checked"))
        return out
    path = rule.by_class.get(arch, rule.default)
    if path is None:
        return out
    config_path = path.removeprefix("config.")
    found, value = _getattr_path(hf_config, config_path) if hf_config is not None else (False, None)
    if not found:
        out.append(Finding("multimodal", "error", f"{cfg_path} has no {config_path}: vLLM {v.version}'s EAGLE "
                           f"proposer reads target_model.{path} for {arch} ({src[1]}, load_model) and fails with an "
                           "AttributeError after the target has loaded. Fix: add \"" + config_path.split(".")[-1]
                           + "\" (the image placeholder token id) to " + cfg_path))
    else:
        out.append(Finding("multimodal", "ok", f"{config_path} = {value} (read by vLLM's proposer for {arch})"))
    return out


# ------------------------------------------------------------------------------- SGLang checks

def _sglang_checks(cfg: dict[str, Any], target_path: str) -> list[Finding]:
    """Import + version + registry. Relies on SGLang's `sglang.srt.models.registry.ModelRegistry.models`
    (arch -> class) and on its EAGLE-3 targets defining `set_eagle3_layers_to_capture` (llama.py,
    qwen2.py, deepseek_v2.py ...). The checks on layer ids and shapes are shared with vLLM."""
    try:
        import sglang
    except Exception as exc:  # noqa: BLE001
        return [Finding("engine", "error", f"sglang is not importable in {sys.executable}: {type(exc).__name__}: "
                        f"{exc}. Fix: install SGLang in the host environment, or set engine.kind: vllm")]
    out = [Finding("engine", "ok", f"sglang {getattr(sglang, '__version__', '?')} in {sys.executable}")]
    arch = (cfg.get("architectures") or [None])[0]
    try:
        from sglang.srt.models.registry import ModelRegistry

        cls = ModelRegistry.models.get(arch)
    except Exception as exc:  # noqa: BLE001
        out.append(Finding("target_arch", "warning", f"could not read SGLang's model registry: {exc}"))
        return out
    if cls is None:
        out.append(Finding("target_arch", "error", f"{target_path}/config.json: {arch} is not in SGLang's model "
                           "registry. Fix: an SGLang version that supports it"))
    elif not hasattr(cls, "set_eagle3_layers_to_capture"):
        out.append(Finding("target_arch", "error", f"{target_path}/config.json: SGLang's {cls.__name__} has no "
                           "set_eagle3_layers_to_capture: no EAGLE-3 for this target in this SGLang"))
    else:
        out.append(Finding("target_arch", "ok", f"{arch} -> SGLang {cls.__name__} supports EAGLE-3"))
    return out


# --------------------------------------------------------------------------------------- run

def run_preflight(engine: EngineConfig, target_path: str, drafters: dict[str, str], *,
                  expected_aux_layer_ids: dict[str, list[int]] | None = None,
                  free_disk_path: str | None = None, check_gpu: bool = True) -> list[Finding]:
    """Every check for one target and its drafters (variant name -> drafter dir), in this python.

    `expected_aux_layer_ids[name]`: the ids (vLLM convention) the drafter `name` was trained on, when known.
    `check_gpu=False` skips the GPU-memory check (e.g. while production still holds the GPUs).
    """
    expected_aux_layer_ids = expected_aux_layer_ids or {}
    findings: list[Finding] = []
    target_cfg, problem = read_config(target_path)
    if problem is not None:
        findings.append(Finding("target_config", problem.level, problem.message))
    target_text = text_config(target_cfg) if target_cfg else {}
    num_layers = target_text.get("num_hidden_layers")

    v: _Vllm | None = None
    target_cls = hf_config = None
    if engine.kind == "vllm":
        try:
            v = _Vllm()
            findings.append(Finding("engine", "ok", f"vllm {v.version} in {sys.executable}"))
        except Exception as exc:  # noqa: BLE001
            findings.append(Finding("engine", "error", f"vllm is not importable in {sys.executable}: "
                                    f"{type(exc).__name__}: {exc}. Fix: install vLLM in the host environment"))
        if v is not None and target_cfg is not None:
            more, target_cls, hf_config = _vllm_target_checks(v, target_path, target_cfg, engine.trust_remote_code)
            findings += more
            if is_multimodal_config(target_cfg):
                findings += _vllm_multimodal_checks(v, target_cls, hf_config, f"{target_path}/config.json")
    else:
        findings += _sglang_checks(target_cfg or {}, target_path)

    default_ids = _default_aux_ids(v, target_cls, int(num_layers)) if v is not None and num_layers else None
    for name, drafter_dir in drafters.items():
        cfg, problem = read_config(drafter_dir)
        if problem is not None:
            findings.append(Finding(f"drafter_config[{name}]", "error", problem.message))
            continue
        fields = drafter_fields(cfg)
        if v is not None:
            findings.append(_vllm_drafter_arch(v, name, drafter_dir, cfg))
        try:
            shapes = safetensors_shapes(drafter_dir)
        except Exception as exc:  # noqa: BLE001
            findings.append(Finding(f"dimensions[{name}]", "error", f"cannot read the safetensors headers in "
                                    f"{drafter_dir}: {type(exc).__name__}: {exc}"))
            shapes = {}
        if not shapes and not any(f.check == f"dimensions[{name}]" for f in findings):
            findings.append(Finding(f"dimensions[{name}]", "error", f"no *.safetensors in {drafter_dir}"))
        if target_cfg is not None:
            findings += check_dimensions(name, target_text, fields, shapes, drafter_dir)
            if num_layers:
                findings += check_aux_layer_ids(
                    name, fields["eagle_aux_hidden_state_layer_ids"], int(num_layers),
                    default_ids if engine.kind == "vllm" else [2, int(num_layers) // 2, int(num_layers) - 3],
                    expected_aux_layer_ids.get(name),
                    fc_num_states(shapes, fields.get("target_hidden_size") or fields.get("hidden_size")),
                    engine.kind, f"{drafter_dir}/config.json")

    if free_disk_path:
        findings.append(check_disk(free_disk_path, engine.min_free_disk_gib))
    if check_gpu:
        need = engine.min_free_gpu_fraction or (engine.gpu_memory_utilization or 0.0)
        findings += check_gpus(need)
    return findings


# --------------------------------------------------------------------------------------- CLI

def _name_value(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise SystemExit(f"{flag} takes NAME=VALUE, got {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagleflow.engines.preflight", description=__doc__.split("\n")[0])
    ap.add_argument("--engine-json", default="{}", help="EngineConfig as JSON (default: all defaults).")
    ap.add_argument("--target", required=True, help="Target checkpoint directory.")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR", help="A drafter variant.")
    ap.add_argument("--expected-aux", action="append", default=[], metavar="NAME=1,2,3",
                    help="Aux layer ids (vLLM convention) drafter NAME was trained on.")
    ap.add_argument("--disk-path", help="Check engine.min_free_disk_gib under this directory.")
    ap.add_argument("--skip-gpu", action="store_true", help="Skip the GPU free-memory check.")
    ap.add_argument("--json", dest="json_out", help="Write the findings here as JSON.")
    args = ap.parse_args(argv)

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # our findings, not vLLM's import chatter
    engine = EngineConfig.model_validate_json(args.engine_json)
    drafters = dict(_name_value(d, "--drafter") for d in args.drafter)
    expected = {}
    for item in args.expected_aux:
        name, value = _name_value(item, "--expected-aux")
        expected[name] = [int(x) for x in value.split(",")]
    t0 = time.monotonic()
    findings = run_preflight(engine, args.target, drafters, expected_aux_layer_ids=expected,
                             free_disk_path=args.disk_path, check_gpu=not args.skip_gpu)
    elapsed = time.monotonic() - t0
    print(format_findings(findings), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "findings": [asdict(f) for f in findings],
            "errors": sum(f.level == "error" for f in findings),
            "warnings": sum(f.level == "warning" for f in findings),
            "elapsed_s": round(elapsed, 3), "python": sys.executable,
        }, indent=2))
    return 1 if has_errors(findings) else 0


if __name__ == "__main__":
    sys.exit(main())
