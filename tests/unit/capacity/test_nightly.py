"""The nightly's plan (eagleflow.capacity.nightly) beside the full run's, on Kimi-K2.5's config and the stated 8 x H200
host: a night's work is its new samples, its steps and one engine load for the benchmark; production is down
for the GPU stages only; the pool's growth meets its budget; the stopping rule sets the benchmark's requests."""

from __future__ import annotations

import json
import math

import pytest

from eagleflow.capacity.costs import default_train_rate
from eagleflow.capacity.nightly import DEFAULT_ROUND_CV, plan_nightly, window_requests
from eagleflow.capacity.planner import plan
from eagleflow.capacity.render import render_nightly
from eagleflow.config import load_config
from eagleflow.contracts.plan import HostFacts, MeasuredRun
from eagleflow.util.text import duration_text
from tests.conftest import ROOT

KIMI = ROOT / "configs" / "kimi-k25.yaml"
FACTS = HostFacts.model_validate(json.loads((ROOT / "configs" / "hosts" / "gpu-8xh200.json").read_text()))


def nightly(**overrides):
    cfg = load_config(KIMI, overrides)
    full = plan(cfg, FACTS)
    return cfg, full, plan_nightly(cfg, FACTS, full)


def stage(p, name):
    return next(s for s in p.stages if s.stage == name)


def test_a_kimi_night_is_its_new_samples_its_steps_and_the_loads_of_a_deploy():
    cfg, full, night = nightly()
    assert cfg.production.promote == "serve" and cfg.extract.backend == "production"
    per_sample = full.tokens.tokens / full.tokens.samples
    assert night.new_tokens == int(1000 * per_sample)
    # generate scales with the new samples (production's server: no engine load of ours)
    assert stage(night, "generate").seconds == pytest.approx(stage(full, "generate").seconds * 1000 / 10_000, rel=0.01)
    # extract too: production captures the states while it serves (no window, no engine of ours)
    assert stage(night, "extract").seconds == pytest.approx(stage(full, "extract").seconds * 1000 / 10_000, rel=0.01)
    rate, source = default_train_rate(FACTS.target, cfg, FACTS.gpus)  # the H200's, scaled to 8 GPUs
    assert stage(night, "train").seconds == pytest.approx(330 * 65536 / rate, rel=0.01)
    assert stage(night, "train").source == source == stage(full, "train").source
    bench = stage(night, "benchmark")
    # the new drafter measured on production: no load of its own, and production serves meanwhile
    assert "on production" in bench.rate and bench.seconds < stage(full, "benchmark").seconds / 3
    assert night.down_stages == ["train", "export", "restore"]
    assert night.down_seconds == pytest.approx(sum(stage(night, s).seconds for s in night.down_stages))
    # production asleep at level 1 (2 TB of RAM holds the 595 GB), tonight's drafter swapped in: no load at all
    assert cfg.production.pause == "sleep" and cfg.production.swap_drafter
    assert night.loads == []
    restore = stage(night, "restore")
    assert restore.seconds < 60 and "no load" in restore.rate and "measured" in restore.source
    assert "asleep at level 1" in night.pause and "CUDA IPC" in night.pause
    text = render_nightly(night, full)
    assert "a night" in text and "production down a night" in text and "engine loads a night: 0\n" in text
    # issue 41's goals: production down at most 10 minutes a night, the night at most an hour
    assert night.down_seconds < 600 and sum(s.seconds for s in night.stages) < 3600
    # what capture asks of production, and for how long: the extract's seconds, its bound in flight, its measured cost
    assert night.capture is not None and night.capture.startswith(duration_text(stage(night, "extract").seconds))
    assert "32 requests x 8,192 tokens in flight" in night.capture and "0.483x while 2,048" in night.capture
    assert f"capture on production: {night.capture}\n" in text


def test_a_night_that_cannot_capture_extracts_in_the_window_on_an_engine_of_its_own():
    _, full, night = nightly(**{"extract.backend": "vllm"})  # extract.fallback's path
    assert night.down_stages == ["extract", "pool", "train", "export", "restore"]
    assert len(night.loads) == 1 and night.loads[0].startswith("extract")
    assert stage(full, "extract").gpus == 8
    assert night.capture is None  # an engine of its own captures: nothing asked of production's serving
    _, _, captured = nightly()
    assert night.down_seconds > captured.down_seconds + stage(night, "extract").seconds * 0.99


def test_a_stopped_production_pays_a_load_to_come_back_and_a_level_2_sleep_counts_it_too():
    _, _, asleep = nightly()
    _, _, stopped = nightly(**{"production.pause": "stop", "production.swap_drafter": False})
    assert len(stopped.loads) == 1 and stopped.loads[0].startswith("restore: production with the new drafter (warm")
    assert "stopped and started again" in stopped.pause and "a wake of seconds" in stopped.pause
    assert stage(stopped, "restore").seconds > 5 * stage(asleep, "restore").seconds
    # 500 GB of RAM cannot hold production's 1.1 TB on its GPUs: level 2, whose wake loses the drafter on vLLM 0.26
    # (a restart)
    ram = {"total_bytes": 500 * 10**9, "available_bytes": 480 * 10**9}
    small = FACTS.model_copy(update={"memory": FACTS.memory.model_copy(update=ram)})
    cfg = load_config(KIMI)
    short = plan_nightly(cfg, small, plan(cfg, small))
    assert "level 2" in short.pause and "vllm#52479" in short.pause and len(short.loads) == 1
    # no swap: the switched drafter needs a restart, asleep or not
    _, _, no_swap = nightly(**{"production.swap_drafter": False})
    assert len(no_swap.loads) == 1 and "swap_drafter is off" in no_swap.pause


def test_a_night_that_only_records_its_promotion_pays_the_benchmarks_own_load_and_the_restore():
    _, _, deploy = nightly(**{"production.pause": "stop", "production.swap_drafter": False})
    _, _, record = nightly(
        **{"production.promote": "record", "production.pause": "stop", "production.swap_drafter": False}
    )
    assert record.down_stages == ["train", "export", "benchmark", "restore"]
    assert len(record.loads) == 2 and "a wake of seconds instead of a load" in record.pause
    assert (
        stage(record, "benchmark").seconds > stage(deploy, "benchmark").seconds + stage(deploy, "restore").seconds / 2
    )
    assert record.down_seconds > deploy.down_seconds + 0.9 * stage(deploy, "restore").seconds


def test_the_benchmark_plans_the_requests_its_stopping_rule_expects():
    cfg = load_config(KIMI)
    assert cfg.benchmark.precision == 0.10
    assert window_requests(cfg, DEFAULT_ROUND_CV) == max(16, min(200, math.ceil((2 * DEFAULT_ROUND_CV / 0.10) ** 2)))
    assert window_requests(load_config(KIMI, {"benchmark.precision": None}), 0.2) == 200  # fixed length
    assert window_requests(load_config(KIMI, {"benchmark.precision": 0.5}), 0.2) == 16  # at least min_requests
    assert window_requests(load_config(KIMI, {"benchmark.precision": 0.001}), 0.2) == 200  # at most num_prompts


def test_the_pool_fills_its_budget_then_evicts():
    _, _, night = nightly()
    assert night.budget_bytes == 1500 * 2**30
    assert night.nights_to_budget == (night.budget_bytes - night.first_night_bytes) // night.night_bytes
    _, _, unbounded = nightly(**{"nightly.pool_budget_gib": None})
    assert unbounded.nights_to_budget is None


def test_production_is_down_only_for_the_gpu_stages_of_a_stage_window():
    _, _, night = nightly(**{"production.window": "stage"})
    assert night.down_stages == ["train", "restore"]
    _, _, night = nightly(**{"production.window": "stage", "production.promote": "record"})
    assert night.down_stages == ["train", "benchmark", "restore"]
    _, _, night = nightly(**{"production.window": "stage", "extract.backend": "vllm"})
    assert night.down_stages == ["extract", "train", "restore"]
    _, _, none = nightly(**{"production.kind": "none", "production.unit": None, "production.promote": "record"})
    assert none.down_stages == [] and none.down_seconds == 0


def test_a_spread_measured_on_the_host_replaces_the_default():
    cfg = load_config(KIMI)
    measured = MeasuredRun(
        stage="benchmark",
        run="benchmark/abc",
        target=cfg.target.model_path,
        round_cv=0.08,
        settings={"max_tokens": 1024},
        created=1.0,
    )
    other_length = measured.model_copy(
        update={"run": "benchmark/short", "settings": {"max_tokens": 64}, "round_cv": 0.5, "created": 2.0}
    )
    facts = FACTS.model_copy(update={"history": [measured, other_length]})
    night = plan_nightly(cfg, facts, plan(cfg, facts))
    assert night.round_cv == 0.08 and night.round_cv_source == "measured (run benchmark/abc)"
    assert night.window_requests == 16  # (2 x 0.08 / 0.10)^2 ~ 3: at least min_requests


def test_the_plan_takes_the_sleep_level_the_runtime_will_take():
    """One rule (eagleflow.config.production.choose_sleep_level) for the plan and the runtime. The runtime compares the
    host's free RAM with what production holds on its GPUs (nvidia-smi: its TP GPUs at gpu_memory_utilization); a
    host whose total RAM holds the weights 1.2 times over but whose free RAM cannot hold production's GPU memory is
    level 2 at night, and the plan must not promise level 1 there (it did, comparing total RAM with the weights)."""
    from eagleflow.capacity.nightly import pause_level, production_gpu_mib
    from eagleflow.config.production import choose_sleep_level

    cfg = load_config(KIMI)
    data = json.loads((ROOT / "configs" / "hosts" / "gpu-8xh200.json").read_text())
    held = production_gpu_mib(cfg, FACTS)
    assert held == int(8 * 143771 * 0.9)  # what nvidia-smi shows production holding while it serves
    weights = FACTS.target.weights_bytes
    data["memory"] = {"total_bytes": 2_000_000_000_000, "available_bytes": int(1.05 * held * 2**20)}
    tight = HostFacts.model_validate(data)
    assert tight.memory.total_bytes > 1.2 * weights  # the old rule's level 1
    runtime = choose_sleep_level(None, held, tight.memory.available_bytes // 2**20)[0]
    assert pause_level(cfg, tight, weights) == runtime == 2
    assert "level 2" in plan_nightly(cfg, tight, plan(cfg, tight)).pause
    data["memory"]["available_bytes"] = int(1.2 * held * 2**20)
    roomy = HostFacts.model_validate(data)
    assert pause_level(cfg, roomy, weights) == choose_sleep_level(None, held, int(1.2 * held))[0] == 1


def test_a_night_plans_the_export_the_host_measured_even_when_this_runs_export_is_done():
    # issue 43: the plan said export "1m 00s, measured" when the measured export took 4 s (this run's export was
    # done, planned at 0 s, and the night fell back to the default while keeping the measured label)
    from eagleflow.contracts.plan import FinishedStages

    cfg = load_config(KIMI)
    export = MeasuredRun(stage="export", run="export/e1", target=cfg.target.model_path, seconds=4.0, created=1.0)
    facts = FACTS.model_copy(update={"history": [export]})
    done = FinishedStages(done=["check", "generate", "extract", "train", "export"])
    night = plan_nightly(cfg, facts, plan(cfg, facts, done))
    ex = stage(night, "export")
    assert (ex.seconds, ex.source) == (4.0, "measured (run export/e1)"), ex
    unmeasured = stage(plan_nightly(cfg, FACTS, plan(cfg, FACTS, done)), "export")
    assert unmeasured.seconds == 60 and unmeasured.source.startswith("default"), unmeasured


def test_an_sglang_night_restarts_production_and_says_which_rates_are_not_its_own():
    """configs/kimi-k25-sglang.yaml: SGLang cannot swap a drafter, so each promoted night is a load; its engine start
    is vLLM's measured rate, said so; capture's cost to production is vLLM's plugin's, said so; and on its hf
    fallback the hf backend's default rate is an 8B dense target's, said so."""
    cfg = load_config(ROOT / "configs" / "kimi-k25-sglang.yaml")
    night = plan_nightly(cfg, FACTS, plan(cfg, FACTS))
    assert len(night.loads) == 1 and night.loads[0].startswith("restore: production with the new drafter")
    assert "SGLang cannot change a running server's drafter" in night.pause and "wake" not in night.pause
    restore = stage(night, "restore")
    assert "SGLang's own start not measured here" in restore.source and "production's load read" in restore.rate
    assert night.down_stages == ["train", "export", "restore"]  # captured from production while it serves
    assert "SGLang's is not measured yet" in night.capture and "--disable-prefill-cuda-graph" in night.capture
    fallback = load_config(ROOT / "configs" / "kimi-k25-sglang.yaml", {"extract.backend": "hf"})
    extract = stage(plan(fallback, FACTS), "extract")
    assert "transformers forward" in extract.source and "not this target's: 595 GB of weights" in extract.source
    # the same target served by vLLM keeps its own sources
    vllm = plan(load_config(KIMI), FACTS)
    assert "SGLang" not in stage(vllm, "benchmark").source and "not this target's" not in stage(vllm, "extract").source
    assert "SGLang" not in plan_nightly(load_config(KIMI), FACTS, vllm).capture
