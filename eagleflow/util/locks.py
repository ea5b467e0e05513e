"""flock-based liveness and mutual exclusion. Standard library only.

An flock is held by an open file description and dies with the last process holding it, so "is this
lock held" is a liveness test that a recycled pid can never fool: jobs, the host lease and the
production guardian all use it before they signal anything.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def is_held(lock_path: str | Path) -> bool:
    """Whether some process holds an flock on lock_path.

    Asked with a shared lock, taken and dropped at once: two processes asking at the same moment never see
    each other as the holder (an exclusive probe did, and a job's follower polling every 0.1 s then made a
    finished job look alive). Holders take the lock exclusively, so a shared probe fails only against one."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops our flock if we got it
    return False


# A probe holds its shared lock for microseconds, unless the scheduler takes its CPU away between the flock and the
# close: on a host whose cores are all busy (the GPU stages' own processes, a loaded CI machine) that is a whole
# time slice, tens of milliseconds. An exclusive taker that meets a probe tries again for about half a second before
# it concludes that a real holder is there (the suite saw 6 tries in 50 ms all meet a prober asking in a loop).
PROBE_RETRIES, PROBE_PAUSE_S = 25, 0.02


def try_lock(lock_path: str | Path) -> int | None:
    """An fd holding an exclusive flock on lock_path (created if missing), or None when another
    process holds it. Close the fd to release. O_CLOEXEC: children never inherit it by accident."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    for attempt in range(PROBE_RETRIES + 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
        if attempt < PROBE_RETRIES:
            time.sleep(PROBE_PAUSE_S)  # perhaps only an is_held probe: it lets go at once
    os.close(fd)
    return None


@contextmanager
def exclusive(lock_path: str | Path) -> Iterator[None]:
    """A short critical section, serialised across processes (blocks until the lock is free)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
