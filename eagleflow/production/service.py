"""The production service, stopped, started and probed only through the operator's own means.

A systemd unit (`systemctl stop|start|is-active <unit>`) or the configured stop/start argv; health is
`health_url` answering 200. eagleflow never signals the production processes themselves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from eagleflow import EagleflowError
from eagleflow.config.production import PROBE_MAX_REQUESTS, PROBE_MAX_S, PROBE_SHARE
from eagleflow.production.ownership import STOP_ENV, TOKEN_ENV
from eagleflow.util import http
from eagleflow.util.procs import wait_until

if TYPE_CHECKING:
    from eagleflow.config import ProductionConfig

LogFn = Callable[[str], None]
HEALTH_TIMEOUT_S = 3.0  # one health probe; a loaded server still answers /health well within this
# While production comes back, whether its process is still there is asked this often, and two answers in a row
# that it is gone end the wait: a unit between two states or a status command racing the start is not taken
# for a death. A start that dies is then known within ~2 x this, where health alone waits restore_timeout_s
# (an hour for Kimi-K2.5, whose load takes ~30 minutes: a drafter it cannot load cost a night's serving).
GONE_POLL_S = 5.0

_default_logger = logging.getLogger("eagleflow.production")


# What systemctl prints when no retry can help (systemd's own texts: src/libsystemd/sd-bus/bus-error.c,
# src/systemctl): the unit is unknown, polkit refused the user, or there is no systemd to talk to.
_NO_UNIT = re.compile(r"Unit \S+ (not found|not loaded|could not be found)")
_NO_SYSTEMD = re.compile(r"System has not been booted with systemd|Failed to connect to (bus|user scope bus)")
_SYSTEMD_REFUSALS = re.compile(
    _NO_UNIT.pattern
    + "|"
    + _NO_SYSTEMD.pattern
    + r"|Interactive authentication required|Access denied|Permission denied"
)


class ProductionError(EagleflowError):
    """Production could not be stopped or is not healthy again; the message says why and what to do."""


class ServiceSettings(Protocol):
    """What this module reads of eagleflow.config.ProductionConfig (the guardian rebuilds it from JSON)."""

    kind: str
    unit: str | None
    user_unit: bool
    start_command: list[str]
    stop_command: list[str]
    status_command: list[str]
    health_url: str | None
    stop_timeout_s: float
    restore_timeout_s: float
    orphan_grace_s: float
    url: str | None
    pause: str
    sleep_level: int | None
    swap_drafter: bool
    probe_share: float
    probe_max_requests: int
    probe_max_s: float


@dataclass
class SettingsRecord:
    kind: str = "none"
    unit: str | None = None
    user_unit: bool = False
    start_command: list[str] = field(default_factory=list)
    stop_command: list[str] = field(default_factory=list)
    status_command: list[str] = field(default_factory=list)
    health_url: str | None = None
    stop_timeout_s: float = 120.0
    restore_timeout_s: float = 1800.0
    orphan_grace_s: float = 20.0
    # Pausing instead of stopping (eagleflow.production.pause): ProductionConfig's fields of the same names.
    url: str | None = None
    pause: str = "stop"
    sleep_level: int | None = None
    swap_drafter: bool = False
    probe_share: float = PROBE_SHARE
    probe_max_requests: int = PROBE_MAX_REQUESTS
    probe_max_s: float = PROBE_MAX_S
    drafter_link: str | None = None  # promote 'serve': the link production's launch reads its drafter from
    # The run's generate split (prompts_path, split, num_samples, holdout, seed): the probe sends its held-out
    # prompts, those the drafter's offline estimate and canary were measured on (tasks/production.py adds it).
    probe_holdout: dict[str, Any] | None = None
    # Tokens a probe request asks for: the canary's (production.canary_max_tokens, else benchmark.max_tokens), so the
    # probe reads the AL over answers as long as those its expected AL was measured on. None: the pause's default.
    probe_max_tokens: int | None = None


def settings_dict(cfg: ServiceSettings) -> dict[str, Any]:
    """The record's fields from a ProductionConfig or a SettingsRecord (a field the config lacks: its default)."""
    defaults = SettingsRecord()
    return {k: getattr(cfg, k, getattr(defaults, k)) for k in SettingsRecord.__dataclass_fields__}


class ProductionService:
    """Stop, start and probe production only through the operator's means; commands are argv lists."""

    def __init__(
        self, cfg: ProductionConfig | ServiceSettings, log: LogFn | None = None, output_log: Path | None = None
    ):
        self.cfg = cfg
        self.log = log or _default_logger.info
        self.output_log = output_log
        self._restarts_at_start: int | None = None  # systemd's NRestarts when eagleflow last started the unit

    # What would run (pure; tested without systemd).
    def _systemctl(self, *args: str) -> list[str]:
        assert self.cfg.unit, "production.unit is required for kind systemd"
        return ["systemctl", *(["--user"] if self.cfg.user_unit else []), *args, self.cfg.unit]

    def stop_argv(self) -> list[str]:
        return self._systemctl("stop") if self.cfg.kind == "systemd" else list(self.cfg.stop_command)

    def start_argv(self) -> list[str]:
        return self._systemctl("start") if self.cfg.kind == "systemd" else list(self.cfg.start_command)

    def is_active_argv(self) -> list[str]:
        return self._systemctl("is-active")

    def what(self) -> str:
        return f"systemd unit {self.cfg.unit}" if self.cfg.kind == "systemd" else "the production service"

    def healthy(self) -> bool:
        if not self.cfg.health_url:
            return False
        return http.answers(self.cfg.health_url, HEALTH_TIMEOUT_S)

    def unit_state(self) -> str | None:
        """systemd's ActiveState of the unit (active, activating, deactivating, inactive, failed)."""
        if self.cfg.kind != "systemd":
            return None
        try:
            out = subprocess.run(self.is_active_argv(), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None

    def restart_count(self) -> int | None:
        """systemd's NRestarts of the unit: how often systemd restarted it after it exited (Restart=on-failure)."""
        if self.cfg.kind != "systemd":
            return None
        try:
            out = subprocess.run(
                self._systemctl("show", "--property=NRestarts", "--value"), capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return int(out.stdout.strip()) if out.stdout.strip().isdigit() else None

    def gone(self) -> str | None:
        """Why production, started, is not coming up any more (its process exited), or None while it may: the
        unit failed, stopped or was restarted by systemd since eagleflow started it; production.status_command
        exiting non-zero. None when nothing can tell (a command service without a status command)."""
        if self.cfg.kind == "systemd":
            state = self.unit_state()
            if state in ("failed", "inactive"):
                return f"systemd unit {self.cfg.unit} is {state}"
            n, before = self.restart_count(), self._restarts_at_start
            if n is not None and before is not None and n > before:
                return f"systemd unit {self.cfg.unit} exited and systemd restarted it (NRestarts {before} -> {n})"
            return None
        argv = list(getattr(self.cfg, "status_command", None) or [])
        if not argv:
            return None
        try:
            out = self._ask_status(argv)
        except (OSError, subprocess.TimeoutExpired):
            return None  # says nothing about production (the check stage names a status command that cannot run)
        if out.returncode == 0:
            return None
        said = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["(no output)"]
        return f"`{' '.join(argv)}` exited with status {out.returncode} ({said[0]})"

    def running_before(self) -> bool:
        """Running = answering healthy, or (systemd) a unit that is up or coming up: both are restored."""
        return self.healthy() or self.unit_state() in ("active", "activating", "reloading")

    def _run(self, argv: list[str], timeout_s: float, why: str, mark: dict[str, str] | None = None) -> tuple[int, str]:
        """Run argv (no shell) in a session of its own, output appended to the commands log.

        Output goes to a file, not a pipe: a start command leaves a daemon behind that inherits its
        stdout, and reading a pipe would then wait for the daemon to exit.
        """
        env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, STOP_ENV)}  # production is never "ours"
        env.update(mark or {})
        with self._output() as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {why}: {json.dumps(argv)}\n".encode())
            out.flush()
            start = out.tell()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd="/",
                    start_new_session=True,
                )
            except OSError as exc:
                return 127, f"cannot run {argv[0]}: {exc}"
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the command we started, in its own session
                proc.wait()
                rc = -9
                out.write(f"--- eagleflow: timed out after {timeout_s:.0f} s, killed\n".encode())
            out.flush()
            out.seek(start)
            text = out.read().decode(errors="replace")
            out.seek(0, os.SEEK_END)
            out.write(f"--- exit status {rc}\n".encode())
        return rc, "\n".join(text.strip().splitlines()[-20:])

    @contextmanager
    def _output(self) -> Iterator[IO[bytes]]:
        if self.output_log is None:
            with tempfile.TemporaryFile() as f:  # anonymous: nothing left on disk
                yield f
        else:
            with open(self.output_log, "a+b") as f:
                yield f

    def _fix(self, action: str) -> str:
        if self.cfg.kind == "systemd":
            user = " --user" if self.cfg.user_unit else ""
            return (
                f"check `systemctl{user} status {self.cfg.unit}` and `journalctl{user} -u {self.cfg.unit}`; "
                f"the host user must be allowed to {action} the unit (a polkit rule, or production.user_unit)"
            )
        return f"run production.{action}_command by hand on the host to see why it fails, and fix it"

    def _refused(self, action: str, argv: list[str], rc: int, out: str, state: str = "") -> str:
        """The message of a stop or start command that failed: systemd's own reason first where it is one no
        retry can mend (no such unit, polkit's refusal, no systemd to talk to), with its fix; else the output."""
        head = "stopping production failed" if action == "stop" else "starting production failed"
        cmd = f"`{' '.join(argv)}` exited with status {rc}" + (f" ({state})" if state else "")
        known = self._systemd_refusal(action, out)
        if known is None:
            return f"{head}: {cmd}.\nIts output:\n{out or '(none)'}\nFix: {self._fix(action)}"
        why, said, fix = known
        return f"{head}: {why}; systemctl said {said!r} ({cmd}).\nIts output:\n{out}\nFix: {fix}"

    def _systemd_refusal(self, action: str, out: str) -> tuple[str, str, str] | None:
        """(why, systemctl's line, fix) when systemctl's output is a refusal no retry mends; else None."""
        said = next((line.strip() for line in out.splitlines() if _SYSTEMD_REFUSALS.search(line)), None)
        if self.cfg.kind != "systemd" or said is None:
            return None
        user = " --user" if self.cfg.user_unit else ""
        if _NO_UNIT.search(said):
            return (
                f"production.unit {self.cfg.unit!r} is not a unit systemd{user} knows here",
                said,
                f"set production.unit to the unit that runs production on this host (`systemctl{user} list-units "
                "--type=service` lists them), or install it (infra/systemd/eagleflow-production-example.service)",
            )
        if _NO_SYSTEMD.search(said):
            return (
                f"there is no systemd{user} to ask on this host",
                said,
                "production.kind systemd needs a running systemd (a user manager for production.user_unit: "
                "`loginctl enable-linger USER`); else production.kind command with its start and stop commands",
            )
        return (
            f"the host user may not {action} {self.cfg.unit}: polkit refused it",
            said,
            f"allow the host user to stop and start {self.cfg.unit} without a password: a polkit rule for "
            "org.freedesktop.systemd1.manage-units on that unit (docs/production.md), or production.user_unit",
        )

    def unit_problem(self) -> str | None:
        """Why production.unit cannot be stopped and started here, found without touching it (the check stage):
        no systemd to ask, or a unit systemd does not know. None when it can be, or for another production.kind."""
        if self.cfg.kind != "systemd":
            return None
        argv = self._systemctl("show", "--property=LoadState", "--value")
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except OSError as exc:
            return f"production.kind is systemd but systemctl cannot run here: {exc}"
        except subprocess.TimeoutExpired:
            return None  # a slow systemd is not a wrong config; the stop will say more
        if out.stdout.strip() == "not-found":
            out.stdout = f"Unit {self.cfg.unit} not found."
        known = self._systemd_refusal("stop", out.stdout + "\n" + out.stderr)
        if known is None:
            return None
        why, said, fix = known
        return f"{why}; `{' '.join(argv)}` said {said!r}. Fix: {fix}"

    @staticmethod
    def _ask_status(argv: list[str]) -> subprocess.CompletedProcess:
        """production.status_command's answer (at most 30 s: it is asked while a restore waits)."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    def status_problem(self) -> str | None:
        """Why production.status_command cannot tell whether production runs, found in the check stage: it cannot
        run here, it does not answer, or it says production is gone while production answers healthy (it would end
        every restore at once). None when it can tell, or when there is none."""
        argv = list(getattr(self.cfg, "status_command", None) or [])
        if self.cfg.kind != "command" or not argv:
            return None
        cmd = " ".join(argv)
        try:
            out = self._ask_status(argv)
        except subprocess.TimeoutExpired:
            return f"production.status_command `{cmd}` did not answer within 30 s. Fix: make it answer at once"
        except OSError as exc:
            return f"production.status_command cannot run on this host: {exc}. Fix: give the argv of a command there"
        if out.returncode != 0 and self.healthy():
            return (
                f"production.status_command `{cmd}` exits with status {out.returncode} (production gone) while "
                f"production answers healthy at {self.cfg.health_url}. Fix: make it exit 0 while production's "
                "process runs, non-zero once it has exited"
            )
        return None

    def stop(self, token: str | None = None) -> float:
        """Stop production and wait until it is down; returns seconds taken.

        With a token, the stop command carries EAGLEFLOW_STOPPING=<token>: if the stage dies mid-stop,
        the guardian waits for that command to finish before it judges whether production is down.
        """
        t0 = time.monotonic()
        argv = self.stop_argv()
        self.log(f"stopping {self.what()}: {' '.join(argv)}")
        rc, out = self._run(argv, self.cfg.stop_timeout_s, "stop", {STOP_ENV: token} if token else None)
        if rc != 0:
            state = (
                "it still answers healthy: nothing was stopped"
                if self.healthy()
                else "it no longer answers healthy: it will be started again"
            )
            raise ProductionError(self._refused("stop", argv, rc, out, state))

        def down() -> bool:
            return not self.healthy() and self.unit_state() not in ("active", "activating", "deactivating", "reloading")

        if not wait_until(down, self.cfg.stop_timeout_s - (time.monotonic() - t0)):
            raise ProductionError(
                f"production still answers at {self.cfg.health_url} {self.cfg.stop_timeout_s:.0f} s after "
                f"`{' '.join(argv)}` (exit 0); it would hold the GPUs and port the benchmark needs. "
                f"Fix: {self._fix('stop')}, or raise production.stop_timeout_s"
            )
        took = time.monotonic() - t0
        self.log(f"production stopped in {took:.1f} s")
        return took

    def start(self) -> None:
        argv = self.start_argv()
        self._restarts_at_start = self.restart_count()
        self.log(f"starting {self.what()}: {' '.join(argv)}")
        rc, out = self._run(argv, self.cfg.restore_timeout_s, "start")
        if rc != 0:
            raise ProductionError(self._refused("start", argv, rc, out))

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until health answers 200; ProductionError after timeout_s, or as soon as production's process is
        known to be gone (`gone`, twice in a row GONE_POLL_S apart)."""
        t0 = time.monotonic()
        strikes, next_ask = 0, t0 + GONE_POLL_S
        while not self.healthy():
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise ProductionError(
                    f"production did not answer healthy at {self.cfg.health_url} within {timeout_s:.0f} s of being "
                    f"started (production.restore_timeout_s). Fix: {self._fix('start')}"
                )
            if now >= next_ask:
                why = self.gone()
                strikes = strikes + 1 if why else 0
                if why and strikes >= 2:
                    raise ProductionError(
                        f"production exited while coming back, {now - t0:.0f} s after it was started: {why}. "
                        f"Its own log says why. Fix: {self._fix('start')}"
                    )
                next_ask = time.monotonic() + GONE_POLL_S
            time.sleep(0.2)
        return time.monotonic() - t0
