"""The vLLM adapter (eagleflow.engines.vllm): its command line (from a LaunchSpec, through the engine
package's server_class) and acceptance from /metrics counter deltas over a measured window."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("prometheus_client")

from eagleflow.config import EngineConfig  # noqa: E402
from eagleflow.contracts.request import StageError  # noqa: E402
from eagleflow.engines import server_class  # noqa: E402
from eagleflow.engines.launch import LaunchSpec  # noqa: E402
from eagleflow.engines.metrics import parse_metrics  # noqa: E402
from eagleflow.engines.vllm import VllmServer, acceptance_from_deltas  # noqa: E402

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 210.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 50.0
"""


def test_acceptance_from_counter_deltas():
    after = parse_metrics(METRICS)
    before = {k: v / 10 for k, v in after.items()}  # a warm-up window that must be subtracted
    acc = acceptance_from_deltas(before, after, 3)
    assert acc["num_drafts"] == pytest.approx(90)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 189 / 90)
    assert acc["acceptance_rate"] == pytest.approx(189 / 270)
    assert acc["per_position_acceptance"] == pytest.approx([81 / 90, 63 / 90, 45 / 90])


def test_no_drafts_means_the_drafter_was_not_used():
    with pytest.raises(StageError, match="drafter was not used"):
        acceptance_from_deltas({}, {}, 3)


def test_launch_command_quotes_nothing_and_carries_speculative_config():
    spec = LaunchSpec(
        python="/py",
        model="/m",
        served_model_name="m",
        dtype="bfloat16",
        engine=EngineConfig(tensor_parallel_size=8, reasoning_parser="kimi_k2", tool_call_parser="kimi_k2"),
        port=8000,
        speculative={"method": "eagle3", "model": "/d x", "num_speculative_tokens": 3},
    )
    assert server_class(spec.engine.kind) is VllmServer
    argv = server_class(spec.engine.kind).argv_for(spec)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--tool-call-parser") + 1] == "kimi_k2"
    assert '"model": "/d x"' in argv[argv.index("--speculative-config") + 1]


def test_a_capture_launch_asks_for_the_hidden_states_method_without_prefix_caching():
    from eagleflow.engines.launch import StateCapture

    spec = LaunchSpec(
        python="py",
        model="/m",
        served_model_name="t",
        dtype="bfloat16",
        engine=EngineConfig(tensor_parallel_size=8),
        port=8000,
        capture=StateCapture(layer_ids=[2, 30, 58, 61], spool_dir="/dev/shm/s"),
    )
    argv = VllmServer.argv_for(spec)
    spec_cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec_cfg == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58, 61]}},
    }
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "eagleflow.engines.hidden_states_connector"
    assert kv["kv_connector_extra_config"] == {"shared_storage_path": "/dev/shm/s"}
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "8"


def test_sglang_refuses_a_capture_launch():
    from eagleflow.engines.launch import StateCapture

    spec = LaunchSpec(
        python="py",
        model="/m",
        served_model_name="t",
        dtype="bfloat16",
        engine=EngineConfig(kind="sglang"),
        port=8000,
        capture=StateCapture([1, 2, 3, 4], "/s"),
    )
    with pytest.raises(ValueError, match="SGLang has no hidden-states capture"):
        server_class("sglang").argv_for(spec)


def test_the_kv_cache_size_is_a_flag_in_bytes_and_sglang_refuses_it():
    def argv(**engine):
        spec = LaunchSpec(
            python="/py", model="/m", served_model_name="m", dtype="bfloat16", engine=EngineConfig(**engine), port=8000
        )
        return server_class(spec.engine.kind).argv_for(spec)

    a = argv(kv_cache_gib=0.25)
    assert a[a.index("--kv-cache-memory-bytes") + 1] == str(256 * 2**20)
    assert "--kv-cache-memory-bytes" not in argv()  # unset: the engine's own choice
    with pytest.raises(ValueError, match="engine.kv_cache_gib is vLLM's --kv-cache-memory-bytes"):
        argv(kind="sglang", kv_cache_gib=0.25)
