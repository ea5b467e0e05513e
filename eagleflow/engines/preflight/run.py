"""Every check for one target and its drafters, in this Python (the host environment)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight.cache import load, preflight_key, store
from eagleflow.engines.preflight.configs import (
    drafter_fields,
    is_multimodal_config,
    read_config,
    safetensors_shapes,
    text_config,
)
from eagleflow.engines.preflight.dimensions import check_dimensions, check_state_norms, fc_num_states
from eagleflow.engines.preflight.findings import Finding
from eagleflow.engines.preflight.layer_ids import check_aux_layer_ids
from eagleflow.engines.preflight.mla import (
    check_attention,
    check_engine_version,
    check_final_layer,
    check_mla_prefill,
    check_rotary_kernel,
    is_mla,
)
from eagleflow.engines.preflight.resources import check_disk, check_gpus
from eagleflow.engines.preflight.sampling import check_sampled_verify
from eagleflow.engines.preflight.sglang import sglang_checks, sglang_drafter_checks
from eagleflow.engines.preflight.vllm import (
    VllmInstall,
    default_aux_ids,
    drafter_checks,
    multimodal_checks,
    target_checks,
)


def run_preflight(
    engine: EngineConfig,
    target_path: str,
    drafters: dict[str, str],
    *,
    expected_aux_layer_ids: dict[str, list[int]] | None = None,
    free_disk_path: str | None = None,
    check_gpu: bool = True,
    draft_attention_backend: str | None = None,
    temperatures: list[float] | None = None,
    cache: Path | None = None,
) -> list[Finding]:
    """Every check for one target and its drafters (variant name -> drafter dir), in this python.

    `expected_aux_layer_ids[name]`: the ids (vLLM convention) the drafter `name` was trained on, when known.
    `check_gpu=False` skips the GPU-memory check (e.g. while production still holds the GPUs).
    `draft_attention_backend`: the speculative config's `attention_backend`, when it sets one.
    `temperatures`: the ones the benchmark will measure at (a fault of the sampled verify path is an error
    when one is above 0).
    `cache`: a directory of kept findings (eagleflow.engines.preflight.cache): the engine's checks are read from
    it when their inputs are unchanged, the disk and GPU checks run every time.
    """
    expected = expected_aux_layer_ids or {}
    temps = temperatures or [0.0]
    args = (engine, target_path, drafters, expected, draft_attention_backend, temps)
    if cache is None:
        findings = engine_findings(*args)
    else:
        key = preflight_key(*args)
        kept = load(cache, key, target_path, drafters)
        if kept is not None:
            findings, computed = kept
            findings = [
                Finding(
                    "preflight_cache",
                    "ok",
                    f"the engine's checks as computed {computed} (key {key[:12]}): "
                    "the same engine install, settings, target and drafter layout",
                ),
                *findings,
            ]
        else:
            findings = engine_findings(*args)
            store(cache, key, findings, target_path, drafters, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if free_disk_path:
        findings.append(check_disk(free_disk_path, engine.min_free_disk_gib))
    if check_gpu:
        need = engine.min_free_gpu_fraction or (engine.gpu_memory_utilization or 0.0)
        findings += check_gpus(need)
    return findings


def engine_findings(
    engine: EngineConfig,
    target_path: str,
    drafters: dict[str, str],
    expected_aux_layer_ids: dict[str, list[int]],
    draft_attention_backend: str | None,
    temperatures: list[float],
) -> list[Finding]:
    """The checks that read the engine install, the target and the drafters' layout (none of the host's state)."""
    findings: list[Finding] = []
    target_cfg, problem = read_config(target_path)
    if problem is not None:
        findings.append(Finding("target_config", problem.level, problem.message))
    target_text = text_config(target_cfg) if target_cfg else {}
    num_layers = target_text.get("num_hidden_layers")
    dtype = str(target_text.get("dtype") or target_text.get("torch_dtype") or "bfloat16")

    v: VllmInstall | None = None
    target_cls = hf_config = None
    if engine.kind == "vllm":
        try:
            v = VllmInstall()
            findings.append(Finding("engine", "ok", f"vllm {v.version} in {sys.executable}"))
        except Exception as exc:  # noqa: BLE001
            findings.append(
                Finding(
                    "engine",
                    "error",
                    f"vllm is not importable in {sys.executable}: "
                    f"{type(exc).__name__}: {exc}. Fix: install vLLM in the host environment",
                )
            )
        if v is not None and target_cfg is not None:
            more, target_cls, hf_config = target_checks(v, target_path, target_cfg, engine.trust_remote_code)
            findings += more
            if is_multimodal_config(target_cfg):
                findings += multimodal_checks(v, target_cls, hf_config, f"{target_path}/config.json")
            try:
                findings.append(check_sampled_verify(engine, temperatures))
            except Exception as exc:  # noqa: BLE001 - a moved engine API: say so, do not fail the launch
                findings.append(
                    Finding(
                        "sampled_verify",
                        "warning",
                        f"could not check vLLM {v.version}'s sampled verify path: {type(exc).__name__}: {exc}",
                    )
                )
            if is_mla(target_text):
                findings.append(check_engine_version(v.version, target_text, f"{target_path}/config.json"))
                for check, name in (
                    (lambda: check_rotary_kernel(target_text, engine, dtype), "rotary"),
                    (lambda: check_mla_prefill(target_text, dtype), "mla_prefill"),
                ):
                    try:
                        findings.append(check())
                    except Exception as exc:  # noqa: BLE001 - a moved engine API: say so, do not fail the launch
                        findings.append(
                            Finding(name, "warning", f"could not ask vLLM {v.version}: {type(exc).__name__}: {exc}")
                        )
            if num_layers:
                classes = [target_cls] if target_cls is not None else []
                text_arch = (target_text.get("architectures") or [None])[0] if target_text is not target_cfg else None
                if text_arch:  # a multimodal wrapper: its language model's class holds the layer loop
                    text_cls, _ = v.load_class(text_arch)
                    classes += [text_cls] if text_cls is not None else []
                findings.append(check_final_layer(classes, int(num_layers), v.version))
    else:
        findings += sglang_checks(target_cfg or {}, target_path)

    default_ids = default_aux_ids(v, target_cls, int(num_layers)) if v is not None and num_layers else None
    drafter_cfgs: dict[str, dict] = {}
    for name, drafter_dir in drafters.items():
        cfg, problem = read_config(drafter_dir)
        if problem is not None:
            findings.append(Finding(f"drafter_config[{name}]", "error", problem.message))
            continue
        fields = drafter_cfgs[name] = drafter_fields(cfg)
        if v is not None:
            findings += drafter_checks(v, name, drafter_dir, cfg)
        try:
            shapes = safetensors_shapes(drafter_dir)
        except Exception as exc:  # noqa: BLE001
            findings.append(
                Finding(
                    f"dimensions[{name}]",
                    "error",
                    f"cannot read the safetensors headers in {drafter_dir}: {type(exc).__name__}: {exc}",
                )
            )
            shapes = {}
        if not shapes and not any(f.check == f"dimensions[{name}]" for f in findings):
            findings.append(Finding(f"dimensions[{name}]", "error", f"no *.safetensors in {drafter_dir}"))
        if engine.kind == "sglang":
            findings += sglang_drafter_checks(name, drafter_dir, cfg, shapes, engine.max_model_len)
        if target_cfg is not None:
            findings += check_dimensions(name, target_text, fields, shapes, drafter_dir)
            norms = check_state_norms(name, fields, shapes, drafter_dir, engine.kind)
            findings += [norms] if norms else []
            if num_layers:
                ids = fields["eagle_aux_hidden_state_layer_ids"]
                if engine.kind == "sglang":  # SGLang reads eagle_config's ids only
                    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or None
                findings += check_aux_layer_ids(
                    name,
                    ids,
                    int(num_layers),
                    default_ids if engine.kind == "vllm" else [2, int(num_layers) // 2, int(num_layers) - 3],
                    expected_aux_layer_ids.get(name),
                    fc_num_states(shapes, fields.get("target_hidden_size") or fields.get("hidden_size")),
                    engine.kind,
                    f"{drafter_dir}/config.json",
                    # SGLang's rule for DeepSeek-V2/V3-family targets (Kimi-K2.5), the MLA targets it serves
                    deepseek=is_mla(target_text),
                )

    if v is not None and target_cfg is not None:
        try:
            findings += check_attention(engine, target_text, drafter_cfgs, draft_attention_backend, dtype, target_path)
        except Exception as exc:  # noqa: BLE001 - an engine whose selector moved: say so, do not fail the launch
            findings.append(
                Finding(
                    "attention",
                    "warning",
                    f"could not ask vLLM {v.version} which attention backends it picks: {type(exc).__name__}: {exc}",
                )
            )
    return findings
