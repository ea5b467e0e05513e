"""An engine's Prometheus page (eagleflow.engines.metrics): counters and histogram sums/counts, and
latency means from histogram deltas over a window."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from eagleflow.engines.metrics import latency_from_deltas, parse_metrics  # noqa: E402


def test_latency_means_from_histogram_deltas():
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


def test_counters_are_summed_over_engines_and_kept_per_position():
    page = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""
    assert parse_metrics(page) == {
        "vllm:spec_decode_num_drafts": 15.0,
        "vllm:spec_decode_num_accepted_tokens_per_pos{position=0}": 8.0,
        "vllm:spec_decode_num_accepted_tokens_per_pos{position=1}": 2.0,
    }  # gauges are not counters: left out
