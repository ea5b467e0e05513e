"""flock liveness and mutual exclusion (eagleflow.util.locks): a lock is held exactly as long as a process
holds it, dies with that process (so a recycled pid never passes for a live holder), and a critical
section serialises processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from eagleflow.util.locks import exclusive, is_held, try_lock
from tests.conftest import ROOT

HOLDER = """
import sys, time
from eagleflow.util.locks import try_lock
fd = try_lock(sys.argv[1])
print("held" if fd is not None else "busy", flush=True)
sys.stdin.read()  # hold it until stdin closes
"""

CRITICAL = """
import sys, time
from eagleflow.util.locks import exclusive
print("taking", flush=True)
with exclusive(sys.argv[1]):
    print(time.monotonic(), flush=True)
"""


def _holder(path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_is_held_follows_the_holder_process(tmp_path):
    lock = tmp_path / "job.lock"
    assert not is_held(lock)  # no file: nobody holds it
    holder = _holder(lock)
    try:
        assert is_held(lock) and is_held(lock)  # asking does not take it
        assert try_lock(lock) is None  # another process holds it
    finally:
        holder.kill()  # no cleanup of any kind: the lock dies with the process
        holder.wait()
    assert not is_held(lock)
    assert lock.exists()  # the file stays; only the flock tells liveness


def test_try_lock_is_exclusive_until_its_fd_closes(tmp_path):
    lock = tmp_path / "host.lock"
    fd = try_lock(lock)
    assert fd is not None and is_held(lock)
    assert try_lock(lock) is None  # a second open file description of this same process is refused too
    busy = subprocess.run(
        [sys.executable, "-c", HOLDER, str(lock)], input="", capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert busy.stdout.strip() == "busy"
    os.close(fd)
    assert not is_held(lock)
    again = try_lock(lock)
    assert again is not None
    os.close(again)


def test_exclusive_serialises_processes(tmp_path):
    lock = tmp_path / "start.lock"
    with exclusive(lock):
        assert is_held(lock)
        waiter = subprocess.Popen(
            [sys.executable, "-c", CRITICAL, str(lock)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        # Once it is taking the lock (however slowly it started), it must stay blocked: a broken lock would let it
        # in now, before this process leaves.
        assert waiter.stdout.readline().strip() == "taking"
        time.sleep(1.0)
        assert waiter.poll() is None
        released = time.monotonic()
    entered = float(waiter.stdout.readline())
    assert waiter.wait(timeout=30) == 0
    assert entered >= released  # it entered only once this process left
    assert not is_held(lock)


PROBER = """
import sys, time
from eagleflow.util.locks import is_held
print("probing", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    is_held(sys.argv[1])
"""


def test_asking_never_looks_like_holding_and_never_keeps_a_taker_out(tmp_path):
    """Another process asking all the time (a job's follower, a guardian, a cancellation): a free lock is still
    free to every other asker, and a taker still gets it (a probe that took the lock exclusively made a finished
    job look alive and could turn a guardian away as "another guardian is watching")."""
    lock = tmp_path / "job.lock"
    lock.touch()
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBER, str(lock), "3"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert prober.stdout.readline().strip() == "probing"
        held_seen, refused, asked = 0, 0, 0
        end = time.monotonic() + 2
        while time.monotonic() < end and prober.poll() is None:
            held_seen += is_held(lock)
            fd = try_lock(lock)
            refused += fd is None
            if fd is not None:
                os.close(fd)
            asked += 1
        assert asked > 100 and held_seen == 0 and refused == 0, (asked, held_seen, refused)
    finally:
        prober.wait(timeout=30)
