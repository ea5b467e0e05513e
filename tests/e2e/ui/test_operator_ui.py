"""What the operator sees, seen the way they see it: the Prefect UI of the session's real server in a
real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright), the deployments registered
from this checkout and a process worker running what the UI triggers.

The scenarios of the people who use it: a custom run of the config's pipeline deployment from its form (typed
fields, the config's values as defaults, a changed value that reaches the run); a failed run whose
failed task shows the root cause at the end of its log and whose failure artifact holds the engine's
log; the benchmark deployment with a `drafter` that re-measures without any upstream stage (the nightly's
schedule and a night's promotion decision: test_nightly_ui.py). Each page is saved as a screenshot
under test-output/ui/ (a person can open them) and checked for the text it must show.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eagleflow.util import http
from tests.conftest import ROOT
from tests.e2e.conftest import api, deployed_worker, run_cli
from tests.e2e.ui.pages import artifact_of, open_run, prop, scroll_logs_to_end, shot, submit, task_runs, wait_final

pytestmark = pytest.mark.e2e

QUICK = {"benchmark.concurrencies": [1]}  # one concurrency: every run here is as short as it can be


@pytest.fixture(scope="module")
def ui(prefect_server, e2e_config, first_run, tmp_path_factory) -> Iterator[dict]:
    """The deployments for the e2e config and a worker on their pool; the UI's base address."""
    log = tmp_path_factory.mktemp("ui-worker") / "worker.log"
    with deployed_worker(prefect_server, e2e_config, "eagleflow-ui", log) as w:
        yield {"deployments": w["deployments"], "base": prefect_server["PREFECT_API_URL"].removesuffix("/api")}


def test_a_custom_run_of_the_pipeline_from_its_form(page, ui, prefect_server, first_run):
    dep = ui["deployments"]["pipeline"]
    page.goto(f"{ui['base']}/deployments/deployment/{dep['id']}/run")
    page.locator(".schema-form-property__label", has_text="Epochs").first.wait_for()
    # Typed fields with their descriptions, the config's values as their defaults.
    for text in (
        "Training epochs over the generated data (train.epochs).",
        "Prompts to answer, held-out ones included (generate.num_samples).",
        "Sampling temperatures the benchmark measures, 0 greedy (benchmark.temperatures).",
        "The GPU host to run on",
    ):
        assert page.get_by_text(text).count(), text
    assert prop(page, "Epochs").locator("input").first.input_value() == "4"
    assert prop(page, "Num Samples").locator("input").first.input_value() == "320"
    temps = prop(page, "Temperatures")
    assert [x.input_value() for x in temps.locator("input").all()] == ["0", "0.7"]
    shot(page, "1-pipeline-custom-run-form")
    # The operator drops temperature 0.7 and measures one concurrency only.
    temps.locator(".p-draggable-list__item").nth(1).locator(
        ".schema-form-property-array-item__control > button"
    ).first.click()
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


def test_a_failed_run_shows_its_root_cause_and_the_engine_log(
    page, ui, prefect_server, e2e_config, first_run, tmp_path
):
    # A target whose weights are cut in half: the engine dies while loading them.
    bad = tmp_path / "bad-target"
    shutil.copytree(ROOT / "demo" / "target", bad)
    shard = bad / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    # Triggered from a shell, as an operator does (eagleflow trigger): through the deployment and its worker.
    proc = run_cli(
        prefect_server,
        "trigger",
        "benchmark",
        str(e2e_config),
        "--drafter",
        first_run["drafter_dir"],
        "--set",
        "benchmark.concurrencies=[1]",
        "--set",
        f"target.model_path={bad}",
        "--wait",
        "--timeout",
        "900",
    )
    run = {"id": run_url(proc)[1]}
    done = wait_final(prefect_server, run["id"])
    assert done["state"]["type"] == "FAILED", done["state"]
    assert proc.returncode == 1 and "benchmark: Failed" in proc.stdout, proc.stdout[-3000:]
    # Three lines wherever a person reads the failure: what failed (stage, host), the root cause (the engine's
    # first traceback's last line), where the logs are (the failure artifact, the stage log on the host).
    error = proc.stdout[proc.stdout.rindex("error: the flow run ended Failed: ") :].strip().splitlines()
    assert len(error) == 4 and "benchmark failed on localhost" in error[0], error
    assert error[1].startswith("cause: ") and "root cause: safetensors" in error[1], error
    assert "artifact eagleflow-e2e-benchmark-failure" in error[2] and "stage.log" in error[2], error
    # then the page to open (issue 43: the cause was at the end of the run's Logs tab): the failure artifact itself
    art = artifact_of(prefect_server, run["id"], "eagleflow-e2e-benchmark-failure")
    assert error[3] == f"failure: {ui['base']}/artifacts/artifact/{art['id']}", error
    status = run_cli(prefect_server, "status", str(e2e_config), "--limit", "1").stdout.splitlines()
    assert status[1].split()[:3] == [done["name"], "benchmark", "Failed"], status[:5]
    assert status[2].startswith("    failed: StageFailed: benchmark failed") and status[3].startswith("    cause: "), (
        status[:5]
    )
    assert f"    {error[3]}" in status[:7], status[:7]
    # the run's log says the failure as lines (issue 43: Prefect's own line showed them with a literal \n between)
    logs = api(
        prefect_server,
        "POST",
        "/logs/filter",
        json={"logs": {"flow_run_id": {"any_": [run["id"]]}, "level": {"ge_": 40}}, "limit": 50},
    ).json()
    # (not "Finished in state Failed('...')": Prefect's repr of a state, which quotes whatever message it holds)
    said = [
        x["message"]
        for x in logs
        if "StageFailed: benchmark failed on localhost" in x["message"] and not x["message"].startswith("Finished in")
    ]
    assert said and all("\\n" not in m for m in said), said
    assert any(m.splitlines()[1].startswith("cause: ") for m in said if len(m.splitlines()) > 1), said
    failed = task_runs(prefect_server, run["id"])["benchmark"]
    assert failed["state"]["type"] == "FAILED"
    message = failed["state"]["message"]
    assert len(message.splitlines()) <= 3 and "#progress" not in message and "Traceback" not in message, message
    assert "root cause: safetensors" in message and "SafetensorError" in message
    assert len(done["state"]["message"].splitlines()) <= 3, done["state"]["message"]

    open_run(page, ui, run["id"], "Task Runs")
    shot(page, "3-failed-run-page")
    page.locator("a[href*='/runs/task-run/']", has_text="benchmark").first.click()
    rows = scroll_logs_to_end(page, r"Finished in state Failed")
    # The root cause near the end of the failed task's log, not pages above it.
    tail = "\n".join(rows[-3:])
    assert "root cause: safetensors" in tail and "SafetensorError" in tail, tail[-2000:]
    shot(page, "3-failed-task-log")

    page.goto(error[3].removeprefix("failure: "))  # the page trigger and status name
    body = page.locator(".artifact-data-markdown")
    body.wait_for()
    text = body.inner_text()
    assert "engine-baseline.log" in text and "SafetensorError" in text and "Benchmark failed on localhost" in text
    # the rest is here (its markdown, as the API gives it): the stage's own log, its progress as a person reads it
    # (never its JSON), and the engine's log with its traceback
    data = art["data"]
    assert "## stage.log" in data and "## engine-baseline.log" in data and "#progress" not in data, data[:3000]
    assert "Traceback (most recent call last)" in data and "stage.log" in text
    shot(page, "3-failure-artifact-engine-log")


def run_url(proc) -> tuple[str, str]:
    """The run page `eagleflow trigger` printed first, and the flow run's id."""
    m = re.match(
        r"flow run \S+ of benchmark/e2e-benchmark on pool eagleflow-ui: (http://\S+/runs/flow-run/(\S+))$",
        proc.stdout.splitlines()[0],
    )
    assert m, proc.stdout[:2000]
    return m.group(1), m.group(2)


def test_a_drafter_benchmarked_from_a_shell_through_the_deployment_then_its_verdict_in_status(
    ui, prefect_server, e2e_config, first_run
):
    proc = run_cli(
        prefect_server,
        "trigger",
        "benchmark",
        str(e2e_config),
        "--drafter",
        first_run["drafter_dir"],
        "--temperatures",
        "[0.0]",
        "--set",
        "benchmark.concurrencies=[1]",
        "--wait",
        "--timeout",
        "900",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    url, run_id = run_url(proc)
    # the UI serves the run's page (to a browser: the server answers 404 to a deep link not asking for HTML)
    assert http.get(url, headers={"Accept": "text/html"}, timeout=30).status_code == 200
    run = api(prefect_server, "GET", f"/flow_runs/{run_id}").json()
    assert run["deployment_id"] == ui["deployments"]["benchmark"]["id"] and run["state"]["type"] == "COMPLETED"
    params = run["parameters"]["params"]
    assert (params["drafter"], params["temperatures"], params["overrides"]) == (first_run["drafter_dir"], [0.0], QUICK)
    out = proc.stdout.splitlines()
    # followed: each stage task as it ran (the benchmark's minute at least) and ended, its progress, then the verdict
    assert any(x.endswith(" benchmark: Running") for x in out), out
    for stage in ("check", "benchmark", "report"):
        assert any(f" {stage}: Completed after " in x for x in out), (stage, out)
    assert any("progress benchmark: " in x for x in out), out
    # the whole verdict, as report.md says it: its line, every finding (issue 43: a slower setting was said nowhere
    # a shell user looks), then the report
    report = out[-1]
    assert report.startswith("report: ")
    written = json.loads(Path(report.removeprefix("report: ")).read_text())
    shown = out[out.index(f"verdict: {written['verdict']['summary']}") :]
    assert written["kind"] == "benchmark" and shown == [
        f"verdict: {written['verdict']['summary']}",
        *(f"  - {f}" for f in written["verdict"]["findings"]),
        report,
    ]
    assert (
        (Path(report.removeprefix("report: ")).parent / "report.md")
        .read_text()
        .startswith("# eagleflow benchmark-only run `e2e`")
    )
    # what the operator reads next: the run, its verdict and its report, under the config
    status = run_cli(prefect_server, "status", str(e2e_config), "--limit", "1").stdout.splitlines()
    assert status[0] == f"config e2e ({e2e_config})" and status[1].split()[:3] == [
        run["name"],
        "benchmark",
        "Completed",
    ]
    assert status[2 : 2 + len(shown)] == [f"    {x}" for x in shown]


def test_a_bad_field_or_a_config_never_deployed_is_refused_before_any_run(ui, prefect_server, e2e_config, tmp_path):
    proc = run_cli(prefect_server, "trigger", "benchmark", str(e2e_config), "--epochs", "3")
    assert proc.returncode == 2 and "has no field --epochs" in proc.stdout
    proc = run_cli(prefect_server, "trigger", "pipeline", str(e2e_config), "--epochs", "0")
    assert proc.returncode == 2 and "epochs" in proc.stdout
    other = tmp_path / "never.yaml"
    other.write_text(yaml.safe_dump({**yaml.safe_load(e2e_config.read_text()), "name": "never-deployed"}))
    proc = run_cli(prefect_server, "trigger", "pipeline", str(other))
    assert proc.returncode == 2 and "no deployment pipeline/never-deployed-pipeline" in proc.stdout
    assert f"eagleflow deploy {other}" in proc.stdout


def test_the_benchmark_deployment_measures_a_given_drafter_without_upstream_stages(page, ui, prefect_server, first_run):
    dep = ui["deployments"]["benchmark"]
    page.goto(f"{ui['base']}/deployments/deployment/{dep['id']}/run")
    drafter = prop(page, "Drafter")
    drafter.wait_for()
    assert page.get_by_text("Drafter to measure: a directory on the host").count()
    drafter.get_by_role("button", name="str", exact=True).click()
    drafter.locator("textarea, input").first.fill(first_run["drafter_dir"])
    prop(page, "Overrides").locator("textarea").first.fill('{"benchmark.concurrencies": [1]}')
    temps = prop(page, "Temperatures")
    temps.locator(".p-draggable-list__item").nth(1).locator(
        ".schema-form-property-array-item__control > button"
    ).first.click()
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
    arts = api(
        prefect_server,
        "POST",
        "/artifacts/filter",
        json={"artifacts": {"key": {"any_": ["eagleflow-e2e"]}}, "sort": "CREATED_DESC"},
    ).json()
    page.goto(f"{ui['base']}/artifacts/artifact/{arts[-1]['id']}")  # the first run's
    for name in ("acceptance", "speedup", "curves"):
        page.wait_for_function(
            "n => { const i = document.querySelector(`img[alt=${n}]`); "
            "return i && i.complete && i.naturalWidth > 300 }",
            arg=name,
        )
    shot(page, "5-report-artifact-plots")
