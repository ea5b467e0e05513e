"""The host abstraction: where stages run. Local now; SSH implements the same interface."""

from __future__ import annotations

import abc
from collections import deque
from typing import Callable

LogFn = Callable[[str], None]


class HostError(RuntimeError):
    """The host cannot be used (unreachable, missing path); the message names the host and the fix."""


class StageFailed(RuntimeError):
    """A stage process exited non-zero. Carries its last lines, the root cause usually among them."""

    def __init__(self, host: str, argv: list[str], returncode: int, tail: list[str], log_path: str | None):
        self.returncode = returncode
        self.tail = tail
        cause = next((line for line in reversed(tail) if line.startswith("error:")), None)
        head = f"{argv[-1] if argv else 'command'} failed on {host} (exit {returncode})"
        if cause:
            head += f": {cause[len('error:'):].strip()}"
        where = f"\nfull log: {host}:{log_path}" if log_path else ""
        super().__init__(head + "\nlast lines:\n" + "\n".join(tail) + where)


class TailBuffer:
    """The last `n` lines of a stream, for failure messages."""

    def __init__(self, n: int = 40):
        self.lines: deque[str] = deque(maxlen=n)

    def add(self, line: str) -> None:
        self.lines.append(line)

    def list(self) -> list[str]:
        return list(self.lines)


class Host(abc.ABC):
    """A machine that runs stage processes and holds their files."""

    name: str

    @abc.abstractmethod
    def run(self, argv: list[str], *, log: LogFn, env: dict[str, str] | None = None,
            log_path: str | None = None) -> None:
        """Run argv to completion, streaming each output line to `log` (and to `log_path` on the host).

        Raises StageFailed with the last lines when it exits non-zero. If the caller is interrupted
        (cancellation, KeyboardInterrupt), the process group it started is ended before re-raising.
        """

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def read_text(self, path: str) -> str: ...

    @abc.abstractmethod
    def write_text(self, path: str, text: str) -> None:
        """Write atomically (temp name, then rename)."""
