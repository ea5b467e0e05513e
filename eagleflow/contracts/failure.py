"""What a person reads when a stage fails: three lines, everywhere it is shown.

    benchmark failed on gpu-1 (exit 1)
    cause: engine baseline exited with code 1 while starting; root cause: SafetensorError: ...
    fix: ... | logs: artifact eagleflow-kimi-benchmark-failure; gpu-1:/data/eagleflow/.../stage.log

The task's state message, the flow run's message, the CLI's `error:` line and the failure artifact's
heading all carry these lines and nothing more. What explains them at length (a check's every finding,
the engine's traceback excerpt, the stage's last lines) goes to the stage log and the failure artifact.

A stage ends its log with its cause and, when known, its fix, each on a line of its own:

    <details: findings, traceback, excerpt>
    error: <cause>
    fix: <what to do>

so the control side reads them from the log's last lines without any other channel (an SSH job that
was re-attached, or a stage killed before it could say anything, are read the same way).
"""

from __future__ import annotations

import re

ERROR_MARK = "error: "
FIX_MARK = "fix: "
MAX_LINE = 600  # characters of a cause or fix line; the rest is in the log

# "Fix: ..." as a section of a message (ProductionError's), or ". Fix: ..." inside its first line (a
# preflight finding's, the capacity plan's "To fix: ...").
_FIX_SECTION = re.compile(r"(?:^|\n)\s*Fix:\s*", re.IGNORECASE)
_FIX_INLINE = re.compile(r"(?<=[.;])\s+(?:To fix|Fix):\s+")


def clip(text: str, limit: int = MAX_LINE) -> str:
    """One line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def split_message(message: str) -> tuple[str, str | None, str]:
    """(cause, fix, details) of an error message written for a person.

    The cause is the message's first line; a list under it ("does not fit this host:" then "  - ..."
    items) puts its first item into the cause and counts the rest. A "Fix: ..." section is the fix.
    Everything else is the details, which stay in the log and the artifact.
    """
    body, fix = message, None
    parts = _FIX_SECTION.split(message, maxsplit=1)
    if len(parts) == 2:
        body, fix = parts[0], clip(parts[1])
    lines = [line for line in body.strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)", fix, ""
    head, rest = lines[0].strip(), lines[1:]
    items = [line.strip()[2:] for line in rest if line.strip().startswith("- ")]
    listed = head.endswith(":") and bool(items)
    cause = items[0] if listed else head
    inline = _FIX_INLINE.split(cause, maxsplit=1)
    if len(inline) == 2:
        cause, fix = inline[0], fix or clip(inline[1])
    if listed:
        more = len(items) - 1
        cause = f"{head} {cause}" + (
            f" (and {more} more finding{'s' if more > 1 else ''}: see the log)" if more else ""
        )
    return clip(cause), fix, "\n".join(rest)


def stage_ending(message: str, fix: str | None = None) -> list[str]:
    """The lines a failing stage prints last: its details, `error: <cause>`, and `fix: <fix>` when known."""
    cause, found_fix, details = split_message(message)
    fix = fix or found_fix
    return ([details] if details else []) + [ERROR_MARK + cause] + ([FIX_MARK + fix] if fix else [])


def read_ending(tail: list[str]) -> tuple[str | None, str | None]:
    """(cause, fix) from a stage log's last lines: its last `error: ` line and a `fix: ` line right after."""
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].startswith(ERROR_MARK):
            after = tail[i + 1] if i + 1 < len(tail) else ""
            fix = after[len(FIX_MARK) :].strip() if after.startswith(FIX_MARK) else None
            return clip(tail[i][len(ERROR_MARK) :]), fix
    return None, None


def three_lines(what: str, cause: str, fix: str | None, logs: list[str]) -> str:
    """What failed; the root cause; the fix when known and where the full logs are."""
    last = " | ".join(x for x in ((f"fix: {fix}" if fix else ""), ("logs: " + "; ".join(logs) if logs else "")) if x)
    return "\n".join(x for x in (clip(what), f"cause: {clip(cause)}", last) if x)
