"""The host abstraction: where stages run. `LocalHost` here, `SshHost` on a GPU host over SSH."""

from __future__ import annotations

import abc
import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from eagleflow import EagleflowError
from eagleflow.contracts.failure import read_ending, split_message, three_lines

LogFn = Callable[[str], None]


class HostError(EagleflowError):
    """The host cannot be used (unreachable, missing path); the message names the host and the fix."""


class HostKeyError(HostError):
    """The host's key is unknown or does not match known_hosts. Never retried, never auto-accepted."""


class HostAuthError(HostError):
    """The host refused our key (or the key file is unusable). Never retried."""


class HostSetupError(HostError):
    """The host is reachable but set up so that no retry can help (a login shell that prints, no permission on
    host.work_root, a full disk, host.python missing). Never retried. Its message is three lines
    (eagleflow.contracts.failure): which host, the cause, the fix (`message`'s ". Fix: ..." part)."""

    def __init__(self, host: str, message: str):
        self.host, self.message = host, message
        cause, fix, _ = split_message(message)
        super().__init__(
            three_lines(f"host {host} cannot be used as it is set up (no retry can mend it)", cause, fix, [])
        )

    def __reduce__(self):
        return (HostSetupError, (self.host, self.message))


class HostUnreachable(HostError):
    """No SSH connection after every attempt with backoff (refused, timed out, no route)."""


class ConnectionLost(HostError):
    """The connection dropped while a job was running. The job goes on; a retry re-attaches to it."""


class HostBusy(HostError):
    """Another run holds the host lease or still has a job running there."""


class StageFailed(EagleflowError):
    """A stage process exited non-zero. Its message is three lines (eagleflow.contracts.failure): what failed, the
    cause the stage printed last, the fix when it named one and where the logs are. `tail` keeps the log's
    last lines for the failure artifact, never for the message."""

    def __init__(self, host: str, argv: list[str], returncode: int, tail: list[str], log_path: str | None):
        self.host, self.argv, self.returncode, self.tail, self.log_path = host, argv, returncode, tail, log_path
        self.stage = stage_of(argv)
        cause, self.fix = read_ending(tail)
        self.cause = cause or (
            f"the process ended with exit status {returncode} without saying why; its last lines are in the log"
        )
        self.logs = [f"{host}:{log_path}"] if log_path else []
        super().__init__(str(self))

    def __str__(self) -> str:
        return three_lines(
            f"{self.stage} failed on {self.host} (exit {self.returncode})", self.cause, self.fix, self.logs
        )

    def __reduce__(self):  # pickled by Prefect with its fields, not its message
        state = {"logs": self.logs}
        return (StageFailed, (self.host, self.argv, self.returncode, self.tail, self.log_path), state)

    def __setstate__(self, state: dict) -> None:
        self.logs = state["logs"]


def stage_of(argv: list[str]) -> str:
    """`python -m eagleflow.stages.train req.json` -> train; any other command: its program's name."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1].rsplit(".", 1)[-1]
    return argv[0].rsplit("/", 1)[-1] if argv else "command"


class TailBuffer:
    """The last `n` lines of a stream, for failure messages."""

    def __init__(self, n: int = 40):
        self.lines: deque[str] = deque(maxlen=n)

    def add(self, line: str) -> None:
        self.lines.append(line)

    def list(self) -> list[str]:
        return list(self.lines)


class Host(abc.ABC):
    """A machine that runs stage processes and holds their files."""

    name: str

    @abc.abstractmethod
    def run(
        self, argv: list[str], *, log: LogFn, env: dict[str, str] | None = None, log_path: str | None = None
    ) -> None:
        """Run argv to completion, streaming each output line to `log` (and to `log_path` on the host).

        Raises StageFailed with the last lines when it exits non-zero. If the caller is interrupted
        (cancellation, KeyboardInterrupt), the process group it started is ended before re-raising.
        """

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
        """Run a stage as the job of `job_dir` (log in `<job_dir>/stage.log`); see `run`.

        `owner` (the flow run) and `attempt` (the task run) let a host with detached jobs re-attach a
        retry to the job it started instead of starting a second one. `secret_env` reaches the stage's
        environment and nothing else: no file, no command line, no log.
        """
        self.run(argv, log=log, env={**(env or {}), **(secret_env or {})}, log_path=f"{job_dir}/stage.log")

    def stop_job(self, job_dir: str, grace_s: float = 5.0) -> dict:
        """End the job of `job_dir` (its process group, only it). Hosts with detached jobs (SSH) can."""
        raise NotImplementedError(f"{self.name} runs no detached jobs: only an SSH host's jobs can be stopped by dir")

    def stop_owner(self, owner: str) -> list[str]:
        """End every running job that `owner` started on this host; return their job dirs."""
        return []

    @contextlib.contextmanager
    def lease(self, owner: str, what: str, log: LogFn | None = None) -> Iterator[None]:
        """Hold the host for one pipeline: a second run, in Prefect or not, fails with HostBusy."""
        yield

    def lease_holder(self) -> dict[str, Any] | None:
        """Who holds the host lease now ({"owner": flow run id, ...}), None when it is free. A host that keeps
        no lease, or cannot be asked, answers {"owner": "unknown"}: never taken for free."""
        return {"owner": "unknown"}

    def close(self) -> None:  # noqa: B027 - a no-op where there is no connection to drop (a local host)
        """Drop connections; the host's jobs go on."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        """How messages name the host (an SSH host adds user, address and port)."""
        return self.name

    @abc.abstractmethod
    def exec(self, argv: list[str], *, timeout: float = 120) -> tuple[int, str, str]:
        """Run a short command on the host with host.env (no shell, no stdin) from the login's home
        directory; return (status, stdout, stderr). A missing executable is status 127, as a shell
        reports it. HostError when it does not finish within `timeout`."""

    @abc.abstractmethod
    def put_file(self, local: str, remote: str) -> None:
        """Copy a file of this machine to `remote` on the host (temporary name, then rename)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def read_text(self, path: str) -> str: ...

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes: ...

    @abc.abstractmethod
    def write_text(self, path: str, text: str) -> None:
        """Write atomically (temp name, then rename)."""
