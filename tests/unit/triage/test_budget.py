"""The triage's own time budget (benchmark.triage.max_s): once it is spent no probe starts, and each probe left is
named in the triage's record as not run, with the setting that stopped it."""

from __future__ import annotations

from pathlib import Path

from eagleflow.config import RunConfig, load_config
from eagleflow.triage import CopyReference, TriageInputs, run_triage
from tests.conftest import ROOT
from tests.helpers.records import window


def inputs(cfg: RunConfig, tmp_path: Path) -> TriageInputs:
    """A suspect drafter window (AL 1.2, slower than the baseline) and its drafter's directory, no answers."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    return TriageInputs(
        cfg=cfg,
        stage_dir=tmp_path,
        variant="drafter",
        drafter_dir=str(drafter),
        trigger="auto: test",
        suspect=True,
        windows=[window("baseline", 100), window("drafter", 90, 1.2)],
        answers={},
        prompts=[[{"role": "user", "content": "hi"}]],
        copy_reference=CopyReference(prompts=[], answers=[]),
        extract=None,
        engine_env=None,
    )


def test_a_spent_budget_starts_no_probe_and_names_each_one_left(tmp_path):
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"benchmark.triage.max_s": 1e-9})
    t = run_triage(inputs(cfg, tmp_path))  # no engine is started: each probe would need one
    assert t.verify is None and t.backends is None
    spent = [s for s in t.skipped if "the triage's budget of 1e-09 s is spent (benchmark.triage.max_s)" in s]
    assert [s.split(":")[0] for s in spent] == ["verify", "backends"], t.skipped


def test_on_sglang_the_vllm_probes_are_named_as_not_built_and_no_engine_starts(tmp_path):
    # SGLang has neither vLLM's ngram proposer, nor an engine capture of ours, nor vLLM's backend names: each
    # probe is named as skipped (the lossless check still reads the answers), none launches an engine
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "engine.kind": "sglang",
            "engine.kv_cache_gib": None,
            "extract.backend": "hf",
            "benchmark.triage.probes": ["verify", "plumbing", "backends"],
        },
    )
    t = run_triage(inputs(cfg, tmp_path))
    assert t.verify is None and t.plumbing is None and t.backends is None
    named = [s.split(":")[0] for s in t.skipped if "not built for engine.kind 'sglang'" in s]
    assert named == ["verify", "plumbing", "backends"], t.skipped


def test_the_probes_that_apply_are_vllms_and_none_on_sglang():
    # the benchmark records copy prompts and the plan counts engine loads only for the probes the engine has
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"benchmark.triage.probes": ["verify", "backends"]})
    assert cfg.benchmark.triage.probes_on("vllm") == ["verify", "backends"]
    assert cfg.benchmark.triage.probes_on("sglang") == []
