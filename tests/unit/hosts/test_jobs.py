"""Host-side job control (eagleflow.hosts.jobs) on this machine: start, re-attach rules, stop, registry, lease.
Real supervisor and stage processes; their process groups are looked at through /proc."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from eagleflow.hosts import jobs
from tests.helpers.procs import group_alive


def spec(root: Path, argv: list[str], owner: str = "flow-1", attempt: str = "task-1") -> dict:
    return {"argv": argv, "env": {}, "owner": owner, "attempt": attempt, "root": str(root)}


def wait_ended(job: jobs.Job, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while job.running():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return job.status()


def test_a_job_runs_detached_and_records_how_it_ended(tmp_path):
    d = tmp_path / "j"
    started = jobs.start(d, spec(tmp_path, [sys.executable, "-c", "import os; print(os.getpgrp(), os.getsid(0))"]))
    assert started["state"] == "started"
    status = wait_ended(jobs.Job(d))
    assert status["state"] == "exited" and status["returncode"] == 0
    pgrp, sid = map(int, (d / "stage.log").read_text().split())
    assert pgrp == sid == started["pid"]  # the stage is in the supervisor's own session and group
    assert pgrp != os.getpgrp()


def test_start_never_runs_two_copies_and_reruns_only_what_failed_before(tmp_path):
    d = tmp_path / "j"
    slow = [sys.executable, "-c", "import time; print('run', flush=True); time.sleep(1.5)"]
    first = jobs.start(d, spec(tmp_path, slow))
    again = jobs.start(d, spec(tmp_path, slow, attempt="task-2"))  # a new flow run while it still runs
    assert again["state"] == "running" and again["pid"] == first["pid"]
    wait_ended(jobs.Job(d))
    assert jobs.start(d, spec(tmp_path, slow))["state"] == "exited"  # done: nothing reruns
    assert (d / "stage.log").read_text().count("run") == 1

    f = tmp_path / "fails"
    failing = [sys.executable, "-c", "raise SystemExit(5)"]
    jobs.start(f, spec(tmp_path, failing))
    assert wait_ended(jobs.Job(f))["returncode"] == 5
    same = jobs.start(f, spec(tmp_path, failing))  # the retry of the same attempt reports the failure
    assert same["state"] == "exited" and same["returncode"] == 5
    assert jobs.start(f, spec(tmp_path, failing, attempt="task-9"))["state"] == "started"  # a new attempt reruns it


def test_a_killed_job_counts_as_vanished_and_is_started_again(tmp_path):
    d = tmp_path / "j"
    started = jobs.start(d, spec(tmp_path, ["sleep", "60"]))
    os.killpg(started["pid"], signal.SIGKILL)
    assert wait_ended(jobs.Job(d))["state"] == "vanished"
    assert jobs.running_jobs(tmp_path) == []  # its stale registry entry is dropped
    again = jobs.start(d, spec(tmp_path, ["true"]))
    assert again["state"] == "started"
    assert wait_ended(jobs.Job(d))["returncode"] == 0
    assert "starting again (vanished before)" in (d / "stage.log").read_text()


def test_stop_signals_only_a_live_job_of_its_own(tmp_path):
    d = tmp_path / "j"
    jobs.start(d, spec(tmp_path, ["sh", "-c", "sleep 60 & sleep 60 & wait"]))
    assert len(jobs.running_jobs(tmp_path)) == 1
    result = jobs.stop(d, grace_s=3)
    assert result["stopped"] and not jobs.Job(d).running()
    assert jobs.Job(d).status()["state"] == "exited"
    # A pid file naming a live process that is not our job (this test process): never signalled.
    e = tmp_path / "stale"
    e.mkdir()
    (e / "job.pid").write_text(str(os.getpid()))
    assert jobs.stop(e)["stopped"] is False


def test_stop_owner_ends_the_jobs_of_one_flow_run(tmp_path):
    first = jobs.start(tmp_path / "a", spec(tmp_path, ["sleep", "60"], owner="flow-1"))
    second = jobs.start(tmp_path / "b", spec(tmp_path, ["sleep", "60"], owner="flow-1", attempt="t2"))
    other_root = tmp_path / "other"
    other = jobs.start(other_root / "c", spec(other_root, ["sleep", "60"], owner="flow-2"))
    assert all(group_alive(j["pid"]) for j in (first, second, other))
    result = jobs.stop_owner(tmp_path, "flow-1", grace_s=2)
    assert sorted(result["stopped"]) == sorted([str(tmp_path / "a"), str(tmp_path / "b")])
    # Each stopped job's whole process group (supervisor and stage) is gone, and its stage ended by the
    # SIGTERM (the supervisor outlives it to record that); the other flow run's job was not touched.
    for job in (first, second):
        assert not group_alive(job["pid"]), f"job group {job['pid']} outlived stop_owner"
        status = jobs.Job(job["job_dir"]).status()
        assert (status["state"], status["returncode"]) == ("exited", -signal.SIGTERM), status
    assert jobs.running_jobs(tmp_path) == []
    assert jobs.Job(other_root / "c").running() and group_alive(other["pid"])
    assert [j["owner"] for j in jobs.running_jobs(other_root)] == ["flow-2"]
    jobs.stop(other_root / "c", grace_s=2)
    assert not group_alive(other["pid"])


def test_follow_streams_until_the_job_ends(tmp_path):
    d = tmp_path / "j"
    jobs.start(
        d, spec(tmp_path, [sys.executable, "-u", "-c", "import time\nfor i in range(3):\n print(i); time.sleep(0.2)"])
    )
    out = io.BytesIO()
    assert jobs.follow(d, out=out) == 0
    assert out.getvalue().split() == [b"0", b"1", b"2"]


def test_the_lease_is_exclusive_and_blocks_jobs_of_other_runs(tmp_path):
    lease = jobs.Lease(tmp_path, "flow-1", "pipeline demo")
    with pytest.raises(jobs.LeaseHeld, match="pipeline demo"):
        jobs.Lease(tmp_path, "flow-2", "pipeline other")
    busy = jobs.start(tmp_path / "x", spec(tmp_path, ["true"], owner="flow-2"))
    assert busy["state"] == "busy" and "flow-1" in busy["message"]
    assert not (tmp_path / "x" / "job.json").exists()
    assert jobs.start(tmp_path / "y", spec(tmp_path, ["sleep", "30"], owner="flow-1"))["state"] == "started"
    lease.release()
    # Lease free, but flow-1's job still runs: flow-2 may not take the host.
    with pytest.raises(jobs.LeaseHeld, match="still running"):
        jobs.Lease(tmp_path, "flow-2", "pipeline other")
    jobs.stop(tmp_path / "y", grace_s=2)
    jobs.Lease(tmp_path, "flow-2", "pipeline other").release()


def test_holder_says_who_holds_the_lease_and_when_it_is_free(tmp_path, capsys):
    # what a queued run asks of the host before it takes back a slot whose holder died (flows/host_slot.py)
    assert jobs.main(["holder", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"holder": None}
    lease = jobs.Lease(tmp_path, "flow-1", "pipeline demo")
    jobs.main(["holder", str(tmp_path)])
    assert json.loads(capsys.readouterr().out)["holder"]["owner"] == "flow-1"
    lease.release()
    jobs.main(["holder", str(tmp_path)])
    assert json.loads(capsys.readouterr().out) == {"holder": None}


def test_cli_prints_one_json_line(tmp_path, capsys):
    assert jobs.main(["status", str(tmp_path / "nothing")]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "absent"


def test_secrets_come_on_stdin_by_name_only():
    import io

    spec = {"secret_env": ["EAGLEFLOW_PRODUCTION_API_KEY"]}
    assert jobs.read_secrets(spec, io.StringIO('{"EAGLEFLOW_PRODUCTION_API_KEY": "k"}\n')) == {
        "EAGLEFLOW_PRODUCTION_API_KEY": "k"
    }
    assert jobs.read_secrets({}, io.StringIO("ignored")) == {}
    with pytest.raises(ValueError, match="EAGLEFLOW_PRODUCTION_API_KEY"):
        jobs.read_secrets(spec, io.StringIO('{"OTHER": "k"}\n'))


def test_a_secret_reaches_the_stage_but_no_file(tmp_path):
    d = tmp_path / "job"
    spec = {
        "argv": [sys.executable, "-c", "import os; print(len(os.environ['S_KEY']))"],
        "root": str(tmp_path),
        "secret_env": ["S_KEY"],
    }
    jobs.start(d, spec, {"S_KEY": "sk-0123456789"})
    deadline = time.monotonic() + 30
    while not (d / "job.exit").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (d / "stage.log").read_text().strip() == "13"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and b"sk-0123456789" in p.read_bytes()]
