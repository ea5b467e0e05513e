"""What the operator sees, seen the way they see it: the Prefect UI of the session's real server in a
real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright), the deployments registered
from this checkout and a process worker running what the UI triggers.

The four scenarios of the people who use it: a custom run of eagleflow-pipeline from its form (typed
fields, the config's values as defaults, a changed value that reaches the run); the nightly retrain's
schedule and a promotion decision on its run page; a failed run whose failed task shows the root
cause at the end of its log and whose failure artifact holds the engine's log; eagleflow-benchmark
with a `drafter` that re-measures without any upstream stage. Each page is saved as a screenshot
under test-output/ui/ (a person can open them) and checked for the text it must show.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import ROOT
from tests.e2e.conftest import api, deployed_worker, wait_flow_run

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
# A closed network: without these Chromium keeps trying Google's services (and is refused, many at a time).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-output" / "ui"
RUN_TIMEOUT_S = 900  # a benchmark-only run is about a minute here; the worker starts a flow process first
QUICK = {"benchmark.concurrencies": [1]}  # one concurrency: every run here is as short as it can be


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make browser` installs it"
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    # Tall: Prefect's pages scroll inside a container of their own, which a full-page screenshot does not
    # unroll, so what a screenshot should show must fit the window.
    ctx = browser.new_context(viewport={"width": 1400, "height": 2400})
    ctx.set_default_timeout(30_000)
    pg = ctx.new_page()
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def ui(prefect_server, e2e_config, first_run, tmp_path_factory) -> Iterator[dict]:
    """The deployments for the e2e config and a worker on their pool; the UI's base address."""
    log = tmp_path_factory.mktemp("ui-worker") / "worker.log"
    with deployed_worker(prefect_server, e2e_config, "eagleflow-ui", log) as w:
        yield {"deployments": w["deployments"], "base": prefect_server["PREFECT_API_URL"].removesuffix("/api")}


def shot(page: Page, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def prop(page: Page, label: str):
    """One field of Prefect's schema form, by its label ("Epochs (Optional)")."""
    return page.locator(".schema-form-property").filter(has=page.locator(
        ".schema-form-property__label", has_text=re.compile(rf"^{label}( \(Optional\))?$", re.I))).last


def submit(page: Page) -> str:
    """Submit the custom-run form; the id of the flow run it created."""
    with page.expect_response(lambda r: r.url.endswith("/create_flow_run") and r.request.method == "POST") as created:
        page.get_by_role("button", name="Submit").click()
    assert created.value.status == 201, created.value.text()
    return created.value.json()["id"]


def wait_final(prefect_server: dict, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    return wait_flow_run(prefect_server, run_id, timeout_s)


def task_runs(prefect_server: dict, run_id: str) -> dict[str, dict]:
    """The flow run's task runs by task ("check-a1f" and "check" are both the check task)."""
    runs = api(prefect_server, "POST", "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}).json()
    return {re.sub(r"-[0-9a-f]{3}$", "", r["name"]): r for r in runs}


def artifact_of(prefect_server: dict, run_id: str, key: str) -> dict:
    arts = api(prefect_server, "POST", "/artifacts/filter",
               json={"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": [run_id]}}}).json()
    assert arts, f"no artifact {key} of flow run {run_id}"
    return arts[0]


def open_run(page: Page, ui: dict, run_id: str, tab: str | None = None) -> None:
    """The flow run's page, on `tab` ("Task Runs", "Artifacts") as a person clicks it."""
    page.goto(f"{ui['base']}/runs/flow-run/{run_id}")
    page.locator(".state-badge").first.wait_for()
    if tab:
        page.locator(".p-tab", has_text=re.compile(rf"^{tab}$")).first.click()


def scroll_logs_to_end(page: Page, until: str, timeout_s: float = 60) -> list[str]:
    """Scroll the log list to its end, as a person does (it loads 50 rows at a time), until a row
    matching the regex `until` is there; the rows' texts, in order."""
    page.locator(".log-row").first.wait_for()
    found = re.compile(until)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = page.locator(".log-row .log-row__content").all_inner_texts()
        if any(found.search(r) for r in rows):
            page.locator(".log-row").last.scroll_into_view_if_needed()
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"no log row matches {until!r} after scrolling; the last: {rows[-3:]}")
        page.locator(".log-row").last.scroll_into_view_if_needed()
        page.mouse.wheel(0, 5000)
        page.wait_for_timeout(300)


def test_a_custom_run_of_the_pipeline_from_its_form(page, ui, prefect_server, first_run):
    dep = ui["deployments"]["eagleflow-pipeline"]
    page.goto(f"{ui['base']}/deployments/deployment/{dep['id']}/run")
    page.locator(".schema-form-property__label", has_text="Epochs").first.wait_for()
    # Typed fields with their descriptions, the config's values as their defaults.
    for text in ("Training epochs over the generated data (train.epochs).",
                 "Prompts to answer, held-out ones included (generate.num_samples).",
                 "Sampling temperatures the benchmark measures, 0 greedy (benchmark.temperatures).",
                 "The GPU host to run on"):
        assert page.get_by_text(text).count(), text
    assert prop(page, "Epochs").locator("input").first.input_value() == "4"
    assert prop(page, "Num Samples").locator("input").first.input_value() == "320"
    temps = prop(page, "Temperatures")
    assert [x.input_value() for x in temps.locator("input").all()] == ["0", "0.7"]
    shot(page, "1-pipeline-custom-run-form")
    # The operator drops temperature 0.7 and measures one concurrency only.
    temps.locator(".p-draggable-list__item").nth(1).locator(".schema-form-property-array-item__control > button").first.click()
    prop(page, "Overrides").locator("textarea").first.fill('{"benchmark.concurrencies": [1]}')
    shot(page, "1-pipeline-custom-run-form-changed")
    run_id = submit(page)

    run = wait_final(prefect_server, run_id)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    params = run["parameters"]["params"]
    assert params["temperatures"] == [0] and params["epochs"] == 4 and params["overrides"] == QUICK
    # The value reached the run: the benchmark measured temperature 0 alone, at concurrency 1.
    bench = artifact_of(prefect_server, run_id, "eagleflow-e2e-benchmark")["data"]
    assert "| drafter | 0 | 1 |" in bench and "| 0.7 |" not in bench and "| drafter | 0 | 4 |" not in bench
    open_run(page, ui, run_id, "Task Runs")
    for stage in ("generate", "extract", "train", "export", "benchmark"):
        page.locator("a[href*='/runs/task-run/']", has_text=stage).first.wait_for()
    assert page.locator(".state-badge").first.inner_text().strip() == "Completed"
    shot(page, "1-pipeline-run-page")


def test_the_nightly_schedule_and_a_promotion_decision_on_its_run_page(page, ui, prefect_server, nightly_runs):
    dep = ui["deployments"]["eagleflow-nightly"]
    page.goto(f"{ui['base']}/deployments/deployment/{dep['id']}")
    schedule = page.locator(".deployment-schedule-card__content")
    schedule.wait_for()
    assert "At 02:00 AM every day" in schedule.inner_text()
    shot(page, "2-nightly-deployment-schedule")

    # The third night of the session's nightly (tests/e2e/flows/test_nightly.py), as the operator opens it.
    run = {"id": nightly_runs["nights"][-1]["id"]}
    decision = artifact_of(prefect_server, run["id"], "eagleflow-nightly-e2e-promotion")
    heading = decision["data"].splitlines()[0]
    # The decision the gate took, as the record of nights on the host keeps it.
    nights = json.loads((nightly_runs["work"] / "runs" / "nightly" / "nightly-e2e" / "nights.json").read_text())
    assert heading.startswith("# Promoted:" if nights[-1]["promoted"] else "# Not promoted"), (heading, nights[-1])
    report = artifact_of(prefect_server, run["id"], "eagleflow-nightly-e2e")["data"]
    assert "AL by night" in report and "![al-by-night](data:image/png;base64," in report

    open_run(page, ui, run["id"])  # the Logs tab: the decision is a line of the promote task, near the end
    scroll_logs_to_end(page, r"^(promoted /|not promoted: )")
    shot(page, "2-nightly-run-logs")
    open_run(page, ui, run["id"], "Artifacts")
    card = page.locator("a[href*='/artifacts/artifact/']", has_text="promotion").first
    card.wait_for()
    card.click()
    body = page.locator(".artifact-data-markdown")
    body.wait_for()
    assert heading.lstrip("# ") in body.inner_text() and "the bars: speedup >=" in body.inner_text()
    shot(page, "2-nightly-promotion-decision")


def test_a_failed_run_shows_its_root_cause_and_the_engine_log(page, ui, prefect_server, e2e_config, first_run,
                                                               tmp_path):
    # A target whose weights are cut in half: the engine dies while loading them.
    bad = tmp_path / "bad-target"
    shutil.copytree(ROOT / "demo" / "target", bad)
    shard = bad / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    dep = ui["deployments"]["eagleflow-benchmark"]
    run = api(prefect_server, "POST", f"/deployments/{dep['id']}/create_flow_run", json={"parameters": {"params": {
        "config_path": str(e2e_config), "drafter": first_run["drafter_dir"],
        "overrides": {**QUICK, "target.model_path": str(bad)}}}}).json()
    done = wait_final(prefect_server, run["id"])
    assert done["state"]["type"] == "FAILED", done["state"]
    failed = task_runs(prefect_server, run["id"])["benchmark"]
    assert failed["state"]["type"] == "FAILED"
    assert "root cause: safetensors" in failed["state"]["message"] and "SafetensorError" in failed["state"]["message"]

    open_run(page, ui, run["id"], "Task Runs")
    shot(page, "3-failed-run-page")
    page.locator("a[href*='/runs/task-run/']", has_text="benchmark").first.click()
    rows = scroll_logs_to_end(page, r"Finished in state Failed")
    # The root cause near the end of the failed task's log, not pages above it.
    tail = "\n".join(rows[-3:])
    assert "root cause: safetensors" in tail and "SafetensorError" in tail, tail[-2000:]
    shot(page, "3-failed-task-log")

    art = artifact_of(prefect_server, run["id"], "eagleflow-e2e-benchmark-failure")
    page.goto(f"{ui['base']}/artifacts/artifact/{art['id']}")
    body = page.locator(".artifact-data-markdown")
    body.wait_for()
    text = body.inner_text()
    assert "engine-baseline.log" in text and "SafetensorError" in text and "Benchmark failed on localhost" in text
    shot(page, "3-failure-artifact-engine-log")


def test_the_benchmark_deployment_measures_a_given_drafter_without_upstream_stages(page, ui, prefect_server,
                                                                                  first_run):
    dep = ui["deployments"]["eagleflow-benchmark"]
    page.goto(f"{ui['base']}/deployments/deployment/{dep['id']}/run")
    drafter = prop(page, "Drafter")
    drafter.wait_for()
    assert page.get_by_text("Drafter to measure: a directory on the host").count()
    drafter.get_by_role("button", name="str", exact=True).click()
    drafter.locator("textarea, input").first.fill(first_run["drafter_dir"])
    prop(page, "Overrides").locator("textarea").first.fill('{"benchmark.concurrencies": [1]}')
    temps = prop(page, "Temperatures")
    temps.locator(".p-draggable-list__item").nth(1).locator(".schema-form-property-array-item__control > button").first.click()
    shot(page, "4-benchmark-custom-run-form")
    run_id = submit(page)

    run = wait_final(prefect_server, run_id)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"]["params"]["drafter"] == first_run["drafter_dir"]
    assert set(task_runs(prefect_server, run_id)) == {"check", "benchmark", "report"}  # nothing upstream
    bench = artifact_of(prefect_server, run_id, "eagleflow-e2e-benchmark")["data"]
    assert "| drafter | 0 | 1 |" in bench
    open_run(page, ui, run_id, "Task Runs")
    page.locator("a[href*='/runs/task-run/']", has_text="benchmark").first.wait_for()
    links = " ".join(a.inner_text() for a in page.locator("a[href*='/runs/task-run/']").all())
    assert "benchmark" in links and not any(s in links for s in ("generate", "extract", "train", "export"))
    shot(page, "4-benchmark-run-page")


def test_the_report_artifact_shows_its_plots(page, ui, prefect_server, first_run):
    arts = api(prefect_server, "POST", "/artifacts/filter", json={"artifacts": {"key": {"any_": ["eagleflow-e2e"]}},
                                                                  "sort": "CREATED_DESC"}).json()
    page.goto(f"{ui['base']}/artifacts/artifact/{arts[-1]['id']}")  # the first run's
    for name in ("acceptance", "speedup", "curves"):
        page.wait_for_function(
            "n => { const i = document.querySelector(`img[alt=${n}]`); return i && i.complete && i.naturalWidth > 300 }",
            arg=name)
    shot(page, "5-report-artifact-plots")
