"""What one engine launch is (eagleflow.engines.launch): the run's target as the run config serves
it, the engine-neutral speculative config, and the engine package picking the adapter by kind."""

from __future__ import annotations

import sys

import pytest

from eagleflow.config import load_config
from eagleflow.engines.launch import served_name, speculative, target_launch
from tests.conftest import ROOT


def test_target_launch_follows_the_run_config():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    spec = target_launch(cfg, speculative("/d", 3), port_offset=2)
    assert (spec.python, spec.model, spec.dtype) == (sys.executable, cfg.target.model_path, "bfloat16")
    assert spec.served_model_name == served_name(cfg) == "demo-target"
    assert spec.port == cfg.engine.port + 2 and spec.engine == cfg.engine
    assert spec.speculative == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert target_launch(cfg).speculative is None and target_launch(cfg).port == cfg.engine.port
    unnamed = load_config(ROOT / "configs" / "demo.yaml", {"target.served_model_name": None})
    assert served_name(unnamed) == unnamed.target.model_path  # requests then name the path


def test_an_unknown_engine_kind_is_named():
    pytest.importorskip("prometheus_client")
    from eagleflow.engines import SERVERS, server_class

    assert sorted(SERVERS) == ["sglang", "vllm"]
    with pytest.raises(ValueError, match=r"unknown engine.kind 'tgi'; expected one of \['sglang', 'vllm'\]"):
        server_class("tgi")
