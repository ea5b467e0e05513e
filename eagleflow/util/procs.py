"""Ending processes: SIGTERM, a grace period, then SIGKILL. Standard library only.

One rule everywhere: eagleflow signals only what it can prove is its own (a process group it started
and still holds, a job whose lock is held, an engine carrying the benchmark's token). The caller
says how to signal and how to tell the target is gone; `terminate` does the escalation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def wait_until(cond: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll `cond` until it holds (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG): an engine
    whose stage is killed, a torchrun rank whose agent is. False where that cannot be set, or where the
    parent is already gone (reparented to init)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        if ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) != 0:
            return False
    except OSError:
        return False
    return os.getppid() != 1


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, read from /proc (Linux)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def terminate(
    send: Callable[[signal.Signals], None], alive: Callable[[], bool], grace_s: float, kill_wait_s: float = 10.0
) -> bool:
    """SIGTERM through `send`, wait up to grace_s for `alive()` to turn False, then SIGKILL and wait
    kill_wait_s. `send` must itself check, right before signalling, that the target is still ours.
    Returns whether the target is gone. A ProcessLookupError from `send` means it already is."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if not alive():
            return True
        try:
            send(sig)
        except ProcessLookupError:
            return True
        if wait_until(lambda: not alive(), wait_s):
            return True
    return not alive()


def end_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End the process group led by `proc`, which we started with start_new_session: only our own group."""

    def send(sig: signal.Signals) -> None:
        if proc.poll() is None:  # reaped means its pid (and the group id) may already be someone else's
            os.killpg(proc.pid, sig)

    terminate(send, lambda: proc.poll() is None, grace_s)
    if proc.poll() is None:
        proc.wait()
