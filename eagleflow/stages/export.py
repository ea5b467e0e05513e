"""Stage export: the train stage's best checkpoint -> the formats the engines load.

    python -m eagleflow.stages.export <stage_dir>/request.json

Writes `vllm/` (config.json + model.safetensors, `LlamaForCausalLMEagle3`, layer ids in vLLM's
convention from target.aux_layer_ids). The layout is documented in eagleflow.drafter.formats.
"""

from __future__ import annotations

import sys

from eagleflow.manifest import Manifest, sha256_file
from eagleflow.stages.common import StageError, StageRequest, stage_main


def run(request: StageRequest) -> Manifest:
    from eagleflow.drafter.formats import FormatError, export_vllm

    config = request.config
    train = request.upstream.get("train")
    if train is None:
        raise StageError("the export stage needs the train stage's manifest (request.upstream['train'])")
    if "best" not in train.outputs:
        raise StageError(f"train manifest in {train.dir} has no outputs['best']")
    checkpoint = train.path(train.outputs["best"])
    outputs, hashes = {}, {}
    try:
        for fmt in config.export.formats:
            if fmt == "vllm":
                export_vllm(checkpoint, request.path / "vllm", list(config.target.aux_layer_ids),
                            dtype=config.target.dtype)
                outputs["vllm"] = "vllm"
                for name in ("config.json", "model.safetensors"):
                    hashes[f"vllm/{name}"] = sha256_file(request.path / "vllm" / name)
    except FormatError as exc:
        raise StageError(str(exc)) from None
    metrics = {"source_checkpoint": train.outputs["best"], "best_epoch": train.outputs.get("best_epoch"),
               "acceptance_length_sim": train.metrics.get("best", {}).get("acceptance_length")}
    return request.manifest(outputs=outputs, metrics=metrics, hashes=hashes)


if __name__ == "__main__":
    sys.exit(stage_main("export", run))
