"""The canary's rule: a deployed drafter stays only if production serves it at the bar."""

from eagleflow.nightly.promotion import PromotionGate, judge_canary, judge_restored

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


def test_a_restored_drafter_is_held_to_its_own_earlier_canary_not_the_gates_floor():
    # Rolled back to a weak drafter production had served at AL 1.2: the gate's floor (1.5) is for new drafters; the
    # restore holds while it serves what it did (a GPU host's nightly failed here: "it too serves below the bar").
    earlier = fig(1.2, 100.0)
    assert judge_restored(fig(1.19, 98.0), earlier, 0.1) == []
    reasons = judge_restored(fig(1.0, 60.0), earlier, 0.1)
    assert len(reasons) == 1 and "1.00 < the last good drafter's 1.20" in reasons[0]
    # the same drafter at its own acceptance, slower because the host is busier now: the restore holds (a restore
    # failed so in the suite: AL 2.70 both times, 118 then 43 output tok/s)
    assert judge_restored(fig(2.70, 43.1), fig(2.70, 117.7), 0.35) == []
    assert judge_canary(fig(2.70, 43.1), fig(2.70, 117.7), GATE, 0.35) != []  # a new drafter's canary still weighs it
    # an adopted drafter never measured: its canary now is its first figure, whatever it reads; failures still count
    assert judge_restored(fig(1.0, 60.0), None, 0.1) == []
    assert "2 of 16 canary requests failed" in judge_restored(fig(1.0, 60.0, errors=2), None, 0.1)[0]
