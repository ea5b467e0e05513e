"""Stage keys and manifests (eagleflow.contracts.manifest): a setting changes the key of exactly the stages that
depend on it, runtime settings change none, and a manifest round-trips through its file."""

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.manifest import Manifest, read_manifest, stage_key, stage_settings, write_manifest
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
    assert (
        "draft_attention_backend"
        not in stage_settings("benchmark", load_config(ROOT / "configs" / "demo.yaml"))["benchmark"]
    )
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"benchmark.draft_attention_backend": "TRITON_MLA"}))
    assert {s for s in base if base[s] != other[s]} == {"benchmark"}


@pytest.mark.parametrize(
    ("field", "value"), [("top_p", 0.95), ("draft_sample_method", "probabilistic"), ("draft_sample_method", "greedy")]
)
def test_productions_sampling_changes_only_the_benchmark_key_and_its_default_keeps_it(field, value):
    # issue 40: top_p and the draft sampling are benchmark settings; left at their defaults, a run's keys are the
    # ones it had before they existed (no cached stage measured again for nothing)
    demo = ROOT / "configs" / "demo.yaml"
    assert field not in stage_settings("benchmark", load_config(demo))["benchmark"]
    base, other = keys(load_config(demo)), keys(load_config(demo, {f"benchmark.{field}": value}))
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


def test_adamw_the_default_optimizer_keeps_the_keys_runs_had_before_muon_existed():
    # Muon's settings do not touch an AdamW drafter; runs trained before train.optimizer existed keep their keys
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"train.muon_momentum": 0.9})
    assert not {"optimizer", "muon_momentum", "muon_weight_decay"} & set(stage_settings("train", cfg)["train"])
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    assert keys(cfg) == base
    muon = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.optimizer": "muon"}))
    assert {s for s in base if base[s] != muon[s]} == {"train", "export", "benchmark"}
    slower = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.optimizer": "muon", "train.muon_momentum": 0.9}))
    assert slower["train"] != muon["train"]


def test_the_cosine_the_default_schedule_keeps_the_keys_runs_had_before_lr_schedule_existed():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert "lr_schedule" not in stage_settings("train", cfg)["train"]
    base = keys(cfg)
    linear = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.lr_schedule": "linear"}))
    assert {s for s in base if base[s] != linear[s]} == {"train", "export", "benchmark"}


@pytest.mark.parametrize(
    "override",
    [
        {"train.time_limit_s": 7200},  # a safety cap: raised, the same stage dir resumes
        {"train.nproc": 2, "train.grad_accum_steps": 4},
        {"train.num_threads": 1, "train.log_every_steps": 7, "train.checkpoint_every_steps": 9},
    ],
)
def test_train_runtime_settings_do_not_change_keys(override):
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    assert keys(load_config(ROOT / "configs" / "demo.yaml", override)) == base


def test_extract_settings_change_extract_and_downstream_and_runtime_ones_nothing():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    for override in (
        {"extract.backend": "vllm"},
        {"extract.storage_dtype": "float8_e4m3fn"},
        {"extract.shard_bytes": 1 << 20},
    ):
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
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    own = stage_settings("generate", cfg)
    assert set(own) == {"target", "engine", "generate"}
    assert set(own["engine"]) == {"kind", "max_model_len", "trust_remote_code", "reasoning_parser", "data_args"}
    assert own["generate"] == {
        k: v for k, v in cfg.generate.model_dump().items() if k not in ("server", "server_wait_s", "split")
    }
    assert keys(load_config(ROOT / "configs" / "demo.yaml", {"generate.server_wait_s": 60})) == base
    prod = {"generate.server": "production", "production.url": "http://127.0.0.1:8000"}
    a = keys(load_config(ROOT / "configs" / "demo.yaml", prod))
    assert a["generate"] != base["generate"]
    assert (
        keys(load_config(ROOT / "configs" / "demo.yaml", {**prod, "engine.max_model_len": 2048}))["generate"]
        == a["generate"]
    )
    assert (
        keys(load_config(ROOT / "configs" / "demo.yaml", {**prod, "production.url": "http://10.0.0.2:8000"}))[
            "generate"
        ]
        != a["generate"]
    )


@pytest.mark.parametrize(
    "override",
    [
        {"engine.env": {"VLLM_CPU_KVCACHE_SPACE": "2"}},
        {"engine.enforce_eager": False},
        {"engine.tensor_parallel_size": 2},
        {"engine.gpu_memory_utilization": 0.8},
        {"engine.extra_args": ["--max-num-seqs", "64", "--attention-backend=TRITON_ATTN"]},
        {"engine.tool_call_parser": "kimi_k2"},
    ],
)
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_engine_flags_that_change_only_speed_rerun_only_the_benchmark(override, backend):
    # The benchmark measures the engine: every launch setting is in its key. The data stages' keys hold only
    # what changes their data, so `eagleflow benchmark CONFIG` still finds the finished drafter after such a change.
    base = keys(load_config(ROOT / "configs" / "demo.yaml", {"extract.backend": backend}))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"extract.backend": backend, **override}))
    assert {s for s in base if base[s] != other[s]} == {"benchmark"}, override


@pytest.mark.parametrize(
    "args", [["--quantization", "fp8"], ["--kv-cache-dtype=fp8"], ["--max-num-seqs", "8", "--dtype", "float16"]]
)
def test_engine_flags_that_change_what_the_model_computes_rerun_the_data_stages(args):
    base = keys(load_config(ROOT / "configs" / "demo.yaml", {"extract.backend": "vllm"}))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"extract.backend": "vllm", "engine.extra_args": args}))
    assert {s for s in base if base[s] != other[s]} == {"generate", "extract", "train", "export", "benchmark"}
    # the hf backend runs no engine: its states do not depend on the engine's flags
    hf = keys(load_config(ROOT / "configs" / "demo.yaml"))
    hf_other = keys(load_config(ROOT / "configs" / "demo.yaml", {"engine.extra_args": args}))
    assert {s for s in hf if hf[s] != hf_other[s]} == {"generate", "extract", "train", "export", "benchmark"}


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


@pytest.mark.parametrize("backend, keyed", [("vllm", True), ("sglang", True), ("hf", False)])
def test_an_extract_stage_whose_engine_makes_the_states_is_keyed_by_that_engines_data_settings(backend, keyed):
    # vllm and sglang extract with an engine of the stage's own: its context and data flags shape the states
    sglang = {"engine.kind": "sglang", "engine.kv_cache_gib": None} if backend == "sglang" else {}
    cfg = load_config(ROOT / "configs" / "demo.yaml", {**sglang, "extract.backend": backend})
    engine = stage_settings("extract", cfg)["engine"]
    assert (engine is not None) == keyed
    if keyed:
        assert engine["kind"] == cfg.engine.kind and engine["max_model_len"] == cfg.engine.max_model_len
