"""Which processes are ours: proven by the benchmark's random token in their environment.

The token is random per benchmark and only its engines get it, so a recycled pid (or anyone else's
process, whose environ we may not even read) is never taken for ours. Every signal is sent right
after `owned` proved it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from eagleflow.util.procs import terminate

TOKEN_ENV = "EAGLEFLOW_TOKEN"  # on every engine of one benchmark: the proof that a process is ours to end
# On every stage of a production window (the window's dir): production is down already, the flow gives it back.
WINDOW_ENV = "EAGLEFLOW_PRODUCTION_WINDOW"
STOP_ENV = "EAGLEFLOW_STOPPING"  # on the stop command only: lets the guardian wait for a stop cut short
ENGINE_GRACE_S = 15.0  # leftover engine: SIGTERM, then SIGKILL after this (vLLM's own shutdown)


def owned(pid: int, token: str, var: str = TOKEN_ENV) -> bool:
    """Whether live process `pid` carries EAGLEFLOW_TOKEN=<token> (or var=<token>) in its environment.

    The token is random per benchmark and only its engines get it, so a recycled pid (or anyone
    else's process, whose environ we may not even read) is never taken for ours. A zombie has an
    empty environ: it holds no GPU or port, so it counts as gone.
    """
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return False
    return f"{var}={token}".encode() in env.split(b"\0")


def owned_pids(token: str, var: str = TOKEN_ENV) -> list[int]:
    """Every live process carrying the token (an engine and the children it spawned)."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and owned(int(p), token, var)]


def end_owned_group(pid: int, token: str, grace_s: float = ENGINE_GRACE_S) -> bool:
    """End the process group led by `pid` (an engine started with start_new_session) if it is ours.

    SIGTERM the group, SIGKILL it after grace_s if the leader is still there. Each signal is sent
    only right after `owned` proved the leader carries our token. Returns whether it was ours.
    Group members that outlive a dead leader are not signalled through the group (its id could be
    reused once empty): `end_owned` finds them by their own token.
    """
    if not owned(pid, token):
        return False

    def send(sig: signal.Signals) -> None:
        if owned(pid, token):
            os.killpg(pid, sig)

    terminate(send, lambda: owned(pid, token), grace_s)
    return True


def end_owned(token: str, grace_s: float = ENGINE_GRACE_S) -> list[int]:
    """End every process still carrying the token, each by its own pid; wait until all are gone."""
    found = owned_pids(token)

    def send(sig: signal.Signals) -> None:
        for p in found:
            if owned(p, token):  # checked again right before the signal: the pid is still ours
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass

    terminate(send, lambda: any(owned(p, token) for p in found), grace_s)
    return found
