"""Stage train: the extract stage's shards -> an EAGLE-3 drafter, one checkpoint per epoch.

    python -m eagleflow.stages.train <stage_dir>/request.json

Writes `checkpoints/epoch-<n>/` (model.safetensors in vLLM names, drafter.json, trainer_state.pt)
and records the best epoch (highest simulated acceptance length on the holdout split) in the
manifest. A rerun resumes after the last finished epoch. Per-epoch metrics go to stdout.
"""

from __future__ import annotations

import sys

from eagleflow.manifest import Manifest, sha256_file
from eagleflow.stages.common import StageError, StageRequest, stage_main


def run(request: StageRequest) -> Manifest:
    from eagleflow.drafter.data import DataError, read_index
    from eagleflow.drafter.formats import CHECKPOINT_WEIGHTS, FormatError, read_target_head
    from eagleflow.drafter.trainer import Trainer, TrainError

    config = request.config
    extract = request.upstream.get("extract")
    if extract is None:
        raise StageError("the train stage needs the extract stage's manifest (request.upstream['extract'])")
    if "index" not in extract.outputs:
        raise StageError(f"extract manifest in {extract.dir} has no outputs['index']")
    try:
        index = read_index(extract.path(extract.outputs["index"]), stage_dir=extract.dir)
        if index.aux_layer_ids != list(config.target.aux_layer_ids):
            raise StageError(
                f"extracted aux layers {index.aux_layer_ids} differ from target.aux_layer_ids "
                f"{config.target.aux_layer_ids}: rerun extract with the current config"
            )
        target = read_target_head(config.target.model_path)
        trainer = Trainer(config.train, target, index, request.path, index.aux_layer_ids).setup()
        result = trainer.train()
    except (DataError, FormatError, TrainError) as exc:
        raise StageError(str(exc)) from None

    best = result.best
    epochs = [
        {"epoch": e.epoch, "complete": e.complete, "tokens_per_s": e.tokens_per_s, "seconds": e.seconds,
         "train_loss": e.train["loss"], "train_acc": e.train["acc"], **{f"val_{k}": v for k, v in e.validation.items()}}
        for e in result.epochs
    ]
    metrics = {
        "best_epoch": best.epoch,
        "best": {"epoch": best.epoch, **best.validation},
        "epochs": epochs,
        "tokens_per_s": round(sum(e.train["tokens"] for e in result.epochs) / max(1e-9, sum(e.seconds for e in result.epochs)), 1),
        "draft_vocab_size": result.vocab_size,
    }
    outputs = {
        "checkpoints": [e.checkpoint for e in result.epochs],
        "best": best.checkpoint,
        "best_epoch": best.epoch,
        "aux_layer_ids": index.aux_layer_ids,
        "arch": result.arch,
    }
    weights = f"{best.checkpoint}/{CHECKPOINT_WEIGHTS}"
    return request.manifest(outputs=outputs, metrics=metrics, hashes={weights: sha256_file(request.path / weights)})


if __name__ == "__main__":
    sys.exit(stage_main("train", run))
