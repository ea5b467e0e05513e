"""Detached jobs on the host: the host-side half of the SSH host. Standard library only
(and eagleflow's own standard-library helpers: files, locks, procs).

A stage on a GPU host runs for hours; the SSH connection that started it must be free to drop. So
the stage runs under a small supervisor in a session of its own, and everything the controller
needs to find it again lives in files in the job's directory:

    job.json   what was started: argv, env, owner (the flow run), attempt (the task run); a secret
               (production's API key) only by name: its value comes on `run`'s stdin and lives
               in the supervisor's and the stage's environment, never in a file
    job.pid    the supervisor's pid, which is also the process group and session id
    job.lock   flock held by the supervisor for as long as it lives: the liveness test, immune to pid reuse
    job.exit   {"returncode": ...}, written atomically when the stage ends
    stage.log  the stage's stdout and stderr

and a registry under `<work_root>/.eagleflow/jobs/` lets a cancellation find every job of a flow
run. `<work_root>/.eagleflow/host.lock` is the host lease: one pipeline at a time, whoever starts it.

    python -m eagleflow.hosts.jobs run JOB_DIR SPEC_JSON     start (or re-attach), follow, report: one round trip
    python -m eagleflow.hosts.jobs start JOB_DIR SPEC_JSON   start, or report the job already there
    python -m eagleflow.hosts.jobs follow JOB_DIR [--tail N]  stream the log until the job ends
    python -m eagleflow.hosts.jobs status JOB_DIR
    python -m eagleflow.hosts.jobs stop JOB_DIR [--grace S]   end this job's process group, only it
    python -m eagleflow.hosts.jobs stop-owner ROOT OWNER      end every job of a flow run
    python -m eagleflow.hosts.jobs lease ROOT OWNER [--what]  hold the host lease until stdin closes
    python -m eagleflow.hosts.jobs holder ROOT                who holds the host lease ({"holder": null}: free)

Each command prints one JSON line, except `follow` and `run`, which print the log on stdout (`run`
puts its JSON lines, how it started and how the job ended, on stderr); exit 3 means busy.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagleflow import EagleflowError
from eagleflow.util.files import read_json, write_json_atomic, write_text_atomic
from eagleflow.util.locks import exclusive, is_held, try_lock
from eagleflow.util.procs import terminate

BUSY = 3  # exit status: the host is leased, or a job of another run is running
VANISHED = 4  # exit status of `follow`: the job died without an exit status (SIGKILL, reboot)

STATE_DIR = ".eagleflow"


class Job:
    """The files of one job directory."""

    def __init__(self, job_dir: str | Path):
        self.dir = Path(job_dir)
        self.spec_path = self.dir / "job.json"
        self.pid_path = self.dir / "job.pid"
        self.lock_path = self.dir / "job.lock"
        self.exit_path = self.dir / "job.exit"
        self.log_path = self.dir / "stage.log"

    def spec(self) -> dict[str, Any] | None:
        return read_json(self.spec_path)

    def running(self) -> bool:
        return is_held(self.lock_path)

    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def exit(self) -> dict[str, Any] | None:
        return read_json(self.exit_path)

    def status(self) -> dict[str, Any]:
        spec = self.spec() or {}
        base = {"job_dir": str(self.dir), "pid": self.pid(), "owner": spec.get("owner"), "attempt": spec.get("attempt")}
        if self.running():
            return {**base, "state": "running"}
        ended = self.exit()
        if ended is not None:
            return {**base, "state": "exited", **ended}
        if self.pid_path.exists():
            return {**base, "state": "vanished"}
        return {**base, "state": "absent"}


# -- the registry and the host lease ------------------------------------------------------------


def _state_dir(root: str | Path) -> Path:
    d = Path(root) / STATE_DIR
    (d / "jobs").mkdir(parents=True, exist_ok=True)
    return d


def _registry_entry(root: str | Path, job_dir: Path) -> Path:
    digest = hashlib.sha256(str(job_dir.resolve()).encode()).hexdigest()[:16]
    return _state_dir(root) / "jobs" / f"{digest}.json"


def running_jobs(root: str | Path) -> list[dict[str, Any]]:
    """Jobs under root whose supervisor is alive; stale entries (a SIGKILLed supervisor) are dropped."""
    found = []
    for entry in sorted((_state_dir(root) / "jobs").glob("*.json")):
        info = read_json(entry)
        if not info:
            continue
        job = Job(info["job_dir"])
        if job.running():
            found.append(job.status())
        else:
            entry.unlink(missing_ok=True)
    return found


def lease_holder(root: str | Path) -> dict[str, Any] | None:
    """Who holds the host lease, or None when it is free."""
    d = _state_dir(root)
    if not is_held(d / "host.lock"):
        return None
    return read_json(d / "host.owner.json") or {"owner": "unknown"}


def conflicts(root: str | Path, owner: str) -> dict[str, Any] | None:
    """Why `owner` may not use the host now: another run's lease, or another run's job still running."""
    holder = lease_holder(root)
    if holder and holder.get("owner") != owner:
        return {"lease": holder}
    for job in running_jobs(root):
        if job.get("owner") != owner:
            return {"job": job}
    return None


class Lease:
    """The host lease held in this process (an open flock); `release()` or process exit frees it."""

    def __init__(self, root: str | Path, owner: str, what: str, wait_same_owner_s: float = 30.0):
        d = _state_dir(root)
        self.owner_path = d / "host.owner.json"
        deadline = time.monotonic() + wait_same_owner_s
        while True:
            fd = try_lock(d / "host.lock")  # rides out another process's is_held probe
            if fd is not None:
                self.fd = fd
                break
            holder = read_json(self.owner_path) or {"owner": "unknown"}
            # The same flow run re-leasing after a dropped connection: its old holder goes as soon as
            # sshd notices the connection is gone.
            if holder.get("owner") == owner and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise LeaseHeld({"lease": holder})
        other = next((j for j in running_jobs(root) if j.get("owner") != owner), None)
        if other:
            os.close(self.fd)
            raise LeaseHeld({"job": other})
        self.info = {"owner": owner, "what": what, "pid": os.getpid(), "since": time.time()}
        write_json_atomic(self.owner_path, self.info)

    def release(self) -> None:
        if self.fd >= 0:
            if (read_json(self.owner_path) or {}).get("pid") == self.info["pid"]:
                self.owner_path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = -1


class LeaseHeld(EagleflowError):
    """Another owner holds the host: its lease, or a job of its still running. The host layer says so with the
    host's name (`eagleflow.hosts.HostBusy`)."""

    def __init__(self, detail: dict[str, Any]):
        self.detail = detail
        super().__init__(describe_busy(detail))


def describe_busy(detail: dict[str, Any]) -> str:
    if "lease" in detail:
        h = detail["lease"]
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h["since"])) if h.get("since") else "?"
        who = h.get("what") or "another run"
        return f"the host is leased by {who} (owner {h.get('owner')}, pid {h.get('pid')}, since {since})"
    j = detail.get("job", {})
    return f"a job of another run is still running: {j.get('job_dir')} (pid {j.get('pid')}, owner {j.get('owner')})"


# -- commands -----------------------------------------------------------------------------------


def read_secrets(spec: dict[str, Any], stream: Any) -> dict[str, str]:
    """The values of spec["secret_env"] (names), one JSON line on `stream`; {} when there are none."""
    names = spec.get("secret_env") or []
    if not names:
        return {}
    values = json.loads(stream.readline() or "{}")
    if not isinstance(values, dict) or sorted(values) != sorted(names):
        raise ValueError(f"expected the values of {sorted(names)} as one JSON line on stdin")
    return {str(k): str(v) for k, v in values.items()}


def start(job_dir: str | Path, spec: dict[str, Any], secrets: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the job, or report the one already there. Never two supervisors for one job dir.

    - running: attach to it, whoever started it (a retry after a dropped connection, or a new flow run
      after the old one crashed); a job's work is never done twice at once;
    - exited with returncode 0: done;
    - exited non-zero by this same attempt: report that failure (it is not retried behind our back);
    - exited non-zero by an earlier attempt, or vanished (killed): start again; stages resume from
      their finished units.
    """
    job = Job(job_dir)
    job.dir.mkdir(parents=True, exist_ok=True)
    with exclusive(job.dir / "start.lock"):
        status = job.status()
        if status["state"] == "running":
            return status
        if status["state"] == "exited" and (status["returncode"] == 0 or status["attempt"] == spec.get("attempt")):
            return status
        clash = conflicts(spec["root"], spec.get("owner", ""))
        if clash:
            return {"state": "busy", "detail": clash, "message": describe_busy(clash)}
        for p in (job.exit_path, job.pid_path):
            p.unlink(missing_ok=True)
        write_json_atomic(job.spec_path, spec)
        if status["state"] in ("exited", "vanished"):
            with open(job.log_path, "a") as f:
                f.write(f"--- eagleflow: starting again ({status['state']} before) ---\n")
        # The supervisor's own session: it and the stage form one group that outlives this connection.
        subprocess.Popen(
            [sys.executable, "-m", "eagleflow.hosts.jobs", "supervise", str(job.dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            cwd=str(job.dir),
            env={**os.environ, **(secrets or {})},
        )
        deadline = time.monotonic() + 30
        while not (job.pid_path.exists() and job.running()):
            if job.exit_path.exists():
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the supervisor of {job.dir} did not start within 30 s")
            time.sleep(0.01)
        return {**job.status(), "state": "started"}


def supervise(job_dir: str | Path) -> int:
    job = Job(job_dir)
    spec = job.spec()
    assert spec is not None, f"{job.spec_path} missing"
    lock_fd = os.open(job.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until we exit, whatever ends us
    # Registry entry first, job.pid last (atomically): `start` returns once job.pid is there, and by then
    # a cancellation (stop_owner) or another run's lease must already see this job.
    entry = _registry_entry(spec["root"], job.dir)
    write_json_atomic(entry, {"job_dir": str(job.dir), "owner": spec.get("owner"), "pid": os.getpid()})
    write_text_atomic(job.pid_path, str(os.getpid()))

    # A signal to the group reaches the stage itself; the supervisor stays to record how it ended.
    # (A Python handler, not SIG_IGN: handlers are reset in the child at exec, SIG_IGN would be inherited.)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    env = {**os.environ, **spec.get("env", {})}
    with open(job.log_path, "ab", buffering=0) as log:
        # The stage inherits the lock too: the job counts as running while either of them lives, so a
        # supervisor killed on its own never lets a second copy start beside an orphaned stage.
        proc = subprocess.Popen(
            spec["argv"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.get("cwd") or str(job.dir),
            pass_fds=(lock_fd,),
        )
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:
                continue
    write_json_atomic(job.exit_path, {"returncode": rc, "ended": time.time()})
    entry.unlink(missing_ok=True)
    return 0


def follow(job_dir: str | Path, tail_lines: int | None = None, out: Any = None) -> int:
    """Copy the log to stdout as it grows; return when the job has ended and the log is drained."""
    out = out or sys.stdout.buffer
    job = Job(job_dir)
    deadline = time.monotonic() + 30
    while not job.log_path.exists():
        if not job.running() and time.monotonic() > deadline:
            return VANISHED
        time.sleep(0.05)
    with open(job.log_path, "rb") as f:
        if tail_lines is not None:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().split(b"\n")[-tail_lines - 1 :]
            out.write(b"\n".join(lines))
            out.flush()
        # Poll, backing off to 0.1 s: ten cheap wake-ups a second for an hours-long stage, and a
        # short one is seen ending within tens of milliseconds.
        pause = 0.005
        while True:
            data = f.read(65536)
            if data:
                out.write(data)
                out.flush()
                pause = 0.005
                continue
            if not job.running():
                rest = f.read()
                if rest:
                    out.write(rest)
                    out.flush()
                return 0 if job.exit_path.exists() else VANISHED
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def run(job_dir: str | Path, spec: dict[str, Any], secrets: dict[str, str] | None = None) -> int:
    """start + follow + the final status in one process, so a stage costs one SSH round trip.

    stderr gets two JSON lines, {"start": <start's answer>} and {"end": <status>}; stdout the log (the
    last 20 lines first when re-attaching to a job that was already there).
    """
    started = start(job_dir, spec, secrets)
    print(json.dumps({"start": started}), file=sys.stderr, flush=True)
    if started["state"] == "busy":
        return BUSY
    rc = follow(job_dir, None if started["state"] == "started" else 20)
    print(json.dumps({"end": Job(job_dir).status()}), file=sys.stderr, flush=True)
    return rc


def stop(job_dir: str | Path, grace_s: float = 8.0) -> dict[str, Any]:
    """End this job's process group: SIGTERM, then SIGKILL after grace_s. Only a live job of ours.

    The pid comes from job.pid and is only signalled while job.lock is held: the supervisor holds it
    for its whole life, so a recycled pid is never hit.
    """
    job = Job(job_dir)
    pid = job.pid()
    if pid is None or not job.running():
        return {**job.status(), "stopped": False}

    def send(sig: signal.Signals) -> None:
        if job.running():  # the lock still held: the pid is still the supervisor's group
            os.killpg(pid, sig)

    terminate(send, job.running, grace_s, kill_wait_s=5.0)
    if not job.exit_path.exists():
        write_json_atomic(job.exit_path, {"returncode": -signal.SIGKILL, "ended": time.time(), "stopped": True})
    return {**job.status(), "stopped": True}


def stop_owner(root: str | Path, owner: str, grace_s: float = 8.0) -> dict[str, Any]:
    stopped = [stop(j["job_dir"], grace_s) for j in running_jobs(root) if j.get("owner") == owner]
    return {"owner": owner, "stopped": [s["job_dir"] for s in stopped if s.get("stopped")]}


def hold_lease(root: str | Path, owner: str, what: str) -> int:
    """Hold the host lease until stdin closes (the controller's SSH channel, or its process)."""
    try:
        lease = Lease(root, owner, what)
    except LeaseHeld as exc:
        print(json.dumps({"state": "busy", "detail": exc.detail, "message": str(exc)}), flush=True)
        return BUSY
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    print(json.dumps({"state": "held", **lease.info}), flush=True)
    try:
        while sys.stdin.buffer.read(1024):
            pass
    finally:
        lease.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagleflow.hosts.jobs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("job_dir")
    p.add_argument("spec")
    p = sub.add_parser("start")
    p.add_argument("job_dir")
    p.add_argument("spec")
    p = sub.add_parser("supervise")
    p.add_argument("job_dir")
    p = sub.add_parser("follow")
    p.add_argument("job_dir")
    p.add_argument("--tail", type=int)
    p = sub.add_parser("status")
    p.add_argument("job_dir")
    p = sub.add_parser("stop")
    p.add_argument("job_dir")
    p.add_argument("--grace", type=float, default=8.0)
    p = sub.add_parser("stop-owner")
    p.add_argument("root")
    p.add_argument("owner")
    p.add_argument("--grace", type=float, default=8.0)
    p = sub.add_parser("lease")
    p.add_argument("root")
    p.add_argument("owner")
    p.add_argument("--what", default="")
    p = sub.add_parser("holder")
    p.add_argument("root")
    args = parser.parse_args(argv)

    if args.cmd == "supervise":
        return supervise(args.job_dir)
    if args.cmd == "follow":
        return follow(args.job_dir, args.tail)
    if args.cmd == "run":
        spec = json.loads(args.spec)
        return run(args.job_dir, spec, read_secrets(spec, sys.stdin))
    if args.cmd == "lease":
        return hold_lease(args.root, args.owner, args.what)
    if args.cmd == "start":
        spec = json.loads(args.spec)
        result = start(args.job_dir, spec, read_secrets(spec, sys.stdin))
    elif args.cmd == "status":
        result = Job(args.job_dir).status()
    elif args.cmd == "stop":
        result = stop(args.job_dir, args.grace)
    elif args.cmd == "holder":
        result = {"holder": lease_holder(args.root)}
    else:
        result = stop_owner(args.root, args.owner, args.grace)
    print(json.dumps(result), flush=True)
    return BUSY if result.get("state") == "busy" else 0


if __name__ == "__main__":
    sys.exit(main())
