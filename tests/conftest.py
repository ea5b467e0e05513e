"""Shared test helpers. Tests run against real processes: vLLM (CPU build), a Prefect server."""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Ports our servers listen on, below the kernel's ephemeral range (32768-60999 by default): a port the kernel hands
# out for port 0 is also what it hands the next outgoing connection as its source port, and with thousands of health
# polls and API calls a second on these cores one took an engine's port in the minutes between the test choosing it
# and the engine binding it ("port ... is already in use"). Each pytest process counts through a block of its own.
_PORTS = itertools.count(20_000 + (os.getpid() % 12) * 1_000 + random.randrange(500))


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now, outside the ephemeral range, never the same twice in a process."""
    for port in _PORTS:
        if port >= 32_000:
            break
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the block ran out (thousands of ports in one session): the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_yaml() -> Path:
    return ROOT / "configs" / "demo.yaml"


def prod_service_config(
    tmp: Path,
    port: int,
    python: str,
    served_name: str = "prod",
    engine_args: tuple = (),
    env_from: tuple = (),
    env: tuple = (),
    **extra,
) -> dict:
    """production: a command-defined service around a real vLLM CPU server of the demo target (no
    drafter), started and stopped by tests/prodservice.py, as an operator's scripts would.
    `env_from`: K=VAR pairs the server gets from the start command's environment (an API key); `env`: more
    K=V pairs of its environment."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(ROOT / "demo" / "target"),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        # as the demo config's engine.kv_cache_gib (0.25): production launched as eagleflow launches its engines
        "--kv-cache-memory-bytes",
        str(2**28),
        *engine_args,
    ]
    return _service_config(tmp, port, argv, env_from, env, **extra)


def standin_service_config(tmp: Path, port: int, load_s: float = 10.0, **extra) -> dict:
    """production: the same operator scripts around a stand-in server (`prodservice.py serve`) that answers its
    health load_s seconds after its start, as an engine loads first: for a case where production is only stopped
    and given back, at none of an engine start's ~17 CPU-seconds."""
    import sys

    argv = [
        sys.executable,
        str(ROOT / "tests" / "prodservice.py"),
        "serve",
        "--port",
        str(port),
        "--load-s",
        str(load_s),
    ]
    return _service_config(tmp, port, argv, (), (), **extra)


def _service_config(tmp: Path, port: int, argv: list[str], env_from: tuple, env: tuple, **extra) -> dict:
    import sys

    pidfile, log = tmp / "prod.pid", tmp / "prod.log"
    script = str(ROOT / "tests" / "prodservice.py")
    return {
        "kind": "command",
        "start_command": [
            sys.executable,
            script,
            "start",
            "--pidfile",
            str(pidfile),
            "--log",
            str(log),
            "--port",
            str(port),
            *[a for kv in env for a in ("--env", kv)],
            *[a for kv in env_from for a in ("--env-from", kv)],
            "--",
            *argv,
        ],
        "stop_command": [sys.executable, script, "stop", "--pidfile", str(pidfile)],
        "status_command": [sys.executable, script, "status", "--pidfile", str(pidfile)],
        "health_url": f"http://127.0.0.1:{port}/health",
        **extra,
    }


def processes_with_env(var: str, value: str) -> list[int]:
    """Live processes whose environment holds var=value (what a benchmark leaves behind, if anything)."""
    import os

    needle = f"{var}={value}".encode()
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                stat = Path(f"/proc/{p}/stat").read_text()
                if stat.rsplit(") ", 1)[1][0] != "Z":
                    out.append(int(p))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return out
