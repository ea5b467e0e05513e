"""The local host: stages run as subprocesses of this machine, each in its own process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

from eagleflow import jobs
from eagleflow.hosts.base import Host, HostBusy, HostError, LogFn, StageFailed, TailBuffer


def end_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the group we started, then SIGKILL what is left after `grace_s`. Only our own group."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


class LocalHost(Host):
    def __init__(self, name: str = "localhost", env: dict[str, str] | None = None, work_root: str | None = None):
        self.name = name
        self.env = dict(env or {})
        self.work_root = work_root

    @contextlib.contextmanager
    def lease(self, owner: str, what: str, log: LogFn | None = None) -> Iterator[None]:
        if self.work_root is None:
            yield
            return
        try:
            held = jobs.Lease(self.work_root, owner, what)
        except jobs.HostBusyError as exc:
            raise HostBusy(f"{self.name} is busy: {exc}; wait for that run to end, or cancel it") from None
        try:
            yield
        finally:
            held.release()

    def run(self, argv: list[str], *, log: LogFn, env: dict[str, str] | None = None,
            log_path: str | None = None) -> None:
        if not argv:
            raise ValueError("empty argv")
        exe = argv[0]
        if os.sep in exe and not os.access(exe, os.X_OK):
            raise HostError(
                f"{exe} does not exist or is not executable on {self.name}; "
                "create the host environment first (make hostenv) or fix host.python in the run config"
            )
        full_env = {**os.environ, **self.env, **(env or {}), "PYTHONUNBUFFERED": "1"}
        tail = TailBuffer()
        logfile = None
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            logfile = open(log_path, "a", buffering=1)
        # A new session: the stage and everything it starts (an engine) form one group we can end.
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, text=True, errors="replace", bufsize=1, start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                tail.add(line)
                if logfile:
                    logfile.write(line + "\n")
                log(line)
            rc = proc.wait()
        except BaseException:
            end_process_group(proc)
            raise
        finally:
            if logfile:
                logfile.close()
        if rc != 0:
            raise StageFailed(self.name, argv, rc, tail.list(), log_path)

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def read_text(self, path: str) -> str:
        return Path(path).read_text()

    def write_text(self, path: str, text: str) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, p)
