"""The SSH host (eagleflow.hosts.ssh) against a real OpenSSH server on 127.0.0.1, through a relay that
can cut the link.

Jobs here are small shell or Python commands: what is under test is the host (detached jobs,
re-attach, stop, lease, errors, a flow run's timeout), not a stage. The full pipeline over SSH is
tests/e2e/flows/test_pipeline_ssh.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagleflow.config import HostConfig
from eagleflow.hosts import (
    ConnectionLost,
    HostAuthError,
    HostBusy,
    HostKeyError,
    HostUnreachable,
    LocalHost,
    StageFailed,
    jobs,
)
from eagleflow.hosts.ssh import SshHost
from eagleflow.util import http
from tests.conftest import ROOT, free_port
from tests.helpers.procs import alive, group_alive
from tests.sshd import Relay, keygen, start_sshd

HOST_PY = str(ROOT / ".hostenv" / "bin" / "python")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def relay(sshd):
    r = Relay(sshd.port)
    sshd.trust_port(r.port)
    yield r
    r.close()


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "work"


def host_config(sshd, root: Path, port: int | None = None, **kw) -> HostConfig:
    fields = dict(
        kind="ssh",
        name="loopback",
        address="127.0.0.1",
        port=port or sshd.port,
        key_path=str(sshd.user_key),
        known_hosts=str(sshd.known_hosts),
        work_root=str(root),
        python=HOST_PY,
    )
    fields.update(kw)
    return HostConfig(**fields)


def test_job_runs_streams_its_log_and_reports_a_failure_with_its_cause(sshd, root):
    lines: list[str] = []
    with SshHost(host_config(sshd, root)) as host:
        host.run_job(str(root / "ok"), [HOST_PY, "-c", "import os; print('hello', os.getpid())"], log=lines.append)
        assert any(line.startswith("hello ") for line in lines)
        with pytest.raises(StageFailed) as err:
            host.run_job(
                str(root / "bad"),
                ["sh", "-c", "echo working; echo 'error: the disk is full'; exit 3"],
                log=lines.append,
            )
    assert err.value.returncode == 3
    what, cause, logs = str(err.value).splitlines()  # three lines: what failed, its cause, where the log is
    assert what == "sh failed on loopback (exit 3)" and cause == "cause: the disk is full", str(err.value)
    assert logs == f"logs: loopback:{root / 'bad' / 'stage.log'}"
    assert (root / "bad" / "job.exit").exists() and not (root / "bad" / "manifest.json").exists()


def test_a_secret_reaches_the_job_in_memory_only(sshd, root):
    """Production's API key: in the stage's environment on the host, in no file of the job (the spec
    names it, the value crosses on the channel's stdin), in no log line."""
    secret = "sk-ssh-" + os.urandom(12).hex()
    script = (
        "import hashlib, os; v = os.environ['EAGLEFLOW_PRODUCTION_API_KEY']; "
        "print('sha', hashlib.sha256(v.encode()).hexdigest())"
    )
    lines: list[str] = []
    with SshHost(host_config(sshd, root)) as host:
        host.run_job(
            str(root / "secret"),
            [HOST_PY, "-c", script],
            log=lines.append,
            secret_env={"EAGLEFLOW_PRODUCTION_API_KEY": secret},
        )
    import hashlib

    assert f"sha {hashlib.sha256(secret.encode()).hexdigest()}" in lines
    assert not any(secret in line for line in lines)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret.encode() in p.read_bytes()]
    assert jobs.Job(root / "secret").spec()["secret_env"] == ["EAGLEFLOW_PRODUCTION_API_KEY"]


def test_a_production_window_outlives_the_ssh_command_that_opened_it(sshd, root, tmp_path):
    """`window open` over SSH returns once production is down; its holder (a session of its own) stays
    when the channel closes, and gives production back when the release is written. Production here
    is the suite's stand-in server behind the operator's start/stop scripts: what is under test is the window."""
    import json

    import httpx

    from tests.conftest import standin_service_config

    port = free_port()
    prod = standin_service_config(tmp_path, port, load_s=0.0, restore_timeout_s=60, orphan_grace_s=30)
    subprocess.run(prod["start_command"], check=True, cwd=str(ROOT))

    def up() -> bool:
        try:
            return http.get(prod["health_url"], timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    deadline = time.monotonic() + 30
    while not up():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    d = str(root / "production" / "w")
    cli = [HOST_PY, "-m", "eagleflow.production.window"]
    try:
        with SshHost(host_config(sshd, root)) as host:
            rc, out, err = host.exec(
                [
                    *cli,
                    "open",
                    d,
                    "--config",
                    json.dumps(prod),
                    "--work-root",
                    str(root),
                    "--owner",
                    "ssh-test",
                    "--stages",
                    "extract",
                ],
                timeout=120,
            )
            assert rc == 0, out + err
            assert not up()
            time.sleep(2)  # the channel is closed: the holder must still be there, production still down
            assert json.loads(host.exec([*cli, "status", d])[1])["state"] == "open" and not up()
            host.write_text(f"{d}/window.release", "")
            deadline = time.monotonic() + 60
            while (status := json.loads(host.exec([*cli, "status", d])[1]))["state"] != "closed":
                assert time.monotonic() < deadline, status
                time.sleep(0.5)
        assert status["result"]["ok"] and status["result"]["down_s"] > 2 and up()
    finally:
        subprocess.run(prod["stop_command"], cwd=str(ROOT))


def test_log_lines_arrive_while_the_job_runs(sshd, root):
    """Causal, not timed: the job prints a line, then waits until the controller has seen it (a file the log
    callback creates; the loopback host shares this file system), then says whether it was seen. Lines that came
    only at the job's end would leave it waiting out its 120 s and saying so."""
    mark = root / "tick-0-seen"
    script = (
        f"import os, time\nprint('tick 0', flush=True)\nend = time.time() + 120\n"
        f"while not os.path.exists({str(mark)!r}) and time.time() < end:\n    time.sleep(0.05)\n"
        f"print('tick 1:', 'seen while running' if os.path.exists({str(mark)!r}) else 'never seen', flush=True)\n"
    )
    seen: list[str] = []

    def log(line: str) -> None:
        seen.append(line)
        if line.startswith("tick 0"):
            mark.touch()

    with SshHost(host_config(sshd, root)) as host:
        host.run_job(str(root / "ticks"), [HOST_PY, "-c", script], log=log)
    assert [s for s in seen if s.startswith("tick")] == ["tick 0", "tick 1: seen while running"], seen


def test_cut_connection_then_retry_reattaches_and_the_job_runs_once(sshd, relay, root):
    """The link drops mid-job: ConnectionLost (the retryable error), the job goes on; the retry with
    the same attempt re-attaches and sees it finish. One process ever ran it. The job runs until the test
    lets it finish, once the retry has re-attached (a fixed 3 s job ended before the retry on a loaded machine)."""
    job_dir = root / "long"
    go = root / "go"
    script = (
        "import os, sys, time\nprint('pid', os.getpid(), flush=True)\ni = 0\n"
        "while not os.path.exists(sys.argv[1]) and i < 600:\n"
        "    print('step', i, flush=True); i += 1; time.sleep(0.2)\n"
        "print('step 5 and done', flush=True)\n"
    )
    argv = [HOST_PY, "-c", script, str(go)]
    cfg = host_config(sshd, root, port=relay.port)
    lines: list[str] = []

    def cut_when_running() -> None:
        while not any(s.startswith("step 1") for s in lines):
            time.sleep(0.05)
        relay.cut()

    threading.Thread(target=cut_when_running, daemon=True).start()
    with SshHost(cfg) as host, pytest.raises(ConnectionLost):
        host.run_job(str(job_dir), argv, log=lines.append, owner="flow-1", attempt="task-1")
    assert jobs.Job(job_dir).running()  # the job outlived the connection

    again: list[str] = []

    def finish_once_reattached() -> None:
        deadline = time.monotonic() + 120  # a safety cap: the job ends by itself after 600 x 0.2 s
        while not any("re-attached" in s for s in again) and time.monotonic() < deadline:
            time.sleep(0.05)
        go.touch()

    threading.Thread(target=finish_once_reattached, daemon=True).start()
    with SshHost(cfg) as host:
        host.run_job(str(job_dir), argv, log=again.append, owner="flow-1", attempt="task-1")
    assert any("re-attached" in s for s in again)
    assert any("step 5 and done" in s for s in again)
    log = (job_dir / "stage.log").read_text()
    assert log.count("pid ") == 1 and log.count("step 5 and done") == 1
    assert jobs.Job(job_dir).status()["returncode"] == 0


def test_stop_ends_the_job_group_and_nothing_else(sshd, root):
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)  # ours, outside the job
    job_dir = root / "stoppable"
    cfg = host_config(sshd, root)
    done = threading.Event()

    def run() -> None:
        with SshHost(cfg) as host, pytest.raises(StageFailed):
            host.run_job(str(job_dir), ["sh", "-c", "sleep 300 & sleep 300 & wait"], log=lambda s: None)
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    # The supervisor takes job.lock before it writes job.pid (the registry entry comes between):
    # wait for both, as `start` does, or the pid may not be there yet.
    while not (jobs.Job(job_dir).running() and jobs.Job(job_dir).pid()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pgid = jobs.Job(job_dir).pid()
    assert pgid and group_alive(pgid)
    start = time.monotonic()
    with SshHost(cfg) as host:
        result = host.stop_job(str(job_dir), grace_s=5)
    assert result["stopped"] and not group_alive(pgid)
    assert time.monotonic() - start < 10
    assert alive(bystander.pid)
    assert done.wait(20)  # the follower saw the end and reported the failure
    bystander.terminate()
    bystander.wait()


def test_unknown_host_key_is_refused_once_naming_the_key_and_the_fix(sshd, relay, root, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as err:
        SshHost(host_config(sshd, root, port=relay.port, known_hosts=str(empty))).connect()
    msg = str(err.value)
    assert "unknown ssh-ed25519 host key SHA256:" in msg and str(empty) in msg and "ssh-keyscan" in msg
    assert relay.accepted == 1  # refused at once, not retried


def test_changed_host_key_is_refused(sshd, root, tmp_path):
    other = tmp_path / "other"
    keygen(other)
    kind, key, _ = Path(f"{other}.pub").read_text().split(maxsplit=2)
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        SshHost(host_config(sshd, root, known_hosts=str(wrong))).connect()


def test_wrong_key_fails_once_with_an_authentication_error(sshd, relay, root, tmp_path):
    stranger = tmp_path / "stranger"
    keygen(stranger)
    with pytest.raises(HostAuthError) as err:
        SshHost(host_config(sshd, root, port=relay.port, key_path=str(stranger))).connect()
    assert "refused authentication" in str(err.value) and str(stranger) in str(err.value)
    assert relay.accepted == 1  # no retry storm
    with pytest.raises(HostAuthError, match="host.key_path"):
        SshHost(host_config(sshd, root, key_path=str(tmp_path / "missing"))).connect()


def test_unreachable_host_is_retried_with_backoff_then_named(sshd, root):
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(HostUnreachable) as err:
        SshHost(host_config(sshd, root, port=port, connect_attempts=3)).connect()
    assert 2.5 < time.monotonic() - start < 15  # waited 1 s + 2 s between the three attempts
    assert f"127.0.0.1:{port}" in str(err.value) and "3 attempts" in str(err.value)


def test_the_lease_admits_one_run_whoever_started_it(sshd, root):
    cfg = host_config(sshd, root)
    with SshHost(cfg) as a, a.lease("flow-A", "pipeline a"):
        with SshHost(cfg) as b, pytest.raises(HostBusy, match="flow-A"):
            with b.lease("flow-B", "pipeline b"):
                pass
        # A run outside Prefect on the host itself meets the same lease.
        with pytest.raises(HostBusy, match="pipeline a"):
            with LocalHost("loopback", work_root=str(root)).lease("manual", "by hand"):
                pass
        # And a job of another run is refused while the lease is held.
        with SshHost(cfg) as b, pytest.raises(HostBusy):
            b.run_job(str(root / "intruder"), ["true"], log=lambda s: None, owner="flow-B", attempt="x")
    with SshHost(cfg) as b, b.lease("flow-B", "pipeline b"):
        pass  # free again once the holder's channel closed


def test_a_dead_controller_frees_the_lease(sshd, root):
    """The holder on the host lives only as long as the controller's channel."""
    script = (
        "import sys, time\nfrom eagleflow.config import HostConfig\nfrom eagleflow.hosts.ssh import SshHost\n"
        "h = SshHost(HostConfig.model_validate_json(sys.argv[1]))\n"
        "with h.lease('flow-dead', 'doomed'):\n    print('held', flush=True); time.sleep(300)\n"
    )
    cfg = host_config(sshd, root)
    proc = subprocess.Popen(
        [os.sys.executable, "-c", script, cfg.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "held"
    assert jobs.lease_holder(root)["owner"] == "flow-dead"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while jobs.lease_holder(root) is not None:
        assert time.monotonic() < deadline, "the lease outlived its controller"
        time.sleep(0.1)


def test_a_lease_lost_with_its_link_is_taken_back(sshd, relay, root):
    said: list[str] = []
    with SshHost(host_config(sshd, root, port=relay.port)) as host, host.lease("flow-A", "pipeline a", log=said.append):
        first = jobs.lease_holder(root)
        relay.cut()
        deadline = time.monotonic() + 30
        while True:
            holder = jobs.lease_holder(root)
            # Between a new holder's flock and its owner record the holder reads as {"owner": "unknown"}.
            if holder and holder.get("pid") not in (None, first["pid"]):
                break
            assert time.monotonic() < deadline, f"the lease was not taken back: {said}"
            time.sleep(0.2)
        assert holder["owner"] == "flow-A"
        # the keeper says so once _take_lease returned, which is after the host shows the new holder: a moment later
        while not any("held again" in s for s in said):
            assert time.monotonic() < deadline, f"no 'held again' line: {said}"
            time.sleep(0.1)
    deadline = time.monotonic() + 15
    while jobs.lease_holder(root) is not None:  # released at the end of the block
        assert time.monotonic() < deadline
        time.sleep(0.1)


TIMEOUT_FLOW = """
import json, sys
from prefect import flow
from eagleflow.config import HostConfig
from eagleflow.hosts.ssh import SshHost

@flow(timeout_seconds=15)  # well after the job has started, even on a loaded machine (a connect takes under 1 s)
def bounded(cfg: str, job_dir: str) -> None:
    with SshHost(HostConfig.model_validate_json(cfg)) as host:
        host.run_job(job_dir, ["sh", "-c", "sleep 120 & sleep 120 & wait"], log=print)

state = bounded(sys.argv[1], sys.argv[2], return_state=True)
print("STATE", state.type.value)
"""


def test_a_flow_run_timeout_ends_the_remote_job(prefect_server, sshd, root):
    cfg = host_config(sshd, root)
    proc = subprocess.run(
        [sys.executable, "-c", TIMEOUT_FLOW, cfg.model_dump_json(), str(root / "job")],
        cwd=ROOT,
        env={**os.environ, **prefect_server},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "STATE FAILED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = jobs.Job(root / "job")
    assert job.pid() is not None, "the job never started before the flow's timeout"
    assert job.status()["state"] == "exited" and not job.running()  # stopped on the way out, not left running
    assert not group_alive(job.pid())
