"""The extraction backends' registry: every name the config accepts has one entry, and the plan, the production
window and the stage read what each takes of the host from it."""

from __future__ import annotations

import pytest

from eagleflow.config import ExtractConfig, RunConfig, load_config
from eagleflow.contracts.manifest import stage_key
from eagleflow.extraction import OPENERS
from eagleflow.extraction.backends import BACKENDS, backend_of
from tests.conftest import ROOT


def config(**extract) -> RunConfig:
    return load_config(ROOT / "configs" / "demo.yaml", {f"extract.{k}": v for k, v in extract.items()})


def test_every_configurable_backend_is_registered():
    assert set(BACKENDS) == set(ExtractConfig.model_fields["backend"].annotation.__args__) == set(OPENERS)


def test_what_each_backend_takes_of_the_host():
    assert backend_of(config(backend="vllm", device="cpu")).uses_gpus(config(backend="vllm", device="cpu"))
    hf_cpu = config(backend="hf", device="cpu")
    assert not backend_of(hf_cpu).uses_gpus(hf_cpu) and not backend_of(hf_cpu).loads_engine
    hf_auto = config(backend="hf", device="auto")
    assert backend_of(hf_auto).uses_gpus(hf_auto)  # 'auto' picks CUDA on a GPU host: it counts
    prod = load_config(
        ROOT / "configs" / "demo.yaml",
        {"extract.backend": "production", "extract.capture_dir": "/c", "production.url": "http://127.0.0.1:8000"},
    )
    # production computes them while it serves: no window, no engine of ours, whatever extract.device says
    assert not backend_of(prod).uses_gpus(prod) and not backend_of(prod).loads_engine


@pytest.mark.parametrize("missing", ["production.url", "extract.capture_dir"])
def test_capture_from_production_needs_its_url_and_the_plugins_directory(missing):
    given = {"extract.backend": "production", "extract.capture_dir": "/c", "production.url": "http://127.0.0.1:8000"}
    del given[missing]
    with pytest.raises(ValueError, match=r"extract.backend 'production' needs production.url .* extract.capture_dir"):
        load_config(ROOT / "configs" / "demo.yaml", given)


def test_an_unknown_backend_names_the_choices():
    cfg = config()
    object.__setattr__(cfg.extract, "backend", "trtllm")  # past validation, as a config from a newer version
    with pytest.raises(
        ValueError, match=r"unknown extract.backend 'trtllm'; expected one of \['hf', 'production', 'sglang', 'vllm'\]"
    ):
        backend_of(cfg)


def test_capture_from_production_on_either_engine_and_its_fallback_is_not_in_the_key():
    given = {"extract.backend": "production", "extract.capture_dir": "/c", "production.url": "http://127.0.0.1:8000"}
    # on SGLang the fallback cannot be vLLM's own-engine capture
    with pytest.raises(ValueError, match=r"extract.fallback is 'vllm' but engine.kind is 'sglang'"):
        load_config(ROOT / "configs" / "demo.yaml", {**given, "engine.kind": "sglang"})
    sgl = load_config(ROOT / "configs" / "demo.yaml", {**given, "engine.kind": "sglang", "extract.fallback": "hf"})
    assert sgl.extract.backend == "production"
    a = load_config(ROOT / "configs" / "demo.yaml", given)
    b = load_config(ROOT / "configs" / "demo.yaml", {**given, "extract.fallback": "none"})
    # where the states would have come from had production not captured is not what they are
    assert stage_key("extract", a, {"generate": "g"}) == stage_key("extract", b, {"generate": "g"})
    assert stage_key("extract", a, {"generate": "g"}) != stage_key("extract", config(), {"generate": "g"})


def test_each_engine_captures_with_its_own_backend_and_falls_back_to_it():
    sgl = {"engine.kind": "sglang", "engine.kv_cache_gib": None}
    own = load_config(ROOT / "configs" / "demo.yaml", {**sgl, "extract.backend": "sglang"})
    # an SGLang engine of ours: it loads the target and takes the GPUs, as vLLM's own capture does
    assert backend_of(own).loads_engine and backend_of(own).uses_gpus(own)
    with pytest.raises(ValueError, match=r"extract.backend is 'sglang' but engine.kind is 'vllm'"):
        config(backend="sglang")
    with pytest.raises(ValueError, match=r"extract.backend is 'vllm' but engine.kind is 'sglang'.*'sglang'"):
        load_config(ROOT / "configs" / "demo.yaml", {**sgl, "extract.backend": "vllm"})
    given = {"extract.backend": "production", "extract.capture_dir": "/c", "production.url": "http://127.0.0.1:8000"}
    night = load_config(ROOT / "configs" / "demo.yaml", {**given, **sgl, "extract.fallback": "sglang"})
    assert night.extract.fallback == "sglang"
    # on vLLM the fallback cannot be SGLang's engine either
    with pytest.raises(ValueError, match=r"extract.fallback is 'sglang' but engine.kind is 'vllm'"):
        load_config(ROOT / "configs" / "demo.yaml", {**given, "extract.fallback": "sglang"})
