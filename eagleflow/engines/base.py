"""An engine server this stage starts, watches while it loads, measures, and ends (only its own group).

Host-side code: runs in the host environment, next to the engine. `VllmServer` and `SglangServer`
fill in the launch command and the metrics; the launch, the watchdog and the teardown are shared.

The watchdog follows the engine log while waiting for readiness: checkpoint-shard progress and the
load milestones go to the stage log (and so into Prefect); the death of the engine, or a fatal line
while it still lives (a dead worker behind a live API server), fails the launch within seconds with
the root cause: the first traceback's exception line, which is the worker's or EngineCore's own,
not the API server's "Engine core initialization failed" wrapper around it.
"""

from __future__ import annotations

import abc
import logging
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from eagleflow.config import EngineConfig
from eagleflow.hosts.local import end_process_group
from eagleflow.stages.common import StageError

log = logging.getLogger("eagleflow.engine")


@dataclass
class LaunchSpec:
    """One engine launch: the target, optionally with a drafter.

    `speculative` is engine-neutral: {"method": "eagle3", "model": <drafter dir>,
    "num_speculative_tokens": k}; each engine turns it into its own flags.
    """

    python: str
    model: str
    served_model_name: str
    dtype: str
    engine: EngineConfig
    port: int
    speculative: dict[str, Any] | None = None

    def argv(self) -> list[str]:
        return server_class(self.engine.kind).argv_for(self)


# -- the launch watchdog ---------------------------------------------------------------------------

# Load milestones worth a line in Prefect (vLLM and SGLang wording).
PROGRESS_PATTERNS = [
    re.compile(r"Loading (?:safetensors )?checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
    re.compile(r"Loading weights took [\d.]+ ?s"),
    re.compile(r"Model loading took [\d.]+ ?GiB"),
    re.compile(r"Initializing a V\d LLM engine \(v[\w.+-]+\)"),
    re.compile(r"init engine.{0,80}?took [\d.]+ ?s(?:econds)?"),
    re.compile(r"Graph capturing finished in [\d.]+ ?s(?:ecs)?"),
    re.compile(r"Load weight end\..*"),
    re.compile(r"(?:Application startup complete|The server is fired up and ready to roll!)"),
]

# A line that means the launch has failed even if the API server process still lives.
FATAL_PATTERNS = [
    re.compile(r"Engine core initialization failed"),
    re.compile(r"EngineCore failed to start"),
    re.compile(r"Worker(?:Proc|_TP\d+)?.*(?:died|exited unexpectedly|failed to start)", re.IGNORECASE),
    re.compile(r"(?:torch\.)?OutOfMemoryError|CUDA out of memory"),
    re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError"),
    re.compile(r"Scheduler hit an exception|Received sigquit from a child process"),  # SGLang
    re.compile(r"Fatal Python error|Segmentation fault|core dumped"),
]

# How long a fatal line is given for the rest of its traceback to reach the log before we act.
FATAL_SETTLE_S = 2.0
# SIGTERM grace for an engine whose launch failed, before SIGKILL.
FAILED_GRACE_S = 3.0
# After a failed request: how long to wait for the engine to exit before saying it still runs.
POST_MORTEM_WAIT_S = 3.0

# vLLM prefixes every line of a child process ("(EngineCore pid=12) ", "(Worker_TP0 pid=34) ") and
# its logger adds "ERROR 11-29 19:27:58 [core.py:1510] "; both are stripped to find the exception.
_PREFIX = re.compile(
    r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?"
)
_EXC_LINE = re.compile(r"^(?:[a-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))\b(?::.*)?$")


def _clip(line: str, max_chars: int) -> str:
    return line if len(line) <= max_chars else line[:max_chars] + " ..."


def root_cause_excerpt(log_text: str, max_lines: int = 25, max_chars: int = 400) -> str:
    """The first traceback of the engine log, else its last lines.

    The first traceback is the worker's / EngineCore's own; later ones are the API server's wrappers
    re-raising it ("Engine core initialization failed"). Its end holds the exception and message.
    """
    lines = [_clip(line, max_chars) for line in log_text.replace("\r", "\n").splitlines()]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return "\n".join(lines[-max_lines:])
    end = starts[1] if len(starts) > 1 else len(lines)
    block = lines[starts[0]:end]
    if len(block) > max_lines:
        block = [block[0], "  ..."] + block[-(max_lines - 2):]
    return "\n".join(block)


def root_cause_line(log_text: str) -> str | None:
    """The exception line that ends the engine's first traceback ('KeyError: ...'), without the
    process prefix; None when the log has no traceback."""
    lines = log_text.replace("\r", "\n").splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return None
    end = starts[1] if len(starts) > 1 else len(lines)
    for line in lines[starts[0] + 1:end]:
        bare = _PREFIX.sub("", line).strip()
        if _EXC_LINE.match(bare):
            return _clip(bare, 400)
    return None


@dataclass
class LogFollower:
    """Reads what an engine log gained since the last call; yields whole lines (tqdm's \\r too)."""

    path: Path
    offset: int = 0
    partial: str = ""
    last_growth: float = field(default_factory=time.monotonic)

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        self.last_growth = time.monotonic()
        text = self.partial + data.decode("utf-8", errors="replace")
        parts = re.split(r"[\r\n]", text)
        self.partial = parts.pop()
        return [p for p in parts if p.strip()]


class LaunchWatch:
    """What the watchdog saw: reports progress once per milestone, remembers the first fatal line."""

    def __init__(self, extra_fatal: list[str]):
        self.fatal = FATAL_PATTERNS + [re.compile(p) for p in extra_fatal]
        self.seen: set[str] = set()
        self.fatal_line: str | None = None
        self.fatal_at: float | None = None

    def feed(self, line: str, name: str) -> None:
        for pat in PROGRESS_PATTERNS:
            m = pat.search(line)
            if m:
                text = m.group(0).strip()
                if text not in self.seen:
                    self.seen.add(text)
                    log.info("engine %s loading: %s", name, text)
                break
        if self.fatal_line is None and any(p.search(line) for p in self.fatal):
            self.fatal_line = _clip(_PREFIX.sub("", line).strip(), 400)
            self.fatal_at = time.monotonic()
            log.warning("engine %s: fatal line in its log: %s", name, self.fatal_line)


# -- the server ------------------------------------------------------------------------------------


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


class EngineServer(abc.ABC):
    """Context manager: launch, watch until healthy, yield, end our process group.

    The engine runs in its own session so ending it ends its workers too, and nothing else. Its pid
    (the group's leader) is written beside its log: what this stage started, and so the only thing
    it, or the production guardian after it, may end.
    """

    health_path = "/health"
    metric_prefix = ""  # of the engine's latency histograms in /metrics ("vllm:", "sglang:")

    def __init__(self, spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None, name: str | None = None):
        self.spec = spec
        self.log_path = Path(log_path)
        self.env = env or {}
        self.name = name or self.log_path.stem
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://{spec.engine.host}:{spec.port}"

    # Engine-specific parts.
    @classmethod
    @abc.abstractmethod
    def argv_for(cls, spec: LaunchSpec) -> list[str]:
        """The launch command for `spec`."""

    @abc.abstractmethod
    def snapshot(self) -> dict[str, float]:
        """Counters to diff around a measured window."""

    @abc.abstractmethod
    def acceptance(self, before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
        """Acceptance over the window between two snapshots."""

    # Shared parts.
    def latency(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
        """Mean TTFT, inter-token latency, time per output token and end-to-end latency over a window,
        in ms, from the engine's own histograms (server side: no client lag in them)."""
        return latency_from_deltas(before, after, self.metric_prefix)

    def __enter__(self) -> "EngineServer":
        self.start()
        self.wait_healthy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid_path(self) -> Path:
        return self.log_path.with_suffix(".pid")

    def start(self) -> None:
        """Launch without waiting: several engines can then load side by side."""
        e = self.spec.engine
        if not port_is_free(e.host, self.spec.port):
            raise StageError(
                f"port {self.spec.port} on {e.host} is already in use; another server is there and eagleflow will not "
                "talk to or end a process it did not start. Free the port or set engine.port to a free one."
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        env = {**os.environ, **e.env, **self.env}
        argv = self.argv_for(self.spec)
        log.info("launching engine %s: %s", self.name, " ".join(argv))
        self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        logf.close()
        self.pid_path.write_text(str(self.proc.pid))

    def wait_healthy(self) -> None:
        """Block until the engine answers; end it and raise with its root cause if the launch fails."""
        try:
            self._watch(self.spec.engine.startup_timeout_s)
        except StageError as exc:
            # Say it first, then clean up: a half-started engine gets a short grace (a clean shutdown
            # of a failed launch can hang for its full timeout, and there is nothing to save).
            log.error("%s", str(exc).splitlines()[0])
            self.stop(grace_s=FAILED_GRACE_S)
            raise
        except BaseException:
            self.stop()
            raise

    def _fail(self, what: str) -> StageError:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        cause = root_cause_line(text)
        head = f"engine {self.name} {what}" + (f"; root cause: {cause}" if cause else "")
        return StageError(f"{head}\nroot cause from {self.log_path}:\n{root_cause_excerpt(text)}\n"
                          f"full engine log: {self.log_path}")

    def _watch(self, timeout_s: float) -> None:
        assert self.proc is not None
        start = time.monotonic()
        follower = LogFollower(self.log_path)
        watch = LaunchWatch(self.spec.engine.fatal_patterns)
        stall = self.spec.engine.stall_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                for line in follower.new_lines():
                    watch.feed(line, self.name)
                rc = self.proc.poll()
                if rc is not None:
                    for line in follower.new_lines():
                        watch.feed(line, self.name)
                    raise self._fail(f"exited with code {rc} while starting ({time.monotonic() - start:.0f} s after launch)")
                if watch.fatal_at is not None and time.monotonic() - watch.fatal_at >= FATAL_SETTLE_S:
                    raise self._fail(f"failed while starting: its log says {watch.fatal_line!r} (the process "
                                     "still lived and was ended)")
                try:
                    if client.get(f"{self.base_url}{self.health_path}").status_code == 200:
                        log.info("engine %s on port %d healthy after %.1f s", self.name, self.spec.port,
                                 time.monotonic() - start)
                        return
                except httpx.TransportError:
                    pass
                now = time.monotonic()
                if now - start > timeout_s:
                    raise self._fail(f"was not healthy after {timeout_s:.0f} s (engine.startup_timeout_s)")
                if stall is not None and now - follower.last_growth > stall:
                    raise self._fail(f"wrote nothing to its log for {stall:.0f} s while starting (engine.stall_timeout_s)")
                time.sleep(0.25)

    def post_mortem(self) -> str:
        """Why the engine stopped answering, when it is dead: its exit status and root cause."""
        if self.proc is not None:
            try:  # a failed request usually means the engine is dying: give it a moment to be reaped
                self.proc.wait(timeout=POST_MORTEM_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is None or self.proc.poll() is None:
            return f"engine {self.name} is still running (pid {self.proc.pid if self.proc else '?'}); see {self.log_path}"
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        cause = root_cause_line(text)
        return (f"engine {self.name} exited with code {self.proc.returncode}"
                + (f"; root cause: {cause}" if cause else " (no traceback in its log: killed from outside, or "
                   "out of memory; see the host's kernel log)")
                + f"\nlast lines of {self.log_path}:\n{root_cause_excerpt(text)}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM our group, SIGKILL after grace_s; the pid file goes with it."""
        if self.proc is not None:
            end_process_group(self.proc, grace_s=grace_s)
            self.proc = None
            self.pid_path.unlink(missing_ok=True)


# -- /metrics ---------------------------------------------------------------------------------------

# The engines' latency histograms (seconds), as `<prefix><name>`; vLLM and SGLang share these names.
LATENCY_HISTOGRAMS = {
    "ttft_ms": "time_to_first_token_seconds",
    "itl_ms": "inter_token_latency_seconds",
    "tpot_ms": "request_time_per_output_token_seconds",
    "e2e_ms": "e2e_request_latency_seconds",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Counters (`name`, without `_total`; `name{position=i}` for per-position ones) and histogram
    `name_sum` / `name_count` of a Prometheus text page, each summed over its other labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                name = sample.name[: -len("_total")]
                if "position" in sample.labels:
                    name = f"{name}{{position={sample.labels['position']}}}"
            elif family.type == "histogram" and sample.name.endswith(("_sum", "_count")):
                name = sample.name
            else:
                continue
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def latency_from_deltas(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, float | None]:
    """Mean of each latency histogram over the window (delta sum / delta count), in ms."""
    out: dict[str, float | None] = {}
    for key, hist in LATENCY_HISTOGRAMS.items():
        n = after.get(f"{prefix}{hist}_count", 0.0) - before.get(f"{prefix}{hist}_count", 0.0)
        total = after.get(f"{prefix}{hist}_sum", 0.0) - before.get(f"{prefix}{hist}_sum", 0.0)
        out[key] = 1000.0 * total / n if n > 0 else None
    return out


def server_class(kind: str) -> type[EngineServer]:
    if kind == "vllm":
        from eagleflow.engines.vllm import VllmServer

        return VllmServer
    if kind == "sglang":
        from eagleflow.engines.sglang import SglangServer

        return SglangServer
    raise ValueError(f"unknown engine.kind {kind!r}; expected 'vllm' or 'sglang'")


def make_server(spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None,
                name: str | None = None) -> EngineServer:
    return server_class(spec.engine.kind)(spec, log_path, env=env, name=name)


def speculative(drafter_dir: str, k: int) -> dict[str, Any]:
    return {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": k}
