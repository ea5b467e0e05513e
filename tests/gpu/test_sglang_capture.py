"""Capture from a production served by SGLang (eagleflow.engines.sglang_capture), on a GPU: the demo target served by
SGLang through eagleflow's adapter with the capture plugin switched on (EAGLEFLOW_CAPTURE_DIR / _LAYERS, an entry
point in SGLang's `sglang.srt.plugins` group, prefill without CUDA graphs), the extract stage's own client sending
capture requests beside an ordinary chat; the captured states against a transformers forward of the same target,
layer by layer, and nothing written for the chat.

Skipped where torch sees no CUDA device or SGLang is not importable (scripts/gpu_suite.sh runs it with SGLang's
staged site).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from pathlib import Path

import pytest

from tests.gpu.sglang_demo import sglang_sets

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not importable"),
]
ROOT = Path(__file__).resolve().parents[2]


def plugin_site(tmp_path: Path) -> str:
    """A dist-info declaring the plugin in SGLang's group, as installing eagleflow into production's environment
    does (pyproject.toml's entry point), for a checkout that is only on the path."""
    d = tmp_path / "plugin-site" / "eagleflow_sglang_capture-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: eagleflow-sglang-capture\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\neagleflow_capture = eagleflow.engines.sglang_capture:register\n"
    )
    return os.pathsep.join([str(d.parent), str(ROOT), os.environ.get("PYTHONPATH", "")])


def assert_parity(cfg, seqs: list[list[int]], captured: list, layers: list[int]) -> None:
    """Each captured [T, n_layers, H] against a transformers forward of the same target, layer by layer (cosine per
    token: mean > 0.999, worst > 0.99); the figures printed for the record (-rP)."""
    from eagleflow.extraction.hf import HfCapture

    ref = HfCapture(cfg, torch.device("cuda"))
    for ids, got in zip(seqs, captured, strict=True):
        want = ref.forward(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].float().cpu()
        assert got.shape == want.shape, (got.shape, want.shape)
        for k, layer in enumerate(layers):
            cos = torch.nn.functional.cosine_similarity(want[:, k], got[:, k].float(), dim=-1)
            print(f"{len(ids)} tokens, layer {layer}: cosine mean {cos.mean():.5f}, worst {cos.min():.5f}")
            assert cos.mean() > 0.999 and cos.min() > 0.99, (layer, len(ids), cos.mean().item(), cos.min().item())


def test_production_on_sglang_captures_the_targets_states_for_capture_requests_only(tmp_path):
    from eagleflow.config import load_config
    from eagleflow.engines import make_server
    from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV
    from eagleflow.engines.launch import target_launch
    from eagleflow.extraction.production import ProductionStates
    from eagleflow.util.http import client

    capture_dir = tmp_path / "capture"
    sets = sglang_sets(tmp_path)  # prefill without CUDA graphs, as the plugin needs
    cfg = load_config(ROOT / "configs" / "demo.yaml", sets)
    layers = [*cfg.target.aux_layer_ids, cfg.target.final_layer_id]
    env = {DIR_ENV: str(capture_dir), LAYERS_ENV: ",".join(map(str, layers)), "PYTHONPATH": plugin_site(tmp_path)}
    vocab = json.loads((Path(cfg.target.model_path) / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    seqs = [[rng.randrange(vocab) for _ in range(n)] for n in (17, 256, 700)]
    with make_server(target_launch(cfg), tmp_path / "engine.log", env=env, name="production") as server:
        chat = {
            "model": cfg.target.served_model_name,
            "messages": [{"role": "user", "content": "Hello."}],
            "max_tokens": 16,
        }
        assert client().post(f"{server.base_url}/v1/chat/completions", json=chat, timeout=120.0).status_code == 200
        assert list(capture_dir.glob("*.safetensors")) == []  # an ordinary request leaves nothing
        prod = load_config(
            ROOT / "configs" / "demo.yaml",
            {
                **sets,
                "production.url": server.base_url,
                "extract.backend": "production",
                "extract.capture_dir": str(capture_dir),
                "extract.fallback": "hf",
            },
        )
        states = ProductionStates(prod)
        captured = [states.collect(states.request(ids), ids) for ids in seqs]  # each [T, n_layers, H]
        states.close()
    log = (tmp_path / "engine.log").read_text(errors="replace")
    assert "eagleflow_capture: layers" in log, log[-3000:]

    assert_parity(cfg, seqs, captured, layers)


def test_the_sglang_backend_captures_the_targets_states_in_an_engine_of_its_own(tmp_path):
    """extract.backend 'sglang' as the extract stage opens it (eagleflow.extraction.open_capture): an SGLang engine of
    the stage's own with the plugin on (declared in the stage directory: eagleflow is only on this host's path),
    prefill without CUDA graphs though the engine is not eager; its states against a transformers forward."""
    from contextlib import ExitStack

    from eagleflow.config import load_config
    from eagleflow.extraction import open_capture

    sets = {**sglang_sets(tmp_path), "engine.enforce_eager": False, "extract.backend": "sglang"}
    cfg = load_config(ROOT / "configs" / "demo.yaml", sets)
    layers = [*cfg.target.aux_layer_ids, cfg.target.final_layer_id]
    hidden = json.loads((Path(cfg.target.model_path) / "config.json").read_text())["hidden_size"]
    vocab = json.loads((Path(cfg.target.model_path) / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    seqs = [[rng.randrange(vocab) for _ in range(n)] for n in (9, 333, 1000)]
    stage = tmp_path / "extract-stage"
    stage.mkdir()
    with ExitStack() as stack:
        engine = open_capture(cfg, stage, stack, hidden)
        captured = [engine.collect(engine.request(ids), ids) for ids in seqs]  # each [T, n_layers, H]
    log = (stage / "engine.log").read_text(errors="replace")
    assert "eagleflow_capture: layers" in log, log[-3000:]  # on: it stays off, saying so, with prefill graphs
    assert_parity(cfg, seqs, captured, layers)
