"""Serving engines: `make_server(spec, log_path)` picks the implementation for `spec.engine.kind`.

The base class (`base.EngineServer`) never names its subclasses: this package's face does, as
`eagleflow.hosts` picks the host. Host-side only (httpx, prometheus_client).
"""

from __future__ import annotations

from pathlib import Path

from eagleflow.engines.base import EngineServer
from eagleflow.engines.launch import LaunchSpec
from eagleflow.engines.sglang import SglangServer
from eagleflow.engines.vllm import VllmServer

SERVERS: dict[str, type[EngineServer]] = {"vllm": VllmServer, "sglang": SglangServer}

__all__ = ["EngineServer", "LaunchSpec", "SERVERS", "make_server", "server_class"]


def server_class(kind: str) -> type[EngineServer]:
    try:
        return SERVERS[kind]
    except KeyError:
        raise ValueError(f"unknown engine.kind {kind!r}; expected one of {sorted(SERVERS)}") from None


def make_server(
    spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None, name: str | None = None
) -> EngineServer:
    return server_class(spec.engine.kind)(spec, log_path, env=env, name=name)
