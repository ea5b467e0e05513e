"""The whole pipeline flow (flows.pipeline) under a real Prefect server, with real vLLM (CPU) and the
demo target.

Stages crossed: check -> generate (vLLM serves the target, reasoning parser on) -> extract
(transformers forward) -> train (the drafter this test trains itself) -> export (vLLM layout) ->
benchmark (vLLM with and without the drafter, acceptance from /metrics) -> report.
The tests in this module share one work root (the session's `first_run`, tests/e2e/conftest.py) and
run in order: a first run, a cached rerun, a rerun after a benchmark change and a deleted manifest,
then failures that must stop before work. The benchmark-only flow, the promotion gate and the
deployments read the same run: tests/e2e/flows/test_benchmark.py, tests/e2e/tasks/test_promotion.py,
tests/e2e/deployments/test_deploy.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import last_report, run_cli, run_flow

pytestmark = pytest.mark.e2e
UPSTREAM = ("generate", "extract", "train", "export")


def test_first_run_trains_a_drafter_that_vllm_accepts(first_run):
    r = first_run
    assert all(not r["stages"][s]["cached"] for s in (*UPSTREAM, "benchmark"))
    assert r["baseline"]["output_tok_s"] > 0 and r["drafter"]["output_tok_s"] > 0
    d = r["drafter"]
    assert d["num_drafts"] > 0  # vLLM really drafted with the exported drafter
    assert len(d["per_position_acceptance"]) == 3
    # An untrained drafter scores 1.0; this one was trained by this test for 4 epochs.
    assert d["mean_acceptance_length"] >= 1.8, d
    assert 0 < d["acceptance_rate"] <= 1
    assert r["speedup"] == pytest.approx(d["output_tok_s"] / r["baseline"]["output_tok_s"])
    # Every variant x temperature x concurrency, and a verdict that trusts the engine: a drafter trained
    # here serves at about its offline estimate.
    assert {(w["variant"], w["temperature"], w["concurrency"]) for w in r["windows"]} == {
        (v, t, c) for v in ("baseline", "drafter") for t in (0.0, 0.7) for c in (1, 4)
    }
    assert not r["verdict"]["integration_suspect"] and "agrees with the offline estimate" in r["verdict"]["summary"]


def test_report_artifact_is_on_the_server(first_run_watched, prefect_server):
    api = prefect_server["PREFECT_API_URL"]
    # the first run's own artifacts: later runs of the same config (other settings) publish under the same keys
    proc = first_run_watched["proc"]
    run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", proc.stdout + proc.stderr).group(1)

    def artifacts(key: str) -> list[dict]:
        query = {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": [run_id]}}}
        return httpx.post(f"{api}/artifacts/filter", json=query).json()

    arts = artifacts("eagleflow-e2e")
    assert arts and "mean acceptance length" in arts[0]["data"] and "**Verdict:**" in arts[0]["data"]
    bench = artifacts("eagleflow-e2e-benchmark")
    assert bench and "| drafter | 0.7 | 4 |" in bench[0]["data"]
    # The pictures ride inline: the UI has none of the host's files.
    for art, names in ((arts[0], ("acceptance", "speedup", "curves")), (bench[0], ("acceptance", "speedup"))):
        for name in names:
            assert f"![{name}](data:image/png;base64,iVBORw0KGgo" in art["data"], name


def test_report_md_shows_the_plots_beside_report_json(first_run):
    report_dir = Path(first_run["path"]).parent
    md = (report_dir / "report.md").read_text()
    for name in ("acceptance", "speedup", "curves"):
        assert f"![{name}]({name}.png)" in md
        png = (report_dir / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, name
    # Drawn on the host, beside the figures: the stage dirs hold them too.
    assert Path(first_run["plots"]["curves"]).parent == Path(first_run["stages"]["train"]["manifest"]).parent
    assert Path(first_run["plots"]["speedup"]).parent == Path(first_run["stages"]["benchmark"]["manifest"]).parent


def _report_shape(out: str) -> list[str]:
    """The printed report's tables up to the verdict, each line's label only (the figures differ per run)."""
    lines = out[out.rindex("eagleflow pipeline run ") :].split("verdict:")[0].splitlines()
    return [re.split(r"\s{2,}", line.strip())[0] for line in lines if line.strip()]


def test_second_run_takes_every_stage_before_the_benchmark_from_cache(first_run_watched, prefect_server, e2e_config):
    # Through the operator's command line (the control environment's console script), not python -m.
    proc = run_cli(prefect_server, "run", str(e2e_config))
    assert proc.returncode == 0
    first = first_run_watched["proc"]
    # The same report (the flow logs it: Prefect's console handler writes to stderr)
    assert _report_shape(proc.stdout + proc.stderr) == _report_shape(first.stdout + first.stderr)
    first_run = first_run_watched["report"]
    r = last_report(proc)
    assert {s: r["stages"][s]["cached"] for s in UPSTREAM} == dict.fromkeys(UPSTREAM, True)
    assert not r["stages"]["benchmark"]["cached"]
    assert {s: r["stages"][s]["key"] for s in UPSTREAM} == {s: first_run["stages"][s]["key"] for s in UPSTREAM}


def test_benchmark_change_and_a_vanished_manifest(first_run, prefect_server, e2e_config):
    # The export manifest disappears from the host: its cached record must not be trusted. The benchmark change is
    # the drafter's alone (k): no speculation's windows do not depend on it, and are reused, not measured again.
    Path(first_run["stages"]["export"]["manifest"]).unlink()
    proc = run_flow(prefect_server, str(e2e_config), "--set", "benchmark.num_speculative_tokens=2")
    assert proc.returncode == 0
    r = last_report(proc)
    assert {s: r["stages"][s]["cached"] for s in UPSTREAM} == {
        "generate": True,
        "extract": True,
        "train": True,
        "export": False,
    }
    assert r["stages"]["export"]["key"] == first_run["stages"]["export"]["key"]
    assert r["stages"]["benchmark"]["key"] != first_run["stages"]["benchmark"]["key"]
    assert r["benchmark_settings"]["num_speculative_tokens"] == 2
    assert r["baseline"]["measured"] is not None and r["baseline"]["measured"].startswith("measured"), r["baseline"]
    assert r["drafter"]["measured"] is None and r["drafter"]["num_drafts"] > 0


def test_bad_config_fails_before_any_work(prefect_server, e2e_config):
    proc = run_flow(prefect_server, str(e2e_config), "--set", "generate.holdout=100000")
    assert proc.returncode == 2 and "generate" in proc.stdout and "holdout" in proc.stdout
    proc = run_cli(prefect_server, "run", str(e2e_config), "--set", "train.epochs=0")
    assert proc.returncode == 2 and "train" in proc.stdout and "epochs" in proc.stdout


def test_status_lists_the_runs_their_stages_and_where_each_stage_dir_is(first_run, prefect_server, e2e_config):
    proc = run_cli(prefect_server, "status", str(e2e_config), "--limit", "50")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "pipeline  Completed" in out and f"config e2e ({e2e_config})" in out
    # what the run concluded, under its line: the verdict and where the report is
    assert f"report: {first_run['path']}" in out and f"verdict: {first_run['verdict']['summary']}" in out
    for stage in UPSTREAM:
        d = str(Path(first_run["stages"][stage]["manifest"]).parent)
        assert f"localhost:{d} (ran)" in out, stage  # the first run's record of where it ran
        assert "finished in" in out and d in out.split("stages of e2e on localhost")[1], stage


def test_missing_model_path_fails_in_the_check_naming_the_field(prefect_server, e2e_config, e2e_workdir):
    before = set((e2e_workdir / "runs").glob("*/*"))
    proc = run_flow(
        prefect_server, str(e2e_config), "--set", "target.model_path=/nonexistent/target", "--set", "name=e2e-missing"
    )
    assert proc.returncode == 1
    assert "target.model_path" in proc.stdout and "/nonexistent/target" in proc.stdout
    created = {
        p for p in set((e2e_workdir / "runs").glob("*/*")) - before if p.parent.name not in ("check", ".eagleflow")
    }  # .eagleflow: the host lease's own
    assert created == set()  # no stage started
    # The CLI's error in three lines at most: what failed, the finding, where the logs are; no progress JSON.
    error = proc.stdout[proc.stdout.index("error: ") :].strip().splitlines()
    assert len(error) <= 3 and error[1].startswith("cause: the run config does not fit this host: target.model_path"), (
        error
    )
    assert "#progress" not in proc.stdout[proc.stdout.index("error: ") :]
    # `eagleflow status` gives the failed run's three lines under the run's line
    lines = run_cli(prefect_server, "status", str(e2e_config), "--limit", "1").stdout.splitlines()
    assert "Failed" in lines[1] and lines[2].startswith("    failed: StageFailed: check failed on localhost"), lines[:5]
    assert (
        lines[3].startswith("    cause: the run config does not fit this host") and "target.model_path" in lines[3]
    ), lines[:5]
