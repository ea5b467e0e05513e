"""The probe after a wake judges the drafter against what it should serve (issue 39): its canary on production, else
its offline estimate, by the 95% interval of its AL over requests sent until that interval decides. On a GPU host a
probe read AL 1.08 for a drafter swapped in with an offline estimate of 3.45 and passed it (the old rule: "accepts
anything"); these tests pin down that such a probe is refused, that the one that served 2.53 passes, what the
window's record keeps, and where the expected AL comes from. With a real engine: tests/gpu/test_swap_probe.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagleflow.config import ProductionConfig
from eagleflow.engines import acceptance
from eagleflow.engines.chat import ChatResult
from eagleflow.measure.intervals import acceptance_length
from eagleflow.production import guardian, pause, served, swap
from eagleflow.production.downtime import Downtime
from eagleflow.production.service import SettingsRecord
from eagleflow.util import http

OFFLINE = 3.45  # the demo drafter's offline estimate (its export's acceptance_length_sim)


def probed(accepted: list[float], drafts: list[float], per_pos: list[float], answers: int = 4) -> dict[str, Any]:
    """A probe's record as pause.probe writes it, from per-request counts."""
    al = 1.0 + sum(accepted) / sum(drafts)
    out = {
        "probe_answers": [f"answer {i}" for i in range(answers)],
        "probe_al": round(al, 4),
        "probe_per_position": per_pos,
        "probe_request_accepted": accepted,
        "probe_request_drafts": drafts,
        "probe_requests": len(drafts),
        "probe_stopped": "settled",
    }
    est = acceptance_length(accepted, drafts)  # as the probe computes it (eagleflow.measure.intervals)
    out["probe_al_interval"] = [est.low, est.high] if est else None
    return out


# The fault: a drafter whose weights did not arrive whole, accepting a little (AL 1.08) where it should serve 3.45.
FAULT = probed([2, 1, 3, 2, 2, 1, 3, 2], [25, 24, 26, 25, 25, 24, 26, 25], [0.05, 0.02, 0.01])
# The same drafter whole: what the canary then measured on production (AL 2.53).
WHOLE = probed([31, 30, 32, 29, 31, 30], [20, 20, 21, 19, 20, 20], [0.7, 0.5, 0.33])
BEFORE = {"probe_answers": [f"answer {i}" for i in range(4)], "probe_al": 2.6, "probe_per_position": [0.7, 0.5, 0.4]}


def test_a_drafter_that_serves_a_fraction_of_its_offline_estimate_is_refused() -> None:
    expected = pause.Expected(OFFLINE, "drafter 1's offline estimate (config.json)")
    why = pause.judge(FAULT, BEFORE, swapped=True, expected=expected, share=0.5)
    assert why is not None and "serves below what it should" in why
    assert "lies below the bar 2.23" in why and "drafter 1's offline estimate" in why
    assert pause.judge(WHOLE, BEFORE, swapped=True, expected=expected, share=0.5) is None
    # Without an expected AL the old rule stands, and says so: both accept something, both pass.
    none = pause.Expected(None, "drafter 1 has no offline estimate (no eagleflow manifest) and no canary on production")
    v = pause.verdict(FAULT, BEFORE, True, none, 0.5)
    assert v["decision"] == "pass" and v["decided_by"].startswith("no expected AL (drafter 1 has no offline estimate")


def test_the_verdict_keeps_the_probes_al_its_interval_requests_and_the_expected_al_with_its_source() -> None:
    v = pause.verdict(WHOLE, BEFORE, True, pause.Expected(OFFLINE, "drafter 1's offline estimate (config.json)"), 0.5)
    assert v["decision"] == "pass" and v["probe_requests"] == 6 and v["answers_as_before"] == "4 of 4"
    assert v["expected_al"] == OFFLINE and v["expected_source"] == "drafter 1's offline estimate (config.json)"
    assert v["bar"] == pytest.approx(1 + 0.5 * (OFFLINE - 1))
    lo, hi = v["probe_al_interval"]
    assert v["bar"] < lo < v["probe_al"] < hi < OFFLINE  # decided above the bar; not what it should serve, not 1.08
    assert "lies above the bar 2.23" in v["decided_by"]


def test_the_interval_must_separate_al_1_1_from_2_5() -> None:
    """Against the demo drafter's bar (2.23), a drafter at 1.1 and one at 2.5 are each decided by their intervals,
    from per-request counts of 64-token answers as the probe sends them; one request alone decides nothing."""
    settled = pause.settles(pause.bar(OFFLINE, 0.5))
    low_acc, low_drafts = [3, 2, 4, 3], [29, 30, 28, 29]  # AL ~1.1
    high_acc, high_drafts = [27, 25, 26, 24, 28, 25], [18, 17, 17, 17, 18, 17]  # AL ~2.5
    assert not settled(low_acc[:1], low_drafts[:1]) and not settled(high_acc[:1], high_drafts[:1])
    assert settled(low_acc, low_drafts) and acceptance_length(low_acc, low_drafts).high < 2.23
    assert settled(high_acc, high_drafts) and acceptance_length(high_acc, high_drafts).low > 2.23


def test_undecided_at_the_caps_the_point_decides_and_the_record_says_so() -> None:
    near = probed([22, 30, 20, 29], [20, 20, 20, 20], [0.6, 0.4, 0.3])  # AL 2.26, its interval holds the bar
    near["probe_stopped"] = "32 requests cap"
    v = pause.verdict(near, BEFORE, True, pause.Expected(OFFLINE, "drafter 1's offline estimate"), 0.5)
    assert v["decision"] == "pass" and "undecided after 4 requests (32 requests cap)" in v["decided_by"]
    assert "the point 2.26 decides" in v["decided_by"]


def test_the_old_checks_still_stand() -> None:
    expected = pause.Expected(OFFLINE, "drafter 0's canary on production")
    wrong = {**WHOLE, "probe_answers": ["x", "y", "z", "answer 3"]}
    assert "1 of 4 greedy answers as before" in pause.judge(wrong, BEFORE, expected=expected)
    nothing = probed([0, 0, 0, 0], [25, 25, 25, 25], [0.0, 0.0, 0.0])
    assert "vllm#52479" in pause.judge(nothing, BEFORE, expected=expected)  # level 2: drafted before, nothing now
    assert "swapped in does not draft" in pause.judge(nothing, BEFORE, swapped=True)


def test_a_drafter_that_never_drafted_is_not_refused_for_accepting_nothing_after_the_swap() -> None:
    """The rollback to an adopted drafter whose canary read AL 1.00 (on a GPU host, nights 2-4 refused it and
    restarted production each time): what it should serve is what it serves. Without that figure, or where its
    figure says it drafts, accepting nothing after the swap is still refused."""
    nothing = probed([0, 0, 0, 0], [25, 25, 25, 25], [0.0, 0.0, 0.0])
    v = pause.verdict(nothing, BEFORE, True, pause.Expected(1.0, "drafter 0's canary on production"), 0.5)
    assert v["decision"] == "pass" and "lies above the bar 1.00" in v["decided_by"]
    assert "does not draft" in pause.judge(nothing, BEFORE, swapped=True, expected=pause.Expected(None, "none"))
    assert "does not draft" in pause.judge(nothing, BEFORE, swapped=True, expected=pause.Expected(1.5, "canary"))


def drafter_dir(d: Path, offline: float | None) -> Path:
    d.mkdir(parents=True)
    conf: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 8, "draft_vocab_size": 32}
    if offline is not None:
        conf["eagleflow"] = {"validation": {"acceptance_length": offline}}
    (d / "config.json").write_text(json.dumps(conf))
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_the_expected_al_is_the_canary_when_known_else_the_offline_estimate_else_none(tmp_path: Path) -> None:
    dep = tmp_path / "production" / "demo"
    link = dep / served.LINK
    served.adopt(dep, drafter_dir(tmp_path / "public", None))  # a public drafter: no eagleflow manifest
    al, why = served.expected_al(link)
    assert al is None and "drafter 0 has no offline estimate" in why
    served.confirm(dep, {"mean_acceptance_length": 2.53, "at": "2026-12-05T01:00:00Z"})
    assert served.expected_al(link) == (2.53, "drafter 0's canary on production (2026-12-05T01:00:00Z)")
    served.switch(dep, drafter_dir(tmp_path / "new", OFFLINE), run="r")
    assert served.expected_al(link) == (OFFLINE, "drafter 1's offline estimate (config.json)")
    # an export whose config.json carries no estimate: its manifest beside the copied directory does
    export = tmp_path / "export" / "k"
    drafter_dir(export / "vllm", None)
    (export / "manifest.json").write_text(json.dumps({"stage": "export", "metrics": {"acceptance_length_sim": 1.27}}))
    served.switch(dep, export / "vllm", run="r2")
    assert served.expected_al(link) == (1.27, "drafter 2's offline estimate (its export manifest)")
    served.rollback(dep, "worse")  # back on drafter 0: its canary is the figure again
    assert served.expected_al(link)[0] == 2.53


class FakeService:
    """What the guardian's resume asks of production's service: healthy until stopped, healthy again once started."""

    def __init__(self, cfg: SettingsRecord):
        self.cfg, self.stopped, self.started = cfg, False, False

    def healthy(self) -> bool:
        return not self.stopped or self.started

    def unit_state(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True

    def start(self) -> None:
        self.started = True

    def wait_healthy(self, timeout_s: float) -> None:
        pass


def woken_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, after: dict[str, Any]) -> tuple[dict, FakeService]:
    """The guardian's resume of a level-1 sleep during which drafter 1 (offline 3.45) was switched in for drafter 0,
    with the engine's calls stubbed and the probe after the wake reading `after`."""
    dep = tmp_path / "production" / "demo"
    served.adopt(dep, drafter_dir(tmp_path / "a", 2.6))
    was = str((dep / served.LINK).resolve())
    served.switch(dep, drafter_dir(tmp_path / "b", OFFLINE), run="r")
    swapped: list[str] = []
    monkeypatch.setattr(swap, "why_not", lambda *a: None)
    monkeypatch.setattr(
        swap, "swap_drafter", lambda base, d: swapped.append(str(d)) or {"swapped_in": str(d), "swap_s": 0.1}
    )
    monkeypatch.setattr(pause, "wake", lambda base, level, api_key=None, between=None: between() if between else {})
    monkeypatch.setattr(pause, "probe", lambda *a, **kw: dict(after))
    cfg = SettingsRecord(kind="command", health_url="http://h/health", url="http://h", pause="sleep", swap_drafter=True)
    cfg.drafter_link = str(dep / served.LINK)
    svc = FakeService(cfg)
    rec = {"paused": {"base_url": "http://h", "level": 1, "drafter": was, "probe_before": BEFORE}}
    out = guardian._resume(svc, rec)  # type: ignore[arg-type]
    assert swapped == [str((dep / "drafters" / "1").resolve())]
    return out, svc


def test_the_guardian_stops_and_starts_production_when_the_probe_reads_a_fraction_of_the_estimate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out, svc = woken_with(monkeypatch, tmp_path, FAULT)
    assert svc.stopped and svc.started and out["ok"] and "resumed" not in out
    assert "serves below what it should" in out["pause_fallback"]
    probe = out["wake_probe"]  # what the window's record (and the report's line) keeps
    assert probe["decision"] == "refuse" and probe["probe_al"] == FAULT["probe_al"]
    assert probe["expected_al"] == OFFLINE and probe["expected_source"] == "drafter 1's offline estimate (config.json)"
    assert probe["probe_al_interval"] == FAULT["probe_al_interval"] and probe["probe_requests"] == 8


def test_the_guardian_keeps_production_woken_when_the_probe_reaches_the_bar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out, svc = woken_with(monkeypatch, tmp_path, WHOLE)
    assert not svc.stopped and out["ok"] and out["resumed"]["swapped_in"].endswith("drafters/1")
    assert out["wake_probe"]["decision"] == "pass" and "wake_probe" not in out["resumed"]
    d = Downtime(tmp_path, "t", was_running=True, kind="command")
    d.result = {**out, "healthy_after_s": 5.0}
    assert "probe AL 2.52 (" in d.summary() and "over 6 requests against the bar 2.23" in d.summary()
    assert d.summary().endswith("drafter 1's offline estimate (config.json): AL 3.45): pass")


def test_the_probe_sends_requests_until_the_interval_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """engines.acceptance.measure_each reads the counters around each request and stops once `settled` holds (at
    least min_requests), at its caps, or when the prompts run out (never a prompt twice)."""
    counts = {"drafts": 0.0, "accepted": 0.0}
    per_request = iter([(20, 30), (21, 28), (19, 31), (20, 29), (20, 30), (20, 30), (20, 30), (20, 30)])

    class Client:
        def __init__(self, *a: Any, **kw: Any) -> None:
            pass

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *a: Any) -> None:
            pass

        def chat(self, convs: list, **kw: Any) -> tuple[list[ChatResult], float]:
            d, a = next(per_request)
            counts["drafts"] += d
            counts["accepted"] += a
            return [ChatResult(index=0, content="x", completion_tokens=64)], 0.1

    class Page:
        @property
        def text(self) -> str:
            return (
                "# TYPE vllm:spec_decode_num_drafts counter\n"
                f"vllm:spec_decode_num_drafts_total {counts['drafts']}\n"
                "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                f"vllm:spec_decode_num_accepted_tokens_total {counts['accepted']}\n"
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {counts["accepted"]}\n'
            )

    monkeypatch.setattr(acceptance, "ChatClient", Client)
    monkeypatch.setattr(http, "get", lambda *a, **kw: Page())  # the one client /metrics is read through
    prompts = [[{"role": "user", "content": str(i)}] for i in range(8)]
    m = acceptance.measure_each("http://h", "m", prompts, 64, settled=pause.settles(2.23), min_requests=4)
    assert m["requests"] == 4 and m["stopped"] == "settled"  # AL ~2.5, its interval above 2.23 after 4
    assert m["request_drafts"] == [20, 21, 19, 20] and m["request_accepted"] == [30, 28, 31, 29]
    per_request = iter([(20, 30)] * 8)
    m = acceptance.measure_each("http://h", "m", prompts, 64, settled=lambda a, d: False, max_requests=5)
    assert m["requests"] == 5 and m["stopped"] == "5 requests cap"
    per_request = iter([(20, 30)] * 8)
    m = acceptance.measure_each("http://h", "m", prompts[:3], 64, settled=lambda a, d: False, max_requests=32)
    assert m["requests"] == 3 and m["stopped"] == "prompts sent"  # never a prompt twice


def test_the_probe_sends_the_runs_held_out_prompts_when_the_window_knows_them(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(40)))
    got, which = pause.probe_prompts({"prompts_path": str(f), "split": "seeded", "num_samples": 40, "holdout": 8})
    assert len(got) == 8 and which == "the run's 8 held-out prompts"
    got, which = pause.probe_prompts({"prompts_path": str(tmp_path / "gone.jsonl"), "num_samples": 40, "holdout": 8})
    assert got == pause.PROBE_PROMPTS and "could not be read" in which
    assert pause.probe_prompts(None) == (pause.PROBE_PROMPTS, "16 generic prompts")


def test_the_share_is_a_typed_config_field_the_window_record_carries() -> None:
    base = dict(kind="command", start_command=["s"], stop_command=["t"], health_url="http://h/health", pause="sleep")
    cfg = ProductionConfig(**base)
    assert (
        cfg.probe_share == 0.5
        and "share of what it should serve" in ProductionConfig.model_fields["probe_share"].description
    )
    with pytest.raises(ValueError):
        ProductionConfig(**base, probe_share=1.5)
    from eagleflow.production.service import settings_dict

    rec = settings_dict(ProductionConfig(**base, probe_share=0.7, probe_max_requests=16))
    assert (rec["probe_share"], rec["probe_max_requests"], rec["probe_holdout"]) == (0.7, 16, None)
