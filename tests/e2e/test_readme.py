"""The README's operator commands, run as written (issue 43): its "Prefect: server, worker, deployments" blocks, read
from README.md and run in order (start the server and a worker, deploy, trigger the benchmark with --wait, status,
plan, then stop) in one fresh bash, in a directory laid out as a checkout after `make demo`: the project's files
linked, configs/ copied (their relative paths then land in this directory), and runs/demo/export holding the
session's trained drafter (`first_run`), where the README's `ls -d runs/demo/export/*/vllm` finds it.

A README that drifts from the code (a renamed flag, a path read against the wrong directory, a command that no
longer exists) fails here. The server listens on the README's own port, 4200.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e
SECTION = "## Prefect: server, worker, deployments"
LINKED = (".venv", ".hostenv", "demo", "eagleflow", "flows", "tasks", "cli", "deployments", "pyproject.toml")


def readme_blocks(readme: Path) -> dict[str, str]:
    """The section's shell blocks by what they do: start, shell (trigger, status, plan), stop."""
    text = readme.read_text()
    section = text[text.index(SECTION) : text.index("\n## ", text.index(SECTION) + len(SECTION))]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    pick = {
        "start": next(b for b in blocks if "server start" in b),
        "shell": next(b for b in blocks if "eagleflow trigger" in b),
        "stop": next(b for b in blocks if "stop()" in b),
    }
    assert len(set(pick.values())) == 3, blocks
    return pick


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def end_started(checkout: Path) -> None:
    """The server and the worker the README started, when its stop block did not run (a failed command): by the
    pids it wrote, each the leader of nothing else; SIGINT twice, as the README's stop does, then SIGKILL."""
    for name in ("worker", "server"):
        pid_file = checkout / ".prefect" / f"{name}.pid"
        if not pid_file.exists():
            continue
        pid = int(pid_file.read_text())
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGKILL):
            try:  # still the process the README started (a pid is reused once its process is gone)
                if "prefect" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    break
                os.kill(pid, sig)
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(5)


def test_the_readme_commands_work_as_written(first_run, tmp_path):
    readme = Path(os.environ.get("EAGLEFLOW_README", ROOT / "README.md"))  # another README: how a drift is seen
    blocks = readme_blocks(readme)
    assert port_free(4200), "something listens on 127.0.0.1:4200, the README's Prefect port: stop it first"
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in LINKED:
        (checkout / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "configs", checkout / "configs")
    # The commands as written; the demo's benchmark smaller (the suite's time: the commands, not the figures, are
    # under test here): 6 prompts of short answers in one setting
    demo = checkout / "configs" / "demo.yaml"
    data = yaml.safe_load(demo.read_text())
    data["benchmark"].update(num_prompts=6, max_tokens=48, temperatures=[0.0], concurrencies=[1], warmup_requests=1)
    demo.write_text(yaml.safe_dump(data, sort_keys=False))
    export = checkout / "runs" / "demo" / "export" / "e2e"
    export.mkdir(parents=True)
    (export / "vllm").symlink_to(first_run["drafter_dir"])
    script = "set -eu\n" + blocks["start"] + blocks["shell"] + blocks["stop"] + "echo README-DONE\n"
    # A fresh shell: none of the suite's Prefect settings; the machine's PATH, the suite's CPU settings and its
    # preflight cache (the engine's findings by their inputs: without it, vLLM imported once more to check again).
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "OMP_WAIT_POLICY",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "EAGLEFLOW_ENGINE_CORE_FORK",
        "EAGLEFLOW_PREFLIGHT_CACHE",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    try:
        proc = subprocess.run(
            ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=1500
        )
    finally:
        end_started(checkout)
    out = proc.stdout
    print(out[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0 and out.rstrip().endswith("README-DONE"), (proc.returncode, out[-3000:])
    # deploy, trigger --wait (its run page first, its verdict and report last), status, plan
    assert "benchmark/demo-benchmark" in out and "schedule inactive" in out
    assert re.search(r"flow run \S+ of benchmark/demo-benchmark on pool eagleflow: http://127.0.0.1:4200/runs/", out)
    report = re.search(r"^report: (\S+/report\.json)$", out, re.M)
    assert report and Path(report.group(1)).is_file() and "verdict: the new drafter serves" in out
    assert f"config demo ({checkout / 'configs' / 'demo.yaml'})" in out  # status, under the config's real path
    assert "capacity plan:" in out
    assert not (checkout / ".prefect" / "server.pid").exists() or port_free(4200)  # stopped
