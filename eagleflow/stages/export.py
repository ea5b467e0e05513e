"""Stage export: the train stage's best checkpoint -> the formats the engines load.

    python -m eagleflow.stages.export <stage_dir>/request.json

Writes `vllm/` (config.json + model.safetensors, `LlamaForCausalLMEagle3`, or
`Eagle3DeepseekV2ForCausalLM` for an MLA drafter, layer ids in vLLM's
convention from target.aux_layer_ids; eagle_config's ids as SGLang reads them wherever SGLang can be told
them, so the same directory serves its trained layers on both engines). The layout is documented in
eagleflow.drafter.vllm_export.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest, sha256_file
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import ExportMetrics, ExportOutputs, TrainMetrics, TrainOutputs
from eagleflow.stages.common import stage_main


def run(request: StageRequest) -> Manifest:
    from eagleflow.drafter.errors import FormatError
    from eagleflow.drafter.vllm_export import export_vllm

    config = request.config
    train = request.upstream.get("train")
    if train is None:
        raise StageError("the export stage needs the train stage's manifest (request.upstream['train'])")
    trained, train_metrics = TrainOutputs.of(train), TrainMetrics.of(train)
    checkpoint = train.path(trained.best)
    outputs, hashes = ExportOutputs(), {}
    try:
        for fmt in config.export.formats:
            if fmt == "vllm":
                export_vllm(
                    checkpoint,
                    request.path / "vllm",
                    list(config.target.aux_layer_ids),
                    dtype=config.target.dtype,
                    eagle_config_ids=sglang_ids(config, required=config.engine.kind == "sglang"),
                )
                outputs.vllm = "vllm"
                for name in ("config.json", "model.safetensors"):
                    hashes[f"vllm/{name}"] = sha256_file(request.path / "vllm" / name)
    except FormatError as exc:
        raise StageError(str(exc)) from None
    metrics = ExportMetrics(
        source_checkpoint=trained.best,
        best_epoch=trained.best_epoch,
        acceptance_length_sim=train_metrics.best.acceptance_length,
    )
    return request.manifest(outputs=outputs, metrics=metrics, hashes=hashes)


def sglang_ids(config: RunConfig, required: bool = True) -> list[int] | None:
    """eagle_config's ids for SGLang (which reads only those, its own way): the same layers as the top level's, which
    vLLM reads first, so one directory serves its trained layers on both engines (the layout SGLang refuses, its
    norms, is the preflight's to say). Layers SGLang cannot be told (a DeepSeek-family target's layer 1): refused
    when the run serves with SGLang (`required`), else None (eagle_config then repeats the top level's)."""
    from eagleflow.engines.preflight.configs import text_config
    from eagleflow.engines.preflight.layer_ids import SGLANG_LAYER_1, sglang_config_ids
    from eagleflow.engines.preflight.mla import is_mla

    target = text_config(json.loads((Path(config.target.model_path) / "config.json").read_text()))
    ids = sglang_config_ids(list(config.target.aux_layer_ids), deepseek=is_mla(target))
    if ids is None and required:
        raise StageError(SGLANG_LAYER_1)
    return ids


if __name__ == "__main__":
    sys.exit(stage_main("export", run))
