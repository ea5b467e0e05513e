"""Looking at processes from outside, through /proc (never through the code under test)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` is a live process. A zombie is gone for our purposes (its parent has not reaped
    it yet: it holds no port, no memory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def end_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """End a process group this test started (its leader `proc`, started in a session of its own): SIGTERM,
    then SIGKILL after `grace_s`."""
    if proc.poll() is not None and not group_members(proc.pid):
        return  # all gone (and the group id not ours to signal any more)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
