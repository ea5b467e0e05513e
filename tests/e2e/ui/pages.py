"""What the browser tests share: Debian's Chromium as Playwright drives it, and the steps a person takes on
Prefect's pages (a screenshot under test-output/ui/, a form field by its label, a run page's tab, a log
scrolled to its end). The browser and page fixtures are in this directory's conftest.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from tests.conftest import ROOT
from tests.e2e.conftest import api, wait_flow_run

CHROMIUM = "/usr/bin/chromium"
# A closed network: without these Chromium keeps trying Google's services (and is refused, many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ROOT / "test-output" / "ui"
RUN_TIMEOUT_S = 900  # a benchmark-only run is about a minute here; the worker starts a flow process first


def shot(page: Page, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def prop(page: Page, label: str):
    """One field of Prefect's schema form, by its label ("Epochs (Optional)")."""
    return (
        page.locator(".schema-form-property")
        .filter(
            has=page.locator(".schema-form-property__label", has_text=re.compile(rf"^{label}( \(Optional\))?$", re.I))
        )
        .last
    )


def submit(page: Page, attempts: int = 5) -> str:
    """Submit the custom-run form; the id of the flow run it created. A 503 is the Prefect server's own "busy, try
    again" (its SQLite database locked by a running flow's writes on 2 cores; seen once in make test): nothing was
    created, and the operator clicks Submit again, as this does after a pause."""
    for attempt in range(attempts):
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run") and r.request.method == "POST") as made:
            page.get_by_role("button", name="Submit").click()
        if made.value.status != 503 or attempt == attempts - 1:
            break
        time.sleep(2.0)
    assert made.value.status == 201, made.value.text()
    return made.value.json()["id"]


def wait_final(prefect_server: dict, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    return wait_flow_run(prefect_server, run_id, timeout_s)


def task_runs(prefect_server: dict, run_id: str) -> dict[str, dict]:
    """The flow run's task runs by task ("check-a1f" and "check" are both the check task)."""
    runs = api(prefect_server, "POST", "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}).json()
    return {re.sub(r"-[0-9a-f]{3}$", "", r["name"]): r for r in runs}


def artifact_of(prefect_server: dict, run_id: str, key: str) -> dict:
    arts = api(
        prefect_server,
        "POST",
        "/artifacts/filter",
        json={"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": [run_id]}}},
    ).json()
    assert arts, f"no artifact {key} of flow run {run_id}"
    return arts[0]


def open_run(page: Page, ui: dict, run_id: str, tab: str | None = None) -> None:
    """The flow run's page, on `tab` ("Task Runs", "Artifacts") as a person clicks it."""
    page.goto(f"{ui['base']}/runs/flow-run/{run_id}")
    page.locator(".state-badge").first.wait_for()
    if tab:
        page.locator(".p-tab", has_text=re.compile(rf"^{tab}$")).first.click()


def open_artifact_card(page: Page, ui: dict, run_id: str, has_text: str) -> str:
    """On the run's Artifacts tab, click the first artifact card showing `has_text`, as a person does; the
    artifact's text as the page shows it."""
    open_run(page, ui, run_id, "Artifacts")
    card = page.locator("a[href*='/artifacts/artifact/']", has_text=has_text).first
    card.wait_for()
    card.click()
    body = page.locator(".artifact-data-markdown")
    body.wait_for()
    return body.inner_text()


def scroll_logs_to_end(page: Page, until: str, timeout_s: float = 180) -> list[str]:
    """Scroll the log list to its end, as a person does (it loads 50 rows at a time), until a row
    matching the regex `until` is there (`timeout_s`: a safety cap); the rows' texts, in order."""
    page.locator(".log-row").first.wait_for()
    found = re.compile(until)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = page.locator(".log-row .log-row__content").all_inner_texts()
        if time.monotonic() > deadline:
            raise AssertionError(f"no log row matches {until!r} after scrolling; the last: {rows[-3:]}")
        try:
            page.locator(".log-row").last.scroll_into_view_if_needed(timeout=5_000)
        except PlaywrightError:
            # The list is virtual: it re-renders its rows as they load, and the last row seen may be gone
            # from the page by the time it is scrolled to. Ask again.
            page.wait_for_timeout(300)
            continue
        if any(found.search(r) for r in rows):
            return rows
        page.mouse.wheel(0, 5000)
        page.wait_for_timeout(300)
