"""The pipeline flow (flows.pipeline) with its host over SSH: a real sshd on 127.0.0.1, a relay in front
of it that cuts the link mid-stage, a real Prefect server, and a process worker that runs a deployment
we cancel. The SSH host on its own (small jobs, a flow run timeout) is tests/e2e/hosts/test_ssh.py.

The "host" is this machine reached over SSH, so the test can look at the host's files and processes
directly: which pids a stage ran under, whether a cancelled job's process group is gone.
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

from eagleflow.hosts import jobs
from tests.conftest import ROOT, free_port
from tests.e2e.conftest import api, deployed_worker
from tests.helpers.procs import alive, group_alive
from tests.sshd import Relay, start_sshd

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def relay(sshd):
    r = Relay(sshd.port)
    sshd.trust_port(r.port)
    yield r
    r.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e-ssh")


def write_config(workdir: Path, sshd, port: int, name: str, **sections: dict) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = name
    data["host"].update(
        kind="ssh",
        name="loopback",
        address="127.0.0.1",
        port=port,
        key_path=str(sshd.user_key),
        known_hosts=str(sshd.known_hosts),
        work_root=str(workdir / name / "runs"),
        python=str(ROOT / ".hostenv" / "bin" / "python"),
        stage_retries=3,
    )
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    # As small as what it shows allows: two shards of generate (the link is cut after the first), a drafter the
    # engine accepts, one benchmark cell.
    data["generate"].update(
        prompts_path=str(ROOT / "demo" / "prompts.jsonl"), num_samples=140, holdout=12, shard_size=70
    )
    data["engine"]["port"] = free_port()
    data["train"].update(epochs=2)
    data["benchmark"].update(num_prompts=6, max_tokens=64, warmup_requests=1, temperatures=[0.0], concurrencies=[1])
    data["report_dir"] = str(workdir / name / "reports")
    for section, values in sections.items():
        data[section].update(values)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def stage_dirs(config: Path, stage: str) -> list[Path]:
    root = Path(yaml.safe_load(config.read_text())["host"]["work_root"])
    return sorted((root / stage).glob("*/"))


def test_pipeline_over_ssh_survives_a_cut_link_and_runs_each_stage_once(prefect_server, sshd, relay, workdir):
    config = write_config(workdir, sshd, relay.port, "ssh")
    env = {**os.environ, **prefect_server}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        # Cut every connection (stage follower, lease) once generate has written its first shard.
        deadline = time.monotonic() + 600
        while True:
            logs = [d / "stage.log" for d in stage_dirs(config, "generate")]
            if logs and logs[0].exists() and "shard 1/2" in logs[0].read_text():
                break
            assert proc.poll() is None and time.monotonic() < deadline, "generate never got going"
            time.sleep(0.2)
        assert relay.cut() >= 1
        out, _ = proc.communicate(timeout=1500)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    print(out[-8000:])
    assert proc.returncode == 0
    assert "ConnectionLost" in out and "re-attached to the job already running" in out
    generate_log = logs[0].read_text()
    assert len(re.findall(r"generate \S+: pid \d+", generate_log)) == 1  # ran exactly once
    assert generate_log.count("shard 2/2") == 1
    report = json.loads(Path(out.split("report: ")[-1].strip().splitlines()[0]).read_text())
    assert report["drafter"]["num_drafts"] > 0 and report["drafter"]["mean_acceptance_length"] > 1.2
    for stage in ("check", "generate", "extract", "train", "export", "benchmark"):
        (d,) = stage_dirs(config, stage)
        assert (d / "manifest.json").exists() and jobs.Job(d).status()["returncode"] == 0
    assert jobs.running_jobs(Path(yaml.safe_load(config.read_text())["host"]["work_root"])) == []


def test_a_wrong_key_fails_the_flow_once_without_retries(prefect_server, sshd, workdir, tmp_path):
    relay = Relay(sshd.port)
    sshd.trust_port(relay.port)
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    config = write_config(workdir, sshd, relay.port, "wrongkey")
    env = {**os.environ, **prefect_server}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.pipeline", str(config), "--set", f"host.key_path={stranger}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    relay.close()
    assert proc.returncode == 1
    assert "refused authentication" in proc.stdout and str(stranger) in proc.stdout
    assert relay.accepted == 1


def test_cancelling_the_flow_run_ends_the_remote_job_within_10_s(prefect_server, sshd, workdir):
    """A deployment run by a process worker, cancelled from the API (as from the UI) while generate's
    engine is serving: the job's process group and the engine are gone within 10 s."""
    config = write_config(workdir, sshd, sshd.port, "cancel", generate={"num_samples": 1100, "shard_size": 1100})
    with deployed_worker(prefect_server, config, "eagleflow-cancel-test", workdir / "worker.log") as w:
        dep = w["deployments"]["pipeline"]
        run = api(
            prefect_server,
            "POST",
            f"/deployments/{dep['id']}/create_flow_run",
            json={"parameters": {"params": {"config_path": str(config), "overrides": {}}}},
        ).json()
        deadline = time.monotonic() + 600
        while True:
            dirs = stage_dirs(config, "generate")
            if dirs and (dirs[0] / "engine.pid").exists() and "healthy" in (dirs[0] / "stage.log").read_text():
                break
            assert w["worker"].poll() is None and time.monotonic() < deadline, (workdir / "worker.log").read_text()[
                -3000:
            ]
            time.sleep(0.2)
        job = jobs.Job(dirs[0])
        pgid, engine_pid = job.pid(), int((dirs[0] / "engine.pid").read_text())
        assert pgid and group_alive(pgid) and alive(engine_pid)

        start = time.monotonic()
        api(
            prefect_server,
            "POST",
            f"/flow_runs/{run['id']}/set_state",
            json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
        )
        while group_alive(pgid) or alive(engine_pid):
            assert time.monotonic() - start < 10, "the remote job outlived the cancellation by 10 s"
            time.sleep(0.1)
        print(f"remote job and engine gone {time.monotonic() - start:.1f} s after the cancel request")
        assert not job.running() and not (dirs[0] / "manifest.json").exists()
        deadline = time.monotonic() + 60
        while api(prefect_server, "GET", f"/flow_runs/{run['id']}").json()["state"]["type"] != "CANCELLED":
            assert time.monotonic() < deadline, "the flow run never reached Cancelled"
            time.sleep(0.5)
        assert jobs.running_jobs(Path(yaml.safe_load(config.read_text())["host"]["work_root"])) == []
