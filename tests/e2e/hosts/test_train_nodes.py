"""Training across two hosts (issue 25): two real sshd "hosts" on loopback, one Prefect server, the real train
task in a flow served as a deployment (`nodes_flow.py`), run and cancelled through the API as from the UI. The flow
takes both hosts (their Prefect limits at once, their leases), starts the train stage as a detached job on each over
SSH, and torchrun runs one gloo rank on each with a static rendezvous on node 0.

Shown: the two-host run completes and its drafter is the one-host two-rank run's, step loss by step loss and byte
for byte (so it serves with the same acceptance: the engine is given the same bytes); a cancel mid-training ends
both nodes' jobs and ranks; a node that fails ends the other's job, which would otherwise wait out torchrun's
rendezvous, and the flow names the node that failed; a node without eagleflow is refused before anything starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import api, run_logs, wait_flow_run
from tests.e2e.hosts.test_ssh import HOST_PY
from tests.helpers.procs import alive, end_group

pytestmark = pytest.mark.e2e

STEP_LOSS = re.compile(r"eagleflow\.train: epoch \d+ step \d+/\d+ lr \S+ loss (\S+)")
TRAIN = {
    "batch_tokens": 128,
    "draft_vocab_size": 24,
    "warmup_steps": 2,
    "max_seq_len": 32,
    "num_threads": 1,
    "log_every_steps": 1,
    "device": "cpu",
    "dtype": "float32",
}
SYNTHETIC = """
import json, sys
from pathlib import Path
from tests.helpers.drafter import extract_manifest, write_synthetic
root = write_synthetic(Path(sys.argv[1]), n_train=120, n_hold=6)
print(json.dumps(extract_manifest(root).model_dump(mode="json")))
"""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A tiny target and extract stage's shards, written by the host's environment (torch is there, not here)."""
    root = tmp_path_factory.mktemp("syn") / "data"
    out = subprocess.run([HOST_PY, "-c", SYNTHETIC, str(root)], cwd=ROOT, capture_output=True, text=True, check=True)
    return root, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deployment(prefect_server, tmp_path_factory):
    """nodes_flow.py served (Prefect's runner: it runs each flow run in a process of its own and, on a cancel,
    ends that process and calls the flow's on_cancellation hooks, as a worker does). Our own process group."""
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "tests/e2e/hosts/nodes_flow.py"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **prefect_server, "PREFECT_RUNNER_POLL_FREQUENCY": "2"},
    )
    try:
        deadline = time.monotonic() + 300
        while (
            found := api(
                prefect_server,
                "POST",
                "/deployments/filter",
                json={"deployments": {"name": {"any_": ["train-across-hosts-test"]}}},
            ).json()
        ) == []:
            assert proc.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()[-3000:]
            time.sleep(1)
        yield found[0]
    finally:
        end_group(proc)
        log.close()


def _host(sshd, name: str, work_root: Path) -> dict:
    return {
        "kind": "ssh",
        "name": name,
        "address": "127.0.0.1",
        "port": sshd.port,
        "key_path": str(sshd.user_key),
        "known_hosts": str(sshd.known_hosts),
        "work_root": str(work_root),
        "python": HOST_PY,
        "stage_retries": 0,
    }


def _config(work: Path, hosts, root: Path, train: dict, across: bool, node: dict | None = None) -> Path:
    """The run config (a YAML file, as the project's flows take it); hosts named after the test's directory, so
    that no test waits for a Prefect limit another one held."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    tag = re.sub(r"[^A-Za-z0-9-]", "-", work.name)[-30:]
    config = {
        "name": "nodes",
        "host": _host(hosts[0], f"a-{tag}", work / "a"),
        "target": {"model_path": str(root / "target"), "aux_layer_ids": [1, 2, 3], "final_layer_id": 4},
        "generate": {"prompts_path": str(work / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
        "train": {**TRAIN, **train},
    }
    if across:
        config["train_nodes"] = {
            "hosts": [{**_host(hosts[1], f"b-{tag}", work / "b"), **(node or {})}],
            "master_port": free_port(),
        }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(prefect_server: dict, deployment: dict, config: Path, extract: dict) -> str:
    """A flow run of the served deployment, as the UI's custom run makes one; its id."""
    params = {
        "params": {"config_path": str(config), "overrides": {}},
        "extract": extract,
        "out": str(config.parent / "manifest.json"),
    }
    return api(
        prefect_server, "POST", f"/deployments/{deployment['id']}/create_flow_run", json={"parameters": params}
    ).json()["id"]


def _logs(prefect_server: dict, run_id: str, wait_s: float = 60) -> str:
    """The run's log lines that are not the stage's own (those are read from the hosts' stage.log files), once its
    engine's closing line ("Finished in state ...") is in, or `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [r["message"] for r in run_logs(prefect_server, run_id)]
        if any(line.startswith("Finished in state") for line in lines) or time.monotonic() > deadline:
            return "\n".join(line for line in lines if not re.match(r"(\[\S+\] )?\d{4}-\d\d-\d\d ", line))
        time.sleep(0.5)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stage_dirs(work: Path) -> tuple[list[Path], list[Path]]:
    """(node 0's stage dirs, node 1's job dirs) under the test's two work roots."""
    return sorted((work / "a" / "train").glob("*")), sorted((work / "b" / "train").glob("*/node-1"))


def _processes_naming(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode() and alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_two_hosts_train_the_one_host_drafter(prefect_server, deployment, two_hosts, synthetic, tmp_path):
    root, extract = synthetic
    runs = {
        "one host, 2 ranks": _config(tmp_path / "one", two_hosts, root, {"epochs": 2, "nproc": 2}, across=False),
        "two hosts, 1 rank each": _config(tmp_path / "two", two_hosts, root, {"epochs": 2, "nproc": 1}, across=True),
    }
    curves, weights, manifests, logs = {}, {}, {}, {}
    for name, config in runs.items():
        run_id = _run(prefect_server, deployment, config, extract)
        run = wait_flow_run(prefect_server, run_id, 900)
        logs[name] = _logs(prefect_server, run_id)
        assert run["state"]["type"] == "COMPLETED", (run["state"], logs[name][-4000:])
        m = json.loads((config.parent / "manifest.json").read_text())
        stage = Path(m["dir"])
        curves[name] = [float(x) for x in STEP_LOSS.findall((stage / "stage.log").read_text())]
        weights[name] = _sha(stage / m["outputs"]["best"] / "model.safetensors")
        manifests[name] = m
    one, two = runs
    [node_job] = _stage_dirs(tmp_path / "two")[1]
    node_log = (node_job / "stage.log").read_text()
    print(f"\nsteps {len(curves[one])}, losses {curves[one][:3]} ... {curves[one][-3:]}; weights {weights[one][:16]}")
    assert "launching 1 ranks on node 1 of 2" in node_log and "node 1 done" in node_log, node_log[-3000:]
    assert "launching 1 ranks on node 0 of 2" in (Path(manifests[two]["dir"]) / "stage.log").read_text()
    assert manifests[two]["metrics"]["nproc"] == manifests[one]["metrics"]["nproc"] == 2
    assert len(curves[one]) == manifests[one]["metrics"]["steps"] > 20
    assert curves[two] == curves[one]  # the same ranks see the same batches: every logged loss alike
    assert weights[two] == weights[one]  # the same drafter, byte for byte
    assert re.search(r"train on 2 hosts: a-\S+, b-\S+ \(rendezvous at 127\.0\.0\.1:\d+\)", logs[two]), logs[two][-3000:]


def _wait_training(work: Path, run_id: str, prefect_server: dict) -> tuple[Path, Path]:
    deadline = time.monotonic() + 600
    while True:
        stages, node_jobs = _stage_dirs(work)
        log = stages[0] / "stage.log" if stages else None  # the directory comes before its log
        if node_jobs and log and log.is_file() and STEP_LOSS.search(log.read_text()):
            return stages[0], node_jobs[0]
        state = api(prefect_server, "GET", f"/flow_runs/{run_id}").json()["state"]
        assert state["type"] in ("SCHEDULED", "PENDING", "RUNNING") and time.monotonic() < deadline, state
        time.sleep(0.2)


def _gone_within(dirs: list[Path], request: Path, limit_s: float) -> float:
    from eagleflow.hosts.jobs import Job

    start = time.monotonic()
    while any(Job(d).running() for d in dirs) or _processes_naming(str(request)):
        assert time.monotonic() - start < limit_s, (
            f"left after {limit_s} s: jobs {[str(d) for d in dirs if Job(d).running()]}, processes "
            f"{_processes_naming(str(request))}"
        )
        time.sleep(0.2)
    return time.monotonic() - start


def test_a_cancel_ends_both_nodes(prefect_server, deployment, two_hosts, synthetic, tmp_path):
    root, extract = synthetic
    config = _config(tmp_path, two_hosts, root, {"epochs": 500, "nproc": 1}, across=True)
    run_id = _run(prefect_server, deployment, config, extract)
    stage, node_job = _wait_training(tmp_path, run_id, prefect_server)
    api(
        prefect_server,
        "POST",
        f"/flow_runs/{run_id}/set_state",
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
    )
    took = _gone_within([stage, node_job], stage / "request.json", 30)
    print(f"\nboth nodes' jobs and ranks gone {took:.1f} s after the cancel")
    assert wait_flow_run(prefect_server, run_id, 120)["state"]["type"] == "CANCELLED"
    assert not (stage / "manifest.json").exists()


def test_a_node_that_fails_ends_the_other_and_is_named(prefect_server, deployment, two_hosts, synthetic, tmp_path):
    """Node 0 fails at once (its rendezvous port is taken by another program); node 1, connected to that program
    and waiting for a rendezvous that never comes, is ended, and the flow fails naming node 0 and why. Without the
    stop, node 1 would wait out torchrun's rendezvous timeout (15 minutes) with both hosts held."""
    import socket

    root, extract = synthetic
    config = _config(tmp_path, two_hosts, root, {"epochs": 500, "nproc": 1}, across=True)
    port = yaml.safe_load(config.read_text())["train_nodes"]["master_port"]
    squatter = socket.create_server(("127.0.0.1", port))  # accepts connections (its backlog), answers nothing
    try:
        run_id = _run(prefect_server, deployment, config, extract)
        run = wait_flow_run(prefect_server, run_id, 300)
        [stage], [node_job] = _stage_dirs(tmp_path)
        took = _gone_within([stage, node_job], stage / "request.json", 30)
    finally:
        squatter.close()
    text = _logs(prefect_server, run_id)
    print(f"\nboth jobs gone {took:.1f} s after the flow ended; the run says: {run['state']['message'][:400]}")
    assert run["state"]["type"] == "FAILED", run["state"]
    assert re.search(r"a-\S+ failed: ending the job on b-", text), text[-4000:]
    assert re.search(r"train failed on a-\S+", run["state"]["message"]), run["state"]
    assert not (stage / "manifest.json").exists()


def test_a_node_without_eagleflow_is_refused_before_anything_starts(
    prefect_server, deployment, two_hosts, synthetic, tmp_path
):
    """Node 1's host.python is not an eagleflow environment: the run stops when it takes node 1's lease, before a job
    starts on either node, naming node 1 and the fix."""
    root, extract = synthetic
    config = _config(
        tmp_path,
        two_hosts,
        root,
        {"epochs": 500, "nproc": 1},
        across=True,
        node={"python": str(tmp_path / "no-env" / "bin" / "python")},
    )
    run = wait_flow_run(prefect_server, _run(prefect_server, deployment, config, extract), 300)
    assert run["state"]["type"] == "FAILED", run["state"]
    message = run["state"]["message"]
    assert "b-" in message and "host.python" in message and "bootstrap" in message, message
    assert _stage_dirs(tmp_path) == ([], [])
