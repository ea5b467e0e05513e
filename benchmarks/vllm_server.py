"""A vLLM OpenAI server started by a benchmark script: its own session and log, /health polled, ended by
its process group. Shared by the GPU benchmarks that start engines themselves (engine_load.py,
sleep_mode.py), which run where eagleflow's engine launch is not what they measure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def gpu_used_mib() -> int | None:
    """The first GPU's memory in use (nvidia-smi), or None where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        return int(out.split()[0])
    except Exception:
        return None


class Server:
    """`python -m vllm.entrypoints.openai.api_server ARGS` on 127.0.0.1:`port`, its output in `log_path`."""

    def __init__(
        self,
        args: list[str],
        port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
        client_timeout_s: float = 120,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ]
        self.log_path = log_path
        log("engine: " + " ".join(self.cmd[3:]))
        self.logf = open(log_path, "w")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        self.client = httpx.Client(timeout=client_timeout_s)

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds from the start to the first healthy /health; RuntimeError with the log's tail if the
        server exits or stays unhealthy past `timeout_s`."""
        while time.perf_counter() - self.t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with code {self.proc.returncode}: {self.tail()}")
            try:
                if self.client.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.perf_counter() - self.t0
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"engine not healthy within {timeout_s} s: {self.tail()}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """SIGINT to the server's group (vLLM frees the GPU on it), SIGKILL after 30 s."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.client.close()
        self.logf.close()
