"""A GPU host set up wrong, met the way a user meets it: the benchmark-only flow (`python -m flows.benchmark`)
against a real sshd on 127.0.0.1 configured that way, with a real Prefect server.

Permanent faults (no retry can mend them) fail at first contact, in seconds, with no retry, in three lines
that name the fix: a login shell that prints, host.python missing or without eagleflow, no permission on
host.work_root, a full disk. An sshd without the sftp subsystem is not a fault: files go over plain commands
and the flow's first stage runs. The transient ones (a cut link, a restarted sshd) are still retried and
re-attached: tests/e2e/hosts/test_ssh.py and tests/e2e/flows/test_pipeline_ssh.py.

Each case prints one line of the table in the closing note: the fault, the seconds to fail, the message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from eagleflow.config import HostConfig
from eagleflow.hosts import HostSetupError
from eagleflow.hosts.ssh import SshHost
from tests.conftest import ROOT
from tests.e2e.conftest import api
from tests.sshd import Sshd, start_sshd

pytestmark = pytest.mark.e2e

HOST_PY = str(ROOT / ".hostenv" / "bin" / "python")
ROOTED = os.geteuid() == 0


def host_config(sshd, work_root: Path, **kw) -> HostConfig:
    fields = dict(
        kind="ssh",
        name="loopback",
        address="127.0.0.1",
        port=sshd.port,
        key_path=str(sshd.user_key),
        known_hosts=str(sshd.known_hosts),
        work_root=str(work_root),
        python=HOST_PY,
    )
    return HostConfig(**{**fields, **kw})


def run_benchmark_flow(prefect_server, sshd, tmp_path: Path, work_root: Path, **host: object) -> dict:
    """`python -m flows.benchmark` against the host; its exit status, its `error:` lines, and the flow run as
    Prefect recorded it (seconds from its start to its end, each task run's attempts)."""
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = f"faults-{tmp_path.name}"[:60]
    data["host"].update(
        kind="ssh",
        name="loopback",
        address="127.0.0.1",
        port=sshd.port,
        key_path=str(sshd.user_key),
        known_hosts=str(sshd.known_hosts),
        work_root=str(work_root),
        **{"python": HOST_PY, **host},
    )
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["generate"]["prompts_path"] = str(ROOT / "demo" / "prompts.jsonl")
    data["report_dir"] = str(tmp_path / "reports")
    config = tmp_path / "faults.yaml"
    config.write_text(yaml.safe_dump(data))
    # A directory that is no drafter: it exists, so the command line's own check (a drafter named there must exist)
    # passes and the run goes on to the host's first contact, where each fault here is to be named.
    (tmp_path / "no-drafter").mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.benchmark", str(config), "--drafter", str(tmp_path / "no-drafter")],
        cwd=ROOT,
        env={**os.environ, **prefect_server},
        capture_output=True,
        text=True,
        timeout=600,
    )
    runs = api(
        prefect_server,
        "POST",
        "/flow_runs/filter",
        json={"sort": "START_TIME_DESC", "limit": 5, "flows": {"name": {"any_": ["benchmark"]}}},
    ).json()
    run = next(r for r in runs if r["parameters"]["params"]["config_path"] == str(config))
    tasks = api(prefect_server, "POST", "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    start, end = (datetime.fromisoformat(run[k]) for k in ("start_time", "end_time"))
    error = proc.stdout[proc.stdout.find("error: ") :] if "error: " in proc.stdout else ""
    return {
        "rc": proc.returncode,
        "error": error.strip(),
        "run": run,
        "seconds": (end - start).total_seconds(),
        "tasks": {t["name"]: t for t in tasks},
        "out": proc.stdout[-4000:] + proc.stderr[-4000:],
    }


def assert_fails_at_first_contact(result: dict, *expected: str) -> None:
    """Failed within 10 s of the flow's start, no task attempted twice, three lines naming the fix."""
    assert result["rc"] == 1 and result["run"]["state"]["type"] == "FAILED", result["out"]
    message = result["run"]["state"]["message"]
    lines = message.splitlines()
    assert len(lines) <= 3 and any(x.startswith("fix: ") for x in lines), message
    for text in expected:
        assert text in message, (text, message)
    assert all(t["run_count"] <= 1 for t in result["tasks"].values()), {
        n: t["run_count"] for n, t in result["tasks"].items()
    }
    assert result["seconds"] < 10, result["seconds"]
    cli = result["error"].splitlines()
    assert len(cli) <= 3 and cli[0].startswith("error: the flow run ended Failed: "), result["error"]
    print(
        f"\nFAULT | {result['seconds']:.1f} s | attempts "
        f"{max([t['run_count'] for t in result['tasks'].values()] or [0])} | {' / '.join(lines)}"
    )


@pytest.fixture(scope="module")
def plain_sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd-plain"))
    yield server
    server.stop()


def test_a_login_shell_that_prints_is_named_at_first_contact(prefect_server, tmp_path):
    # A banner from the shell's startup files before every command, as `echo` in ~/.bashrc does: the sftp
    # subsystem and every command's output get it first.
    login = tmp_path / "noisy-login"
    login.write_text(
        '#!/bin/sh\necho "Welcome to gpu-7. Unauthorized access is prohibited."\n'
        'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
    )
    login.chmod(0o755)
    sshd = start_sshd(tmp_path / "sshd", sftp="/usr/lib/openssh/sftp-server", extra=f"ForceCommand {login}\n")
    try:
        result = run_benchmark_flow(prefect_server, sshd, tmp_path, tmp_path / "work")
    finally:
        sshd.stop()
    assert_fails_at_first_contact(
        result, "prints to standard output before every command", "Welcome to gpu-7", "~/.bashrc"
    )


def test_host_python_missing_is_named_at_first_contact(prefect_server, plain_sshd, tmp_path):
    result = run_benchmark_flow(
        prefect_server, plain_sshd, tmp_path, tmp_path / "work", python="/opt/nowhere/bin/python"
    )
    assert_fails_at_first_contact(result, "host.python /opt/nowhere/bin/python does not exist", "eagleflow bootstrap")


def test_host_python_without_eagleflow_is_named_at_first_contact(prefect_server, plain_sshd, tmp_path):
    bare = shutil.which("python3", path="/usr/bin:/bin")
    assert bare and subprocess.run([bare, "-c", "import eagleflow"], cwd="/", capture_output=True).returncode != 0
    result = run_benchmark_flow(prefect_server, plain_sshd, tmp_path, tmp_path / "work", python=bare)
    assert_fails_at_first_contact(result, "is not an environment with eagleflow installed", "No module named")


NEEDS_SETPRIV = pytest.mark.skipif(
    not shutil.which("setpriv") and ROOTED, reason="root needs setpriv to drop its override"
)


@contextlib.contextmanager
def locked_sshd(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """An sshd whose sessions may not write in the directory it yields (mode 0555). As root the sshd runs
    without CAP_DAC_OVERRIDE (a root that bypasses permissions meets none); the mode is restored after."""
    wrap = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if ROOTED else None
    sshd = start_sshd(tmp_path / "sshd", wrap=wrap)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        yield sshd, locked
    finally:
        locked.chmod(0o755)
        sshd.stop()


@NEEDS_SETPRIV
def test_no_permission_on_work_root_is_named_at_first_contact(prefect_server, tmp_path):
    with locked_sshd(tmp_path) as (sshd, locked):
        result = run_benchmark_flow(prefect_server, sshd, tmp_path, locked / "eagleflow")
    assert_fails_at_first_contact(result, "may not write under host.work_root", "chown -R")


@pytest.mark.skipif(not ROOTED, reason="a small filesystem for the sshd's sessions needs a mount namespace of root's")
def test_a_full_disk_is_named_at_first_contact(prefect_server, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # The sshd and its sessions see a 1 MiB tmpfs at `disk` (a mount namespace of their own), then it is filled.
    wrap = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o size=1m tmpfs "$1" && shift && exec "$@"',
        "sh",
        str(disk),
    ]
    sshd = start_sshd(tmp_path / "sshd", wrap=wrap)
    try:
        with SshHost(host_config(sshd, disk / "eagleflow")) as host:
            host.exec(["sh", "-c", f"head -c 4000000 /dev/zero > {disk}/filler"])
            rc, out, _ = host.exec(["df", "-Pk", str(disk)])
            assert rc == 0 and out.splitlines()[-1].split()[3] == "0", out  # the sessions' disk is full
        result = run_benchmark_flow(prefect_server, sshd, tmp_path, disk / "eagleflow")
    finally:
        sshd.stop()
    assert_fails_at_first_contact(result, "is full", "host.work_root")


@NEEDS_SETPRIV
def test_a_write_refused_for_permission_names_the_directory_and_the_fix(tmp_path):
    """The same refusal met by a file write (a request, a copied wheel), not job control: named, not a lost link."""
    with locked_sshd(tmp_path) as (sshd, locked), SshHost(host_config(sshd, locked)) as host:
        t0 = time.monotonic()
        with pytest.raises(HostSetupError) as err:
            host.write_text(str(locked / "stage" / "request.json"), "{}")
        took = time.monotonic() - t0
    assert "may not write in" in str(err.value) and "fix: " in str(err.value) and took < 10, (took, str(err.value))


def test_without_the_sftp_subsystem_files_go_over_commands_and_the_flow_runs(prefect_server, tmp_path):
    """A hardened sshd (no `Subsystem sftp`): every file operation works over plain commands, and the flow's
    first stage (check) runs there; the flow then fails on what it was given (no drafter), not on the host."""
    sshd = start_sshd(tmp_path / "sshd", sftp=None)
    work = tmp_path / "work"
    try:
        with SshHost(host_config(sshd, work)) as host:
            target = work / "a b" / "it's.json"  # names a shell would split or unquote
            host.write_text(str(target), '{"x": 1}\n')
            assert host.no_sftp and target.read_text() == '{"x": 1}\n'
            assert host.exists(str(target)) and not host.exists(str(work / "none"))
            assert host.read_text(str(target)) == '{"x": 1}\n'
            blob = tmp_path / "blob.bin"
            blob.write_bytes(os.urandom(3 << 20) + b"\n\x00end")
            host.put_file(str(blob), str(work / "w" / "blob.bin"))
            assert (work / "w" / "blob.bin").read_bytes() == blob.read_bytes()
            assert host.tail(str(target)) == ['{"x": 1}']
            with pytest.raises(FileNotFoundError):
                host.read_bytes(str(work / "none"))
            assert sorted(p.name for p in (work / "a b").iterdir()) == ["it's.json"]  # no temporary left
        result = run_benchmark_flow(prefect_server, sshd, tmp_path, work)
    finally:
        sshd.stop()
    assert "subsystem request for sftp" in (tmp_path / "sshd" / "sshd.log").read_text()
    assert result["tasks"]["check"]["state"]["type"] == "COMPLETED", result["out"]
    assert result["rc"] == 1 and "no-drafter" in result["run"]["state"]["message"], result["run"]["state"]


def test_a_restarted_sshd_with_the_link_dropped_is_retried_and_the_job_reattached(tmp_path):
    """Transient, so retried: the link drops and the sshd restarts (down 3 s) while a job runs. The job goes on;
    the retry is refused while the sshd is down, reconnects with backoff once it is back, and re-attaches.
    One process ever ran the job."""
    from eagleflow.hosts import ConnectionLost, jobs
    from tests.sshd import Relay

    sshd = start_sshd(tmp_path / "sshd")
    relay = Relay(sshd.port)
    sshd.trust_port(relay.port)
    job_dir = tmp_path / "work" / "long"
    script = (
        "import os, time\nprint('pid', os.getpid(), flush=True)\n"
        "for i in range(40):\n    print('step', i, flush=True); time.sleep(0.5)\n"
    )
    argv = [HOST_PY, "-c", script]
    cfg = host_config(sshd, tmp_path / "work", port=relay.port, connect_attempts=6)
    lines: list[str] = []
    restarted = threading.Event()

    def restart_when_running() -> None:
        while not any(s.startswith("step 1") for s in lines):
            time.sleep(0.05)
        relay.cut()
        sshd.restart(down_s=3.0)
        restarted.set()

    try:
        threading.Thread(target=restart_when_running, daemon=True).start()
        with SshHost(cfg) as host, pytest.raises(ConnectionLost):
            host.run_job(str(job_dir), argv, log=lines.append, owner="flow-1", attempt="task-1")
        assert not restarted.is_set() and jobs.Job(job_dir).running()  # the retry starts while the sshd is down
        t0 = time.monotonic()
        again: list[str] = []
        seen: dict[str, float] = {}

        def follow(line: str) -> None:
            again.append(line)
            seen.setdefault(line.split()[0], time.monotonic() - t0)

        with SshHost(cfg) as host:
            host.run_job(str(job_dir), argv, log=follow, owner="flow-1", attempt="task-1")
        took = seen["re-attached"]
    finally:
        relay.close()
        sshd.stop()
    assert restarted.is_set() and any("re-attached" in s for s in again), again[:5]
    log = (job_dir / "stage.log").read_text()
    assert log.count("pid ") == 1 and log.count("step 39") == 1
    assert jobs.Job(job_dir).status()["returncode"] == 0
    print(f"\nTRANSIENT | sshd restarted (down 3 s) with the link cut | re-attached {took:.1f} s after the retry began")
