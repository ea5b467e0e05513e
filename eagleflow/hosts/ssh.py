"""The SSH host: stages run as detached jobs on a GPU host, followed over SSH, files moved by SFTP (or plain
commands where the sshd has none: eagleflow.hosts.ssh_files), over one verified connection
(eagleflow.hosts.ssh_link).

The host side is `eagleflow.hosts.jobs` (installed there with the project wheel): a job outlives the
connection that started it, and a retry of the same stage re-attaches to it instead of starting a
second copy. Only what the controller needs crosses the wire: requests, manifests, log lines.

Errors are distinct because the right reaction differs: an unknown or changed host key
(`HostKeyError`) and a refused key (`HostAuthError`) are never retried; an unreachable host is tried
`connect_attempts` times with doubling backoff (`HostUnreachable`); a connection that drops while a
job runs (`ConnectionLost`) is the one Prefect retries, and the retry re-attaches. A host reachable but
set up so that no retry can help (a login shell that prints, host.python missing or without eagleflow,
no permission on host.work_root, a full disk) fails at first contact with its fix (`HostSetupError`).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import posixpath
import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import paramiko

from eagleflow.config import HostConfig
from eagleflow.hosts.base import (
    ConnectionLost,
    Host,
    HostBusy,
    HostError,
    HostSetupError,
    LogFn,
    StageFailed,
)
from eagleflow.hosts.ssh_files import TRANSPORT_ERRORS as _TRANSPORT_ERRORS
from eagleflow.hosts.ssh_files import SshFiles
from eagleflow.hosts.ssh_link import SshLink

CANCEL_GRACE_S = 5.0  # SIGTERM to SIGKILL when a cancelled run ends its job: gone well within 10 s


class SshHost(SshLink, SshFiles, Host):
    def __init__(self, config: HostConfig):
        assert config.kind == "ssh" and config.address
        self.config = config
        self.name = config.name
        self.address = config.address
        self.port = config.port
        self.user = config.user or getpass.getuser()
        self.work_root = config.work_root
        self.python = config.python
        self.known_hosts = os.path.expanduser(config.known_hosts)
        self.key_path = os.path.expanduser(config.key_path) if config.key_path else None
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.no_sftp = False  # the sshd refused the sftp subsystem: files over commands (cat, mv, test)

    # -- commands ---------------------------------------------------------------------------------

    def exec(self, argv: list[str], *, timeout: float = 120) -> tuple[int, str, str]:
        """Run a short command on the host with host.env (quoted for its shell); return (status, stdout, stderr)."""
        env = [f"{k}={v}" for k, v in self.config.env.items()]
        command = shlex.join(["env", *env, *argv] if env else argv)
        try:
            _, out, err = self._conn().exec_command(command, timeout=timeout)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
            rc = out.channel.recv_exit_status()
        except TimeoutError:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():  # slow command, healthy link: not retryable
                raise HostError(f"{argv[:4]} on {self.label} sent nothing for {timeout:.0f} s; gave up") from None
            raise self._lost(f"running {argv[:4]}", TimeoutError(f"no answer for {timeout:.0f} s")) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(f"running {argv[:4]}", exc) from None
        if rc == -1:  # the channel closed without an exit status: the transport went away
            raise self._lost(f"running {argv[:4]}", EOFError("no exit status"))
        return rc, stdout, stderr

    def run(
        self, argv: list[str], *, log: LogFn, env: dict[str, str] | None = None, log_path: str | None = None
    ) -> None:
        job_dir = (
            posixpath.dirname(log_path) if log_path else posixpath.join(self.work_root, "jobs", str(time.time_ns()))
        )
        self.run_job(job_dir, argv, log=log, env=env)

    def run_job(
        self,
        job_dir: str,
        argv: list[str],
        *,
        log: LogFn,
        env: dict[str, str] | None = None,
        owner: str = "",
        attempt: str = "",
        secret_env: dict[str, str] | None = None,
    ) -> None:
        spec = {
            "argv": argv,
            "env": {**self.config.env, **(env or {}), "PYTHONUNBUFFERED": "1"},
            "owner": owner,
            "attempt": attempt,
            "root": self.work_root,
            "secret_env": sorted(secret_env or {}),
        }  # names only: the values go over the channel's stdin
        control: dict[str, Any] = {}
        try:
            rc, err = self._stream(
                [self.python, "-m", "eagleflow.hosts.jobs", "run", job_dir, json.dumps(spec)],
                log,
                control,
                job_dir,
                stdin=json.dumps(secret_env) + "\n" if secret_env else None,
            )
        except ConnectionLost:
            raise  # the job goes on; Prefect's retry re-attaches
        except BaseException:
            # Cancelled, timed out, interrupted: end this job's process group, and only it.
            if "start" in control:
                with contextlib.suppress(Exception):
                    self.stop_job(job_dir, grace_s=CANCEL_GRACE_S)
            raise
        if "start" not in control:
            self._raise_setup_error(rc, err)
        if control["start"]["state"] == "busy":
            raise HostBusy(
                f"{self.label} is busy: {control['start']['message']}; wait for that run to end, or cancel it"
            )
        end = control.get("end", {})
        if end.get("state") == "exited" and end.get("returncode") == 0:
            return
        tail = self.tail(f"{job_dir}/stage.log")
        if end.get("state") != "exited":
            tail.append(
                f"error: the job's supervisor is gone without an exit status ({end.get('state')}): "
                "killed on the host (SIGKILL, OOM killer, reboot)?"
            )
        raise StageFailed(self.name, argv, int(end.get("returncode", -9)), tail, f"{job_dir}/stage.log")

    def _stream(
        self, argv: list[str], log: LogFn, control: dict[str, Any], job_dir: str, stdin: str | None = None
    ) -> tuple[int, str]:
        """Run `jobs run` on one channel: log lines from stdout as they come, control JSON from stderr;
        `stdin` (the secrets' line) is written to the command and the channel's input closed."""
        try:
            transport = self._conn().get_transport()
            assert transport is not None
            chan = transport.open_session()
            chan.settimeout(1.0)
            chan.exec_command(shlex.join(argv))
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            pending, err = b"", b""
            while True:
                try:
                    data = chan.recv(65536)
                except TimeoutError:
                    if not transport.is_active():
                        raise EOFError("transport closed") from None
                    data = None
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    *done, err_rest = err.split(b"\n")
                    for line in done:
                        self._control_line(line, control, log, job_dir)
                    err = err_rest
                if data is None:
                    continue
                if not data:
                    break
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    log(line.decode(errors="replace"))
            if pending:
                log(pending.decode(errors="replace"))
            rc = chan.recv_exit_status()
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            for line in err.split(b"\n"):
                self._control_line(line, control, log, job_dir)
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(f"following {job_dir}", exc) from None
        if rc == -1 or not transport.is_active():
            raise self._lost(f"following {job_dir}", EOFError("the channel closed without an exit status"))
        return rc, control.get("stderr", "")

    def _control_line(self, raw: bytes, control: dict[str, Any], log: LogFn, job_dir: str) -> None:
        line = raw.decode(errors="replace").strip()
        if not line:
            return
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            msg = None
        if not isinstance(msg, dict) or not ({"start", "end"} & msg.keys()):
            control["stderr"] = control.get("stderr", "") + line + "\n"
            return
        control.update(msg)
        started = msg.get("start")
        if started is None:
            return
        state = started["state"]
        if state == "running":
            log(
                f"re-attached to the job already running on {self.name} (pid {started['pid']}, "
                f"attempt {started.get('attempt')}); its last lines follow"
            )
        elif state == "exited":
            log(f"the job on {self.name} had already ended (exit {started.get('returncode')}); its last lines follow")
        elif state == "started":
            log(f"started job on {self.name}: pid {started['pid']} (its process group), log {job_dir}/stage.log")

    def _raise_setup_error(self, rc: int, err: str) -> None:
        """Job control (`python -m eagleflow.hosts.jobs`) could not run or refused: the host's setup, named with its
        fix."""
        if rc == 127 or ("No such file" in err and self.python in err):
            raise HostSetupError(
                self.label,
                f"host.python {self.python} does not exist on {self.label}. Fix: bootstrap the host first "
                "(eagleflow bootstrap CONFIG) or set host.python to the python of its eagleflow environment",
            )
        if "No module named 'eagleflow." in err:
            raise HostSetupError(
                self.label,
                f"the eagleflow installed for {self.python} on {self.label} is older than this control side "
                f"({err.strip().splitlines()[-1]}; job control is eagleflow.hosts.jobs since 0.2). "
                "Fix: bootstrap the host again (eagleflow bootstrap CONFIG), which installs this version",
            )
        if "No module named" in err:
            raise HostSetupError(
                self.label,
                f"{self.python} on {self.label} is not an environment with eagleflow installed "
                f"({err.strip().splitlines()[-1]}). "
                "Fix: bootstrap the host (eagleflow bootstrap CONFIG), or set host.python to the python of that "
                "environment",
            )
        if "No space left on device" in err:
            free = self._free_bytes(self.work_root)
            raise HostSetupError(
                self.label,
                f"the disk holding host.work_root {self.work_root} on {self.label} is full"
                + (f" ({free:,} bytes free)" if free is not None else "")
                + ". Fix: free space there, or point host.work_root at a larger disk",
            )
        if "PermissionError" in err or "Permission denied" in err:
            said = next((x for x in reversed(err.strip().splitlines()) if "ermission" in x), err.strip()[-300:])
            raise HostSetupError(
                self.label,
                f"{self.user} may not write under host.work_root {self.work_root} on {self.label} ({said.strip()}). "
                f"Fix: give {self.user} that directory (chown -R {self.user} {self.work_root}), or set host.work_root "
                "to a directory the user owns",
            )
        # One line, as every failure a person reads (eagleflow.contracts.failure): its traceback's last line says why.
        said = next((x.strip() for x in reversed(err.splitlines()) if x.strip()), "no output")[:400]
        raise HostError(
            f"job control on {self.label} failed (exit {rc}): {said}. Fix: run "
            f"`{self.python} -m eagleflow.hosts.jobs --help` on the host to see it fail whole, or bootstrap it again"
        )

    def _job(self, *args: str) -> dict[str, Any]:
        argv = [self.python, "-m", "eagleflow.hosts.jobs", *args]
        rc, out, err = self.exec(argv)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if rc not in (0, 3) or not lines:
            self._raise_setup_error(rc, err)
        return json.loads(lines[-1])

    def stop_job(self, job_dir: str, grace_s: float = CANCEL_GRACE_S) -> dict[str, Any]:
        """End this job's process group on the host (SIGTERM, SIGKILL after grace_s)."""
        return self._job("stop", job_dir, "--grace", str(grace_s))

    def stop_owner(self, owner: str) -> list[str]:
        return self._job("stop-owner", self.work_root, owner, "--grace", str(CANCEL_GRACE_S))["stopped"]

    def lease_holder(self) -> dict[str, Any] | None:
        try:
            return self._job("holder", self.work_root)["holder"]
        except (HostError, KeyError, ValueError):  # unreachable, or an eagleflow on the host without `holder`
            return {"owner": "unknown"}

    def _take_lease(self, owner: str, what: str) -> tuple[paramiko.SSHClient, paramiko.Channel]:
        """Start the lease holder on a connection of its own; return it once the host says 'held'."""
        client = self.connect()
        try:
            chan = client.get_transport().open_session()
            chan.settimeout(120)
            chan.exec_command(
                shlex.join([self.python, "-m", "eagleflow.hosts.jobs", "lease", self.work_root, owner, "--what", what])
            )
            line = chan.makefile("rb").readline().decode(errors="replace").strip()
        except _TRANSPORT_ERRORS as exc:
            client.close()
            raise ConnectionLost(f"connection to {self.label} lost while taking the host lease: {exc}") from None
        if not line.startswith("{"):
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            client.close()
            self._raise_setup_error(chan.recv_exit_status(), err)
        answer = json.loads(line)
        if answer["state"] == "busy":
            client.close()
            raise HostBusy(f"{self.label} is busy: {answer['message']}; wait for that run to end, or cancel it")
        return client, chan

    @contextlib.contextmanager
    def lease(self, owner: str, what: str, log: LogFn | None = None) -> Iterator[None]:
        """Hold the host lease for as long as the block runs.

        The holder on the host exits when its channel closes, so a controller that dies frees the
        lease by itself. A link that drops while the block runs would free it too; a keeper thread
        takes it again (same owner: the host lets it wait for the old holder to go). If another run
        got in between, the next stage is refused by the host with HostBusy, naming that run.
        """
        say = log or (lambda msg: None)
        held = [self._take_lease(owner, what)]
        done = threading.Event()

        def keep() -> None:
            while not done.wait(1.0):
                client, chan = held[0]
                transport = client.get_transport()
                if not (chan.closed or chan.exit_status_ready() or transport is None or not transport.is_active()):
                    continue
                client.close()
                say(f"the host lease on {self.name} was lost with its connection; taking it again")
                while not done.is_set():
                    try:
                        held[0] = self._take_lease(owner, what)
                        say(f"host lease on {self.name} held again")
                        break
                    except HostBusy as exc:
                        say(f"could not take the host lease back: {exc}")
                        return
                    except (HostError, OSError):
                        done.wait(5.0)

        keeper = threading.Thread(target=keep, name=f"lease-{self.name}", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join(timeout=10)
            client, chan = held[0]
            with contextlib.suppress(Exception):
                chan.shutdown_write()
            client.close()
