"""The deployments (deployments.deploy) registered on a real Prefect server: all four, each the flow it
should run from this checkout, with the run config as its parameter, the nightly one on its schedule."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import api, run_cli, run_flow

pytestmark = pytest.mark.e2e

EXPECTED = {  # deployment -> (entrypoint, flow name)
    "eagleflow-pipeline": ("flows/pipeline.py:pipeline", "pipeline"),
    "eagleflow-nightly": ("flows/retrain.py:retrain", "retrain"),
    "eagleflow-benchmark": ("flows/benchmark.py:benchmark_only", "benchmark"),
    "eagleflow-bootstrap": ("flows/bootstrap.py:bootstrap", "bootstrap"),
}


def test_deployments_register(prefect_server, e2e_config):
    proc = run_flow(prefect_server, "--config", str(e2e_config), module="deployments.deploy")
    assert proc.returncode == 0, proc.stderr
    deps = {d["name"]: d for d in api(prefect_server, "POST", "/deployments/filter", json={}).json()}
    assert set(deps) == set(EXPECTED)
    assert all(d["id"] in proc.stdout.split() for d in deps.values())  # it prints each deployment's id
    for name, (entrypoint, flow_name) in EXPECTED.items():
        d = deps[name]
        assert d["entrypoint"] == entrypoint, name
        assert api(prefect_server, "GET", f"/flows/{d['flow_id']}").json()["name"] == flow_name, name
        assert d["work_pool_name"] == "eagleflow", name  # the default process pool
        assert d["parameters"]["params"] == {"config_path": str(e2e_config), "overrides": {}}, name
        crons = [s["schedule"].get("cron") for s in d["schedules"]]
        assert crons == (["0 2 * * *"] if name == "eagleflow-nightly" else []), name
    # The custom-run forms: typed fields whose defaults are the config's values (what the UI shows).
    form = deps["eagleflow-pipeline"]["parameter_openapi_schema"]["definitions"]["RunParams"]["properties"]
    assert (form["epochs"]["default"], form["num_samples"]["default"], form["temperatures"]["default"]) == (4, 320, [0.0, 0.7])
    assert "train.epochs" in form["epochs"]["description"] and form["host_address"]["default"] is None  # local: no address
    bench = deps["eagleflow-benchmark"]["parameter_openapi_schema"]["definitions"]["BenchmarkParams"]["properties"]
    assert {"drafter", "temperatures", "current_drafter", "host_address", "overrides"} <= set(bench)


def test_deploy_through_the_command_line_refuses_a_bad_override(prefect_server, e2e_config):
    proc = run_cli(prefect_server, "deploy", str(e2e_config), "--set", "train.epochs=0")
    assert proc.returncode == 2 and "epochs" in proc.stdout
