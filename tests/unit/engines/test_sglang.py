"""The SGLang adapter (eagleflow.engines.sglang): its command line and its acceptance parsers
(SGLang is not installed here; outputs as SGLang 0.5.15's source writes them are the fixtures)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("prometheus_client")

from eagleflow.config import EngineConfig  # noqa: E402
from eagleflow.contracts.request import StageError  # noqa: E402
from eagleflow.engines import server_class  # noqa: E402
from eagleflow.engines.launch import LaunchSpec  # noqa: E402
from eagleflow.engines.metrics import parse_metrics  # noqa: E402
from eagleflow.engines.sglang import (  # noqa: E402
    MAX_RUNNING_REQUESTS,
    SglangServer,
    acceptance_from_answers,
    acceptance_from_counters,
    acceptance_from_log,
)


def test_sglang_launch_command_has_the_eagle3_flags():
    engine = EngineConfig(
        kind="sglang",
        tensor_parallel_size=8,
        max_model_len=32768,
        gpu_memory_utilization=0.85,
        reasoning_parser="kimi_k2",
        trust_remote_code=True,
        enforce_eager=False,  # as the launch resolves 'auto' on a GPU build (eagleflow.engines.launch)
    )
    spec = LaunchSpec(
        python="/py",
        model="/m",
        served_model_name="kimi",
        dtype="bfloat16",
        engine=engine,
        port=30000,
        speculative={"method": "eagle3", "model": "/d", "num_speculative_tokens": 3},
    )
    assert server_class(spec.engine.kind) is SglangServer
    argv = server_class(spec.engine.kind).argv_for(spec)
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    flag = lambda f: argv[argv.index(f) + 1]  # noqa: E731
    assert (flag("--tp-size"), flag("--context-length"), flag("--mem-fraction-static")) == ("8", "32768", "0.85")
    assert (flag("--speculative-algorithm"), flag("--speculative-draft-model-path")) == ("EAGLE3", "/d")
    assert (
        flag("--speculative-num-steps"),
        flag("--speculative-eagle-topk"),
        flag("--speculative-num-draft-tokens"),
    ) == ("3", "1", "4")
    assert "--trust-remote-code" in argv and "--speculative-config" not in argv
    # SGLang caps a speculative server at 48 requests unless told: both launches batch as vLLM's default does
    assert flag("--max-running-requests") == str(MAX_RUNNING_REQUESTS) == "256"
    eager = dataclasses.replace(spec, engine=engine.model_copy(update={"enforce_eager": True}))
    argv_eager = server_class("sglang").argv_for(eager)
    assert "--disable-decode-cuda-graph" in argv_eager and "--disable-prefill-cuda-graph" in argv_eager
    assert "--disable-decode-cuda-graph" not in argv
    assert "--speculative-use-rejection-sampling" not in argv  # greedy drafts: SGLang's default
    assert flag("--reasoning-parser") == "kimi_k2"  # the same name on both engines
    r1 = dataclasses.replace(spec, engine=engine.model_copy(update={"reasoning_parser": "deepseek_r1"}))
    argv_r1 = SglangServer.argv_for(r1)
    assert argv_r1[argv_r1.index("--reasoning-parser") + 1] == "deepseek-r1"  # vLLM's name, SGLang's spelling
    backend = dataclasses.replace(spec, speculative={**spec.speculative, "attention_backend": "triton"})
    argv_b = SglangServer.argv_for(backend)  # benchmark.draft_attention_backend reaches SGLang, not dropped
    assert argv_b[argv_b.index("--speculative-draft-attention-backend") + 1] == "triton"
    assert "--speculative-draft-attention-backend" not in argv


def test_sglang_sampled_drafts_need_the_whole_vocabulary(tmp_path):
    """benchmark.draft_sample_method 'probabilistic' is SGLang's rejection sampling, which 0.5.15 refuses to start
    with for a drafter over fewer tokens than the target's: refused at launch by the field that sets it."""
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    for d, cfg in ((target, {"vocab_size": 2048}), (drafter, {"vocab_size": 2048, "draft_vocab_size": 256})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    spec = LaunchSpec(
        python="/py",
        model=str(target),
        served_model_name="t",
        dtype="bfloat16",
        engine=EngineConfig(kind="sglang"),
        port=30000,
        speculative={
            "method": "eagle3",
            "model": str(drafter),
            "num_speculative_tokens": 3,
            "draft_sample_method": "probabilistic",
        },
    )
    with pytest.raises(ValueError, match="train.draft_vocab_size: 2048") as err:
        SglangServer.argv_for(spec)
    assert "draft_vocab_size 256" in str(err.value) and "'greedy'" in str(err.value)
    (drafter / "config.json").write_text('{"vocab_size": 2048, "draft_vocab_size": 2048}')
    assert "--speculative-use-rejection-sampling" in SglangServer.argv_for(spec)
    greedy = dataclasses.replace(spec, speculative={**spec.speculative, "draft_sample_method": "greedy"})
    assert "--speculative-use-rejection-sampling" not in SglangServer.argv_for(greedy)


def test_sglang_acceptance_from_its_decode_log_lines():
    window = (
        "[2026-11-29 10:00:01] Decode batch. #running-req: 1, #token: 97, token usage: 0.00, accept len: 3.00, "
        "gen throughput (token/s): 49.95\n[2026-11-29 10:00:02] Decode batch. #running-req: 1, accept len: 2.00\n"
    )
    acc = acceptance_from_log(window, None, 3)
    assert acc["mean_acceptance_length"] == pytest.approx(2.5) and acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position_acceptance"] is None
    assert acceptance_from_log("", 2.2, 3)["mean_acceptance_length"] == pytest.approx(2.2)
    with pytest.raises(StageError, match="drafter was not used"):
        acceptance_from_log("", float("nan"), 3)


def _page(generated: int, requests: int, verified: int) -> str:
    """/metrics as SGLang 0.5.15 writes its per-request counters (metrics_collector.py), labels and all."""
    labels = '{engine_type="unified",model_name="kimi"}'
    return "".join(
        f"# HELP sglang:{name}_total {name}\n# TYPE sglang:{name}_total counter\nsglang:{name}_total{labels} {value}\n"
        for name, value in (
            ("generation_tokens", generated),
            ("num_requests", requests),
            ("spec_verify_calls", verified),
        )
    )


def test_sglang_acceptance_from_its_request_counters():
    before, after = parse_metrics(_page(1000, 10, 300)), parse_metrics(_page(1960, 26, 620))
    acc = acceptance_from_counters(before, after, 3)
    # 960 tokens of 16 requests, each one's first from its prefill: 944 over 320 verify steps
    assert acc["mean_acceptance_length"] == pytest.approx(944 / 320)
    assert acc["acceptance_rate"] == pytest.approx((944 / 320 - 1) / 3) and acc["per_position_acceptance"] is None
    # the benchmark's rounds need steps and accepted drafts, as vLLM's counters give them
    assert acc["num_drafts"] == 320 and acc["num_accepted_tokens"] == pytest.approx(944 - 320)
    # no request verified in the window (no speculation, or none finished): the log lines decide
    assert acceptance_from_counters(before, before, 3) is None


def answer(meta: dict | None) -> dict:
    """A whole chat answer as SGLang 0.5.15 returns it with return_meta_info (serving_chat.py)."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
    return {"choices": [{**choice, **({"meta_info": meta} if meta is not None else {})}], "usage": {}}


def test_sglang_acceptance_per_position_comes_from_each_answers_histogram():
    # request 1: 10 steps accepting 0,1,2,3 drafts 1,2,3,4 times; request 2: 5 steps, all 3 accepted
    one = {"spec_verify_ct": 10, "spec_num_correct_drafts": 20, "spec_correct_drafts_histogram": [1, 2, 3, 4]}
    two = {"spec_verify_ct": 5, "spec_num_correct_drafts": 15, "spec_correct_drafts_histogram": [0, 0, 0, 5]}
    acc = acceptance_from_answers([answer(one), answer(two), answer(None)], 3)
    assert acc["num_drafts"] == 15 and acc["num_accepted_tokens"] == 35
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 35 / 15)
    # position i is accepted in the steps that accepted at least i drafts: 14, 12, 9 of 15
    assert acc["per_position_acceptance"] == pytest.approx([14 / 15, 12 / 15, 9 / 15])
    # the per-position rates add up to the accepted drafts per step, as vLLM's do
    assert sum(acc["per_position_acceptance"]) == pytest.approx(35 / 15)
    # answers without the engine's report (no drafter, another engine): no figure from them
    assert acceptance_from_answers([answer(None), answer({"spec_verify_ct": 0})], 3) is None


def test_sglang_on_a_high_port_is_given_a_grpc_port_it_accepts(tmp_path, monkeypatch):
    """SGLang 0.5.15 checks --port + 10000 as its gRPC port at every start and stops above 65535 (a benchmark engine
    on free port 56733 did, on a GPU host): the adapter names one below in SGLANG_GRPC_PORT, and only there."""
    monkeypatch.delenv("SGLANG_GRPC_PORT", raising=False)
    spec = LaunchSpec(
        python="/py", model="/m", served_model_name="t", dtype="bfloat16", engine=EngineConfig(kind="sglang"), port=0
    )
    high = SglangServer(dataclasses.replace(spec, port=56733), tmp_path / "a.log", env={"X": "1"})
    assert high.env == {"X": "1", "SGLANG_GRPC_PORT": "46733"}
    assert SglangServer(dataclasses.replace(spec, port=30000), tmp_path / "b.log").env == {}
    own = SglangServer(dataclasses.replace(spec, port=60000), tmp_path / "c.log", env={"SGLANG_GRPC_PORT": "50001"})
    assert own.env == {"SGLANG_GRPC_PORT": "50001"}  # the caller's choice stands
    in_config = dataclasses.replace(
        spec, port=60000, engine=EngineConfig(kind="sglang", env={"SGLANG_GRPC_PORT": "50010"})
    )
    assert SglangServer(in_config, tmp_path / "e.log").env == {}  # engine.env's stands too
    monkeypatch.setenv("SGLANG_GRPC_PORT", "50002")
    assert SglangServer(dataclasses.replace(spec, port=60000), tmp_path / "d.log").env == {}  # so does the host's
