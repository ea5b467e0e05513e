"""A preflight check's verdict, and how a list of them is printed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warning", "error"]


@dataclass(frozen=True)
class Finding:
    """One check's verdict. Errors name the cause (file, field, values) and the fix."""

    check: str
    level: Level
    message: str


def format_findings(findings: list[Finding]) -> str:
    """One line per finding, errors first, for logs and exception messages."""
    order = {"error": 0, "warning": 1, "ok": 2}
    lines = [f"{f.level.upper():7} {f.check}: {f.message}" for f in sorted(findings, key=lambda f: order[f.level])]
    return "\n".join(lines)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)
