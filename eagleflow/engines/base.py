"""An engine server this stage starts, watches while it loads, measures, and ends (only its own group).

Host-side code: runs in the host environment, next to the engine. `VllmServer` and `SglangServer`
(eagleflow.engines.vllm, .sglang) fill in the launch command and the metrics; the launch, the
watchdog (eagleflow.engines.watchdog) and the teardown are shared here. `eagleflow.engines.make_server`
picks the implementation for `engine.kind`.
"""

from __future__ import annotations

import abc
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from eagleflow.contracts.progress import Progress
from eagleflow.contracts.request import StageError
from eagleflow.engines.launch import LaunchSpec
from eagleflow.engines.metrics import latency_from_deltas
from eagleflow.engines.watchdog import FATAL_SETTLE_S, LaunchWatch, LogFollower, root_cause_excerpt, root_cause_line
from eagleflow.util.procs import die_with_parent, end_process_group

if TYPE_CHECKING:
    from eagleflow.engines.chat import ChatResult

log = logging.getLogger("eagleflow.engine")

# SIGTERM grace for an engine whose launch failed, before SIGKILL.
FAILED_GRACE_S = 3.0
GUARD_GRACE_S = 15.0  # the guard's SIGTERM-to-SIGKILL wait when the stage that started the engine dies
# After a failed request: how long to wait for the engine to exit before saying it still runs.
POST_MORTEM_WAIT_S = 3.0


# vLLM's loader, one tqdm update per shard: "Loading safetensors checkpoint shards:  50% Completed | 32/64 [...]"
_SHARDS_LOADED = re.compile(r"Loading \w+ checkpoint shards:.*?(\d+)/(\d+)")


def shards_loaded(line: str) -> tuple[int, int] | None:
    """(loaded, total) from an engine log line of the checkpoint loader, the line's last update."""
    found = _SHARDS_LOADED.findall(line.rsplit("\r", 1)[-1]) or _SHARDS_LOADED.findall(line)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def checkpoint_shards(model: str) -> int | None:
    """How many safetensors files the model directory holds (None: not a local directory)."""
    path = Path(model)
    return len(list(path.glob("*.safetensors"))) or None if path.is_dir() else None


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
    request_extra: dict[str, Any] = {}  # what each measured request adds to its body (SGLang: its meta_info)

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

    def answers_acceptance(self, results: list[ChatResult], k: int) -> dict[str, Any] | None:
        """Acceptance over these answers from what each answer itself reports, or None where the engine reports
        it only in its counters (vLLM)."""
        return None

    # Shared parts.
    def latency(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
        """Mean TTFT, inter-token latency, time per output token and end-to-end latency over a window,
        in ms, from the engine's own histograms (server side: no client lag in them)."""
        return latency_from_deltas(before, after, self.metric_prefix)

    def __enter__(self) -> EngineServer:
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
        # Under eagleflow.engines.guard, the group's leader: a killed stage or a crashed API server takes the
        # engine's children (vLLM's engine core) with it, which the parent-death signal alone does not.
        guarded = [sys.executable, "-m", "eagleflow.engines.guard", str(GUARD_GRACE_S), "--", *argv]
        self.proc = subprocess.Popen(
            guarded,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
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
        return StageError(
            f"{head}\nroot cause from {self.log_path}:\n{root_cause_excerpt(text)}\nfull engine log: {self.log_path}"
        )

    def _watch(self, timeout_s: float) -> None:
        assert self.proc is not None
        start = time.monotonic()
        follower = LogFollower(self.log_path)
        watch = LaunchWatch(self.spec.engine.fatal_patterns)
        stall = self.spec.engine.stall_timeout_s
        # Kimi-K2.5's 64 checkpoint shards take about half an hour: say how far the load is.
        progress = Progress(
            "engine",
            f"load-{self.name}",
            checkpoint_shards(self.spec.model),
            "checkpoint shards",
            label=f"engine {self.name} load",
            every_s=10.0,
        )
        with httpx.Client(timeout=5.0) as client:
            while True:
                for line in follower.new_lines():
                    watch.feed(line, self.name)
                    loaded = shards_loaded(line)
                    if loaded is not None:
                        progress.total = progress.total or loaded[1]
                        progress.done = loaded[0]
                progress.update(figures={"seconds": round(time.monotonic() - start)})
                rc = self.proc.poll()
                if rc is not None:
                    for line in follower.new_lines():
                        watch.feed(line, self.name)
                    raise self._fail(
                        f"exited with code {rc} while starting ({time.monotonic() - start:.0f} s after launch)"
                    )
                if watch.fatal_at is not None and time.monotonic() - watch.fatal_at >= FATAL_SETTLE_S:
                    raise self._fail(
                        f"failed while starting: its log says {watch.fatal_line!r} (the process "
                        "still lived and was ended)"
                    )
                try:
                    if client.get(f"{self.base_url}{self.health_path}").status_code == 200:
                        log.info(
                            "engine %s on port %d healthy after %.1f s",
                            self.name,
                            self.spec.port,
                            time.monotonic() - start,
                        )
                        progress.finish(progress.total, {"seconds": round(time.monotonic() - start)})
                        return
                except httpx.TransportError:
                    pass
                now = time.monotonic()
                if now - start > timeout_s:
                    raise self._fail(f"was not healthy after {timeout_s:.0f} s (engine.startup_timeout_s)")
                if stall is not None and now - follower.last_growth > stall:
                    raise self._fail(
                        f"wrote nothing to its log for {stall:.0f} s while starting (engine.stall_timeout_s)"
                    )
                time.sleep(0.25)

    def post_mortem(self) -> str:
        """Why the engine stopped answering, when it is dead: its exit status and root cause."""
        if self.proc is not None:
            try:  # a failed request usually means the engine is dying: give it a moment to be reaped
                self.proc.wait(timeout=POST_MORTEM_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is None or self.proc.poll() is None:
            return (
                f"engine {self.name} is still running (pid {self.proc.pid if self.proc else '?'}); see {self.log_path}"
            )
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        cause = root_cause_line(text)
        return (
            f"engine {self.name} exited with code {self.proc.returncode}"
            + (
                f"; root cause: {cause}"
                if cause
                else " (no traceback in its log: killed from outside, or out of memory; see the host's kernel log)"
            )
            + f"\nlast lines of {self.log_path}:\n{root_cause_excerpt(text)}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM our group, SIGKILL after grace_s; the pid file goes with it."""
        if self.proc is not None:
            end_process_group(self.proc, grace_s=grace_s)
            self.proc = None
            self.pid_path.unlink(missing_ok=True)
