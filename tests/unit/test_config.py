"""The run config (eagleflow.config): the shipped examples load, paths resolve, a bad field is named,
overrides are validated, and a removed setting (train.time_budget_s) says what replaced it."""

from pathlib import Path

import pytest
import yaml

from eagleflow.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def demo_dict() -> dict:
    return yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())


def test_examples_load_and_resolve_paths():
    demo = load_config(ROOT / "configs" / "demo.yaml")
    assert demo.target.model_path == str(ROOT / "demo" / "target")
    assert demo.host.python == str(ROOT / ".hostenv" / "bin" / "python")
    kimi = load_config(ROOT / "configs" / "kimi-k25.yaml")
    assert kimi.engine.tensor_parallel_size == 8
    assert kimi.engine.reasoning_parser == kimi.engine.tool_call_parser == "kimi_k2"
    assert kimi.engine.max_model_len == 32768
    assert (kimi.target.aux_layer_ids, kimi.target.final_layer_id) == ([2, 30, 58], 61)
    assert (kimi.generate.num_samples, kimi.generate.holdout, kimi.train.epochs) == (10000, 1000, 5)
    assert kimi.train.warm_start and kimi.production.unit == "vllm-kimi-k25-int4"
    assert (kimi.extract.backend, kimi.extract.fallback, kimi.extract.storage_dtype) == (
        "production",
        "vllm",
        "float8_e4m3fn",
    )
    # the nightly: the demo's deployed paused (a worker left running starts nothing), Kimi's active
    assert (demo.schedule.cron, demo.schedule.timezone, demo.schedule.active) == ("0 2 * * *", "UTC", False)
    assert kimi.schedule.active and kimi.schedule.describe() == "cron '0 2 * * *' (UTC), schedule active"


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["generate"].update(holdout=900, num_samples=800), "generate"),
        (lambda d: d["target"].update(aux_layer_ids=[1, 2, 4]), "target"),
        (lambda d: d["target"].update(aux_layer_ids=[3, 2, 1]), "target"),
        (lambda d: d["engine"].update(port=80), "engine.port"),
        (lambda d: d["train"].update(epochs=0), "train.epochs"),
        (lambda d: d["generate"].update(temprature=0.5), "generate.temprature"),
        (lambda d: d.pop("target"), "target"),
        (lambda d: d["benchmark"].update(num_prompts=1000), "benchmark.num_prompts"),
        (lambda d: d["extract"].update(storage_dtype="int4"), "extract.storage_dtype"),
        (lambda d: (d["extract"].update(backend="vllm"), d["engine"].update(kind="sglang")), "extract.backend"),
        (
            lambda d: (
                d["extract"].update(backend="hf"),
                d["engine"].update(kind="sglang"),
                d.update(
                    production={
                        "kind": "systemd",
                        "unit": "sgl",
                        "url": "http://127.0.0.1:8000",
                        "health_url": "http://127.0.0.1:8000/health",
                        "pause": "sleep",
                    }
                ),
            ),
            "production.pause: stop",
        ),
        (
            lambda d: (
                d["extract"].update(backend="production", capture_dir="/c", fallback="vllm"),
                d["engine"].update(kind="sglang"),
                d.update(production={"url": "http://127.0.0.1:30000"}),
            ),
            "extract.fallback is 'vllm'",
        ),
        (lambda d: d["generate"].update(server="production"), "production.url"),
        (lambda d: d.update(production={"window": "nightly"}), "production.window"),
        (lambda d: d.update(production={"replicas": ["10.0.0.2:8000"]}), "production.replicas[0]"),
        (lambda d: d.update(production={"replicas": ["http://a:1", "http://a:1/"]}), "production.replicas"),
        (lambda d: d.update(production={"api_key_env": "NOT A NAME"}), "production.api_key_env"),
        (lambda d: d.update(schedule={"cron": "0 2 * *"}), "schedule.cron"),
        (lambda d: d.update(schedule={"timezone": "Mars/Olympus"}), "schedule.timezone"),
        (lambda d: d.update(schedule={"active": "sometimes"}), "schedule.active"),
    ],
)
def test_bad_config_names_the_field(tmp_path, mutate, field):
    data = demo_dict()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    assert field in str(err.value)


def test_generate_from_production_takes_its_url_or_its_replicas(tmp_path):
    data = demo_dict()
    data["generate"]["server"] = "production"
    data["production"] = {"replicas": ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]}
    assert load_config(write(tmp_path, data)).production.replicas[1] == "http://10.0.0.3:8000"


def _ssh(name: str, work_root: str) -> dict:
    return {"kind": "ssh", "name": name, "address": "10.0.0.2", "work_root": work_root, "python": "/opt/ef/bin/python"}


@pytest.mark.parametrize(
    "host, nodes, said",
    [
        (None, [_ssh("gpu-b", "/local/ef")], "host.kind and every train_nodes.hosts[].kind must be 'ssh'"),
        (_ssh("gpu-a", "/shared/ef"), [_ssh("gpu-a", "/local/ef")], "must differ from each other and from host.name"),
        (_ssh("gpu-a", "/shared/ef"), [_ssh("gpu-b", "/shared/ef/")], "lies in host.work_root"),
        (_ssh("gpu-a", "/shared/ef"), [_ssh("gpu-b", "/shared/ef/b")], "lies in host.work_root"),
        (_ssh("gpu-a", "/shared/ef"), [{**_ssh("gpu-b", "/local/ef"), "kind": "local"}], "must be 'ssh'"),
    ],
)
def test_training_across_hosts_is_checked_before_anything_runs(tmp_path, host, nodes, said):
    data = demo_dict()
    if host:
        data["host"] = host
    data["train_nodes"] = {"hosts": nodes}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    assert "train_nodes" in str(err.value) and said in str(err.value)


def test_training_across_hosts_loads(tmp_path):
    data = demo_dict()
    data["host"] = _ssh("gpu-a", "/shared/ef")
    data["train_nodes"] = {"hosts": [_ssh("gpu-b", "/local/ef")], "master_port": 29600}
    cfg = load_config(write(tmp_path, data))
    assert [n.name for n in cfg.train_nodes.hosts] == ["gpu-b"] and cfg.train_nodes.master_port == 29600
    assert cfg.train_nodes.master_addr is None  # host.address, when the flow launches


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_overrides_are_validated(tmp_path):
    p = write(tmp_path, demo_dict())
    assert load_config(p, {"benchmark.max_tokens": 7}).benchmark.max_tokens == 7
    with pytest.raises(ConfigError, match="benchmark.max_tokens"):
        load_config(p, {"benchmark.max_tokens": 0})


def test_removed_time_budget_names_its_replacement(tmp_path):
    data = demo_dict()
    data["train"]["time_budget_s"] = 300
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    msg = str(err.value)
    assert "train" in msg and "time_budget_s is gone" in msg and "epochs or max_steps" in msg
    with pytest.raises(ConfigError, match="time_budget_s is gone"):
        load_config(ROOT / "configs" / "demo.yaml", {"train.time_budget_s": 150})
    # What replaced it: step bounds, and a cap that is only a safety net.
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"train.max_steps": 50, "train.on_time_limit": "stop"})
    assert (cfg.train.max_steps, cfg.train.on_time_limit, cfg.train.time_limit_s) == (50, "stop", 3600)


def test_the_warm_up_covers_every_setting_before_its_first_measured_round():
    """A fresh GPU engine compiles a batch size's or a sampler's kernels the first time it meets them: warmed at
    concurrency 1 alone, a baseline's first round at concurrency 8 read a TTFT of 342 ms against 8-20 ms warm."""
    from eagleflow.config.measure import BenchmarkConfig

    b = BenchmarkConfig(temperatures=[0.0, 1.0], concurrencies=[1, 8], warmup_requests=2)
    assert b.warmup() == [(0.0, 1, 2), (0.0, 8, 8), (1.0, 1, 2), (1.0, 8, 8)]
    assert BenchmarkConfig(warmup_requests=0).warmup() == []


def test_with_sglang_the_drafter_is_trained_in_the_layout_sglang_serves(tmp_path):
    """SGLang 0.5.15's EAGLE-3 layers have neither norm (eagleflow.engines.preflight.sglang): with engine.kind 'sglang'
    both default to off, an MLA drafter keeps its per-state norms, and a norm asked for by name is refused by name."""
    data = demo_dict()
    data["engine"]["kind"] = "sglang"
    data["extract"] = {**data.get("extract", {}), "backend": "hf"}
    cfg = load_config(write(tmp_path, data))
    assert (cfg.train.norm_before_fc, cfg.train.norm_before_residual) == (False, False)
    assert load_config(write(tmp_path, demo_dict())).train.norm_before_fc  # vLLM keeps the default recipe
    data["train"] = {**data["train"], "drafter_arch": "mla"}
    cfg = load_config(write(tmp_path, data))
    assert (cfg.train.norm_before_fc, cfg.train.norm_before_residual) == (True, False)
    data["train"] = {**data["train"], "drafter_arch": "auto", "norm_before_residual": True}
    with pytest.raises(ConfigError, match=r"train.norm_before_residual is true but engine.kind is 'sglang'"):
        load_config(write(tmp_path, data))


def test_with_sglang_a_vllm_named_draft_attention_backend_is_refused_by_its_field(tmp_path):
    # SGLang's --speculative-draft-attention-backend takes its own names: TRITON_MLA would stop the launch after the
    # target had loaded (minutes on Kimi); refused at the config, and SGLang's own name taken
    data = demo_dict()
    data["engine"]["kind"] = "sglang"
    data["extract"] = {**data.get("extract", {}), "backend": "hf"}
    data["benchmark"] = {**data["benchmark"], "draft_attention_backend": "TRITON_MLA"}
    with pytest.raises(ConfigError, match=r"benchmark.draft_attention_backend is 'TRITON_MLA', a vLLM name"):
        load_config(write(tmp_path, data))
    data["benchmark"]["draft_attention_backend"] = "triton"
    assert load_config(write(tmp_path, data)).benchmark.draft_attention_backend == "triton"


def test_a_config_extends_its_base_and_says_only_how_it_differs(tmp_path):
    """configs/kimi-k25-sglang.yaml is configs/kimi-k25.yaml (its base) with SGLang's differences: sections merged key
    by key, lists and values replaced, null back to the default; a missing base or a loop is named."""
    kimi = load_config(ROOT / "configs" / "kimi-k25.yaml")
    sgl = load_config(ROOT / "configs" / "kimi-k25-sglang.yaml")
    assert (sgl.engine.kind, sgl.engine.port, sgl.engine.gpu_memory_utilization) == ("sglang", 30000, None)
    assert sgl.engine.tensor_parallel_size == 8 and sgl.target == kimi.target and sgl.train.epochs == kimi.train.epochs
    assert (sgl.extract.backend, sgl.extract.capture_dir, sgl.extract.fallback) == (
        "production",
        kimi.extract.capture_dir,
        "sglang",
    )
    assert (sgl.production.pause, sgl.production.swap_drafter) == ("stop", False)
    assert sgl.production.traffic == kimi.production.traffic and sgl.production.unit == "sglang-kimi-k25-int4"
    assert (sgl.benchmark.draft_sample_method, sgl.benchmark.num_prompts) == ("greedy", kimi.benchmark.num_prompts)
    # the SGLang differences the layout rules apply on their own
    assert (sgl.train.norm_before_fc, sgl.train.norm_before_residual) == (False, False)
    child = tmp_path / "child.yaml"
    child.write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml does not exist"):
        load_config(child)
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="leads back to a config it extends"):
        load_config(tmp_path / "a.yaml")
