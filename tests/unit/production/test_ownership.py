"""Which processes are the benchmark's (eagleflow.production.ownership): proven by the token in their
environment, and only those are ever signalled. Real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from eagleflow.production import TOKEN_ENV, end_owned, end_owned_group, owned, owned_pids


def standin_engine(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, **env}, start_new_session=True
    )


def test_owned_and_end_owned_group_touch_only_the_token() -> None:
    ours = standin_engine({"EAGLEFLOW_TOKEN": "t0ken"})
    other = standin_engine({"EAGLEFLOW_TOKEN": "other"})
    try:
        time.sleep(0.3)  # past exec: /proc/<pid>/environ is the new program's
        assert owned(ours.pid, "t0ken") and not owned(other.pid, "t0ken") and not owned(os.getpid(), "t0ken")
        assert not end_owned_group(other.pid, "t0ken")
        assert other.poll() is None
        assert end_owned_group(ours.pid, "t0ken", grace_s=5)
        assert ours.wait(timeout=5) == -signal.SIGTERM
    finally:
        for p in (ours, other):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_end_owned_ends_every_process_carrying_the_token_and_no_other() -> None:
    token = f"tok-{os.getpid()}-{time.monotonic_ns()}"
    ours = [standin_engine({TOKEN_ENV: token}) for _ in range(2)]
    other = standin_engine({TOKEN_ENV: token + "-not"})
    try:
        time.sleep(0.3)
        assert sorted(owned_pids(token)) == sorted(p.pid for p in ours)
        assert sorted(end_owned(token, grace_s=5)) == sorted(p.pid for p in ours)
        assert [p.wait(timeout=5) for p in ours] == [-signal.SIGTERM] * 2
        assert owned_pids(token) == [] and other.poll() is None
    finally:
        for p in (*ours, other):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
