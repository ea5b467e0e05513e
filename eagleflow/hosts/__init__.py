"""Hosts that run stages: `make_host(config.host)` picks the implementation.

`jobs` (detached jobs and the host lease) and `facts` (what a host has) run on the host itself as
`python -m eagleflow.hosts.jobs` and `python -m eagleflow.hosts.facts`: this package's face imports only the
standard library and `eagleflow.util`/`contracts.failure`, so they start in a fraction of a second there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagleflow.hosts.base import (
    ConnectionLost,
    Host,
    HostAuthError,
    HostBusy,
    HostError,
    HostKeyError,
    HostSetupError,
    HostUnreachable,
    StageFailed,
)
from eagleflow.hosts.local import LocalHost

if TYPE_CHECKING:
    from eagleflow.config import HostConfig

__all__ = [
    "ConnectionLost",
    "Host",
    "HostAuthError",
    "HostBusy",
    "HostError",
    "HostKeyError",
    "HostSetupError",
    "HostUnreachable",
    "LocalHost",
    "StageFailed",
    "make_host",
    "is_transient",
]


def make_host(config: HostConfig) -> Host:
    if config.kind == "ssh":
        from eagleflow.hosts.ssh import SshHost  # paramiko: control side only

        return SshHost(config)
    return LocalHost(config.name, config.env, config.work_root)


def is_transient(exc: BaseException) -> bool:
    """Worth a retry: the link dropped or the host was briefly unreachable. Keys and auth never are."""
    return isinstance(exc, (ConnectionLost, HostUnreachable))
