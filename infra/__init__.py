"""Control-side operations on hosts that are not pipeline stages: bootstrapping the host environment
(`bootstrap`: the steps; `wheel`: the project's wheel built for the host; `summary`: what a person reads).

Runs in the control environment (paramiko for SSH hosts); never imports Prefect, so `python -m
infra.bootstrap` works without a Prefect server. `tasks/bootstrap.py` wraps it as a Prefect task.
"""

from __future__ import annotations

from eagleflow import EagleflowError


class BootstrapError(EagleflowError):
    """The host environment could not be created or updated; the message names the host, the path and the fix."""


def tail(text: str, lines: int = 25) -> str:
    """The last lines of a command's output, for an error message."""
    return "\n".join(text.strip().splitlines()[-lines:])
