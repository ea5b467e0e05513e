"""The nightly retrain as the operator sees it in the Prefect UI (Debian's Chromium, Playwright): the
nightly deployment's schedule (the demo config's: paused, so a worker left running starts no retrain), and the last
night of the suite's nightly that trained (its third:
`nightly_runs`, tests/e2e/conftest.py; tests/e2e/flows/test_nightly.py) with its promotion decision in the
run's log and artifacts, the very decision the gate took, its report with AL by night, and production's drafter
history (what production serves since that night's deploy)."""

from __future__ import annotations

import json

import pytest

from flows.params import deployment_name
from tests.e2e.conftest import api
from tests.e2e.ui.pages import artifact_of, open_artifact_card, open_run, scroll_logs_to_end, shot

pytestmark = pytest.mark.e2e


def test_the_nightly_schedule_and_a_promotion_decision_on_its_run_page(page, prefect_server, nightly_runs):
    base = prefect_server["PREFECT_API_URL"].removesuffix("/api")
    deps = api(
        prefect_server,
        "POST",
        "/deployments/filter",
        json={"deployments": {"name": {"any_": [deployment_name("nightly-e2e", "nightly")]}}},
    ).json()
    assert [s["active"] for s in deps[0]["schedules"]] == [False]  # demo.yaml's schedule: active false
    page.goto(f"{base}/deployments/deployment/{deps[0]['id']}")
    schedule = page.locator(".deployment-schedule-card__content")
    schedule.wait_for()
    assert "At 02:00 AM every day" in schedule.inner_text()
    # The card's pause/resume switch: shown, and off (Prefect's toggle marks an active one --checked).
    toggle = page.locator(".deployment-schedule-card .p-toggle__control").first
    toggle.wait_for(state="attached")  # the switch's control may be drawn over a hidden input
    assert "p-toggle__control--checked" not in (toggle.get_attribute("class") or "")
    shot(page, "2-nightly-deployment-schedule")

    run_id = nightly_runs["nights"][-1]["id"]
    decision = artifact_of(prefect_server, run_id, "eagleflow-nightly-e2e-promotion")
    heading = decision["data"].splitlines()[0]
    # The decision the gate took, as the record of nights on the host keeps it.
    nights = json.loads((nightly_runs["work"] / "runs" / "nightly" / "nightly-e2e" / "nights.json").read_text())
    assert heading.startswith("# Promoted:" if nights[-1]["promoted"] else "# Not promoted"), (heading, nights[-1])
    report = artifact_of(prefect_server, run_id, "eagleflow-nightly-e2e")["data"]
    assert "AL by night" in report and "![al-by-night](data:image/png;base64," in report

    ui = {"base": base}
    open_run(page, ui, run_id)  # the Logs tab: the decision is a line of the promote task, near the end
    scroll_logs_to_end(page, r"^(promoted /|not promoted: )")
    shot(page, "2-nightly-run-logs")
    text = open_artifact_card(page, ui, run_id, "promotion")
    assert heading.lstrip("# ") in text and "the bars: speedup >=" in text
    shot(page, "2-nightly-promotion-decision")

    # What production serves, and its history: the deploys of the nights (production.promote: serve).
    history = artifact_of(prefect_server, run_id, "eagleflow-nightly-e2e-deployed")["data"]
    assert history.startswith("# Deployed: production serves" if nights[-1]["promoted"] else "# Rolled back"), history
    text = open_artifact_card(page, ui, run_id, "deployed")
    assert "Production serves drafter" in text and "measured good on production" in text and "adopted" in text, text[
        :2000
    ]
    shot(page, "2-nightly-deployed-history")
