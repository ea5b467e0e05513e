"""Stage keys and manifests (eagleflow.manifest): a setting changes the key of exactly the stages that
depend on it, runtime settings change none, and a manifest round-trips through its file."""

import pytest

from eagleflow.config import load_config
from eagleflow.manifest import Manifest, read_manifest, stage_key, stage_settings, write_manifest
from tests.conftest import ROOT


def keys(cfg):
    out = {}
    out["generate"] = stage_key("generate", cfg, {})
    out["extract"] = stage_key("extract", cfg, {"generate": out["generate"]})
    out["train"] = stage_key("train", cfg, {"extract": out["extract"]})
    out["export"] = stage_key("export", cfg, {"train": out["train"]})
    out["benchmark"] = stage_key("benchmark", cfg, {"export": out["export"], "generate": out["generate"]})
    return out


def test_benchmark_settings_change_only_the_benchmark_key():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    bench = keys(load_config(ROOT / "configs" / "demo.yaml", {"benchmark.max_tokens": 64}))
    assert {s for s in base if base[s] != bench[s]} == {"benchmark"}


def test_a_drafters_own_attention_backend_changes_only_the_benchmark_key_and_none_keeps_it():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    assert "draft_attention_backend" not in stage_settings("benchmark", load_config(ROOT / "configs" / "demo.yaml"))[
        "benchmark"]
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"benchmark.draft_attention_backend": "TRITON_MLA"}))
    assert {s for s in base if base[s] != other[s]} == {"benchmark"}


def test_train_settings_change_train_and_downstream():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.learning_rate": 0.0005}))
    assert {s for s in base if base[s] != other[s]} == {"train", "export", "benchmark"}
    bounded = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.max_steps": 100}))
    assert {s for s in base if base[s] != bounded[s]} == {"train", "export", "benchmark"}  # a bound is a setting


def test_the_drafter_arch_left_to_auto_keeps_the_keys_runs_had_before_it_existed():
    # 'auto' is resolved from the target, which the upstream keys already cover; an explicit choice is a setting
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert "drafter_arch" not in stage_settings("train", cfg)["train"]
    base = keys(cfg)
    explicit = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.drafter_arch": "llama"}))
    assert {s for s in base if base[s] != explicit[s]} == {"train", "export", "benchmark"}


@pytest.mark.parametrize("override", [
    {"train.time_limit_s": 7200},  # a safety cap: raised, the same stage dir resumes
    {"train.nproc": 2, "train.grad_accum_steps": 4},
    {"train.num_threads": 1, "train.log_every_steps": 7, "train.checkpoint_every_steps": 9},
])
def test_train_runtime_settings_do_not_change_keys(override):
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    assert keys(load_config(ROOT / "configs" / "demo.yaml", override)) == base


def test_extract_settings_change_extract_and_downstream_and_runtime_ones_nothing():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    for override in ({"extract.backend": "vllm"}, {"extract.storage_dtype": "float8_e4m3fn"},
                     {"extract.shard_bytes": 1 << 20}):
        other = keys(load_config(ROOT / "configs" / "demo.yaml", override))
        assert {s for s in base if base[s] != other[s]} == {"extract", "train", "export", "benchmark"}, override
    runtime = {"extract.concurrency": 64, "extract.spool_dir": "/tmp/x", "extract.spread": "always"}
    assert keys(load_config(ROOT / "configs" / "demo.yaml", runtime)) == base
    # The vllm backend serves the target as production does: its launch settings are in the extract key.
    vllm = {"extract.backend": "vllm"}
    a = keys(load_config(ROOT / "configs" / "demo.yaml", vllm))
    b = keys(load_config(ROOT / "configs" / "demo.yaml", {**vllm, "engine.max_model_len": 2048}))
    assert a["extract"] != b["extract"]


def test_generate_from_production_is_keyed_by_its_url_and_not_by_our_engine_flags():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    # The settings an own-server generate was keyed by before `server` existed: finished runs stay cached.
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    own = stage_settings("generate", cfg)
    assert set(own) == {"target", "engine", "generate"}
    assert own["generate"] == {k: v for k, v in cfg.generate.model_dump().items() if k not in ("server", "server_wait_s")}
    assert keys(load_config(ROOT / "configs" / "demo.yaml", {"generate.server_wait_s": 60})) == base
    prod = {"generate.server": "production", "production.url": "http://127.0.0.1:8000"}
    a = keys(load_config(ROOT / "configs" / "demo.yaml", prod))
    assert a["generate"] != base["generate"]
    assert keys(load_config(ROOT / "configs" / "demo.yaml", {**prod, "engine.max_model_len": 2048}))["generate"] == a["generate"]
    assert keys(load_config(ROOT / "configs" / "demo.yaml", {**prod, "production.url": "http://10.0.0.2:8000"}))[
        "generate"] != a["generate"]


def test_engine_port_does_not_change_data_keys():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"engine.port": 19999}))
    assert base == other


def test_missing_upstream_key_is_an_error():
    with pytest.raises(ValueError, match="upstream"):
        stage_key("extract", load_config(ROOT / "configs" / "demo.yaml"), {})


def test_manifest_roundtrip(tmp_path):
    m = Manifest(stage="train", key="abc", dir=str(tmp_path / "train" / "abc"), metrics={"loss": 1.5})
    path = write_manifest(m)
    assert path == tmp_path / "train" / "abc" / "manifest.json"
    assert read_manifest(path) == m
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]  # written atomically: no temp file left
