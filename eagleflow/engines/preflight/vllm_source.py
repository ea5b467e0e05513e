"""Reading the installed vLLM's source text (with ast, never importing it) for rules it keeps in code:
the EAGLE-3 target whitelist of older versions, and which target config field its EAGLE proposer
copies into a multimodal drafter's config. Pure functions over source text."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from eagleflow.engines.preflight.findings import Finding


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
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
            and "eagle3" in node.func.value.id
            and "supported" in node.func.value.id
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
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
        return Finding(
            "whitelist",
            "ok",
            f"vLLM {engine_version} has no EAGLE-3 target model-type whitelist in "
            f"{where}; the target class's SupportsEagle3 interface decides",
        )
    if whitelist_admits(wl.model_types, model_type):
        return Finding(
            "whitelist",
            "ok",
            f"target model_type {model_type!r} is in vLLM {engine_version}'s EAGLE-3 "
            f"whitelist {wl.model_types} ({where})",
        )
    extra = f" (plus {wl.conditional} for some drafter formats)" if wl.conditional else ""
    admitted_conditionally = whitelist_admits(wl.conditional, model_type)
    return Finding(
        "whitelist",
        "warning" if admitted_conditionally else "error",
        f"vLLM {engine_version} allows EAGLE-3 only for target model types containing one of {wl.model_types}"
        f"{extra} (eagle3_target_supported in {where}); the target's text model_type is {model_type!r}, so the "
        f'launch fails with "Eagle3 is only supported for ... models". Fix: use a vLLM version without this '
        "whitelist (0.32 has none) or one that lists this model type"
        + ("; it is admitted only with a speculators-format drafter" if admitted_conditionally else ""),
    )


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


# Drafter options that change the drafter's forward, each read by name from the drafter's config in the
# model module that builds it. A vLLM whose module never names one builds the plain EAGLE-3 layer: the
# drafter loads, serves, and accepts little, with no error anywhere.
DRAFTER_OPTIONS = {
    "norm_output": "each drafting step after the first is fed the normed state (EAGLE 3.1)",
    "fc_norm": "one RMSNorm per target state before fc (EAGLE 3.1)",
}


def names_in_source(source: str) -> set[str]:
    """Every string constant in the source text (ast; a getattr(config, "x", ...) names "x")."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def check_drafter_options(
    name: str, cfg: dict, cfg_path: str, module_source: str, where: str, engine_version: str
) -> Finding | None:
    """An error when the drafter's config turns on an option the class's module never reads; None when
    it turns none on."""
    on = [k for k in DRAFTER_OPTIONS if cfg.get(k)]
    if not on:
        return None
    check = f"drafter_options[{name}]"
    missing = [k for k in on if k not in names_in_source(module_source)]
    if not missing:
        return Finding(check, "ok", f"{', '.join(on)}: read by {where}")
    what = "; ".join(f"{k}: {DRAFTER_OPTIONS[k]}" for k in missing)
    return Finding(
        check,
        "error",
        f"{cfg_path} turns on {', '.join(missing)}, which vLLM {engine_version}'s drafter "
        f"({where}) never reads ({what}): it would serve the drafter without it and accept little, with "
        f"no error. Fix: a vLLM that reads it (0.32 does), or train the drafter with it off "
        f"(train.{missing[0]}: false)",
    )
