"""check: the host check, seconds before any stage starts work (the engine's own preflight is the benchmark's).

Catches what would otherwise fail an hour in: a missing target, a layer count that does not match
the config, an empty or malformed prompt set, thinking markers the tokenizer splits, a missing engine,
an engine kernel that would serve an MLA target wrongly, a production.unit systemd does not know, and a run whose
extracted states will not fit the free disk, and a production that cannot capture (extract.backend 'production':
the night then takes extract.fallback's path). It reads production's traffic from its engine's /metrics
(`eagleflow.production.observed`) and says where the config stands for another load. It prints the capacity plan
(`eagleflow.capacity`: each stage's disk, GPU memory and time) and records it in its manifest; the
prompts are counted with the target's tokenizer and chat template (up to 2,000 of them, evenly spaced),
the rest of the facts are `eagleflow.capacity.facts`' (the same `python -m cli.plan` reads).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from eagleflow.capacity.facts import chat_token_counter, gather
from eagleflow.capacity.planner import plan
from eagleflow.capacity.render import render_plan
from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.plan import CapacityPlan, FinishedStages, HostFacts
from eagleflow.contracts.prompts import PromptError, load_prompts, split_indices
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import CAPTURES, CheckMetrics
from eagleflow.engines.preflight.layer_ids import SGLANG_LAYER_1, sglang_config_ids
from eagleflow.engines.preflight.mla import check_rotary_kernel, is_mla
from eagleflow.hosts.facts import ENGINE_DISTRIBUTIONS, version_of
from eagleflow.production import ProductionService, observed
from eagleflow.stages.common import stage_main

log = logging.getLogger("eagleflow.check")
CAPTURE_PROBE = "eagleflow asks production whether it captures hidden states."  # a few tokens of any tokenizer


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    problems: list[str] = []
    model = Path(cfg.target.model_path)
    facts: dict[str, object] = {}
    tok = None
    hf: dict = {}
    if not (model / "config.json").is_file():
        problems.append(f"target.model_path: {model} has no config.json (does the path exist on this host?)")
    else:
        raw = json.loads((model / "config.json").read_text())
        hf = {**raw, **(raw.get("text_config") or {})}  # a multimodal wrapper (Kimi-K2.5) nests its language model
        layers = hf.get("num_hidden_layers")
        facts.update(architectures=hf.get("architectures"), num_hidden_layers=layers, hidden_size=hf.get("hidden_size"))
        if layers != cfg.target.final_layer_id:
            problems.append(
                f"target.final_layer_id is {cfg.target.final_layer_id} but {model} has {layers} layers; "
                f"set it to {layers}"
            )
        if layers is not None and max(cfg.target.aux_layer_ids) >= layers:
            problems.append(f"target.aux_layer_ids {cfg.target.aux_layer_ids} must be below the layer count {layers}")
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(model))
            for field in ("thinking_start", "thinking_end"):
                marker = getattr(cfg.target, field)
                if len(tok(marker, add_special_tokens=False)["input_ids"]) != 1:
                    problems.append(
                        f"target.{field} {marker!r} is not a single token of the target's tokenizer; "
                        "the engine's reasoning parser will not find it"
                    )
            if not getattr(tok, "chat_template", None):
                problems.append(f"target.model_path: the tokenizer in {model} has no chat_template")
        except Exception as exc:  # noqa: BLE001 - any load failure is a finding
            problems.append(f"target.model_path: the tokenizer in {model} does not load: {exc}")
    try:
        prompts = load_prompts(cfg.generate.prompts_path)
        split_indices(len(prompts), cfg.generate.num_samples, cfg.generate.holdout, cfg.generate.seed)
        facts["prompts"] = len(prompts)
    except PromptError as exc:
        problems.append(str(exc))
    kind = cfg.engine.kind
    version = version_of(*ENGINE_DISTRIBUTIONS[kind])
    if version is None:
        problems.append(
            f"engine.kind is {kind!r} but none of {list(ENGINE_DISTRIBUTIONS[kind])} is installed in "
            f"{sys.executable}; create the host environment (make hostenv, or python -m infra.bootstrap)"
        )
    else:
        facts["engine"] = f"{kind} {version}"
        if kind == "vllm" and hf and is_mla(hf):
            problems += _mla_engine_problems(cfg, hf)
    if kind == "sglang" and hf and sglang_config_ids(list(cfg.target.aux_layer_ids), is_mla(hf)) is None:
        problems.append(SGLANG_LAYER_1)  # found now, not at export after hours of training
    if kind == "sglang" and hf and cfg.benchmark.draft_sample_method == "probabilistic":
        vocab = int(hf.get("vocab_size") or 0)
        if vocab and cfg.train.draft_vocab_size < vocab:  # the benchmark's launch would refuse it after training
            problems.append(
                "benchmark.draft_sample_method is 'probabilistic' and engine.kind 'sglang', but "
                f"train.draft_vocab_size {cfg.train.draft_vocab_size} is below the target's vocab_size {vocab}: "
                "SGLang tests sampled drafts "
                "against their probabilities (--speculative-use-rejection-sampling) only for a drafter over the whole "
                f"vocabulary. Fix: train.draft_vocab_size: {vocab}, or benchmark.draft_sample_method: greedy"
            )
    service = ProductionService(cfg.production)
    # found now, not after hours of generate when the first window stops production
    problems += [p for p in (service.unit_problem(), service.status_problem()) if p is not None]
    # Production's own counts of its load, read before any stage touches it: what the benchmark's cells stand for
    seen = observed.read(cfg)
    if seen is not None:
        facts["production_traffic"] = seen
        log.info("%s", seen.describe())
        for d in seen.disagreements:
            log.warning("production's traffic: %s", d)
    if cfg.extract.backend == "production" and tok is not None:
        problems += _production_capture(cfg, tok, facts)
    log.info("host facts: %s", facts)
    capacity = _plan(cfg, tok)
    if capacity is not None:
        log.info("\n%s", render_plan(capacity))
        facts["plan"] = capacity
        if capacity.refusal:
            problems.insert(0, capacity.refusal)
    if problems:
        raise StageError("the run config does not fit this host:\n  - " + "\n  - ".join(problems))
    return request.manifest(outputs={}, metrics=CheckMetrics.model_validate(facts))


def _mla_engine_problems(cfg: RunConfig, text_cfg: dict) -> list[str]:
    """An MLA target meets the engine in generate already (an own server, or extraction through it): the
    engine faults that would make it serve garbage are checked here, before hours of work, not only in the
    benchmark's preflight."""
    finding = check_rotary_kernel(
        text_cfg, cfg.engine, str(text_cfg.get("dtype") or text_cfg.get("torch_dtype") or "bfloat16")
    )
    log.info("engine: %s %s: %s", finding.level.upper(), finding.check, finding.message)
    return [f"engine {finding.check}: {finding.message}"] if finding.level == "error" else []


def _production_capture(cfg: RunConfig, tok: Any, facts: dict[str, object]) -> list[str]:
    """Production asked, with one short capture request, whether it captures the run's layers; asked now so the
    night can take extract.fallback's path before any work, or (fallback 'none') stop here."""
    from eagleflow.extraction.production import capture_problem  # torch: only for a run that captures

    problem = capture_problem(cfg, tok(CAPTURE_PROBE, add_special_tokens=False)["input_ids"])
    facts["production_capture"] = problem or CAPTURES
    if problem is None:
        return []
    if cfg.extract.fallback == "none":
        return ["production cannot capture (extract.fallback is 'none'):\n    " + problem.replace("\n", "\n    ")]
    log.warning(
        "production cannot capture: the states come from extract.backend %r instead (extract.fallback)\n%s",
        cfg.extract.fallback,
        problem,
    )
    return []


def _plan(cfg: RunConfig, tok: object | None) -> CapacityPlan | None:
    """The capacity plan on this host; None when the target's config.json cannot be read (a problem
    already named)."""

    facts = gather(cfg, chat_token_counter(tok))
    if facts.get("target") is None:
        return None
    return plan(cfg, HostFacts.model_validate(facts), FinishedStages.model_validate(facts["progress"]))


if __name__ == "__main__":
    sys.exit(stage_main("check", run))
