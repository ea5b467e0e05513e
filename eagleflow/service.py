"""The production service on the host: stopped for the benchmark, always given back.

The benchmark needs production's GPUs and port, so it stops production through the operator's own
means (a systemd unit, or the configured stop/start argv) and never signals production itself.
Giving production back must survive everything: success, failure, a cancelled stage (SIGTERM), a
SIGKILLed stage, a dead controller. So the restore is not done by the stage but by a GUARDIAN, a
small detached process started before production is stopped:

    stage                                         guardian (`python -m eagleflow.service guard DIR`)
    -----                                         --------
    was production healthy? (was_running)
    flock production.hold, write production.json
    start the guardian, wait for its marker  ---> flock production.watching, write {pid, token}
    stop production                               note the host lease holder (the controller)
    ... engines, each with EAGLEFLOW_TOKEN ...    wait: production.hold free, or controller gone
                                                  for orphan_grace_s -> end the stage's group
    release production.hold                 ---> end leftover engines (only processes whose
    wait for production.restored.json             environment carries the token), start
    (not on cancellation: leave at once)          production if it was running and is down, wait
                                                  healthy, write production.restored.json, exit

Files in the state dir (the benchmark's stage dir):

    production.json            the hold: config, was_running, stage pid/pgid, token, times (kept)
    production.restored.json   the guardian's result {ok, was_running, started, healthy_after_s, ...} (kept)
    production-guardian.log    the guardian's log (kept)
    production-commands.log    output of every stop/start/systemctl command run (kept)
    production.hold            flock held by the stage for the block (transient)
    production.watching        flock held by the guardian for its life, {pid, token} (transient)
    engine-<name>.pid          the engines' pids (written by VllmServer beside engine-<name>.log)

Imports only the standard library, httpx and eagleflow.jobs, so the guardian starts in a blink; the
pydantic ProductionConfig is only a type here (the guardian rebuilds it from production.json).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Protocol

import httpx

from eagleflow import jobs

if TYPE_CHECKING:
    from eagleflow.config import ProductionConfig

LogFn = Callable[[str], None]
TOKEN_ENV = "EAGLEFLOW_TOKEN"  # on every engine of one benchmark: the proof that a process is ours to end
STOP_ENV = "EAGLEFLOW_STOPPING"  # on the stop command only: lets the guardian wait for a stop cut short

HOLD = "production.hold"
RECORD = "production.json"
RESULT = "production.restored.json"
WATCHING = "production.watching"
GUARDIAN_LOG = "production-guardian.log"
COMMANDS_LOG = "production-commands.log"

HEALTH_TIMEOUT_S = 3.0  # one health probe; a loaded server still answers /health well within this
GUARDIAN_START_S = 30.0  # the guardian must confirm it is watching within this, or nothing is stopped
STAGE_GRACE_S = 20.0  # guardian -> orphaned stage: SIGTERM, then SIGKILL after this (the stage ends its engines with 15 s)
ENGINE_GRACE_S = 15.0  # leftover engine: SIGTERM, then SIGKILL after this (vLLM's own shutdown)
RESULT_MARGIN_S = 120.0  # the stage waits restore_timeout_s + this for the guardian's result
POLL_S = 0.25

_default_logger = logging.getLogger("eagleflow.production")


class ProductionError(RuntimeError):
    """Production could not be stopped or is not healthy again; the message says why and what to do."""


class ServiceSettings(Protocol):
    """What this module reads of eagleflow.config.ProductionConfig (the guardian rebuilds it from JSON)."""

    kind: str
    unit: str | None
    user_unit: bool
    start_command: list[str]
    stop_command: list[str]
    health_url: str | None
    stop_timeout_s: float
    restore_timeout_s: float
    orphan_grace_s: float


@dataclass
class _Settings:
    kind: str = "none"
    unit: str | None = None
    user_unit: bool = False
    start_command: list[str] = field(default_factory=list)
    stop_command: list[str] = field(default_factory=list)
    health_url: str | None = None
    stop_timeout_s: float = 120.0
    restore_timeout_s: float = 1800.0
    orphan_grace_s: float = 20.0


def _settings_dict(cfg: ServiceSettings) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in _Settings.__dataclass_fields__}


# -- small file helpers -------------------------------------------------------------------------


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    jobs.write_json_atomic(path, data, indent=1)


_read_json = jobs.read_json


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"


# -- processes of ours: proven by the token in their environment --------------------------------


def owned(pid: int, token: str, var: str = TOKEN_ENV) -> bool:
    """Whether live process `pid` carries EAGLEFLOW_TOKEN=<token> (or var=<token>) in its environment.

    The token is random per benchmark and only its engines get it, so a recycled pid (or anyone
    else's process, whose environ we may not even read) is never taken for ours. A zombie has an
    empty environ: it holds no GPU or port, so it counts as gone.
    """
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return False
    return f"{var}={token}".encode() in env.split(b"\0")


def owned_pids(token: str, var: str = TOKEN_ENV) -> list[int]:
    """Every live process carrying the token (an engine and the children it spawned)."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and owned(int(p), token, var)]


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def end_owned_group(pid: int, token: str, grace_s: float = ENGINE_GRACE_S) -> bool:
    """End the process group led by `pid` (an engine started with start_new_session) if it is ours.

    SIGTERM the group, SIGKILL it after grace_s if the leader is still there. Each signal is sent
    only right after `owned` proved the leader carries our token. Returns whether it was ours.
    Group members that outlive a dead leader are not signalled through the group (its id could be
    reused once empty): `end_owned` finds them by their own token.
    """
    if not owned(pid, token):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    if not _wait(lambda: not owned(pid, token), grace_s) and owned(pid, token):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait(lambda: not owned(pid, token), 10.0)
    return True


def end_owned(token: str, grace_s: float = ENGINE_GRACE_S) -> list[int]:
    """End every process still carrying the token, each by its own pid; wait until all are gone."""
    found = owned_pids(token)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        left = [p for p in found if owned(p, token)]
        for p in left:
            if owned(p, token):  # checked again right before the signal: the pid is still ours
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
        if _wait(lambda: not any(owned(p, token) for p in found), wait_s):
            break
    return found


# -- the service ---------------------------------------------------------------------------------


class ProductionService:
    """Stop, start and probe production only through the operator's means; commands are argv lists."""

    def __init__(self, cfg: "ProductionConfig | ServiceSettings", log: LogFn | None = None,
                 output_log: Path | None = None):
        self.cfg = cfg
        self.log = log or _default_logger.info
        self.output_log = output_log

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
        try:
            return httpx.get(self.cfg.health_url, timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def unit_state(self) -> str | None:
        """systemd's ActiveState of the unit (active, activating, deactivating, inactive, failed)."""
        if self.cfg.kind != "systemd":
            return None
        try:
            out = subprocess.run(self.is_active_argv(), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None

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
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, cwd="/", start_new_session=True)
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
            return (f"check `systemctl{user} status {self.cfg.unit}` and `journalctl{user} -u {self.cfg.unit}`; "
                    f"the host user must be allowed to {action} the unit (a polkit rule, or production.user_unit)")
        return f"run production.{action}_command by hand on the host to see why it fails, and fix it"

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
            state = "it still answers healthy: nothing was stopped" if self.healthy() else \
                "it no longer answers healthy: it will be started again"
            raise ProductionError(
                f"stopping production failed: `{' '.join(argv)}` exited with status {rc} ({state}).\n"
                f"Its output:\n{out or '(none)'}\nFix: {self._fix('stop')}"
            )

        def down() -> bool:
            return not self.healthy() and self.unit_state() not in ("active", "activating", "deactivating", "reloading")

        if not _wait(down, self.cfg.stop_timeout_s - (time.monotonic() - t0)):
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
        self.log(f"starting {self.what()}: {' '.join(argv)}")
        rc, out = self._run(argv, self.cfg.restore_timeout_s, "start")
        if rc != 0:
            raise ProductionError(
                f"starting production failed: `{' '.join(argv)}` exited with status {rc}.\n"
                f"Its output:\n{out or '(none)'}\nFix: {self._fix('start')}"
            )

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until health answers 200; ProductionError after timeout_s."""
        t0 = time.monotonic()
        if not _wait(self.healthy, timeout_s):
            raise ProductionError(
                f"production did not answer healthy at {self.cfg.health_url} within {timeout_s:.0f} s of being "
                f"started (production.restore_timeout_s). Fix: {self._fix('start')}"
            )
        return time.monotonic() - t0


# -- the stage's side: the hold ------------------------------------------------------------------


@dataclass
class Hold:
    """What the benchmark gets inside `production_stopped`."""

    state_dir: Path
    token: str
    was_running: bool
    kind: str = "none"
    stopped_s: float | None = None
    result: dict[str, Any] | None = None  # the guardian's result (+ "summary"), once the block has been left

    def engine_env(self) -> dict[str, str]:
        """Add to every engine's environment: how the guardian (and `owned`) knows it is ours."""
        return {TOKEN_ENV: self.token}

    def pid_file(self, name: str) -> Path:
        """Where the pid of engine `name` goes (VllmServer writes it beside engine-<name>.log)."""
        return self.state_dir / f"engine-{name}.pid"

    def summary(self) -> str:
        r = self.result or {}
        if self.kind == "none":
            return "no production service configured"
        if not r.get("ok"):
            return f"production NOT healthy: {r.get('error', 'no result from the guardian')}"
        if not r.get("was_running"):
            return "production was not running before the benchmark; it was left stopped"
        if not r.get("started"):
            return "production was never stopped; it answers healthy"
        return f"production restored, healthy after {r['healthy_after_s']:.1f} s"


def _guardian_alive(state_dir: Path) -> bool:
    return jobs._held(state_dir / WATCHING)


def _wait_previous_guardian(state_dir: Path, timeout_s: float, log: LogFn) -> None:
    """A cancelled attempt's guardian may still be restoring production: let it finish first."""
    if not _guardian_alive(state_dir):
        return
    log(f"a previous benchmark's guardian is still restoring production (see {state_dir / GUARDIAN_LOG}); waiting")
    if not _wait(lambda: not _guardian_alive(state_dir), timeout_s):
        raise ProductionError(
            f"the guardian of a previous benchmark attempt in {state_dir} is still running after {timeout_s:.0f} s; "
            f"see {state_dir / GUARDIAN_LOG}"
        )


def _inherited_was_running(state_dir: Path) -> bool:
    """A previous attempt that stopped production and whose restore never finished (its guardian was
    killed, or the start failed) left production down: that production is still ours to restore."""
    before = _read_json(state_dir / RECORD)
    if not before or not before.get("was_running"):
        return False
    after = _read_json(state_dir / RESULT)
    return not (after and after.get("token") == before.get("token") and after.get("ok"))


def _archive_previous(state_dir: Path) -> None:
    """A retry overwrites production.json and the result: keep the previous attempt's in the guardian log."""
    prev = {name: _read_json(state_dir / name) for name in (RECORD, RESULT)}
    if any(prev.values()):
        with open(state_dir / GUARDIAN_LOG, "a") as f:
            f.write(f"--- previous attempt: {json.dumps(prev)}\n")
    (state_dir / RESULT).unlink(missing_ok=True)


def _start_guardian(state_dir: Path, token: str) -> subprocess.Popen:
    pkg_root = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, STOP_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    with open(state_dir / GUARDIAN_LOG, "ab") as logf:
        # Its own session: a cancellation ends the stage's process group, never the guardian.
        proc = subprocess.Popen([sys.executable, "-m", "eagleflow.service", "guard", str(state_dir)],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                env=env, cwd="/", start_new_session=True, close_fds=True)

    def watching() -> bool:
        mark = _read_json(state_dir / WATCHING)
        return bool(mark and mark.get("token") == token and _guardian_alive(state_dir))

    deadline = time.monotonic() + GUARDIAN_START_S
    while not watching():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ProductionError(
                f"the production guardian did not start (exit {proc.poll()}); production was not stopped. "
                f"Its log {state_dir / GUARDIAN_LOG}:\n{_tail(state_dir / GUARDIAN_LOG)}"
            )
        time.sleep(0.02)
    return proc  # it outlives us by design; waited for only after its result (no zombie if we live on)


def _await_result(state_dir: Path, token: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        res = _read_json(state_dir / RESULT)
        if res and res.get("token") == token:
            return res
        if not _guardian_alive(state_dir):
            res = _read_json(state_dir / RESULT)  # it may have written and exited between our two looks
            if res and res.get("token") == token:
                return res
            return {"ok": False, "token": token, "error": "the guardian exited without a result; "
                    f"its log:\n{_tail(state_dir / GUARDIAN_LOG)}"}
        if time.monotonic() > deadline:
            return {"ok": False, "token": token, "error": f"no result from the guardian after {timeout_s:.0f} s; "
                    f"it may still be restoring production. Its log:\n{_tail(state_dir / GUARDIAN_LOG)}"}
        time.sleep(POLL_S)


@contextmanager
def production_stopped(cfg: "ProductionConfig | ServiceSettings", state_dir: str | Path, *, work_root: str | Path,
                       log: LogFn | None = None) -> Iterator[Hold]:
    """Production stopped for the block, restored afterwards by the guardian whatever happens.

    On a normal exit or an exception, waits for the guardian's result and raises ProductionError when
    production is not healthy again (chained to the block's own exception, if any). On SystemExit or
    KeyboardInterrupt (a cancelled stage) leaves at once: the guardian does the work alone.
    """
    log = log or _default_logger.info
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    if cfg.kind == "none":
        hold = Hold(state_dir, token, was_running=False)
        yield hold
        hold.result = {"ok": True, "kind": "none", "was_running": False, "started": False,
                       "summary": hold.summary()}
        return

    svc = ProductionService(cfg, log, state_dir / COMMANDS_LOG)
    _wait_previous_guardian(state_dir, cfg.restore_timeout_s + RESULT_MARGIN_S, log)
    was_running = svc.running_before()
    if not was_running and _inherited_was_running(state_dir):
        log("production is down because a previous attempt of this benchmark stopped it: it will be restored")
        was_running = True
    _archive_previous(state_dir)
    hold = Hold(state_dir, token, was_running, kind=cfg.kind)

    hold_fd = os.open(state_dir / HOLD, os.O_RDWR | os.O_CREAT, 0o644)  # O_CLOEXEC: engines never inherit it
    try:
        fcntl.flock(hold_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(hold_fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ProductionError(f"{state_dir / HOLD} is held by another process: a second benchmark in the "
                                  "same directory; only one may run") from None
        raise
    record = {"config": _settings_dict(cfg), "was_running": was_running, "pid": os.getpid(), "pgid": os.getpgid(0),
              "token": token, "work_root": str(Path(work_root).resolve()), "since": time.time()}
    guardian: subprocess.Popen | None = None
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            os.close(hold_fd)  # drops the flock: the guardian's signal to act
            released = True

    def restored() -> dict[str, Any]:
        release()
        hold.result = _await_result(state_dir, token, cfg.restore_timeout_s + RESULT_MARGIN_S)
        hold.result["summary"] = hold.summary()  # the line the report shows
        log(hold.result["summary"])
        try:
            assert guardian is not None
            guardian.wait(timeout=10)  # it exits right after writing the result: reap it
        except subprocess.TimeoutExpired:
            pass
        return hold.result

    try:
        _write_atomic(state_dir / RECORD, record)
        guardian = _start_guardian(state_dir, token)
        log(f"production guardian {guardian.pid} is watching (log: {state_dir / GUARDIAN_LOG})")
        if was_running:
            _write_atomic(state_dir / RECORD, {**record, "stopping": True})
            hold.stopped_s = svc.stop(token)
            _write_atomic(state_dir / RECORD, {**record, "stopping": True, "stopped_s": hold.stopped_s})
        else:
            log(f"production was not running ({cfg.health_url} does not answer): it will not be started afterwards")
        yield hold
    except (SystemExit, KeyboardInterrupt):
        release()
        if guardian is not None:
            log(f"cancelled: the guardian restores production (log: {state_dir / GUARDIAN_LOG})")
        raise
    except BaseException as exc:
        if guardian is None:  # nothing was stopped: there is nothing to restore
            raise
        if not restored().get("ok"):
            raise ProductionError(f"{hold.summary()}; and before that: {type(exc).__name__}: {exc}") from exc
        raise
    else:
        if not restored().get("ok"):
            raise ProductionError(hold.summary())
    finally:
        release()


# -- the guardian ---------------------------------------------------------------------------------


def _glog(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} guardian[{os.getpid()}]: {msg}", flush=True)


class ControllerWatch:
    """Whether the controller that leased the host (the flow process, or an SSH-held lease process)
    is gone: the lease free, or held by another owner, continuously for grace_s."""

    def __init__(self, work_root: str, grace_s: float):
        self.work_root = work_root
        self.grace_s = grace_s
        self.holder = jobs.lease_holder(work_root)
        self.gone_since: float | None = None

    def gone(self) -> bool:
        if self.holder is None:
            return False  # run without a lease (by hand): only the hold tells
        now = jobs.lease_holder(self.work_root)
        if now is not None and now.get("owner") == self.holder.get("owner"):
            self.gone_since = None  # still there, or re-leased by the same flow run after a dropped link
            return False
        self.gone_since = self.gone_since or time.monotonic()
        return time.monotonic() - self.gone_since >= self.grace_s


def _controller_in_group(holder: dict[str, Any] | None, pgid: int) -> bool:
    """Whether the controller runs in the stage's process group (a stage not started in a session of
    its own); asked at start, while the controller is still alive."""
    try:
        return bool(holder and holder.get("pid")) and os.getpgid(int(holder["pid"])) == pgid
    except (ProcessLookupError, ValueError):
        return False


def _end_stage(rec: dict[str, Any], hold: Path, shared: bool) -> None:
    """The controller is gone but the stage still holds production: end the stage's process group.

    Safe because the hold flock being held proves the stage (or a fork of it) is alive, so its
    pgid is still its own. If the group is shared with anything not ours (the controller), only
    the stage's pid is signalled.
    """
    pid, pgid = int(rec["pid"]), int(rec["pgid"])
    shared = shared or pgid == os.getpgid(0)
    kill = (lambda s: os.kill(pid, s)) if shared else (lambda s: os.killpg(pgid, s))
    for sig, wait_s in ((signal.SIGTERM, STAGE_GRACE_S), (signal.SIGKILL, 10.0)):
        if not jobs._held(hold):
            return
        _glog(f"ending the stage: {sig.name} to {'pid' if shared else 'process group'} {pid if shared else pgid}")
        try:
            kill(sig)
        except ProcessLookupError:
            return
        if _wait(lambda: not jobs._held(hold), wait_s):
            return


def _restore(svc: ProductionService, was_running: bool) -> dict[str, Any]:
    if not was_running:
        _glog("production was not running before the benchmark: not starting it")
        return {"ok": True, "was_running": False, "started": False, "healthy": svc.healthy()}
    # Never a second copy: production that still answers (the stop failed or never happened) is left
    # alone. A systemd unit also has to be settled "active": while a stop job is pending, `start` is
    # what queues it back up.
    if svc.healthy() and svc.unit_state() in (None, "active"):
        _glog("production answers healthy: it was never stopped, nothing to start")
        return {"ok": True, "was_running": True, "started": False, "healthy_after_s": 0.0}
    t0 = time.monotonic()
    try:
        svc.start()
        svc.wait_healthy(max(1.0, svc.cfg.restore_timeout_s - (time.monotonic() - t0)))
    except ProductionError as exc:
        _glog(f"restore failed: {exc}")
        return {"ok": False, "was_running": True, "started": True, "error": str(exc)}
    took = time.monotonic() - t0
    _glog(f"production restored, healthy after {took:.1f} s")
    return {"ok": True, "was_running": True, "started": True, "healthy_after_s": round(took, 2)}


def guard(state_dir: str | Path) -> int:
    """The guardian's whole life: watch, clean up, restore once, record, exit."""
    d = Path(state_dir)
    # A terminal's or session's signals are not ours to die of; SIGKILL still ends us if someone must.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: _glog(f"ignoring {signal.Signals(s).name}: production must be restored first"))
    rec = _read_json(d / RECORD)
    if not rec:
        _glog(f"no {d / RECORD}: nothing to guard")
        return 2
    mark_fd = os.open(d / WATCHING, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(mark_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        _glog("another guardian is watching this directory: exiting")  # one restore, never two
        return 3
    try:
        os.ftruncate(mark_fd, 0)
        os.write(mark_fd, json.dumps({"pid": os.getpid(), "token": rec["token"]}).encode())
        return _guard(d, rec)
    finally:
        # HOLD before WATCHING: a next attempt waits while WATCHING is held, then makes its own HOLD.
        (d / HOLD).unlink(missing_ok=True)
        (d / WATCHING).unlink(missing_ok=True)
        os.close(mark_fd)


def _guard(d: Path, rec: dict[str, Any]) -> int:
    token = rec["token"]
    svc = ProductionService(_Settings(**rec["config"]), _glog, d / COMMANDS_LOG)
    watch = ControllerWatch(rec["work_root"], svc.cfg.orphan_grace_s)
    _glog(f"watching stage pid {rec['pid']} (pgid {rec['pgid']}); was_running={rec['was_running']}; "
          f"controller: {watch.holder or 'none (no host lease held)'}")
    hold, orphaned = d / HOLD, False
    shared = _controller_in_group(watch.holder, int(rec["pgid"]))
    while jobs._held(hold):
        if watch.gone():
            _glog(f"the controller ({watch.holder}) is gone for {svc.cfg.orphan_grace_s:.0f} s")
            _end_stage(rec, hold, shared)
            orphaned = True
            break
        time.sleep(POLL_S)
    _glog("the hold is free" if not orphaned else "the stage is ended")

    ended = []
    for pid_file in sorted(d.glob("*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if end_owned_group(pid, token):
            _glog(f"ended leftover engine group {pid} ({pid_file.name})")
            ended.append(pid)
    stragglers = end_owned(token)
    if stragglers:
        _glog(f"ended leftover processes carrying the token: {stragglers}")

    # A stop cut short by the stage's death may still be running: judge production after it is done.
    rec = _read_json(d / RECORD) or rec
    if rec.get("stopping") and owned_pids(token, STOP_ENV):
        _glog("the stop command is still running: waiting for it")
        _wait(lambda: not owned_pids(token, STOP_ENV), svc.cfg.stop_timeout_s)

    # Production is only touched now, once: the hold is free and nothing of the benchmark is left.
    result = _restore(svc, bool(rec["was_running"]))
    _write_atomic(d / RESULT, {**result, "token": token, "by": "guardian", "guardian_pid": os.getpid(), "orphaned": orphaned,
                               "ended_engines": ended + stragglers, "at": time.time()})
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagleflow.service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("guard", help="the guardian (started by production_stopped)")
    p.add_argument("state_dir")
    args = parser.parse_args(argv)
    return guard(args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
