"""Shared test helpers. Tests run against real processes: vLLM (CPU build), a Prefect server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_yaml() -> Path:
    return ROOT / "configs" / "demo.yaml"
