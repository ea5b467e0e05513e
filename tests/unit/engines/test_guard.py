"""The engine's group leader (eagleflow.engines.guard): whatever ends, nothing of the engine's group is left.

The "engine" here is a small Python process that starts a child in its group which ignores SIGTERM (as vLLM's
engine core may while it loads), then either waits or exits; the group is watched through /proc by the tests'
own helper, not by the code under test."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from eagleflow.util.procs import wait_until
from tests.helpers.procs import group_members

ENGINE = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('child up', flush=True); time.sleep(600)"])
time.sleep({live_s})
sys.exit(7)
"""


def start(live_s: float, grace_s: float = 1.0) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eagleflow.engines.guard",
            str(grace_s),
            "--",
            sys.executable,
            "-c",
            ENGINE.format(live_s=live_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "child up"
    assert len(group_members(proc.pid)) == 3  # the guard, the engine, its child
    return proc


def test_a_stopped_engine_takes_its_stubborn_child_with_it() -> None:
    proc = start(live_s=600)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # as the stage stops an engine: the guard ends the group
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert wait_until(lambda: group_members(proc.pid) == [], 10), group_members(proc.pid)
    took = time.monotonic() - t0
    assert took < 1.0 + 5.0 + 5.0  # the grace, then SIGKILL for the child that ignored SIGTERM


def test_an_engine_that_exits_leaves_nothing_and_its_code_is_the_guards() -> None:
    proc = start(live_s=0.5)
    assert proc.wait(timeout=30) == 7  # the engine's own exit status reaches the stage
    assert wait_until(lambda: group_members(proc.pid) == [], 10), group_members(proc.pid)
