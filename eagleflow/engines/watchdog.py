"""The launch watchdog: what an engine's log says while it loads.

Load milestones (checkpoint-shard progress, weights loaded, graphs captured) are reported once each;
a fatal line (a dead worker behind a live API server, CUDA out of memory, an NCCL error) is noted so
the launch fails within seconds; and when it fails, the root cause is the exception that ends the
log's *first* traceback: the worker's or EngineCore's own, not the API server's "Engine core
initialization failed" wrapper around it. Pure functions over log text, plus a log follower.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("eagleflow.engine")

# Load milestones worth a line in Prefect (vLLM and SGLang wording).
PROGRESS_PATTERNS = [
    re.compile(r"Loading (?:safetensors )?checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
    re.compile(r"Loading weights took [\d.]+ ?s"),
    re.compile(r"Model loading took [\d.]+ ?GiB"),
    re.compile(r"Initializing a V\d LLM engine \(v[\w.+-]+\)"),
    re.compile(r"init engine.{0,80}?took [\d.]+ ?s(?:econds)?"),
    re.compile(r"Graph capturing finished in [\d.]+ ?s(?:ecs)?"),
    re.compile(r"Load weight end\..*"),
    re.compile(r"(?:Application startup complete|The server is fired up and ready to roll!)"),
]

# A line that means the launch has failed even if the API server process still lives.
FATAL_PATTERNS = [
    re.compile(r"Engine core initialization failed"),
    re.compile(r"EngineCore failed to start"),
    re.compile(r"Worker(?:Proc|_TP\d+)?.*(?:died|exited unexpectedly|failed to start)", re.IGNORECASE),
    re.compile(r"(?:torch\.)?OutOfMemoryError|CUDA out of memory"),
    re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError"),
    re.compile(r"Scheduler hit an exception|Received sigquit from a child process"),  # SGLang
    re.compile(r"Fatal Python error|Segmentation fault|core dumped"),
]

# How long a fatal line is given for the rest of its traceback to reach the log before we act.
FATAL_SETTLE_S = 2.0
# vLLM prefixes every line of a child process ("(EngineCore pid=12) ", "(Worker_TP0 pid=34) ") and
# its logger adds "ERROR 11-29 19:27:58 [core.py:1510] "; both are stripped to find the exception.
_PREFIX = re.compile(
    r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?"
)
_EXC_LINE = re.compile(r"^(?:[a-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))\b(?::.*)?$")


def _clip(line: str, max_chars: int) -> str:
    return line if len(line) <= max_chars else line[:max_chars] + " ..."


def root_cause_excerpt(log_text: str, max_lines: int = 25, max_chars: int = 400) -> str:
    """The first traceback of the engine log, else its last lines.

    The first traceback is the worker's / EngineCore's own; later ones are the API server's wrappers
    re-raising it ("Engine core initialization failed"). Its end holds the exception and message.
    """
    lines = [_clip(line, max_chars) for line in log_text.replace("\r", "\n").splitlines()]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return "\n".join(lines[-max_lines:])
    end = starts[1] if len(starts) > 1 else len(lines)
    block = lines[starts[0] : end]
    if len(block) > max_lines:
        block = [block[0], "  ..."] + block[-(max_lines - 2) :]
    return "\n".join(block)


# argparse's last word on a flag it refuses ("api_server.py: error: unrecognized arguments: --no-such-flag"), after
# a hundred lines of usage text and no traceback.
_ARGPARSE_ERROR = re.compile(r"^\S+: error: (.+)$")
# A line the engine's logger wrote at ERROR or CRITICAL: vLLM says some refusals so, without a traceback.
_LOGGED_ERROR = re.compile(r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\]\s*(.+)$")


def root_cause_line(log_text: str) -> str | None:
    """The engine's own reason: the exception line that ends its first traceback ('KeyError: ...'), without the
    process prefix; with no traceback, argparse's refusal of a flag, else the first line logged at ERROR; None when
    the log has none of these (killed from outside, out of memory)."""
    lines = log_text.replace("\r", "\n").splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        refused = [m.group(0) for line in lines if (m := _ARGPARSE_ERROR.match(line.strip()))]
        if refused:
            return _clip(refused[-1], 400)
        logged = [m.group(1).strip() for line in lines if (m := _LOGGED_ERROR.match(line.strip()))]
        return _clip(logged[0], 400) if logged else None
    end = starts[1] if len(starts) > 1 else len(lines)
    block = lines[starts[0] + 1 : end]
    for i, line in enumerate(block):
        bare = _PREFIX.sub("", line).strip()
        if _EXC_LINE.match(bare):
            # pydantic's "1 validation error for ModelConfig" says what failed on the line after it
            if re.search(r"validation errors? for \w+$", bare) and i + 1 < len(block):
                bare += ": " + _PREFIX.sub("", block[i + 1]).strip().removeprefix("Value error, ")
            return _clip(bare, 400)
    return None


@dataclass
class LogFollower:
    """Reads what an engine log gained since the last call; yields whole lines (tqdm's \\r too)."""

    path: Path
    offset: int = 0
    partial: str = ""
    last_growth: float = field(default_factory=time.monotonic)

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        self.last_growth = time.monotonic()
        text = self.partial + data.decode("utf-8", errors="replace")
        parts = re.split(r"[\r\n]", text)
        self.partial = parts.pop()
        return [p for p in parts if p.strip()]


class LaunchWatch:
    """What the watchdog saw: reports progress once per milestone, remembers the first fatal line."""

    def __init__(self, extra_fatal: list[str]):
        self.fatal = FATAL_PATTERNS + [re.compile(p) for p in extra_fatal]
        self.seen: set[str] = set()
        self.fatal_line: str | None = None
        self.fatal_at: float | None = None

    def feed(self, line: str, name: str) -> None:
        for pat in PROGRESS_PATTERNS:
            m = pat.search(line)
            if m:
                text = m.group(0).strip()
                if text not in self.seen:
                    self.seen.add(text)
                    log.info("engine %s loading: %s", name, text)
                break
        if self.fatal_line is None and any(p.search(line) for p in self.fatal):
            self.fatal_line = _clip(_PREFIX.sub("", line).strip(), 400)
            self.fatal_at = time.monotonic()
            log.warning("engine %s: fatal line in its log: %s", name, self.fatal_line)
