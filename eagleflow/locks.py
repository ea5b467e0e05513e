"""flock-based liveness and mutual exclusion. Standard library only.

An flock is held by an open file description and dies with the last process holding it, so "is this
lock held" is a liveness test that a recycled pid can never fool: jobs, the host lease and the
production guardian all use it before they signal anything.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def is_held(lock_path: str | Path) -> bool:
    """Whether some process holds an flock on lock_path (we take and drop it if nobody does)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops our flock if we got it
    return False


def try_lock(lock_path: str | Path) -> int | None:
    """An fd holding an exclusive flock on lock_path (created if missing), or None when another
    process holds it. Close the fd to release. O_CLOEXEC: children never inherit it by accident."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


@contextmanager
def exclusive(lock_path: str | Path) -> Iterator[None]:
    """A short critical section, serialised across processes (blocks until the lock is free)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
