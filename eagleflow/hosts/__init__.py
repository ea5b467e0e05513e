"""Hosts that run stages: `make_host(config.host)` picks the implementation."""

from __future__ import annotations

from eagleflow.config import HostConfig
from eagleflow.hosts.base import Host, HostError, StageFailed
from eagleflow.hosts.local import LocalHost

__all__ = ["Host", "HostError", "StageFailed", "LocalHost", "make_host"]


def make_host(config: HostConfig) -> Host:
    if config.kind == "local":
        return LocalHost(config.name, config.env)
    raise HostError(f"host.kind {config.kind!r} is not supported yet")
