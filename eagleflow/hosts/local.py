"""The local host: stages run as subprocesses of this machine, each in its own process group."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagleflow.hosts import jobs
from eagleflow.hosts.base import Host, HostBusy, HostError, LogFn, StageFailed, TailBuffer
from eagleflow.util.files import copy_file_atomic, write_text_atomic
from eagleflow.util.procs import end_process_group


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
        except jobs.LeaseHeld as exc:
            raise HostBusy(f"{self.name} is busy: {exc}; wait for that run to end, or cancel it") from None
        try:
            yield
        finally:
            held.release()

    def lease_holder(self) -> dict[str, Any] | None:
        return jobs.lease_holder(self.work_root) if self.work_root else {"owner": "unknown"}

    def run(
        self, argv: list[str], *, log: LogFn, env: dict[str, str] | None = None, log_path: str | None = None
    ) -> None:
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
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
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

    @property
    def label(self) -> str:
        return f"{self.name} (this machine)"

    def exec(self, argv: list[str], *, timeout: float = 120) -> tuple[int, str, str]:
        # From the home directory, as an SSH login starts: never a checkout, whose eagleflow would
        # shadow the one installed in the host environment.
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=os.path.expanduser("~"),
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
            )
        except (FileNotFoundError, PermissionError) as exc:
            return 127, "", str(exc)
        except subprocess.TimeoutExpired:
            raise HostError(f"{argv[:4]} on {self.label} did not finish within {timeout:.0f} s") from None
        return proc.returncode, proc.stdout, proc.stderr

    def put_file(self, local: str, remote: str) -> None:
        copy_file_atomic(local, remote)

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def read_text(self, path: str) -> str:
        return Path(path).read_text()

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def write_text(self, path: str, text: str) -> None:
        write_text_atomic(path, text)
