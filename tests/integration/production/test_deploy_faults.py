"""Production's drafter on the host side, where no flow can help: a drafter production cannot start with, and a
reboot mid-window. Production is a stand-in server (tests/prodservice.py serve) that reads its drafter through
eagleflow's link and dies at once on a broken one, started and stopped by the operator's scripts; the window,
the guardian, the link and the boot restore are the real ones (eagleflow.production)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eagleflow.production import served
from eagleflow.util import http
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.integration
PY = sys.executable
SCRIPT = str(ROOT / "tests" / "prodservice.py")


def answer(url: str) -> str | None:
    try:
        r = http.get(url, timeout=2)
        return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def wait_for(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture
def prod(tmp_path: Path):
    """A production whose launch reads <work_root>/production/demo/drafter; the first drafter adopted."""
    work = tmp_path / "runs"
    d = work / "production" / "demo"
    for name, broken in (("good", False), ("better", False), ("broken", True)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"name": name, **({"broken": True} if broken else {})}))
    served.adopt(d, tmp_path / "good")
    port = free_port()
    pidfile = tmp_path / "prod.pid"
    cfg = {
        "kind": "command",
        "health_url": f"http://127.0.0.1:{port}/health",
        "restore_timeout_s": 8,
        "stop_timeout_s": 20,
        "orphan_grace_s": 5,
        "start_command": [
            PY,
            SCRIPT,
            "start",
            "--pidfile",
            str(pidfile),
            "--log",
            str(tmp_path / "prod.log"),
            "--port",
            str(port),
            "--",
            PY,
            SCRIPT,
            "serve",
            "--port",
            str(port),
            "--drafter",
            str(d / "drafter"),
        ],
        "stop_command": [PY, SCRIPT, "stop", "--pidfile", str(pidfile)],
        "status_command": [PY, SCRIPT, "status", "--pidfile", str(pidfile)],
    }
    subprocess.run(cfg["start_command"], check=True, timeout=30)
    wait_for(lambda: answer(cfg["health_url"]), 30, "production not up")
    yield {"cfg": cfg, "work": work, "dir": d, "tmp": tmp_path, "drafter_url": f"http://127.0.0.1:{port}/drafter"}
    subprocess.run(cfg["stop_command"], timeout=60)


def open_window(prod: dict, name: str) -> tuple[Path, dict]:
    w = prod["work"] / "production" / name
    out = subprocess.run(
        [
            PY,
            "-m",
            "eagleflow.production.window",
            "open",
            str(w),
            "--config",
            json.dumps(prod["cfg"]),
            "--work-root",
            str(prod["work"]),
            "--owner",
            "flow-run",
            "--stages",
            "train,deploy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return w, json.loads(out.stdout.strip().splitlines()[-1])


def closed(w: Path, timeout_s: float) -> dict:
    result = {}

    def done() -> bool:
        nonlocal result
        out = subprocess.run(
            [PY, "-m", "eagleflow.production.window", "status", str(w)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        )
        s = json.loads(out.stdout)
        result = s.get("result") or {}
        return s["state"] == "closed"

    wait_for(done, timeout_s, f"window {w} not closed")
    return result


def test_a_drafter_production_cannot_start_with_is_rolled_back_by_the_guardian(prod):
    w, _ = open_window(prod, "w1")
    served.switch(prod["dir"], prod["tmp"] / "better", run="r1", window=w)
    served.confirm(prod["dir"], {"mean_acceptance_length": 2.0})  # a good one first: it serves after the window
    (w / "window.release").touch()
    assert closed(w, 60)["ok"] and answer(prod["drafter_url"]) == "better"

    # The broken drafter's production exits while it loads: its status command says so and the guardian rolls back
    # then, not after restore_timeout_s (set here beyond what the test waits for the window to close).
    prod["cfg"]["restore_timeout_s"] = 600
    w, _ = open_window(prod, "w2")
    served.switch(prod["dir"], prod["tmp"] / "broken", run="r2", window=w)
    t0 = time.monotonic()
    (w / "window.release").touch()
    result = closed(w, 90)
    assert result["ok"], result
    assert "did not come back with drafter 2" in result["rolled_back"], result
    assert "production exited while coming back" in result["rolled_back"], result
    assert answer(prod["drafter_url"]) == "better"  # production serves the last good drafter, healthy
    summary = served.summary(prod["dir"])
    assert summary["serving"] == 1 and served.states(summary["events"])[2] == "rejected"
    print(
        f"broken drafter: rolled back and healthy {time.monotonic() - t0:.1f} s after the release "
        f"(restore_timeout_s {prod['cfg']['restore_timeout_s']})"
    )


@pytest.mark.parametrize("pending", [False, True])
def test_a_reboot_mid_window_is_given_back_at_boot(prod, pending):
    """A reboot ends every process: the window's holder, its guardian, production. At boot the host restores
    what was left open, by itself: production starts (with the last good drafter when the one switched in
    that window cannot start)."""
    w, rec = open_window(prod, "w3")
    assert answer(prod["cfg"]["health_url"]) is None  # production is down for the window
    if pending:
        served.switch(prod["dir"], prod["tmp"] / "broken", run="r3", window=w)
    guardian = json.loads((w / "production.watching").read_text())["pid"]
    for pid in (rec["pid"], guardian):  # the power goes: both die without a word (processes this test started)
        os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: (
            not Path(f"/proc/{guardian}").exists()
            or "Z" in Path(f"/proc/{guardian}/stat").read_text().rsplit(") ", 1)[1][:1]
        ),
        10,
        "the guardian outlived SIGKILL",
    )
    time.sleep(1.0)
    assert answer(prod["cfg"]["health_url"]) is None  # nobody is left to give production back

    boot = subprocess.run(
        [PY, "-m", "eagleflow.production.guardian", "--boot", str(prod["work"])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert boot.returncode == 0, boot.stdout + boot.stderr
    restored = json.loads(boot.stdout.strip().splitlines()[-1])["restored"]
    assert [r["dir"] for r in restored] == [str(w)] and restored[0]["by"] == "boot"
    assert answer(prod["drafter_url"]) == "good"
    assert bool(restored[0].get("rolled_back")) is pending
    assert closed(w, 10)["ok"]  # a controller that survived reads the window as closed
    again = subprocess.run(
        [PY, "-m", "eagleflow.production.guardian", "--boot", str(prod["work"])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert json.loads(again.stdout.strip().splitlines()[-1])["restored"] == []  # once
