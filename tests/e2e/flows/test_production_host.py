"""The production host (issue 12): generate from production's own server, one production window.

A real vLLM server of the demo target plays production: started by the operator's scripts
(tests/prodservice.py), its reasoning parser on, an API key it reads from its own environment. The
pipeline generates from it (`generate.server: production`, the key from the flow run's environment),
then runs extract, train, export and benchmark in one production window. A thread asks production's
health URL twice a second from before the flow starts to after it ends.

Shown: production answered every health check until the window opened (all of generate), went down
exactly once and answered again after it; the data trained a drafter the engine accepts; the report
says for which stages and how long production was down; the key is on no file under the run's dirs or
the Prefect server's home (its database: logs, artifacts, parameters) and in none of the flow run's
logs read back through the API; without the key production refuses (so the key was what let generate in).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port, prod_service_config
from tests.e2e.conftest import api, last_report, run_flow
from tests.e2e.health import HealthLog, healthy

pytestmark = pytest.mark.e2e
HOSTENV_PY = str(ROOT / ".hostenv" / "bin" / "python")
KEY_VAR = "E2E_PRODUCTION_KEY"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prod-host")


@pytest.fixture(scope="module")
def key() -> str:
    return "sk-e2e-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def production(workdir, key) -> dict:
    prod = prod_service_config(
        workdir,
        free_port(),
        HOSTENV_PY,
        served_name="demo-target",
        engine_args=("--reasoning-parser", "deepseek_r1"),
        env_from=(f"VLLM_API_KEY={KEY_VAR}",),
        orphan_grace_s=10,
        restore_timeout_s=300,
    )
    env = {**__import__("os").environ, KEY_VAR: key}
    subprocess.run(prod["start_command"], check=True, timeout=60, env=env)
    deadline = time.monotonic() + 300
    while not healthy(prod["health_url"]):
        assert time.monotonic() < deadline, "production not healthy at start"
        time.sleep(1)
    yield prod
    subprocess.run(prod["stop_command"], timeout=60)


@pytest.fixture(scope="module")
def run(prefect_server, workdir, production, key) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    url = production["health_url"].rsplit("/health", 1)[0]
    data.update(name="e2e-prod", report_dir=str(workdir / "reports"))
    data["host"].update(name="prod-host", work_root=str(workdir / "runs"), python=HOSTENV_PY)
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["engine"]["port"] = free_port()  # the stages' own engines; production has its port
    data["generate"].update(
        server="production",
        prompts_path=str(ROOT / "demo" / "prompts.jsonl"),
        num_samples=96,
        holdout=6,
        shard_size=48,
        concurrency=8,
    )
    # Capture from production asked for, but production runs without eagleflow's plugin: the check finds it out
    # and the night takes extract.fallback's path (hf here), in the window as before.
    (workdir / "capture").mkdir(exist_ok=True)
    data["extract"].update(backend="production", capture_dir=str(workdir / "capture"), fallback="hf", max_seq_len=1023)
    data["train"].update(epochs=2, max_seq_len=1023)
    data["benchmark"].update(num_prompts=4, max_tokens=48, temperatures=[0.0], concurrencies=[1], warmup_requests=1)
    data["production"] = {**production, "url": url, "api_key_env": KEY_VAR, "window": "pipeline"}
    config = workdir / "e2e-prod.yaml"
    config.write_text(yaml.safe_dump(data))

    health = HealthLog(production["health_url"])
    health.start()
    proc = run_flow(prefect_server, str(config), env={KEY_VAR: key})
    time.sleep(3)  # production answers again before the flow returns; a few more samples say it stays up
    health.done.set()
    health.join()
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {"report": last_report(proc), "health": health, "proc": proc, "config": config}


def test_generate_asks_production_which_stays_up_and_goes_down_once_for_the_gpu_stages(run):
    report, health = run["report"], run["health"]
    [window] = report["production_windows"]
    assert window["ok"] and window["was_running"]
    assert window["stages"] == ["extract", "train", "export", "benchmark"]
    opened = json.loads((Path(window["dir"]) / "window.open.json").read_text())
    closed = json.loads((Path(window["dir"]) / "window.closed.json").read_text())

    # Production was up for every check until the stop was issued: the whole of generate (None: slower than 2 s
    # to answer while generate kept it busy, never refused).
    before = [ok for t, ok in health.samples if t < opened["stop_issued_at"]]
    assert before.count(True) > 20 and False not in before, before
    # One spell down, inside the window; healthy after it to the end.
    [(down, up)] = health.down_spells()
    assert opened["stop_issued_at"] <= down and up <= closed["back_at"] + 1.0
    assert [ok for _, ok in health.samples if ok is not None][-1]
    assert window["down_s"] == pytest.approx(closed["back_at"] - opened["stop_issued_at"], abs=0.5)
    commands = (Path(window["dir"]) / "production-commands.log").read_text()
    out = run["proc"].stdout + run["proc"].stderr  # the flow's log and the report table, as printed
    assert commands.count('"stop", "--pidfile"') == 1 and commands.count('"start", "--pidfile"') == 1

    checked = json.loads(Path(report["stages"]["check"]["manifest"]).read_text())["metrics"]
    said = checked["production_capture"]
    assert "capture plugin wrote nothing" in said and "EAGLEFLOW_CAPTURE_DIR=" in said, said
    extracted = json.loads(Path(report["stages"]["extract"]["manifest"]).read_text())["metrics"]
    assert extracted["backend"] == "hf"  # extract.fallback
    assert "production cannot capture" in out and "extract.backend 'hf'" in out

    gen = json.loads(Path(report["stages"]["generate"]["manifest"]).read_text())
    assert gen["metrics"]["server"] == "production" and gen["metrics"]["failed"] == 0
    assert gen["outputs"]["num_train"] == 90
    assert report["drafter"]["num_drafts"] > 0  # the data trained a drafter the engine accepts
    assert report["production"] is None  # the benchmark measured inside the window, it stopped nothing itself
    assert "production down" in out and "for extract, train, export, benchmark" in out


def test_production_refuses_without_the_key(run, production):
    url = production["health_url"].rsplit("/health", 1)[0]
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=30,
        json={"model": "demo-target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 401


def test_the_key_is_nowhere_on_disk_nor_in_prefect(run, key, workdir, prefect_server):
    needle = key.encode()
    roots = [workdir, Path(prefect_server["PREFECT_HOME"])]
    found = [p for root in roots for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
    assert found == []
    flow_runs = api(prefect_server, "POST", "/flow_runs/filter", json={"limit": 200}).json()
    ours = [f for f in flow_runs if (f["parameters"].get("params") or {}).get("config_path") == str(run["config"])]
    assert ours
    logs, offset = [], 0
    while page := api(
        prefect_server,
        "POST",
        "/logs/filter",
        json={"logs": {"flow_run_id": {"any_": [f["id"] for f in ours]}}, "limit": 200, "offset": offset},
    ).json():
        logs += page
        offset += len(page)
    artifacts = api(prefect_server, "POST", "/artifacts/filter", json={"limit": 200}).json()
    assert logs and artifacts
    assert key not in json.dumps(logs) and key not in json.dumps(artifacts) and key not in json.dumps(ours)
    assert key not in run["proc"].stdout + run["proc"].stderr
