"""Production is always given back (eagleflow.production.downtime, and the guardian it starts,
eagleflow.production.guardian): stopped around the benchmark, restored whatever ends it.

Production is run by the operator's own start/stop scripts (tests/prodservice.py); the benchmark side is the
real production_stopped and its real guardian. What stops and restarts production, and when, is the same whatever
production serves: cases 1-7 run against a stand-in server (`prodservice.py serve`) that answers its health only
LOAD_S seconds after its start, as an engine loads first, so a restore is still told from not waiting for one
(`standin`, conftest.py). The cases that need the engine itself run against a real vLLM CPU server of the demo
target, one for the package (`prod`: sleep and wake, a drafter switched while asleep, and test_window.py's
generate cases); a real production restored after a killed, cancelled or crashed benchmark is
tests/e2e/flows/test_benchmark.py. Each case checks production answers healthy again before the guardian's
restore cap (RESTORE_CAP_S) and nothing of the benchmark is left (no process carrying its token, no guardian,
no file outside its state dir). The systemd argv, the token's ownership rules and kind 'none' need no server:
tests/unit/production/.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from eagleflow.config import ProductionConfig
from eagleflow.production import ProductionError, end_owned_group, production_stopped
from eagleflow.production.service import SettingsRecord
from eagleflow.production.state import COMMANDS_LOG, GUARDIAN_LOG, RECORD, RESULT, WATCHING
from eagleflow.util import http
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PY = sys.executable
PRODSERVICE = str(ROOT / "tests" / "prodservice.py")
PORTS = range(18600, 18650)  # ours on this machine; others use other ports
# A safety cap, not a speed goal: the guardian's own restore_timeout_s. How fast production comes back is
# printed per case (the seconds on a quiet machine: docs/benchmarks.md); on 2 busy cores a vLLM start takes minutes.
RESTORE_CAP_S = 480.0
# The stand-in production's load: seconds from its start to its first healthy answer (asleep, no CPU).
LOAD_S = 20.0
KEPT = {RECORD, RESULT, GUARDIAN_LOG, COMMANDS_LOG, "engine-standin.pid"}
TIMES: dict[str, float] = {}


@dataclass
class Prod:
    port: int
    pidfile: Path
    health_url: str
    start_command: list[str]
    stop_command: list[str]
    first_start_s: float = 0.0  # how long its first start took here: bounds on later starts are relative to it

    def cfg(self, **over: object) -> ProductionConfig:
        base = dict(
            kind="command",
            start_command=self.start_command,
            stop_command=self.stop_command,
            health_url=self.health_url,
            stop_timeout_s=60,
            restore_timeout_s=RESTORE_CAP_S,
            orphan_grace_s=3,
        )
        return ProductionConfig(**{**base, **over})


def healthy(url: str) -> bool:
    return http.answers(url, 3)


def wait_healthy(url: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not healthy(url):
        assert time.monotonic() - t0 < timeout_s, f"production not healthy within {timeout_s:.0f} s"
        time.sleep(0.25)
    return time.monotonic() - t0


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def carrying(token: str) -> list[int]:
    """Every process whose environment carries the token: scanned here, not through the code under test."""
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"EAGLEFLOW_TOKEN={token}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                found.append(int(p))
        except OSError:
            pass
    return found


def files_outside(root: Path, state_dir: Path) -> set[str]:
    """Files under the test's tmp dir, except the state dir and the host lease's own .eagleflow dir."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and state_dir not in p.parents and ".eagleflow" not in p.parts
    }


def assert_clean(state_dir: Path, token: str, guardian: int, root: Path, before: set[str]) -> None:
    deadline = time.monotonic() + 15  # the guardian exits right after writing its result
    while alive(guardian) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(guardian), f"guardian {guardian} still running"
    assert carrying(token) == [], f"processes of the benchmark left: {carrying(token)}"
    left = set(os.listdir(state_dir))
    assert left <= KEPT, f"transient files left in the state dir: {left - KEPT}"
    assert {RECORD, RESULT, GUARDIAN_LOG} <= left
    assert files_outside(root, state_dir) == before


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 18600-18649")


def vllm_prod(d: Path) -> Prod:
    """A real vLLM CPU server of the demo target (served as "prod") behind the operator's start/stop scripts,
    on a port of ours; not started yet."""
    port = free_port()
    engine = [
        PY,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(ROOT / "demo" / "target"),
        "--served-model-name",
        "prod",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(2**28),  # the demo config's engine.kv_cache_gib
    ]
    # the dev routes production.pause 'sleep' drives (/sleep, /wake_up, /is_sleeping)
    return operated(d, "prod", port, engine, env=("VLLM_SERVER_DEV_MODE=1",))


def standin_prod(d: Path) -> Prod:
    """The stand-in production server behind the same operator scripts, on a port of ours; not started yet."""
    port = free_port()
    return operated(d, "standin", port, [PY, PRODSERVICE, "serve", "--port", str(port), "--load-s", str(LOAD_S)])


def operated(d: Path, name: str, port: int, argv: list[str], env: tuple[str, ...] = ()) -> Prod:
    """argv as production, started and stopped by the operator's scripts (tests/prodservice.py): its pid file and
    log under d, named `name`."""
    pidfile = d / f"{name}.pid"
    return Prod(
        port=port,
        pidfile=pidfile,
        health_url=f"http://127.0.0.1:{port}/health",
        start_command=[
            *(PY, PRODSERVICE, "start", "--pidfile", str(pidfile), "--log", str(d / f"{name}.log")),
            *("--port", str(port), *(a for kv in env for a in ("--env", kv)), "--", *argv),
        ],
        stop_command=[PY, PRODSERVICE, "stop", "--pidfile", str(pidfile)],
    )


def guardian_pid(state_dir: Path) -> int:
    return int(json.loads((state_dir / WATCHING).read_text())["pid"])


def standin_engine(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-c", "import time; time.sleep(600)"], env={**os.environ, **env}, start_new_session=True
    )


def start_block(prod: Prod, state_dir: Path, work_root: Path) -> tuple[subprocess.Popen, str, int]:
    """The stand-in stage in a process (and process group) of its own; returns it, the token, its engine."""
    proc = subprocess.Popen(
        [
            PY,
            PRODSERVICE,
            "block",
            "--state-dir",
            str(state_dir),
            "--work-root",
            str(work_root),
            "--config",
            prod.cfg().model_dump_json(),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("in-block "):
            _, token, engine = line.split()
            return proc, token, int(engine)
    raise AssertionError(
        f"the block never started (exit {proc.wait()}); guardian log:\n" + (state_dir / GUARDIAN_LOG).read_text()
    )


# -- with production (each case leaves production as it found it, but case 5, which runs after the package's other
# cases; `standin` and `prod` start it again if a case left it down) --


def test_6_failing_stop_names_the_command_and_leaves_production_running(standin: Prod, tmp_path: Path) -> None:
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    pid_before = standin.pidfile.read_text()
    cfg = standin.cfg(stop_command=[PY, PRODSERVICE, "refuse"])
    with pytest.raises(ProductionError) as err:
        with production_stopped(cfg, state_dir, work_root=tmp_path):
            pytest.fail("the block must not run when production could not be stopped")
    msg = str(err.value)
    print(f"\n{msg}")
    assert "prodservice.py refuse" in msg and "status 3" in msg and "permission denied" in msg
    assert "nothing was stopped" in msg
    assert healthy(standin.health_url) and standin.pidfile.read_text() == pid_before  # not restarted either
    result = json.loads((state_dir / RESULT).read_text())
    assert result["ok"] and not result["started"]
    assert_clean(state_dir, result["token"], result["guardian_pid"], tmp_path, before)


def test_1_normal_exit_restores_production(standin: Prod, tmp_path: Path) -> None:
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    with production_stopped(standin.cfg(), state_dir, work_root=tmp_path) as downtime:
        guardian = guardian_pid(state_dir)
        assert downtime.was_running and not healthy(standin.health_url)
        engine = standin_engine(downtime.engine_env())  # the benchmark's engine, ended by the benchmark itself
        downtime.pid_file("standin").write_text(str(engine.pid))
        time.sleep(0.3)
        assert end_owned_group(engine.pid, downtime.token, grace_s=5)
        engine.wait()
        t0 = time.monotonic()
    took = time.monotonic() - t0
    TIMES["1 normal exit"] = took
    print(f"\n{downtime.summary()} (block left -> healthy: {took:.1f} s; stop took {downtime.stopped_s:.1f} s)")
    assert downtime.result and downtime.result["ok"] and downtime.result["started"]
    assert healthy(standin.health_url) and took < RESTORE_CAP_S
    assert_clean(state_dir, downtime.token, guardian, tmp_path, before)


def test_2_exception_in_the_block_restores_production_and_ends_the_engine(standin: Prod, tmp_path: Path) -> None:
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    with pytest.raises(RuntimeError, match="benchmark blew up"):
        with production_stopped(standin.cfg(), state_dir, work_root=tmp_path) as downtime:
            guardian = guardian_pid(state_dir)
            engine = standin_engine(downtime.engine_env())  # left running: the guardian must end it
            downtime.pid_file("standin").write_text(str(engine.pid))
            time.sleep(0.3)
            t0 = time.monotonic()
            raise RuntimeError("benchmark blew up")
    took = time.monotonic() - t0
    TIMES["2 exception"] = took
    print(f"\n{downtime.summary()} (block left -> healthy: {took:.1f} s)")
    assert engine.wait(timeout=5) == -signal.SIGTERM
    assert downtime.result and downtime.result["ok"] and downtime.result["ended_engines"] == [engine.pid]
    assert healthy(standin.health_url) and took < RESTORE_CAP_S
    assert_clean(state_dir, downtime.token, guardian, tmp_path, before)


def test_3_sigkilled_stage_guardian_ends_engine_and_restores(standin: Prod, tmp_path: Path) -> None:
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not ours: must survive
    block, token, engine = start_block(standin, state_dir, tmp_path)
    try:
        guardian = guardian_pid(state_dir)
        assert not healthy(standin.health_url) and alive(engine)
        block.kill()  # SIGKILL: no cleanup of any kind in the stage
        t0 = time.monotonic()
        block.wait()
        wait_healthy(standin.health_url, RESTORE_CAP_S)
        took = time.monotonic() - t0
        TIMES["3 stage SIGKILLed"] = took
        print(f"\nstage SIGKILLed -> production healthy after {took:.1f} s")
        assert_clean(state_dir, token, guardian, tmp_path, before)
        result = json.loads((state_dir / RESULT).read_text())
        assert result["ok"] and result["started"] and result["ended_engines"] == [engine]
        assert bystander.poll() is None
    finally:
        for p in (block, bystander):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_4_controller_gone_guardian_ends_the_stage_and_restores(standin: Prod, tmp_path: Path) -> None:
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    # The controller: the real lease process an SSH host uses, held until it dies.
    lease = subprocess.Popen(
        [PY, "-m", "eagleflow.hosts.jobs", "lease", str(tmp_path), "flow-run-1", "--what", "test"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert lease.stdout is not None and json.loads(lease.stdout.readline())["state"] == "held"
    block, token, engine = start_block(standin, state_dir, tmp_path)
    try:
        guardian = guardian_pid(state_dir)
        lease.kill()  # the controller vanishes; the stage itself lives on
        lease.wait()
        t0 = time.monotonic()
        assert block.wait(timeout=30) == 128 + signal.SIGTERM  # ended by the guardian, through its own handler
        ended = time.monotonic() - t0
        took = wait_healthy(standin.health_url, RESTORE_CAP_S + 3) + ended
        TIMES["4 controller gone (incl. 3 s grace)"] = took
        print(f"\ncontroller killed -> stage ended after {ended:.1f} s -> production healthy after {took:.1f} s")
        assert_clean(state_dir, token, guardian, tmp_path, before)
        result = json.loads((state_dir / RESULT).read_text())
        assert result["ok"] and result["started"] and result["orphaned"] and result["ended_engines"] == [engine]
    finally:
        for p in (block, lease):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_7_cancelled_stage_leaves_at_once_and_a_retry_waits_for_its_guardian(standin: Prod, tmp_path: Path) -> None:
    """SIGTERM (a cancelled task) leaves the block without waiting; the guardian restores production;
    a retry in the same directory waits for that guardian instead of racing it (no double start)."""
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    block, token, engine = start_block(standin, state_dir, tmp_path)
    try:
        first_guardian = guardian_pid(state_dir)
        os.killpg(block.pid, signal.SIGTERM)  # what a cancellation does to the stage's group
        t0 = time.monotonic()
        assert block.wait(timeout=10) == 128 + signal.SIGTERM
        left_after = time.monotonic() - t0
        # Leaving "at once" is told from waiting for the restore, which takes the stand-in LOAD_S to answer.
        assert left_after < LOAD_S / 2, f"the cancelled stage waited {left_after:.1f} s for the restore"
        with production_stopped(standin.cfg(), state_dir, work_root=tmp_path) as downtime:  # the retry
            waited = time.monotonic() - t0
            assert not alive(first_guardian) and carrying(token) == []
            assert downtime.was_running and not healthy(standin.health_url)
            guardian = guardian_pid(state_dir)
        TIMES["7 cancelled (SIGTERM) -> retry entered"] = waited
        print(
            f"\ncancelled stage left after {left_after:.1f} s; the retry entered after {waited:.1f} s "
            f"(the first guardian's restore); {downtime.summary()}"
        )
        assert downtime.result and downtime.result["ok"] and downtime.result["started"]
        assert LOAD_S <= waited < RESTORE_CAP_S and healthy(standin.health_url)  # it waited for the whole restore
        assert_clean(state_dir, downtime.token, guardian, tmp_path, before)
    finally:
        if block.poll() is None:
            block.kill()
        block.wait()


def chat_in_background(prod: Prod) -> tuple[threading.Thread, dict]:
    """A user's request to production, answered whenever production gets to it."""
    got: dict = {}

    def send() -> None:
        t0 = time.monotonic()
        r = httpx.post(
            f"http://127.0.0.1:{prod.port}/v1/chat/completions",
            timeout=RESTORE_CAP_S,
            json={"model": "prod", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4},
        )
        got.update(status=r.status_code, at=time.monotonic(), took=time.monotonic() - t0)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t, got


def test_8_paused_production_sleeps_and_wakes_without_a_restart(prod: Prod, tmp_path: Path) -> None:
    """production.pause 'sleep' on a real engine (the CPU build: its workers keep their memory, the engine pauses
    its scheduling, which is what this checks): no stop, no start, a user's request waits and is answered."""
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    pid_before = prod.pidfile.read_text()
    with production_stopped(prod.cfg(pause="sleep", sleep_level=1), state_dir, work_root=tmp_path) as downtime:
        guardian = guardian_pid(state_dir)
        assert downtime.paused and downtime.paused["level"] == 1 and downtime.stopped_s is None
        assert len(downtime.paused["probe_before"]["probe_answers"]) == 4  # what the wake is judged against
        asleep = httpx.get(f"http://127.0.0.1:{prod.port}/is_sleeping", timeout=10).json()
        assert asleep == {"is_sleeping": True}
        thread, got = chat_in_background(prod)
        time.sleep(3)
        assert got == {}, f"a request was served while production slept: {got}"
        woken_at = time.monotonic()
    thread.join(RESTORE_CAP_S)
    print(f"\n{downtime.summary()}; the request sent while asleep: {got}")
    res = downtime.result or {}
    assert res.get("ok") and not res.get("started") and res["resumed"]["level"] == 1
    assert "no drafter" in res["resumed"]["probe"]  # this production serves none; the H200 run probes one
    assert got.get("status") == 200 and got["at"] > woken_at  # queued, not refused, answered after the wake
    assert prod.pidfile.read_text() == pid_before and healthy(prod.health_url)  # the same server: no restart
    assert "woken from sleep level 1" in downtime.summary()
    assert_clean(state_dir, downtime.token, guardian, tmp_path, before)


def test_9_a_drafter_switched_while_asleep_without_a_swap_is_loaded_by_a_restart(prod: Prod, tmp_path: Path) -> None:
    (tmp_path / "d0").mkdir()
    (tmp_path / "d1").mkdir()
    link = tmp_path / "drafter"
    link.symlink_to("d0")
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    pid_before = prod.pidfile.read_text()
    cfg = prod.cfg(pause="sleep", sleep_level=1).model_dump()
    with production_stopped(
        SettingsRecord(
            **{k: v for k, v in cfg.items() if k in SettingsRecord.__dataclass_fields__}, drafter_link=str(link)
        ),
        state_dir,
        work_root=tmp_path,
    ) as downtime:
        guardian = guardian_pid(state_dir)
        assert downtime.paused and downtime.paused["drafter"] == os.path.realpath(tmp_path / "d0")
        tmp = tmp_path / "drafter.new"
        tmp.symlink_to("d1")
        os.replace(tmp, link)  # as deployed.switch does inside the window
    print(f"\n{downtime.summary()}")
    res = downtime.result or {}
    assert res.get("ok") and res.get("started") and "swap_drafter is off" in res["pause_fallback"]
    assert prod.pidfile.read_text() != pid_before and healthy(prod.health_url)  # restarted: it reads the new link
    assert_clean(state_dir, downtime.token, guardian, tmp_path, before)


def test_5_production_not_running_before_is_not_started_after(standin: Prod, tmp_path: Path) -> None:
    subprocess.run(standin.stop_command, check=True)  # the operator took production down
    assert not healthy(standin.health_url)
    state_dir, before = tmp_path / "bench", files_outside(tmp_path, tmp_path / "bench")
    with production_stopped(standin.cfg(), state_dir, work_root=tmp_path) as downtime:
        guardian = guardian_pid(state_dir)
        assert not downtime.was_running
    print(f"\n{downtime.summary()}")
    assert downtime.result == {**downtime.result, "ok": True, "was_running": False, "started": False}
    assert "left stopped" in downtime.summary()
    time.sleep(3)
    assert not healthy(standin.health_url) and not standin.pidfile.exists()
    assert_clean(state_dir, downtime.token, guardian, tmp_path, before)
