"""Fixtures of the host tests: two GPU "hosts", each a real sshd on loopback with keys of its own."""

from __future__ import annotations

import pytest

from tests.sshd import start_sshd


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    servers = [start_sshd(tmp_path_factory.mktemp(f"sshd-{n}")) for n in ("a", "b")]
    yield servers
    for s in servers:
        s.stop()
