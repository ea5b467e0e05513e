"""A finished train stage's offline estimate read both ways: the engine walk judging every draft (before issue 40)
and judging a draft only where the held-out answer so far is the target's argmax (`engine_walk`'s `greedy`).

    .hostenv/bin/python benchmarks/offline_walk.py TRAIN_STAGE_DIR EXTRACT_STAGE_DIR

Loads the stage's best epoch, validates it on the extract stage's holdout split with the stage's own train config,
once each way, and prints both estimates per position as JSON. With greedy answers the two agree exactly; with
answers sampled at production's setting the first reads low (docs/benchmarks.md, "The offline estimate on sampled
answers"). The train stage's directory is only read: the trainer's scratch goes to a temporary directory.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from safetensors.torch import load_file

import eagleflow.drafter.objective as objective
from eagleflow.config.train import TrainConfig
from eagleflow.drafter.data import read_index
from eagleflow.drafter.target import read_target_head
from eagleflow.drafter.trainer import Trainer

FIGURES = ("acceptance_length", "accept_pos", "judged", "drafts")


def main(stage: Path, extract: Path) -> dict:
    request = json.loads((stage / "request.json").read_text())
    best = json.loads((stage / "manifest.json").read_text())["metrics"]["best_epoch"]
    index = read_index(str(extract / "data" / "index.json"), stage_dir=str(extract))
    target = read_target_head(request["config"]["target"]["model_path"])
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(TrainConfig(**request["config"]["train"]), target, index, scratch, index.aux_layer_ids)
        trainer.setup()
        weights = load_file(str(stage / "checkpoints" / f"epoch-{best}" / "model.safetensors"))
        for vocab_map in ("d2t", "t2d"):  # the checkpoint keeps the vocabulary maps beside the weights
            weights.pop(vocab_map, None)
        trainer.model.load_state_dict(weights)
        on_argmax = trainer.validate()
        walk = objective.engine_walk
        objective.engine_walk = lambda correct, mask, lengths, greedy=None: walk(correct, mask, lengths, None)
        try:
            every = trainer.validate()
        finally:
            objective.engine_walk = walk
    return {
        "best_epoch": best,
        "judged_on_the_argmax": {k: on_argmax.get(k) for k in FIGURES},
        "every_draft_judged": {k: every.get(k) for k in FIGURES},
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), indent=1))
