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
    import sys

    pidfile, log = tmp / "prod.pid", tmp / "prod.log"
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
        *engine_args,
    ]
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
            "--env",
            "VLLM_CPU_KVCACHE_SPACE=1",
            *[a for kv in env for a in ("--env", kv)],
            *[a for kv in env_from for a in ("--env-from", kv)],
            "--",
            *argv,
        ],
        "stop_command": [sys.executable, script, "stop", "--pidfile", str(pidfile)],
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
