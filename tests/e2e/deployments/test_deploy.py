"""The deployments (deployments.deploy) registered on a real Prefect server: four for each config, named after
it, each the flow it should run from this checkout with the run config as its parameter, the nightly one on the
config's schedule (inactive unless the config says active); several configs side by side, one redeployed alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import api, run_cli, run_flow

pytestmark = pytest.mark.e2e

EXPECTED = {  # kind -> (entrypoint, flow name)
    "pipeline": ("flows/pipeline.py:pipeline", "pipeline"),
    "nightly": ("flows/retrain.py:retrain", "retrain"),
    "benchmark": ("flows/benchmark.py:benchmark_only", "benchmark"),
    "bootstrap": ("flows/bootstrap.py:bootstrap", "bootstrap"),
}


def deployments_of(prefect_server: dict, config_name: str) -> dict[str, dict]:
    """The config's deployments on the server, by kind."""
    deps = {d["name"]: d for d in api(prefect_server, "POST", "/deployments/filter", json={}).json()}
    return {kind: deps[f"{config_name}-{kind}"] for kind in EXPECTED if f"{config_name}-{kind}" in deps}


def other_config(e2e_config: Path, tmp_path: Path) -> Path:
    """A second config: the e2e one under another name, on another host, its nightly at 03:30 Berlin time, active."""
    data = yaml.safe_load(e2e_config.read_text())
    data["name"] = "e2e-two"
    data["host"]["name"] = "second-host"
    data["schedule"] = {"cron": "30 3 * * *", "timezone": "Europe/Berlin", "active": True}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_deployments_register(prefect_server, e2e_config):
    proc = run_flow(prefect_server, "--config", str(e2e_config), module="deployments.deploy")
    assert proc.returncode == 0, proc.stderr
    deps = deployments_of(prefect_server, "e2e")
    assert set(deps) == set(EXPECTED)
    for kind, (entrypoint, flow_name) in EXPECTED.items():
        d = deps[kind]
        assert d["entrypoint"] == entrypoint, kind
        assert api(prefect_server, "GET", f"/flows/{d['flow_id']}").json()["name"] == flow_name, kind
        assert d["work_pool_name"] == "eagleflow", kind  # the default process pool
        assert d["parameters"]["params"] == {"config_path": str(e2e_config), "overrides": {}}, kind
        assert {"eagleflow", "config:e2e"} <= set(d["tags"]), kind
        schedules = [(s["schedule"].get("cron"), s["schedule"].get("timezone"), s["active"]) for s in d["schedules"]]
        # demo.yaml's schedule: 02:00 UTC, inactive (no nightly nobody asked for); the deployment itself is not
        # paused (it runs when triggered), and the line says what Prefect says
        assert schedules == ([("0 2 * * *", "UTC", False)] if kind == "nightly" else []), kind
        assert d["paused"] is False, kind  # Prefect: not paused (it runs when triggered), its schedule off
        # one line a deployment: flow/name, schedule, pool; no ids, no Prefect advice
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{flow_name}/e2e-{kind} "))
        nightly = kind == "nightly"
        assert line.endswith("pool eagleflow") and ("cron '0 2 * * *' (UTC), schedule inactive" in line) == nightly
        assert "paused" not in line, line
    assert not any(d["id"] in proc.stdout for d in deps.values()) and "prefect deployment run" not in proc.stdout
    # the worker command as a fresh shell in the checkout can paste it (issue 43: it lacked .venv/bin/)
    assert proc.stdout.splitlines()[-1] == "start a worker: .venv/bin/prefect worker start --pool eagleflow"
    # The custom-run forms: typed fields whose defaults are the config's values (what the UI shows).
    form = deps["pipeline"]["parameter_openapi_schema"]["definitions"]["RunParams"]["properties"]
    assert (form["epochs"]["default"], form["num_samples"]["default"], form["temperatures"]["default"]) == (
        4,
        320,
        [0.0, 0.7],
    )
    assert (
        "train.epochs" in form["epochs"]["description"] and form["host_address"]["default"] is None
    )  # local: no address
    bench = deps["benchmark"]["parameter_openapi_schema"]["definitions"]["BenchmarkParams"]["properties"]
    assert {"drafter", "temperatures", "current_drafter", "host_address", "overrides"} <= set(bench)


def test_two_configs_side_by_side_and_one_redeployed_alone(prefect_server, e2e_config, tmp_path):
    two = other_config(e2e_config, tmp_path)
    proc = run_cli(prefect_server, "deploy", str(e2e_config), str(two))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = deployments_of(prefect_server, "e2e"), deployments_of(prefect_server, "e2e-two")
    assert set(first) == set(second) == set(EXPECTED)
    assert "config:e2e-two" in second["pipeline"]["tags"] and "host:second-host" in second["pipeline"]["tags"]
    assert [
        (s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in second["nightly"]["schedules"]
    ] == [("30 3 * * *", "Europe/Berlin", True)]
    assert "cron '30 3 * * *' (Europe/Berlin), schedule active" in proc.stdout

    # The first config again, its nightly switched on: its own deployments change, the second's are untouched,
    # and its schedule is replaced, not added to.
    again = run_cli(prefect_server, "deploy", str(e2e_config), "--set", "schedule.active=true")
    assert again.returncode == 0, again.stdout + again.stderr
    first2, second2 = deployments_of(prefect_server, "e2e"), deployments_of(prefect_server, "e2e-two")
    assert [s["active"] for s in first2["nightly"]["schedules"]] == [True]
    assert {k: (d["id"], d["updated"]) for k, d in second2.items()} == {
        k: (d["id"], d["updated"]) for k, d in second.items()
    }
    assert first2["pipeline"]["parameters"]["params"]["overrides"] == {"schedule.active": True}
    run_cli(prefect_server, "deploy", str(e2e_config))  # as the other tests expect it: schedule inactive, no overrides


def test_two_configs_of_one_name_are_refused_before_anything_is_registered(prefect_server, e2e_config, tmp_path):
    same = tmp_path / "same.yaml"
    same.write_text(e2e_config.read_text())
    before = {d["id"]: d["updated"] for d in api(prefect_server, "POST", "/deployments/filter", json={}).json()}
    proc = run_cli(prefect_server, "deploy", str(e2e_config), str(same))
    assert proc.returncode == 2 and "both named 'e2e'" in proc.stdout and str(same) in proc.stdout
    assert {d["id"]: d["updated"] for d in api(prefect_server, "POST", "/deployments/filter", json={}).json()} == before


def test_deploy_through_the_command_line_refuses_a_bad_override(prefect_server, e2e_config):
    proc = run_cli(prefect_server, "deploy", str(e2e_config), "--set", "train.epochs=0")
    assert proc.returncode == 2 and "epochs" in proc.stdout


def test_a_bad_schedule_is_refused_naming_the_field(prefect_server, e2e_config):
    proc = run_cli(prefect_server, "deploy", str(e2e_config), "--set", "schedule.timezone=Mars/Olympus")
    assert proc.returncode == 2 and "schedule.timezone" in proc.stdout and "IANA" in proc.stdout
