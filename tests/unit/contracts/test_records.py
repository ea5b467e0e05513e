"""The typed manifest records (eagleflow.contracts): each stage's outputs and metrics round-trip
through a manifest, and a manifest with an unknown or renamed key fails `of` naming it, instead of
being read as something else later."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eagleflow.config import load_config
from eagleflow.contracts.benchmark_records import BenchmarkMetrics, Measurement, ProductionResult
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.request import StageRequest
from eagleflow.contracts.stage_records import (
    CheckMetrics,
    ExportOutputs,
    GenerateMetrics,
    GenerateOutputs,
    TrainMetrics,
    TrainOutputs,
)
from tests.conftest import ROOT
from tests.helpers.records import benchmark_manifest, train_manifest


def test_records_round_trip_through_a_stage_manifest(tmp_path):
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    req = StageRequest(stage="generate", key="k", dir=str(tmp_path), config=cfg)
    outputs = GenerateOutputs(shards=["data/shard-00000.parquet"], num_train=10, num_holdout=2, num_tokens=999)
    metrics = GenerateMetrics(failed=0, output_tok_s=None, completion_tokens=500)
    manifest = req.manifest(outputs=outputs, metrics=metrics, hashes={"data/shard-00000.parquet": "ab"})
    assert GenerateOutputs.of(manifest) == outputs and GenerateMetrics.of(manifest) == metrics
    again = Manifest.model_validate_json(manifest.model_dump_json())  # as read back from manifest.json
    assert GenerateOutputs.of(again) == outputs and GenerateMetrics.of(again) == metrics
    train = train_manifest("/w/train/k")
    assert TrainMetrics.of(train).epochs[1].validation.acceptance_length == 2.9
    assert TrainOutputs.of(train).best == "checkpoints/epoch-2"
    assert BenchmarkMetrics.of(benchmark_manifest("/w/b")).drafter.mean_acceptance_length == 3.3


def test_each_record_reads_its_own_part_of_the_manifest():
    train = train_manifest("/w/train/k")
    with pytest.raises(ValidationError):
        TrainOutputs.model_validate(train.metrics)  # metrics are not outputs
    swapped = train.model_copy(update={"outputs": train.metrics, "metrics": train.outputs})
    with pytest.raises(ValidationError):
        TrainOutputs.of(swapped)
    with pytest.raises(ValidationError):
        TrainMetrics.of(swapped)


def test_the_old_flat_epoch_keys_fail_naming_the_key():
    """Before typed manifests, epochs held train_loss, train_tokens and val_* beside each other."""
    m = train_manifest("/w/train/k")
    epoch = m.metrics["epochs"][0]
    epoch["train_tokens"] = epoch["train"]["tokens"]
    with pytest.raises(ValidationError) as err:
        TrainMetrics.of(m)
    text = str(err.value)
    assert "epochs.0.train_tokens" in text and "Extra inputs are not permitted" in text


def test_a_renamed_key_fails_naming_both_names():
    m = benchmark_manifest("/w/b")
    m.metrics["measurements"] = m.metrics.pop("windows")
    with pytest.raises(ValidationError) as err:
        BenchmarkMetrics.of(m)
    text = str(err.value)
    assert "windows\n  Field required" in text and "measurements\n  Extra inputs are not permitted" in text


def test_an_unknown_output_key_fails():
    m = Manifest(stage="export", key="k", dir="/w/export/k", outputs={"vllm": "vllm", "sglang": "sglang"})
    with pytest.raises(ValidationError, match="sglang"):
        ExportOutputs.of(m)
    assert ExportOutputs.of(Manifest(stage="export", key="k", dir="/w", outputs={})).vllm is None
    with pytest.raises(ValidationError, match="engine_version"):
        CheckMetrics.of(Manifest(stage="check", key="k", dir="/w", metrics={"engine_version": "0.32.0"}))


def test_measurements_are_strict_and_production_results_are_not():
    with pytest.raises(ValidationError, match="tok_s"):
        Measurement(variant="drafter", temperature=0.0, concurrency=1, output_tok_s=1.0, tok_s=1.0)
    # The guardian's record carries more than the report shows; the rest is dropped, not refused.
    result = ProductionResult.model_validate({"ok": True, "token": "t", "stage_pid": 3, "by": "guardian"})
    assert result.model_dump(exclude_none=True) == {
        "ok": True,
        "was_running": False,
        "started": False,
        "by": "guardian",
    }
