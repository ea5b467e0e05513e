"""The production backend's client (eagleflow.extraction.production) against a server that answers as production
does without eagleflow's capture plugin: every request served, no file written. The stage must stop at its first
request and say what is missing, the launch it needs, and the way that needs no change to production. (With the
plugin, on a real vLLM server: tests/integration/stages/test_extract.py.)"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.request import StageError
from eagleflow.extraction.production import ProductionStates, open_production
from tests.conftest import ROOT


@pytest.fixture
def production_without_plugin() -> Iterator[tuple[str, list[dict]]]:
    """A server answering /health and /v1/completions (one token), recording each request's body."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = b""
            if self.path == "/v1/models":  # as vLLM says it: the served name and its context
                body = json.dumps({"data": [{"id": "demo-target", "max_model_len": 1024}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"choices": [{"text": "x"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def test_a_production_without_the_plugin_is_named_with_the_launch_it_needs(production_without_plugin, tmp_path):
    url, seen = production_without_plugin
    capture = tmp_path / "capture"
    capture.mkdir()
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {"extract.backend": "production", "extract.capture_dir": str(capture), "production.url": url},
    )
    states = ProductionStates(cfg)
    try:
        with pytest.raises(StageError) as err:
            states.request([1, 2, 3])
    finally:
        states.close()
    lines = str(err.value).splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"production answered a capture request but its capture plugin wrote nothing to {capture}"
    assert f"EAGLEFLOW_CAPTURE_DIR={capture}" in lines[1] and "EAGLEFLOW_CAPTURE_LAYERS=1,2,3,4" in lines[1]
    assert "extract.backend to 'vllm'" in lines[2]
    # what production was asked: the ids as the prompt, one token, marked and salted (no prefix-cache hit)
    (body,) = seen
    name = body["vllm_xargs"]["eagleflow_capture"]
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 1 and body["cache_salt"] == name


def test_conversations_longer_than_productions_context_are_refused_before_any_request(
    production_without_plugin, tmp_path
):
    url, seen = production_without_plugin
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {"extract.backend": "production", "extract.capture_dir": str(tmp_path), "production.url": url},
    )
    assert cfg.extract.max_seq_len == 1024
    with ExitStack() as stack, pytest.raises(StageError) as err:
        open_production(cfg, stack)
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and "production's context of 1024 tokens" in lines[0], lines
    assert lines[1].startswith("set extract.max_seq_len to 1023 or less") and seen == []
    cfg.extract.max_seq_len = 1023
    with ExitStack() as stack:
        assert open_production(cfg, stack).capture_dir == tmp_path


def test_on_an_sglang_production_the_drafts_room_of_each_request_is_counted(production_without_plugin, tmp_path):
    # SGLang serving EAGLE keeps k + 1 tokens of each request for a step's drafts and refuses a request that leaves
    # none (tokenizer_manager.py): a conversation of context - 1 tokens fits vLLM's production, not SGLang's
    url, seen = production_without_plugin
    sets = {"extract.backend": "production", "extract.capture_dir": str(tmp_path), "production.url": url}
    sglang = {
        **sets,
        "engine.kind": "sglang",
        "engine.kv_cache_gib": None,
        "extract.max_seq_len": 1023,
        "train.max_seq_len": 1019,
        "extract.fallback": "sglang",
    }
    cfg = load_config(ROOT / "configs" / "demo.yaml", sglang)
    assert cfg.benchmark.num_speculative_tokens == 3
    with ExitStack() as stack, pytest.raises(StageError) as err:
        open_production(cfg, stack)
    lines = str(err.value).splitlines()
    assert "and the 4 tokens SGLang keeps for a step's drafts" in lines[0], lines
    assert lines[1].startswith("set extract.max_seq_len to 1019 or less") and seen == []
    cfg.extract.max_seq_len = 1019
    with ExitStack() as stack:
        assert open_production(cfg, stack).capture_dir == tmp_path
