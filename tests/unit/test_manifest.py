import json
from pathlib import Path

import pytest

from eagleflow.config import load_config
from eagleflow.manifest import Manifest, read_manifest, stage_key, write_json_atomic, write_manifest

ROOT = Path(__file__).resolve().parents[2]


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


def test_train_settings_change_train_and_downstream():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"train.learning_rate": 0.0005}))
    assert {s for s in base if base[s] != other[s]} == {"train", "export", "benchmark"}


def test_engine_port_does_not_change_data_keys():
    base = keys(load_config(ROOT / "configs" / "demo.yaml"))
    other = keys(load_config(ROOT / "configs" / "demo.yaml", {"engine.port": 19999}))
    assert base == other


def test_missing_upstream_key_is_an_error():
    with pytest.raises(ValueError, match="upstream"):
        stage_key("extract", load_config(ROOT / "configs" / "demo.yaml"), {})


def test_manifest_roundtrip_and_atomic_write(tmp_path):
    m = Manifest(stage="train", key="abc", dir=str(tmp_path / "train" / "abc"), metrics={"loss": 1.5})
    path = write_manifest(m)
    assert read_manifest(path) == m

    class Boom:
        pass

    target = tmp_path / "x.json"
    write_json_atomic(target, {"ok": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": Boom()})
    # The failed write left the earlier complete file and no temp file behind.
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
