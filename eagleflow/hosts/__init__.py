"""Hosts that run stages: `make_host(config.host)` picks the implementation."""

from __future__ import annotations

from eagleflow.config import HostConfig
from eagleflow.hosts.base import (
    ConnectionLost, Host, HostAuthError, HostBusy, HostError, HostKeyError, HostSetupError, HostUnreachable,
    StageFailed,
)
from eagleflow.hosts.local import LocalHost

__all__ = ["ConnectionLost", "Host", "HostAuthError", "HostBusy", "HostError", "HostKeyError", "HostSetupError",
           "HostUnreachable",
           "LocalHost", "StageFailed", "make_host", "is_transient"]


def make_host(config: HostConfig) -> Host:
    if config.kind == "ssh":
        from eagleflow.hosts.ssh import SshHost  # paramiko: control side only

        return SshHost(config)
    return LocalHost(config.name, config.env, config.work_root)


def is_transient(exc: BaseException) -> bool:
    """Worth a retry: the link dropped or the host was briefly unreachable. Keys and auth never are."""
    return isinstance(exc, (ConnectionLost, HostUnreachable))
