"""One production window for several stages: production stopped once, given back after the last.

    python -m eagleflow.production.window open DIR --config JSON --work-root W --owner O --stages a,b
        start the holder (a process in a session of its own) and return once production is down;
        prints {"token", "env", "was_running", "stopped_s", ...}: `env` goes to every stage in the window
    python -m eagleflow.production.window status DIR      {"state": "open" | "closed", "result": ...}
    python -m eagleflow.production.window release-owner WORK_ROOT OWNER
        ask every open window of a flow run to give production back (its cancellation hook)

The control side closes a window by writing `window.release` into DIR and polling `status`.

The holder is a stage in all but name: `production_stopped` around a wait for `window.release`. So
every guarantee the benchmark has holds for the window: the guardian restores production when the
holder leaves, fails or is killed, and when the controller's host lease has been gone for
`orphan_grace_s` (then it ends the holder and every process carrying the window's token, which the
stages in the window and their engines inherit through `env`).

Files in DIR (besides production_stopped's own: production.json, production.restored.json, the logs):

    window.open.json     the holder's record once production is down: token, env, owner, stages, times
    window.release       written by the control side: give production back now
    window.closed.json   the holder's result: ok, summary, down_s (stop issued -> healthy again)
    window.log           the holder's log
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagleflow.production.downtime import production_stopped
from eagleflow.production.ownership import STOP_ENV, TOKEN_ENV, WINDOW_ENV
from eagleflow.production.service import ProductionError, SettingsRecord
from eagleflow.production.state import POLL_S, RESULT, tail
from eagleflow.util.files import read_json, write_json_atomic

OPEN, RELEASE, CLOSED, LOG = "window.open.json", "window.release", "window.closed.json", "window.log"
OPEN_MARGIN_S = 60.0  # beyond stop_timeout_s: the guardian's start and the health probe


def settings(config_json: str) -> SettingsRecord:
    """The service settings out of production's whole config section (its other fields are not ours)."""
    data = json.loads(config_json)
    return SettingsRecord(**{k: data[k] for k in SettingsRecord.__dataclass_fields__ if k in data})


def _say(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} window[{os.getpid()}]: {msg}", flush=True)


def hold(d: Path, cfg: SettingsRecord, work_root: str, owner: str, stages: list[str]) -> int:
    """The holder's life: production down, wait for the release, production back, record."""
    signal.signal(signal.SIGTERM, lambda s, _f: sys.exit(128 + s))  # unwinds like a cancelled stage
    issued = time.time()
    closed: dict[str, Any] = {"owner": owner, "stages": stages, "stop_issued_at": issued}
    held = None
    try:
        with production_stopped(cfg, d, work_root=work_root, log=_say) as downtime:
            held = downtime
            env = {**downtime.engine_env(), WINDOW_ENV: str(d)}
            write_json_atomic(
                d / OPEN,
                {
                    "token": downtime.token,
                    "env": env,
                    "owner": owner,
                    "stages": stages,
                    "was_running": downtime.was_running,
                    "stopped_s": downtime.stopped_s,
                    "paused": downtime.paused,
                    "stop_issued_at": issued,
                    "down_at": time.time(),
                    "pid": os.getpid(),
                },
                indent=1,
            )
            _say(f"production is down for {', '.join(stages)}; waiting for {d / RELEASE}")
            while not (d / RELEASE).exists():
                time.sleep(POLL_S)
            closed["released_at"] = time.time()
            _say("released: giving production back")
        result = downtime.result or {}
    except ProductionError as exc:
        # Stopping failed (nothing is down), or production is not healthy after the window.
        result = {**((held.result or {}) if held else {}), "ok": False, "summary": str(exc)}
    back = time.time()
    was_running = bool(result.get("was_running"))
    write_json_atomic(
        d / CLOSED,
        {
            **closed,
            "ok": bool(result.get("ok")),
            "was_running": was_running,
            "summary": result.get("summary") or result.get("error", ""),
            "healthy_after_s": result.get("healthy_after_s"),
            "back_at": back,
            "rolled_back": result.get("rolled_back"),
            "resumed": result.get("resumed"),
            "pause_fallback": result.get("pause_fallback"),
            "wake_probe": result.get("wake_probe"),
            "down_s": round(back - issued, 2) if was_running else None,
        },
        indent=1,
    )
    return 0 if result.get("ok") else 1


def open_window(d: Path, config_json: str, work_root: str, owner: str, stages: list[str]) -> dict[str, Any]:
    """Start the holder and wait until production is down (or the holder says why it is not)."""
    d.mkdir(parents=True, exist_ok=True)
    if read_json(d / OPEN):
        raise ProductionError(f"{d} already holds a production window; every window needs a directory of its own")
    cfg = settings(config_json)
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, STOP_ENV, WINDOW_ENV)}
    argv = [
        sys.executable,
        "-m",
        "eagleflow.production.window",
        "hold",
        str(d),
        "--config",
        config_json,
        "--work-root",
        work_root,
        "--owner",
        owner,
        "--stages",
        ",".join(stages),
    ]
    with open(d / LOG, "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + cfg.stop_timeout_s + OPEN_MARGIN_S
    while True:
        rec = read_json(d / OPEN)
        if rec:
            return rec
        if proc.poll() is not None or time.monotonic() > deadline:
            closed = read_json(d / CLOSED) or {}
            raise ProductionError(
                f"production was not stopped for {', '.join(stages)}: "
                f"{closed.get('summary') or 'the window holder exited'}. Its log {d / LOG}:\n"
                f"{tail(d / LOG)}"
            )
        time.sleep(0.1)


def _holder_alive(pid: int | None, d: Path) -> bool:
    """Whether `pid` is still this window's holder (its command line names the dir; a recycled pid does not)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z" and b"hold" in cmd and str(d).encode() in cmd


def status(d: Path) -> dict[str, Any]:
    closed = read_json(d / CLOSED)
    if closed:
        return {"state": "closed", "result": closed}
    opened = read_json(d / OPEN) or {}
    result = read_json(d / RESULT)
    if opened and result and result.get("token") == opened.get("token") and not _holder_alive(opened.get("pid"), d):
        if read_json(d / CLOSED):  # it wrote its record and exited between our looks
            return {"state": "closed", "result": read_json(d / CLOSED)}
        # The holder was killed; its guardian gave production back without it.
        return {
            "state": "closed",
            "result": {
                "ok": bool(result.get("ok")),
                "was_running": result.get("was_running"),
                "summary": "the window's holder was gone; its guardian: "
                + (result.get("error") or "production restored"),
                "stages": opened.get("stages"),
                "down_s": None,
                "healthy_after_s": result.get("healthy_after_s"),
                "rolled_back": result.get("rolled_back"),
            },
        }
    return {"state": "open" if opened else "opening"}


def release_owner(work_root: str, owner: str) -> list[str]:
    """Write the release into every open window of `owner` (a flow run) under work_root/production."""
    released = []
    for rec_path in sorted(Path(work_root, "production").glob(f"*/{OPEN}")):
        rec = read_json(rec_path) or {}
        if rec.get("owner") == owner and not (rec_path.parent / CLOSED).exists():
            (rec_path.parent / RELEASE).touch()
            released.append(str(rec_path.parent))
    return released


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagleflow.production.window",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("open", "hold"):
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
        p.add_argument("--config", required=True, help="production settings as JSON (ProductionConfig's fields)")
        p.add_argument("--work-root", required=True)
        p.add_argument("--owner", default="")
        p.add_argument("--stages", default="")
    sub.add_parser("status").add_argument("dir", type=Path)
    p = sub.add_parser("release-owner")
    p.add_argument("work_root")
    p.add_argument("owner")
    args = parser.parse_args(argv)
    if args.cmd == "status":
        print(json.dumps(status(args.dir)))
        return 0
    if args.cmd == "release-owner":
        print(json.dumps({"released": release_owner(args.work_root, args.owner)}))
        return 0
    stages = [s for s in args.stages.split(",") if s]
    if args.cmd == "hold":
        return hold(args.dir.resolve(), settings(args.config), args.work_root, args.owner, stages)
    try:
        print(json.dumps(open_window(args.dir.resolve(), args.config, args.work_root, args.owner, stages)))
    except ProductionError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
