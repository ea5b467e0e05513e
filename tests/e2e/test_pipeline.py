"""The whole pipeline under a real Prefect server, with real vLLM (CPU) and the demo target.

Stages crossed: check -> generate (vLLM serves the target, reasoning parser on) -> extract
(transformers forward) -> train (the drafter this test trains itself) -> export (vLLM layout) ->
benchmark (vLLM with and without the drafter, acceptance from /metrics) -> report.
The tests in this module share one work root and run in order: a first run, a cached rerun, a
rerun after a benchmark change and a deleted manifest, then failures that must stop before work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.e2e
UPSTREAM = ("generate", "extract", "train", "export")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def config_path(workdir: Path) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = "e2e"
    data["host"].update(work_root=str(workdir / "runs"), python=str(ROOT / ".hostenv" / "bin" / "python"))
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["generate"].update(prompts_path=str(ROOT / "demo" / "prompts.jsonl"), num_samples=320, holdout=12,
                            shard_size=160)
    data["engine"]["port"] = free_port()
    data["train"].update(epochs=4, time_budget_s=150)
    data["benchmark"].update(num_prompts=6, max_tokens=64, warmup_requests=1)
    data["report_dir"] = str(workdir / "reports")
    path = workdir / "e2e.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_flow(prefect_server: dict, *args: str, module: str = "flows.pipeline") -> subprocess.CompletedProcess:
    env = {**os.environ, **prefect_server}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    print(proc.stdout[-6000:], proc.stderr[-6000:])
    return proc


def last_report(proc: subprocess.CompletedProcess) -> dict:
    line = [x for x in proc.stdout.splitlines() if x.startswith("report: ")][-1]
    return json.loads(Path(line.split("report: ", 1)[1]).read_text())


@pytest.fixture(scope="module")
def first_run(prefect_server, config_path) -> dict:
    proc = run_flow(prefect_server, str(config_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return last_report(proc)


def test_first_run_trains_a_drafter_that_vllm_accepts(first_run):
    r = first_run
    assert all(not r["stages"][s]["cached"] for s in (*UPSTREAM, "benchmark"))
    assert r["baseline"]["output_tok_s"] > 0 and r["drafter"]["output_tok_s"] > 0
    d = r["drafter"]
    assert d["num_drafts"] > 0  # vLLM really drafted with the exported drafter
    assert len(d["per_position_acceptance"]) == 3
    # An untrained drafter scores 1.0; this one was trained by this test for at most 150 s.
    assert d["mean_acceptance_length"] >= 1.8, d
    assert 0 < d["acceptance_rate"] <= 1
    assert r["speedup"] == pytest.approx(d["output_tok_s"] / r["baseline"]["output_tok_s"])
    # Every variant x temperature x concurrency, and a verdict that trusts the engine: a drafter trained
    # here serves at about its offline estimate.
    assert {(w["variant"], w["temperature"], w["concurrency"]) for w in r["windows"]} == {
        (v, t, c) for v in ("baseline", "drafter") for t in (0.0, 0.7) for c in (1, 4)}
    assert not r["verdict"]["integration_suspect"] and "agrees with the offline estimate" in r["verdict"]["summary"]


def test_report_artifact_is_on_the_server(first_run, prefect_server):
    api = prefect_server["PREFECT_API_URL"]
    arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"key": {"any_": ["eagleflow-e2e"]}}}).json()
    assert arts and "mean acceptance length" in arts[0]["data"] and "**Verdict:**" in arts[0]["data"]
    bench = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"key": {"any_": ["eagleflow-e2e-benchmark"]}}}).json()
    assert bench and "| drafter | 0.7 | 4 |" in bench[0]["data"]


def test_second_run_takes_every_stage_before_the_benchmark_from_cache(first_run, prefect_server, config_path):
    proc = run_flow(prefect_server, str(config_path))
    assert proc.returncode == 0
    r = last_report(proc)
    assert {s: r["stages"][s]["cached"] for s in UPSTREAM} == dict.fromkeys(UPSTREAM, True)
    assert not r["stages"]["benchmark"]["cached"]
    assert {s: r["stages"][s]["key"] for s in UPSTREAM} == {s: first_run["stages"][s]["key"] for s in UPSTREAM}


def test_benchmark_change_and_a_vanished_manifest(first_run, prefect_server, config_path):
    # The export manifest disappears from the host: its cached record must not be trusted.
    Path(first_run["stages"]["export"]["manifest"]).unlink()
    proc = run_flow(prefect_server, str(config_path), "--set", "benchmark.max_tokens=32")
    assert proc.returncode == 0
    r = last_report(proc)
    assert {s: r["stages"][s]["cached"] for s in UPSTREAM} == {
        "generate": True, "extract": True, "train": True, "export": False}
    assert r["stages"]["export"]["key"] == first_run["stages"]["export"]["key"]
    assert r["stages"]["benchmark"]["key"] != first_run["stages"]["benchmark"]["key"]
    assert r["benchmark_settings"]["max_tokens"] == 32


def test_benchmark_only_flow(first_run, prefect_server, config_path):
    proc = run_flow(prefect_server, str(config_path), module="flows.benchmark")
    assert proc.returncode == 0
    assert last_report(proc)["drafter"]["num_drafts"] > 0


def test_bad_config_fails_before_any_work(prefect_server, config_path, workdir):
    proc = run_flow(prefect_server, str(config_path), "--set", "generate.holdout=100000")
    assert proc.returncode == 2 and "generate" in proc.stdout and "holdout" in proc.stdout


def test_missing_model_path_fails_in_the_check_naming_the_field(prefect_server, config_path, workdir):
    before = set((workdir / "runs").glob("*/*"))
    proc = run_flow(prefect_server, str(config_path), "--set", "target.model_path=/nonexistent/target",
                    "--set", "name=e2e-missing")
    assert proc.returncode == 1
    assert "target.model_path" in proc.stdout and "/nonexistent/target" in proc.stdout
    created = {p for p in set((workdir / "runs").glob("*/*")) - before if p.parent.name != "check"}
    assert created == set()  # no stage started


def test_deployments_register(prefect_server, config_path):
    proc = run_flow(prefect_server, "--config", str(config_path), module="deployments.deploy")
    assert proc.returncode == 0, proc.stderr
    api = prefect_server["PREFECT_API_URL"]
    deps = {d["name"]: d for d in httpx.post(f"{api}/deployments/filter", json={}).json()}
    assert {"eagleflow-pipeline", "eagleflow-nightly", "eagleflow-benchmark"} <= set(deps)
    crons = [s["schedule"].get("cron") for s in deps["eagleflow-nightly"]["schedules"]]
    assert crons == ["0 2 * * *"]
    assert deps["eagleflow-pipeline"]["parameters"]["params"]["config_path"] == str(config_path)


PROMOTE_SCRIPT = """
import json, sys
from prefect import flow
from eagleflow.config import load_config
from tasks.promote import promote

@flow
def gate(path: str, report: dict) -> bool:
    return promote(load_config(path), report, min_speedup=1.0, min_acceptance_length=1.5)

print("PROMOTED", gate(sys.argv[1], json.loads(sys.argv[2])))
"""


def test_promotion_gate_keeps_the_better_drafter(first_run, prefect_server, config_path, workdir):
    env = {**os.environ, **prefect_server}

    def gate(al: float, speedup: float, **extra) -> bool:
        report = {**first_run, "speedup": speedup, "drafter": {**first_run["drafter"], "mean_acceptance_length": al},
                  **extra}
        proc = subprocess.run([sys.executable, "-c", PROMOTE_SCRIPT, str(config_path), json.dumps(report)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return "PROMOTED True" in proc.stdout

    record = workdir / "runs" / "promoted" / "e2e.json"
    assert gate(3.0, 1.2) and json.loads(record.read_text())["mean_acceptance_length"] == 3.0
    assert not gate(2.5, 1.3)  # worse than the promoted drafter
    assert not gate(3.5, 0.9)  # slower than no speculation
    assert not gate(3.6, 1.3, verdict={"integration_suspect": True})  # the engine, not the drafter, is in doubt
    faster = {**first_run["drafter"], "output_tok_s": first_run["drafter"]["output_tok_s"] * 2}
    assert not gate(3.6, 1.3, current=faster)  # production's drafter served faster in the same benchmark
    assert gate(3.2, 1.1) and json.loads(record.read_text())["mean_acceptance_length"] == 3.2
