"""The canary's rule: a deployed drafter stays only if production serves it at the bar."""

from eagleflow.nightly.promotion import PromotionGate, judge_canary

GATE = PromotionGate(min_acceptance_length=1.5)


def fig(al: float, tok_s: float, errors: int = 0) -> dict:
    return {"mean_acceptance_length": al, "output_tok_s": tok_s, "requests": 16, "errors": errors}


def test_acceptance_zero_after_a_wake_is_caught():
    reasons = judge_canary(fig(1.0, 50.0), None, GATE, 0.1)
    assert len(reasons) == 1 and "not in use" in reasons[0]


def test_against_the_last_good_drafter_within_the_tolerance():
    prev = fig(2.5, 100.0)
    assert judge_canary(fig(2.3, 91.0), prev, GATE, 0.1) == []
    reasons = judge_canary(fig(2.2, 85.0), prev, GATE, 0.1)
    assert len(reasons) == 2 and "2.20 < the last good drafter's 2.50" in reasons[0] and "85.0" in reasons[1]


def test_failed_requests_fail_the_canary():
    assert "2 of 16 canary requests failed" in judge_canary(fig(2.5, 100.0, errors=2), None, GATE, 0.1)[0]
