"""The stage's side: production stopped for a block of work and given back by the guardian, whatever happens.

    with production_stopped(cfg, stage_dir, work_root=...) as downtime:
        ... engines, each with downtime.engine_env() ...

The stage takes an flock on `production.hold`, starts the guardian (its own session) and waits for it
to watch, then stops production. Leaving the block releases the hold; the guardian then restores
production and writes its result, which the block waits for (not on cancellation: it leaves at once).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagleflow.production import pause
from eagleflow.production.ownership import STOP_ENV, TOKEN_ENV
from eagleflow.production.service import ProductionError, ProductionService, ServiceSettings, settings_dict
from eagleflow.production.state import (
    COMMANDS_LOG,
    GUARDIAN_LOG,
    HOLD,
    POLL_S,
    RECORD,
    RESULT,
    WATCHING,
    guardian_alive,
    tail,
)
from eagleflow.util.files import read_json, write_json_atomic
from eagleflow.util.locks import try_lock
from eagleflow.util.procs import wait_until

if TYPE_CHECKING:
    from eagleflow.config import ProductionConfig

LogFn = Callable[[str], None]
_logger = logging.getLogger("eagleflow.production")
GUARDIAN_START_S = 30.0  # the guardian must confirm it is watching within this, or nothing is stopped
RESULT_MARGIN_S = 120.0  # the stage waits restore_timeout_s + this for the guardian's result


def _write_record(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data, indent=1)


@dataclass
class Downtime:
    """Production stopped for a block of work: what the block gets inside `production_stopped`."""

    state_dir: Path
    token: str
    was_running: bool
    kind: str = "none"
    stopped_s: float | None = None
    paused: dict[str, Any] | None = None  # asleep instead of stopped: eagleflow.production.pause's record
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
        if r.get("resumed"):
            res = r["resumed"]
            swapped = (
                f", drafter {res['swapped_in']} swapped in ({res['swap_s']:.1f} s)" if res.get("swapped_in") else ""
            )
            healthy = f"healthy after {r['healthy_after_s']:.1f} s"
            return f"production woken from sleep level {res['level']}, {healthy}{swapped}{probe_line(r, res)}"
        if not r.get("started"):
            return "production was never stopped; it answers healthy"
        if r.get("rolled_back"):
            return (
                f"production restored with the last good drafter, healthy after {r['healthy_after_s']:.1f} s: "
                f"{r['rolled_back']}"
            )
        fallback = f" (stopped and started: {r['pause_fallback']})" if r.get("pause_fallback") else ""
        return f"production restored, healthy after {r['healthy_after_s']:.1f} s{fallback}"


def probe_line(r: dict[str, Any], res: dict[str, Any]) -> str:
    """The wake's probe as the report's line says it: its AL and interval against what the drafter should serve."""
    v = r.get("wake_probe") or {}
    if v.get("expected_al") is not None and v.get("probe_al") is not None:
        ci = v.get("probe_al_interval")
        shown = f"probe AL {v['probe_al']:.2f}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        return (
            f", {shown} over {v.get('probe_requests')} requests against the bar {v['bar']:.2f} "
            f"({v['share']:.0%} of {v['expected_source']}: AL {v['expected_al']:.2f}): {v['decision']}"
        )
    if not res.get("probe_al"):
        return ""
    none = f"; no expected AL: {v['expected_source']}" if v.get("expected_source") else ""
    return f", its drafter drafts (probe AL {res['probe_al']:.2f}{none})"


def _pause(cfg: ProductionConfig | ServiceSettings, log: LogFn) -> tuple[dict[str, Any] | None, str | None]:
    """Put production to sleep (eagleflow.production.pause); (what was done, None), or (None, why it was not)."""
    plan = pause.preflight(cfg.pause, cfg.sleep_level, cfg.url, cfg.health_url)
    if not plan.ok:
        log(f"production is stopped, not paused: {plan.why}")
        return None, plan.why
    assert plan.base_url and plan.level
    link = getattr(cfg, "drafter_link", None)  # the window's SettingsRecord only: tasks/production.py adds it
    try:
        # What the wake must give back: its answers, its drafter's acceptance; on the prompts the wake's probe sends.
        prompts = pause.probe_prompts(getattr(cfg, "probe_holdout", None))[0]
        probed = pause.probe(plan.base_url, prompts=prompts, max_tokens=getattr(cfg, "probe_max_tokens", None))
    except Exception as exc:  # noqa: BLE001 - production that cannot be probed is stopped, as before
        log(f"production is stopped, not paused: it did not answer the probe before the sleep: {exc}")
        return None, f"the probe before the sleep failed: {exc}"
    try:
        info = pause.sleep(plan.base_url, plan.level, gpu_before_mib=plan.gpu_used_mib)
        before, asleep = info["gpu_used_mib_before"], info["gpu_used_mib_asleep"]
        if before and asleep is not None and before - asleep < pause.MIN_FREED_FRACTION * before:
            raise pause.PauseError(
                f"asleep, production still holds {asleep:,} of {before:,} MiB on the GPUs: the stages would not fit"
            )
    except Exception as exc:  # noqa: BLE001 - a pause that went wrong in any way is a stop
        log(f"the sleep did not free the GPUs: {exc}; waking production to stop it instead")
        try:
            pause.wake(plan.base_url, plan.level)
        except Exception as wake_exc:  # noqa: BLE001
            log(f"the wake before the stop failed too ({wake_exc}); the stop ends it either way")
        return None, f"the sleep failed: {exc}"
    log(
        f"production is asleep ({plan.why}) in {info['sleep_s']:.2f} s; GPU memory "
        f"{info['gpu_used_mib_before']} -> {info['gpu_used_mib_asleep']} MiB"
    )
    return {**plan.as_dict(), **info, "drafter": os.path.realpath(link) if link else None, "probe_before": probed}, None


def _wait_previous_guardian(state_dir: Path, timeout_s: float, log: LogFn) -> None:
    """A cancelled attempt's guardian may still be restoring production: let it finish first."""
    if not guardian_alive(state_dir):
        return
    log(f"a previous benchmark's guardian is still restoring production (see {state_dir / GUARDIAN_LOG}); waiting")
    if not wait_until(lambda: not guardian_alive(state_dir), timeout_s):
        raise ProductionError(
            f"the guardian of a previous benchmark attempt in {state_dir} is still running after {timeout_s:.0f} s; "
            f"see {state_dir / GUARDIAN_LOG}"
        )


def _inherited_was_running(state_dir: Path) -> bool:
    """A previous attempt that stopped production and whose restore never finished (its guardian was
    killed, or the start failed) left production down: that production is still ours to restore."""
    before = read_json(state_dir / RECORD)
    if not before or not before.get("was_running"):
        return False
    after = read_json(state_dir / RESULT)
    return not (after and after.get("token") == before.get("token") and after.get("ok"))


def _archive_previous(state_dir: Path) -> None:
    """A retry overwrites production.json and the result: keep the previous attempt's in the guardian log."""
    prev = {name: read_json(state_dir / name) for name in (RECORD, RESULT)}
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
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagleflow.production.guardian", str(state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )

    def watching() -> bool:
        mark = read_json(state_dir / WATCHING)
        return bool(mark and mark.get("token") == token and guardian_alive(state_dir))

    deadline = time.monotonic() + GUARDIAN_START_S
    while not watching():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ProductionError(
                f"the production guardian did not start (exit {proc.poll()}); production was not stopped. "
                f"Its log {state_dir / GUARDIAN_LOG}:\n{tail(state_dir / GUARDIAN_LOG)}"
            )
        time.sleep(0.02)
    return proc  # it outlives us by design; waited for only after its result (no zombie if we live on)


def _await_result(state_dir: Path, token: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        res = read_json(state_dir / RESULT)
        if res and res.get("token") == token:
            return res
        if not guardian_alive(state_dir):
            res = read_json(state_dir / RESULT)  # it may have written and exited between our two looks
            if res and res.get("token") == token:
                return res
            return {
                "ok": False,
                "token": token,
                "error": f"the guardian exited without a result; its log:\n{tail(state_dir / GUARDIAN_LOG)}",
            }
        if time.monotonic() > deadline:
            return {
                "ok": False,
                "token": token,
                "error": f"no result from the guardian after {timeout_s:.0f} s; "
                f"it may still be restoring production. Its log:\n{tail(state_dir / GUARDIAN_LOG)}",
            }
        time.sleep(POLL_S)


@contextmanager
def production_stopped(
    cfg: ProductionConfig | ServiceSettings, state_dir: str | Path, *, work_root: str | Path, log: LogFn | None = None
) -> Iterator[Downtime]:
    """Production stopped for the block, restored afterwards by the guardian whatever happens.

    On a normal exit or an exception, waits for the guardian's result and raises ProductionError when
    production is not healthy again (chained to the block's own exception, if any). On SystemExit or
    KeyboardInterrupt (a cancelled stage) leaves at once: the guardian does the work alone.
    """
    log = log or _logger.info
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    if cfg.kind == "none":
        hold = Downtime(state_dir, token, was_running=False)
        yield hold
        hold.result = {"ok": True, "kind": "none", "was_running": False, "started": False, "summary": hold.summary()}
        return

    svc = ProductionService(cfg, log, state_dir / COMMANDS_LOG)
    _wait_previous_guardian(state_dir, cfg.restore_timeout_s + RESULT_MARGIN_S, log)
    was_running = svc.running_before()
    if not was_running and _inherited_was_running(state_dir):
        log("production is down because a previous attempt of this benchmark stopped it: it will be restored")
        was_running = True
    _archive_previous(state_dir)
    hold = Downtime(state_dir, token, was_running, kind=cfg.kind)

    hold_fd = try_lock(state_dir / HOLD)  # close-on-exec: engines never inherit it
    if hold_fd is None:
        raise ProductionError(
            f"{state_dir / HOLD} is held by another process: a second benchmark in the same directory; only one may run"
        )
    record = {
        "config": settings_dict(cfg),
        "was_running": was_running,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "token": token,
        "work_root": str(Path(work_root).resolve()),
        "since": time.time(),
    }
    guardian: subprocess.Popen | None = None
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            os.close(hold_fd)  # drops the flock: the guardian's signal to act
            released = True

    def restored() -> dict[str, Any]:
        release()
        # twice: a start with a deployed drafter that fails, then the guardian's rollback and second start
        hold.result = _await_result(state_dir, token, 2 * cfg.restore_timeout_s + RESULT_MARGIN_S)
        hold.result["summary"] = hold.summary()  # the line the report shows
        log(hold.result["summary"])
        try:
            assert guardian is not None
            guardian.wait(timeout=10)  # it exits right after writing the result: reap it
        except subprocess.TimeoutExpired:
            pass
        return hold.result

    try:
        _write_record(state_dir / RECORD, record)
        guardian = _start_guardian(state_dir, token)
        log(f"production guardian {guardian.pid} is watching (log: {state_dir / GUARDIAN_LOG})")
        if was_running and cfg.pause == "sleep":
            _write_record(state_dir / RECORD, {**record, "pausing": True})  # a guardian acting now wakes it
            hold.paused, record["pause_fallback"] = _pause(cfg, log)
            if hold.paused:
                record["paused"] = hold.paused
            _write_record(state_dir / RECORD, record)
        if was_running and not hold.paused:
            _write_record(state_dir / RECORD, {**record, "stopping": True})
            hold.stopped_s = svc.stop(token)
            _write_record(state_dir / RECORD, {**record, "stopping": True, "stopped_s": hold.stopped_s})
        elif not was_running:
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
