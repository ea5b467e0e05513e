"""An engine server (eagleflow.engines.base.EngineServer) lives no longer than the stage that started
it: a stage that is cancelled (SIGTERM, its `with` block ends the engine) or killed (SIGKILL, the
engine dies with its parent) takes its engine with it, and nothing else. Real vLLM (CPU), through
the generate stage. The engine core runs in a child process of the engine, spawned (vLLM's CPU default, here with
its worker in a third process) or forked (`make test`'s EAGLEFLOW_ENGINE_CORE_FORK with the worker inside the
core), and the test waits for that child: the whole engine's process group must go, however the core was made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.manifest import stage_dir, stage_key
from eagleflow.contracts.request import StageRequest
from tests.conftest import ROOT, free_port
from tests.helpers.procs import group_members

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def start_generate(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp_path / "runs"),
            "engine.port": free_port(),
            "generate.num_samples": 1000,
            "generate.max_tokens": 512,
            "engine.env": env,
        },
    )
    key = stage_key("generate", cfg, {})
    d = Path(stage_dir(cfg, "generate", key))
    d.mkdir(parents=True)
    (d / "request.json").write_text(StageRequest(stage="generate", key=key, dir=str(d), config=cfg).model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagleflow.stages.generate", str(d / "request.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, d


def engine_core(members: list[int]) -> int | None:
    """The member that named itself vLLM's engine core (its process title), if one has yet."""
    for pid in members:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
                return pid
        except OSError:
            continue
    return None


def wait_for_engine(d: Path, timeout: float = 300) -> tuple[int, list[int], int]:
    """The engine's pid (its own process group) once its engine-core child runs, the group's processes, and the
    engine core's pid."""
    deadline = time.monotonic() + timeout
    while not (d / "engine.pid").exists():
        assert time.monotonic() < deadline, "the engine never started"
        time.sleep(0.2)
    engine = int((d / "engine.pid").read_text())
    while (core := engine_core(members := group_members(engine))) is None:
        assert time.monotonic() < deadline, f"the engine {engine} never started its engine-core process"
        time.sleep(0.2)
    return engine, members, core


def spawned(pid: int) -> bool:
    """Whether `pid` was started by multiprocessing's spawn: a new program, whose environment (as exec gave it)
    holds the method vLLM's CPU platform set for it. A forked child keeps its parent's environment from exec,
    which never held it."""
    return b"VLLM_WORKER_MULTIPROC_METHOD=spawn" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def wait_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# EAGLEFLOW_ENGINE_CORE_FORK asks for a forked core in both; eagleflow's vLLM plugin forks only where the worker
# runs inside the core (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the first keeps vLLM's spawn.
@pytest.mark.parametrize(
    ("sig", "multiprocessing"), [(signal.SIGTERM, "1"), (signal.SIGKILL, "0")], ids=["SIGTERM", "SIGKILL"]
)
def test_ending_the_stage_ends_its_engine_only(tmp_path, sig, multiprocessing):
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)  # not ours to end
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing, "EAGLEFLOW_ENGINE_CORE_FORK": "1"}
    proc, d = start_generate(tmp_path, env)
    engine = None
    try:
        engine, members, core = wait_for_engine(d)
        assert alive(engine) and engine in members
        assert spawned(core) == (multiprocessing == "1"), (core, multiprocessing)
        os.killpg(proc.pid, sig)  # what a cancelled task does to the stage's group
        proc.wait(timeout=60)
        for pid in members:  # the engine and its engine core, each
            assert wait_gone(pid), f"engine process {pid} (of {members}) outlived its stage after {sig.name}"
        assert group_members(engine) == []
        assert bystander.poll() is None
        assert not (d / "manifest.json").exists()
    finally:
        for p in (proc, bystander):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if engine is not None and alive(engine):  # a failed run: end the engine this test started
            os.killpg(engine, signal.SIGKILL)
