"""The nightly decides on evidence (issue 44): the suite's nightly (`nightly_runs`, tests/e2e/conftest.py: the
config's nightly deployment run by a process worker, real vLLM (CPU), the demo target, production taking what is
promoted) on a prompt source that grows between nights, one night's file written as a user writes their own prompts
({"prompt": "..."} lines).

- Night 1 is not promoted (its gate's acceptance floor set out of reach, so the refusal is certain): production
  goes back to the drafter it served before.
- Night 2, with new prompts appended and no promoted drafter to continue, is a full run on the whole pool (night 1's
  batch and its own, every sequence), not tonight's batch and a replay sample; its holdout AL is within noise of
  night 1's; the report says what it trained on and how many sequences it saw, and which interval decided.
- A last night, with nothing appended, says "nothing new" in the flow run's state message and in `eagleflow status`,
  and leaves production up.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import NIGHT_FLOORS, NIGHT_PROMPTS, NIGHTLY_NAME, run_cli

pytestmark = pytest.mark.e2e


def test_a_night_without_a_drafter_to_continue_trains_on_the_whole_pool(nightly_runs, nightly_production):
    # the record of nights on the host: the report's rows, then each night's decision (written after its report)
    rows = json.loads((nightly_runs["work"] / "runs" / "nightly" / NIGHTLY_NAME / "nights.json").read_text())
    report = nightly_runs["nights"][-1]["report"]
    assert [n["train_sequences"] for n in report["nights"]] == [n["train_sequences"] for n in rows]
    assert [n["night"] for n in rows] == list(range(1, len(NIGHT_PROMPTS) + 1))
    first, second = rows[:2]
    assert first["promoted"] is False and f"gate's floor {NIGHT_FLOORS[0]:.2f}" in first["decided_by"], first
    # production went back to what it served before (the adopted drafter 0), from night 1's (drafter 1)
    shown = subprocess.run(
        [str(ROOT / ".hostenv" / "bin" / "python"), "-m", "eagleflow.production.served", "show"]
        + [str(nightly_production["served_dir"])],
        capture_output=True,
        text=True,
        check=True,
    )
    events = json.loads(shown.stdout)["events"]
    assert any(e["action"] == "rollback" and e["seq"] == 0 and e["from"] == 1 for e in events), events
    assert second["warm_start"] is None and second["trained_on"] == "the whole pool"
    ledger = json.loads((nightly_runs["work"] / "runs" / "nightly" / NIGHTLY_NAME / "ledger.json").read_text())
    assert [len(b["prompts"]) for b in ledger["batches"]][:2] == [NIGHT_PROMPTS[0] - 12, NIGHT_PROMPTS[1]]
    # every train sequence of the pool (the holdout excepted): night 1's all and its own (less any too short),
    # where tonight's batch and a replay sample (nightly.replay 1.0) would have been twice its own
    new_tonight = second["train_sequences"] - first["train_sequences"]
    assert NIGHT_PROMPTS[1] - 10 <= new_tonight <= NIGHT_PROMPTS[1], (first, second)
    assert second["replay_sequences"] == first["train_sequences"], (first, second)
    assert second["train_sequences"] > 2 * NIGHT_PROMPTS[1], (first, second)
    # within noise of the first night on the same held-out prompts
    assert second["holdout_al"] >= first["holdout_al"] - 0.15, (first, second)
    assert second["decided_by"], second
    print(
        "nights:",
        [
            (n["night"], n["trained_on"], n["train_sequences"], n["holdout_al"], n["promoted"], n["decided_by"])
            for n in rows
        ],
    )


def test_a_night_with_nothing_new_says_so_in_its_state_and_in_status(nightly_runs, nightly_production, prefect_server):
    last = nightly_runs["nothing_new"]
    assert last["state"]["type"] == "COMPLETED"
    assert "nothing new tonight" in (last["state"]["message"] or ""), last["state"]
    # nothing trained, measured or recorded, and production never went down
    rows = json.loads((nightly_runs["work"] / "runs" / "nightly" / NIGHTLY_NAME / "nights.json").read_text())
    assert len(rows) == len(NIGHT_PROMPTS)
    assert not [s for s in nightly_production["health"].down_spells() if last["began"] <= s[0] <= last["ended"]]
    status = run_cli(prefect_server, "status", str(nightly_runs["config"]), "--limit", "1")
    assert status.returncode == 0, status.stdout[-2000:]
    assert f"(flow run {last['id']})" in status.stdout, status.stdout[-3000:]
    assert re.search(r"Completed.*\n\s+nothing new tonight", status.stdout), status.stdout[-3000:]
