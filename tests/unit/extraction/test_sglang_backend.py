"""The `sglang` extraction backend's launch (eagleflow.extraction.sglang): prefill out of CUDA graphs for the capture
plugin, and the plugin declared to SGLang where no installed eagleflow declares it. Its capture itself runs on a GPU
host (tests/gpu/test_sglang_capture.py)."""

from __future__ import annotations

import configparser
import os

from eagleflow.extraction import sglang as backend


def test_prefill_leaves_cuda_graphs_unless_the_engine_has_none():
    assert backend.capture_args(["--attention-backend", "triton"], enforce_eager=False) == [
        "--attention-backend",
        "triton",
        "--disable-prefill-cuda-graph",
    ]
    # eager engines already run without graphs; an operator's own flag is not repeated
    assert backend.capture_args(["--x"], enforce_eager=True) == ["--x"]
    assert backend.capture_args(["--disable-prefill-cuda-graph"], enforce_eager=False) == [
        "--disable-prefill-cuda-graph"
    ]


def test_the_plugin_is_declared_to_sglang_only_where_eagleflow_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(backend, "plugin_declared", lambda: True)
    assert backend.plugin_path(tmp_path) == {}  # a second declaration would register the hooks twice
    assert not (tmp_path / "sglang-plugin").exists()

    monkeypatch.setattr(backend, "plugin_declared", lambda: False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = backend.plugin_path(tmp_path)
    site, checkout, rest = env["PYTHONPATH"].split(os.pathsep)
    assert site == str(tmp_path / "sglang-plugin") and rest == "/elsewhere"
    assert os.path.isfile(os.path.join(checkout, "eagleflow", "engines", "sglang_capture.py"))
    # the declaration SGLang's loader reads: its group, the plugin's name, the register function
    entry = configparser.ConfigParser()
    entry.read(tmp_path / "sglang-plugin" / "eagleflow_sglang_capture-0.0.dist-info" / "entry_points.txt")
    assert dict(entry["sglang.srt.plugins"]) == {"eagleflow_capture": "eagleflow.engines.sglang_capture:register"}


def test_production_flags_that_would_turn_the_plugin_off_are_left_out_of_the_capture_engine():
    # a production on data-parallel attention, or with its own prefill graphs, turns the plugin off there (each DP
    # rank holds its own requests' states; replayed prefill graphs skip the final norm's hook): the night's fallback
    # engine inherits engine.extra_args and would be off too, after production was stopped for it
    prod = [
        "--enable-dp-attention",
        "--dp-size",
        "8",
        "--cuda-graph-backend-prefill=breakable",
        "--moe-a2a-backend",
        "deepep",
    ]
    prod += ["--cuda-graph-config", '{"prefill": {"backend": "full"}}', "--data-parallel-size=8"]
    assert backend.capture_args(prod, enforce_eager=False) == [
        "--moe-a2a-backend",
        "deepep",
        "--disable-prefill-cuda-graph",
    ]
