import pytest

from eagleflow.engines.chat import parse_choice
from eagleflow.engines.vllm import LaunchSpec, acceptance_from_deltas, parse_metrics, root_cause_excerpt
from eagleflow.config import EngineConfig
from eagleflow.stages.common import StageError

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


def test_answer_without_content_is_an_error():
    assert parse_choice(0, {"choices": [{"message": {"content": None}, "finish_reason": "length"}]}).error
    assert parse_choice(0, {"oops": 1}).error
    r = parse_choice(0, {"choices": [{"message": {"content": "x", "reasoning_content": "r"}}],
                         "usage": {"completion_tokens": 3}})
    assert (r.error, r.content, r.reasoning, r.completion_tokens) == (None, "x", "r", 3)
    assert parse_choice(0, {"choices": [{"message": {"content": None, "reasoning": "r"}}]}).reasoning == "r"


def test_launch_command_quotes_nothing_and_carries_speculative_config():
    spec = LaunchSpec(python="/py", model="/m", served_model_name="m", dtype="bfloat16",
                      engine=EngineConfig(tensor_parallel_size=8, reasoning_parser="kimi_k2", tool_call_parser="kimi_k2"),
                      port=8000, speculative={"method": "eagle3", "model": "/d x", "num_speculative_tokens": 3})
    argv = spec.argv()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--tool-call-parser") + 1] == "kimi_k2"
    assert '"model": "/d x"' in argv[argv.index("--speculative-config") + 1]


def test_root_cause_prefers_the_first_traceback():
    log = "\n".join(["INFO loading", "(EngineCore pid=1) Traceback (most recent call last):",
                     "(EngineCore pid=1) ValueError: hidden size mismatch", "APIServer Traceback (most recent call last):",
                     "RuntimeError: Engine core initialization failed"])
    out = root_cause_excerpt(log)
    assert out.splitlines()[0].endswith("Traceback (most recent call last):")
    assert "hidden size mismatch" in out and "initialization failed" not in out
    long_tb = "\n".join(["Traceback (most recent call last):"] + [f'  File "x.py", line {i}' for i in range(100)]
                        + ["ValueError: " + "y" * 5000])
    tail = root_cause_excerpt(long_tb).splitlines()
    assert tail[-1].startswith("ValueError: yyy") and len(tail[-1]) < 500 and len(tail) <= 25
