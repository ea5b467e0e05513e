"""One benchmark session's windows (eagleflow.measure.session) and the stopping rule inside them: a drafter's
window stops once its intervals are within benchmark.precision and min_requests were sent, and not before; with
no precision it sends every prompt. The engines here are stand-ins with perfectly steady rounds (what the
session reads of an engine: its answers, its wall time, its counters), so where a window stops is known exactly;
tests/integration/stages/test_benchmark.py measures the same loop on real engines."""

from __future__ import annotations

from eagleflow.config import load_config
from eagleflow.engines.chat import ChatResult
from eagleflow.measure.session import Session, Variant
from tests.conftest import ROOT

PROMPTS = [[{"role": "user", "content": f"q{i}"}] for i in range(12)]
TOKENS = 24


class SteadyEngine:
    """Every request takes the same time and tokens; a drafter's every drafting step accepts 2 of 3 tokens."""

    def __init__(self, drafter: bool) -> None:
        self.drafter, self.drafts, self.sent = drafter, 0.0, 0

    def chat(self, convs, max_tokens, temperature, concurrency, extra, seed):
        self.sent += len(convs)
        self.drafts += len(convs) * TOKENS / 3
        return [ChatResult(index=i, content="x", completion_tokens=TOKENS) for i in range(len(convs))], 0.5

    def snapshot(self) -> dict[str, float]:
        return {"drafts": self.drafts}

    def acceptance(self, before, after, k):
        drafts = after["drafts"] - before["drafts"]
        return {
            "num_drafts": drafts,
            "num_draft_tokens": 3 * drafts,
            "num_accepted_tokens": 2 * drafts,
            "acceptance_rate": 2 / 3,
            "mean_acceptance_length": 3.0,
            "per_position_acceptance": [0.8, 0.7, 0.5],
        }

    def latency(self, before, after):
        return {}

    def post_mortem(self) -> str:
        return ""


def measure(precision: float | None) -> Session:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "benchmark.temperatures": [0.0],
            "benchmark.concurrencies": [1],
            "benchmark.num_prompts": 12,
            "benchmark.precision": precision,
            "benchmark.min_requests": 3,
            "benchmark.warmup_requests": 0,
        },
    )
    variants = [Variant("baseline", None), Variant("drafter", "/drafter")]
    session = Session(cfg, PROMPTS, variants)
    for v in variants:
        engine = SteadyEngine(v.drafter is not None)
        v.server = v.client = engine  # the session talks to an engine through both
    for group in session.groups():
        session.measure_setting(group, 0.0, 1)
    return session


def test_a_steady_drafter_window_stops_at_min_requests_and_the_baseline_sends_every_prompt():
    s = measure(precision=0.05)
    base, drafter = s.rows[("baseline", 0.0, 1)], s.rows[("drafter", 0.0, 1)]
    assert base.requests == 12 and base.stopped == "all prompts"  # no interval of its own to wait for
    assert drafter.requests == 3 and drafter.stopped == "precision", drafter  # zero spread: at min_requests
    assert drafter.mean_acceptance_length == 3.0 and s.progress.done == 24  # the unsent prompts counted as done


def test_without_a_precision_every_window_sends_every_prompt():
    s = measure(precision=None)
    assert all(m.requests == 12 and m.stopped == "all prompts" for m in s.rows.values())


def test_each_settings_windows_are_timed_for_the_report():
    s = measure(precision=None)
    assert list(s.seconds) == [
        "baseline: windows at temperature 0, concurrency 1",
        "drafter: windows at temperature 0, concurrency 1",
    ]
    assert all(x >= 0 for x in s.seconds.values())


def test_sampled_requests_carry_production_top_p_and_greedy_ones_do_not():
    # issue 40: Kimi-K2.5 is served at top_p 0.95; the benchmark sampled at top_p 1
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {"benchmark.temperatures": [0.0, 1.0], "benchmark.top_p": 0.95, "benchmark.warmup_requests": 0},
    )
    sent: list[tuple[float, dict]] = []

    class Recording(SteadyEngine):
        def chat(self, convs, max_tokens, temperature, concurrency, extra, seed):
            sent.append((temperature, extra))
            return super().chat(convs, max_tokens, temperature, concurrency, extra, seed)

    session = Session(cfg, PROMPTS, [Variant("baseline", None)])
    engine = Recording(False)
    session.variants[0].server = session.variants[0].client = engine
    for group in session.groups():
        for t in (0.0, 1.0):
            session.measure_setting(group, t, 1)
    assert {t: extra.get("top_p") for t, extra in sent} == {0.0: None, 1.0: 0.95}
    assert all(extra["ignore_eos"] for _, extra in sent)
