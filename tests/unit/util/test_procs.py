"""Ending processes (eagleflow.util.procs): SIGTERM, a grace period, then SIGKILL, on real child processes;
a whole process group ended, and nothing outside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from eagleflow.util.procs import end_process_group, terminate, wait_until
from tests.helpers.procs import group_alive, group_members

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_terminate_escalates_to_sigkill_for_a_process_ignoring_sigterm():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # its SIGTERM handler is in place
        sent: list[signal.Signals] = []

        def send(sig: signal.Signals) -> None:
            sent.append(sig)
            proc.send_signal(sig)

        start = time.monotonic()
        assert terminate(send, lambda: proc.poll() is None, grace_s=1.0)
        took = time.monotonic() - start
        assert sent == [signal.SIGTERM, signal.SIGKILL]
        assert proc.returncode == -signal.SIGKILL
        assert 1.0 <= took < 10  # the grace period was given, then no more
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_terminate_stops_at_sigterm_for_a_process_that_obeys():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent: list[signal.Signals] = []
        assert terminate(lambda sig: (sent.append(sig), proc.send_signal(sig)), lambda: proc.poll() is None, 10.0)
        assert sent == [signal.SIGTERM] and proc.returncode == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_terminate_signals_nothing_that_is_already_gone():
    sent: list[signal.Signals] = []
    assert terminate(sent.append, lambda: False, grace_s=5.0)
    assert sent == []

    def vanished(sig: signal.Signals) -> None:  # `send` finds the target gone right before signalling
        sent.append(sig)
        raise ProcessLookupError

    assert terminate(vanished, lambda: True, grace_s=5.0)
    assert sent == [signal.SIGTERM]


def test_end_process_group_ends_the_group_and_nothing_else():
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        assert wait_until(lambda: len(group_members(proc.pid)) >= 3, 10)
        start = time.monotonic()
        end_process_group(proc, grace_s=1.0)  # the shell ignores SIGTERM: SIGKILL ends it
        assert proc.returncode == -signal.SIGKILL
        assert wait_until(lambda: not group_alive(proc.pid), 10), "a member of the group outlived it"
        assert time.monotonic() - start < 15
        assert bystander.poll() is None
        end_process_group(proc)  # reaped: its pid may be someone else's now; nothing is signalled
    finally:
        for p in (proc, bystander):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_wait_until():
    t0 = time.monotonic()
    assert wait_until(lambda: time.monotonic() - t0 > 0.2, 5, poll_s=0.01)
    assert not wait_until(lambda: False, 0.2, poll_s=0.01)
    assert time.monotonic() - t0 < 5
