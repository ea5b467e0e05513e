"""The chat client (eagleflow.engines.chat) against a real socket with nothing behind it: every
request fails, naming the address."""

from __future__ import annotations

import pytest

from eagleflow.engines.chat import chat_all
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_unreachable_server_names_the_address():
    port = free_port()
    results, _ = chat_all(
        f"http://127.0.0.1:{port}",
        "m",
        [[{"role": "user", "content": "hi"}]],
        max_tokens=4,
        temperature=0,
        concurrency=1,
        timeout_s=5,
    )
    assert results[0].error and f"127.0.0.1:{port}" in results[0].error and results[0].attempts == 3
    assert results[0].transient  # nothing was served: against production, sent again once it answers
