"""A fleet on one Prefect server (issue 25) with the real pipelines: the demo and the demo-MLA configs deployed
together on one work pool, each on its own GPU "host" (a real sshd on loopback), run through one process worker
as the UI runs them. They hold their hosts at once; pointed at one host, the second queues on that host's Prefect
concurrency limit, and its run page in the browser names the run it waits for.

By hand, not in `make test` (two whole pipelines and two benchmarks: 11-14 minutes on 2 cores with a suite
beside it, a third of the suite): `EAGLEFLOW_FLEET_PIPELINES=1 .venv/bin/python -m pytest -s
tests/e2e/hosts/test_fleet_pipelines.py`
(`make fleet-pipelines`). tests/e2e/hosts/test_fleet.py shows the same in the suite with a short job of its own.

The second pair of runs keeps each config's work root: both loopback hosts see one disk, so every stage before
the benchmark comes from cache and each run re-measures only its benchmark (on real hosts that share no
filesystem, the second config's stages would be computed again on the first host)."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import api, deployed_worker, run_logs, wait_flow_run
from tests.e2e.hosts.test_ssh import HOST_PY
from tests.e2e.ui.conftest import browser, page  # noqa: F401 (the browser tests' fixtures)
from tests.e2e.ui.pages import open_run, scroll_logs_to_end, shot

pytestmark = pytest.mark.skipif(
    not os.environ.get("EAGLEFLOW_FLEET_PIPELINES"),
    reason="by hand, ~12 min: EAGLEFLOW_FLEET_PIPELINES=1 (make fleet-pipelines)",
)

POOL = "eagleflow-fleet"
SMALL = {
    "generate": {"num_samples": 320, "holdout": 12, "shard_size": 160},
    "train": {"epochs": 4},
    "benchmark": {
        "num_prompts": 6,
        "max_tokens": 64,
        "warmup_requests": 1,
        "temperatures": [0.0],
        "concurrencies": [1],
    },
}


def _config(base: str, name: str, sshd, host_name: str, work: Path) -> Path:
    """configs/<base>.yaml, small, named `name`, on `sshd` as the host `host_name`, its paths absolute."""
    data = yaml.safe_load((ROOT / "configs" / f"{base}.yaml").read_text())
    data["name"] = name
    host = {k.split(".", 1)[1]: v for k, v in sshd.host_overrides().items()}
    data["host"].update(host, name=host_name, work_root=str(work / name / "runs"), python=HOST_PY)
    data["target"]["model_path"] = str(ROOT / "demo" / Path(data["target"]["model_path"]).name)
    data["generate"]["prompts_path"] = str(ROOT / "demo" / "prompts.jsonl")
    for section, values in SMALL.items():
        data[section].update(values)
    data["engine"]["port"] = free_port()
    data["report_dir"] = str(work / name / "reports")
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(prefect_server: dict, deployment: dict, config: Path, overrides: dict | None = None) -> str:
    run = api(
        prefect_server,
        "POST",
        f"/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": {"params": {"config_path": str(config), "overrides": overrides or {}}}},
    ).json()
    return run["id"]


def _held(prefect_server: dict, run_id: str) -> tuple[float, float, list[str]]:
    """When the run held its host (its "holding host" and "released host" log lines, as the server keeps them),
    and what it said while it waited."""
    deadline = time.monotonic() + 120
    while True:  # the last log lines reach the server after the run is final
        logs = run_logs(prefect_server, run_id)
        at = {
            what: [log["timestamp"] for log in logs if log["message"].startswith(what)]
            for what in ("holding host", "released host")
        }
        if all(at.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(at.values()), [log["message"] for log in logs][-20:]
    stamp = lambda s: datetime.fromisoformat(s).timestamp()
    return (
        stamp(at["holding host"][0]),
        stamp(at["released host"][-1]),
        [log["message"] for log in logs if log["message"].startswith("waiting for host")],
    )


@pytest.fixture(scope="module")
def fleet(prefect_server, two_hosts, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet-pipelines")
    configs = {
        "demo": _config("demo", "fleet-demo", two_hosts[0], "gpu-a", work),
        "demo-mla": _config("demo-mla", "fleet-mla", two_hosts[1], "gpu-b", work),
    }
    with deployed_worker(prefect_server, configs["demo"], POOL, work / "worker.log", more=(configs["demo-mla"],)) as w:
        yield {
            "configs": configs,
            "work": work,
            "hosts": two_hosts,
            "pipeline": {
                "demo": w["by_config"]["fleet-demo"]["pipeline"],
                "demo-mla": w["by_config"]["fleet-mla"]["pipeline"],
            },
        }


def test_the_two_pipelines_run_at_once_on_two_hosts(fleet, prefect_server):
    ids = {k: _run(prefect_server, fleet["pipeline"][k], c) for k, c in fleet["configs"].items()}
    runs = {k: wait_flow_run(prefect_server, i, timeout_s=3600) for k, i in ids.items()}
    assert all(r["state"]["type"] == "COMPLETED" for r in runs.values()), (
        {k: r["state"] for k, r in runs.items()},
        (fleet["work"] / "worker.log").read_text()[-5000:],
    )
    held = {k: _held(prefect_server, i) for k, i in ids.items()}
    overlap = min(h[1] for h in held.values()) - max(h[0] for h in held.values())
    for k, (a, b, _) in held.items():
        print(f"\n{k} ({runs[k]['name']}): held its host {b - a:.0f} s")
    print(f"two hosts: the pipelines held their hosts at once for {overlap:.0f} s")
    assert overlap > 60  # each pipeline alone holds its host for minutes
    assert not any("held by" in said for h in held.values() for said in h[2])  # neither waited for the other


def test_pointed_at_one_host_the_second_waits_and_its_page_names_the_first(fleet, prefect_server, page):
    one = {**fleet["hosts"][0].host_overrides(), "host.name": "gpu-a"}  # its own work root kept: see the docstring
    first = _run(prefect_server, fleet["pipeline"]["demo"], fleet["configs"]["demo"])
    deadline = time.monotonic() + 600
    while not _said(prefect_server, first, "holding host"):
        assert time.monotonic() < deadline, "the first run never held its host"
        time.sleep(2)
    second = _run(prefect_server, fleet["pipeline"]["demo-mla"], fleet["configs"]["demo-mla"], one)
    name = api(prefect_server, "GET", f"/flow_runs/{first}").json()["name"]
    ui = {"base": prefect_server["PREFECT_API_URL"].rsplit("/api", 1)[0]}
    while not _said(prefect_server, second, "waiting for host"):  # it started, and waits
        assert time.monotonic() < deadline, "the second run never said it waits"
        time.sleep(2)
    open_run(page, ui, second)  # what a person sees on its page meanwhile
    rows = scroll_logs_to_end(page, rf"waiting for host gpu-a .*{name}")
    shot(page, "fleet-pipelines-the-second-waits")
    # the run's tag names the host it was sent to, not its deployment's (gpu-b)
    assert "host:gpu-a" in page.locator(".p-tag").all_inner_texts()
    assert "host:gpu-a" in api(prefect_server, "GET", f"/flow_runs/{second}").json()["tags"]
    print("\nthe waiting run's page says: " + next(r for r in rows if "waiting for host" in r))
    done = {i: wait_flow_run(prefect_server, i, timeout_s=1800) for i in (first, second)}
    assert all(r["state"]["type"] == "COMPLETED" for r in done.values()), {i: r["state"] for i, r in done.items()}
    (a0, a1, _), (b0, _, waited) = _held(prefect_server, first), _held(prefect_server, second)
    print(f"one host: the first held it {a1 - a0:.0f} s; the second held it {b0 - a1:.1f} s after the first let go")
    assert b0 >= a1 and waited and name in waited[0], waited


def _said(prefect_server: dict, run_id: str, prefix: str) -> bool:
    return any(log["message"].startswith(prefix) for log in run_logs(prefect_server, run_id))
