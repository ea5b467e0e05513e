"""The guardian: a small detached process that gives production back, once, however the stage ends.

    python -m eagleflow.production.guardian STATE_DIR      (started by `production_stopped`)
    python -m eagleflow.production.guardian --boot WORK_ROOT   (at the host's boot:
    infra/systemd/eagleflow-restore.service)

It flocks `production.watching`, then waits until the stage's hold is free (the stage left, failed,
was cancelled or killed) or until the controller's host lease has been gone for `orphan_grace_s`
(then it ends the stage's group first). It ends leftover processes carrying the token, starts
production if it was running and is down, waits for health, writes `production.restored.json` and
exits. Nothing is signalled without proof it is ours (the hold flock, the token in /proc/<pid>/environ).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagleflow.hosts.jobs import lease_holder
from eagleflow.production import pause, served, swap
from eagleflow.production.ownership import STOP_ENV, end_owned, end_owned_group, owned_pids
from eagleflow.production.served import WINDOW_MARK
from eagleflow.production.service import ProductionError, ProductionService, SettingsRecord
from eagleflow.production.state import COMMANDS_LOG, HOLD, POLL_S, RECORD, RESULT, WATCHING
from eagleflow.util.files import read_json, write_json_atomic
from eagleflow.util.locks import is_held, try_lock
from eagleflow.util.procs import terminate, wait_until

STAGE_GRACE_S = (
    20.0  # guardian -> orphaned stage: SIGTERM, then SIGKILL after this (the stage ends its engines with 15 s)
)


def _write_record(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data, indent=1)


def _glog(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} guardian[{os.getpid()}]: {msg}", flush=True)


class ControllerWatch:
    """Whether the controller that leased the host (the flow process, or an SSH-held lease process)
    is gone: the lease free, or held by another owner, continuously for grace_s."""

    def __init__(self, work_root: str, grace_s: float):
        self.work_root = work_root
        self.grace_s = grace_s
        self.holder = lease_holder(work_root)
        self.gone_since: float | None = None

    def gone(self) -> bool:
        if self.holder is None:
            return False  # run without a lease (by hand): only the hold tells
        now = lease_holder(self.work_root)
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

    def send(sig: signal.Signals) -> None:
        if not is_held(hold):
            return  # the stage is gone: its pgid may already be another's
        _glog(f"ending the stage: {sig.name} to {'pid' if shared else 'process group'} {pid if shared else pgid}")
        os.kill(pid, sig) if shared else os.killpg(pgid, sig)

    terminate(send, lambda: is_held(hold), STAGE_GRACE_S)


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


class WakeRefused(pause.PauseError):
    """Production is not back whole from its sleep; `verdict`: the probe's record when the probe decided it."""

    def __init__(self, why: str, verdict: dict[str, Any] | None = None):
        super().__init__(why)
        self.verdict = verdict


def expectation(cfg: SettingsRecord) -> pause.Expected:
    """What the drafter production serves after the wake should serve: the link's drafter's canary or offline
    estimate (eagleflow.production.served). A production whose launch names its drafter itself has none here."""
    if not cfg.drafter_link:
        return pause.Expected(None, "production's launch does not read its drafter from eagleflow's link")
    al, source = served.expected_al(Path(cfg.drafter_link))
    return pause.Expected(al, source)


def wake_checked(cfg: SettingsRecord, paused: dict[str, Any], healthy: Callable[[], bool]) -> dict[str, Any]:
    """Wake production from the sleep `paused` records (a drafter switched meanwhile swapped in between the weights'
    wake and the KV cache's), then probe it and judge it whole against the probe before the sleep and against what
    its drafter should serve. Returns what was done with the probe's verdict (`wake_probe`); raises WakeRefused
    (with the verdict when the probe ran) when production is not back whole."""
    base = paused.get("base_url") or pause.base_url(cfg.url, cfg.health_url)
    assert base is not None
    level = int(paused.get("level") or cfg.sleep_level or 2)
    was, now = paused.get("drafter"), os.path.realpath(cfg.drafter_link) if cfg.drafter_link else None
    between = None
    if now and now != was:
        if why := swap.why_not(cfg.swap_drafter, base, Path(was) if was else None, Path(now)):
            raise WakeRefused(f"drafter {now} was switched in while production slept and cannot be swapped in: {why}")
        between = lambda: swap.swap_drafter(base, Path(now))  # noqa: E731
    _glog(f"waking production (level {level})" + (f", swapping in {now}" if between else ""))
    woke = pause.wake(base, level, between=between)
    if not healthy():
        raise WakeRefused(f"production does not answer healthy at {cfg.health_url} after the wake")
    expected = expectation(cfg)
    prompts, which = pause.probe_prompts(cfg.probe_holdout)
    _glog(
        f"probing production on {which}: expected AL "
        + (f"{expected.al:.2f} ({expected.source})" if expected.al is not None else f"unknown ({expected.source})")
    )
    after = pause.probe(
        base, None, prompts, expected, cfg.probe_share, cfg.probe_max_requests, cfg.probe_max_s, cfg.probe_max_tokens
    )
    verdict = pause.verdict(after, paused.get("probe_before"), between is not None, expected, cfg.probe_share)
    verdict["prompts"] = which
    _glog(f"the probe: {verdict['decision']}: {verdict['decided_by']}")
    if verdict["decision"] == "refuse":
        raise WakeRefused(verdict["decided_by"], verdict)
    keep = ("probe_answers", "probe_request_drafts", "probe_request_accepted")
    return {**woke, **{k: v for k, v in after.items() if k not in keep}, "wake_probe": verdict}


def _resume(svc: ProductionService, rec: dict[str, Any]) -> dict[str, Any]:
    """Production was put to sleep for the window: wake it and check it is whole (`wake_checked`). Anything that
    fails: stop and start it, the probe's verdict kept in the result when it was the probe that refused."""
    cfg, paused = svc.cfg, rec.get("paused") or {}
    base = paused.get("base_url") or pause.base_url(cfg.url, cfg.health_url)
    t0 = time.monotonic()
    try:
        if not paused:  # the stage died mid-sleep, the level unrecorded: a restart is what is sure to work
            if base is None or not pause.is_sleeping(base):
                return _restore(svc, True)
            raise pause.PauseError("the stage ended while production was being put to sleep")
        woke = wake_checked(cfg, paused, svc.healthy)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the guardian must still give production back
        _glog(f"production is not back whole from its sleep: {exc}; stopping and starting it instead")
        try:
            svc.stop()
        except ProductionError as stop_exc:
            _glog(f"stop before the start: {stop_exc}")
        verdict = getattr(exc, "verdict", None)
        return {**_restore(svc, True), "pause_fallback": str(exc), **({"wake_probe": verdict} if verdict else {})}
    took = time.monotonic() - t0
    verdict = woke.pop("wake_probe", None)
    _glog(f"production woken, healthy after {took:.1f} s: {json.dumps(woke)}")
    return {
        "ok": True,
        "was_running": True,
        "started": False,
        "healthy_after_s": round(took, 2),
        "resumed": {"level": int(paused.get("level") or cfg.sleep_level or 2), **woke},
        "wake_probe": verdict,
    }


def _roll_back(svc: ProductionService, d: Path, failed: dict[str, Any]) -> dict[str, Any]:
    """Production did not come back with the drafter switched in this window: point it back at the last good
    drafter and start it again. Done here, not by the flow: the flow may be gone, production must not be."""
    mark = read_json(d / WINDOW_MARK) or {}
    why = f"production did not come back with drafter {mark.get('seq')}: {failed.get('error')}"
    try:
        served.rollback(Path(mark["dir"]), why, window=d)
    except (served.ServedDrafterError, OSError, KeyError) as exc:
        _glog(f"cannot roll the drafter back: {exc}")
        return {**failed, "rollback_error": str(exc)}
    _glog(f"rolled the drafter back ({why}); starting production again")
    try:
        svc.stop()  # what the failed start left (a unit in failed state, a half-started server)
    except ProductionError as exc:
        _glog(f"stop before the second start: {exc}")
    result = _restore(svc, True)
    return {**result, "rolled_back": why, "first_error": failed.get("error")}


def guard(state_dir: str | Path) -> int:
    """The guardian's whole life: watch, clean up, restore once, record, exit."""
    d = Path(state_dir)
    # A terminal's or session's signals are not ours to die of; SIGKILL still ends us if someone must.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: _glog(f"ignoring {signal.Signals(s).name}: production must be restored first"))
    rec = read_json(d / RECORD)
    if not rec:
        _glog(f"no {d / RECORD}: nothing to guard")
        return 2
    mark_fd = try_lock(d / WATCHING)
    if mark_fd is None:
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
    svc = ProductionService(SettingsRecord(**rec["config"]), _glog, d / COMMANDS_LOG)
    watch = ControllerWatch(rec["work_root"], svc.cfg.orphan_grace_s)
    _glog(
        f"watching stage pid {rec['pid']} (pgid {rec['pgid']}); was_running={rec['was_running']}; "
        f"controller: {watch.holder or 'none (no host lease held)'}"
    )
    hold, orphaned = d / HOLD, False
    shared = _controller_in_group(watch.holder, int(rec["pgid"]))
    while is_held(hold):
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
    rec = read_json(d / RECORD) or rec
    if rec.get("stopping") and owned_pids(token, STOP_ENV):
        _glog("the stop command is still running: waiting for it")
        wait_until(lambda: not owned_pids(token, STOP_ENV), svc.cfg.stop_timeout_s)

    # Production is only touched now, once: the hold is free and nothing of the benchmark is left.
    if rec.get("paused") or rec.get("pausing"):
        result = _resume(svc, rec)
    else:
        result = _restore(svc, bool(rec["was_running"]))
        if rec.get("pause_fallback"):
            result["pause_fallback"] = rec["pause_fallback"]
    if not result["ok"] and (d / WINDOW_MARK).exists():
        result = _roll_back(svc, d, result)
    _write_record(
        d / RESULT,
        {
            **result,
            "token": token,
            "by": "guardian",
            "guardian_pid": os.getpid(),
            "orphaned": orphaned,
            "ended_engines": ended + stragglers,
            "at": time.time(),
        },
    )
    return 0 if result["ok"] else 1


def at_boot(work_root: str | Path) -> list[dict[str, Any]]:
    """After a reboot mid-window, no guardian is left to give production back: every state dir under work_root
    whose production.json has no result and no guardian watching is restored now (production started if it was
    running, a drafter switched in that window rolled back if production does not come back with it). The first
    restore brings production back; the others find it healthy and leave it."""
    done = []
    for rec_path in sorted(Path(work_root).glob(f"*/*/{RECORD}")):
        d = rec_path.parent
        rec = read_json(rec_path)
        if not rec or (d / RESULT).exists() or is_held(d / WATCHING):
            continue
        _glog(f"at boot: {d} was left open (no result, no guardian): giving production back")
        svc = ProductionService(SettingsRecord(**rec["config"]), _glog, d / COMMANDS_LOG)
        result = _restore(svc, bool(rec.get("was_running")))
        if not result["ok"] and (d / WINDOW_MARK).exists():
            result = _roll_back(svc, d, result)
        result = {**result, "token": rec.get("token"), "by": "boot", "at": time.time()}
        _write_record(d / RESULT, result)
        done.append({"dir": str(d), **result})
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagleflow.production.guardian",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "state_dir",
        help="the benchmark's stage dir, holding production.json (with --boot: the "
        "work root, whose every state dir is looked at)",
    )
    parser.add_argument("--boot", action="store_true", help="at the host's boot: restore what a reboot left open")
    args = parser.parse_args(argv)
    if args.boot:
        done = at_boot(args.state_dir)
        print(json.dumps({"restored": done}))
        return 0 if all(r["ok"] for r in done) else 1
    return guard(args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
