"""The train and export stages end to end on a tiny synthetic target (eagleflow.stages.train, with
eagleflow.stages.export on its output): checkpoints per epoch, the best epoch and typed metrics in
the manifest, a rerun that resumes instead of training again, the vLLM drafter exported from the
best checkpoint, and a time cap that fails the stage naming it. Host environment (torch). The stage
as a real process (killed and resumed, torchrun) is in tests/integration/stages/test_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagleflow.contracts.manifest import stage_key  # noqa: E402
from eagleflow.contracts.request import StageError  # noqa: E402
from eagleflow.contracts.stage_records import ExportMetrics, TrainMetrics, TrainOutputs  # noqa: E402
from eagleflow.stages import export as export_stage  # noqa: E402
from eagleflow.stages import train as train_stage  # noqa: E402
from tests.helpers.drafter import V, extract_manifest, stage_request, write_synthetic  # noqa: E402

TRAIN = {
    "epochs": 2,
    "batch_tokens": 128,
    "draft_vocab_size": 24,
    "warmup_steps": 2,
    "max_seq_len": 32,
    "num_threads": 1,
}


def test_train_and_export_stages(tmp_path):
    root = write_synthetic(tmp_path / "syn")
    req = stage_request(tmp_path, root, "train", {"extract": extract_manifest(root)}, TRAIN)
    manifest = train_stage.run(req)
    assert manifest.outputs["checkpoints"] == ["checkpoints/epoch-1", "checkpoints/epoch-2"]
    assert manifest.outputs["best"] in manifest.outputs["checkpoints"]
    assert len(manifest.metrics["epochs"]) == 2
    assert {"acceptance_length", "accept_pos", "acc", "loss"} <= set(manifest.metrics["best"])
    assert manifest.metrics["draft_vocab_size"] == 24
    assert (Path(req.dir) / "checkpoints" / "epoch-2" / "trainer_state.pt").is_file()
    assert not list((Path(req.dir) / "checkpoints").glob(".*tmp"))
    # Typed: each epoch's training and holdout scores, and what ended training.
    metrics, outputs = TrainMetrics.of(manifest), TrainOutputs.of(manifest)
    assert (metrics.bounded_by, metrics.steps) == ("epochs", metrics.epochs[-1].step)
    assert all(e.complete and e.train.tokens > 0 and e.validation is not None for e in metrics.epochs)
    assert metrics.best.epoch == metrics.best_epoch == outputs.best_epoch
    assert (
        metrics.best.acceptance_length
        == next(e for e in metrics.epochs if e.epoch == metrics.best_epoch).validation.acceptance_length
    )
    assert outputs.aux_layer_ids == [1, 2, 3] and outputs.arch["draft_vocab_size"] == 24
    assert set(manifest.hashes) == {f"{outputs.best}/model.safetensors"}

    # A rerun resumes after the last finished epoch: same results, no new training.
    again = train_stage.run(req)
    assert again.metrics["epochs"] == manifest.metrics["epochs"]

    req_e = stage_request(tmp_path, root, "export", {"train": manifest}, TRAIN)
    exported = export_stage.run(req_e)
    vllm_dir = Path(req_e.dir) / exported.outputs["vllm"]
    cfg = json.loads((vllm_dir / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 24 and cfg["vocab_size"] == V
    assert set(exported.hashes) == {"vllm/config.json", "vllm/model.safetensors"}
    em = ExportMetrics.of(exported)
    assert (em.source_checkpoint, em.best_epoch) == (outputs.best, outputs.best_epoch)
    assert em.acceptance_length_sim == metrics.best.acceptance_length


def test_a_time_cap_fails_the_stage_and_a_higher_cap_resumes_in_the_same_dir(tmp_path):
    """train.time_limit_s is outside the stage key: the failed stage names the cap, and the same stage
    directory, rerun with the cap raised, resumes from the step checkpoint the failure wrote."""
    root = write_synthetic(tmp_path / "syn")
    upstream = {"extract": extract_manifest(root)}
    capped = stage_request(tmp_path, root, "train", upstream, {**TRAIN, "time_limit_s": 1e-9})
    raised = stage_request(tmp_path, root, "train", upstream, {**TRAIN, "time_limit_s": 3600})
    assert stage_key("train", capped.config, {"extract": "e"}) == stage_key("train", raised.config, {"extract": "e"})
    with pytest.raises(StageError, match=r"train\.time_limit_s .* reached at step 1 "):
        train_stage.run(capped)
    assert sorted(p.name for p in (Path(capped.dir) / "checkpoints").iterdir()) == ["step-1"]
    manifest = train_stage.run(raised)
    assert TrainMetrics.of(manifest).bounded_by == "epochs"
    assert manifest.outputs["checkpoints"] == ["checkpoints/epoch-1", "checkpoints/epoch-2"]


def test_max_steps_is_recorded_as_what_ended_training(tmp_path):
    root = write_synthetic(tmp_path / "syn")
    req = stage_request(tmp_path, root, "train", {"extract": extract_manifest(root)}, {**TRAIN, "max_steps": 2})
    metrics = TrainMetrics.of(train_stage.run(req))
    assert (metrics.bounded_by, metrics.steps, len(metrics.epochs)) == ("max_steps", 2, 1)
    assert metrics.epochs[0].complete is False and metrics.epochs[0].step == 2
