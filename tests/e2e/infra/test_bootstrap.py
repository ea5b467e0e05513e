"""Host bootstrap (infra.bootstrap, and its flow, flows.bootstrap) against a real OpenSSH server on
127.0.0.1: a fresh venv on the loopback "host".

Crosses: the config -> SSH (paramiko, verified host key) -> `python3 -m venv` there -> the project
wheel built here, sent by SFTP, installed --no-deps -> `python -m eagleflow.hosts.facts` there; then
the same as a Prefect flow under a real Prefect server, with its Markdown artifact. No packages are
installed (packages=[]): the wheel alone, so the test needs no package index on the host side.
The flow's test is here, last, because it needs the venv the tests before it bootstrapped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import eagleflow
from eagleflow.config import RunConfig, load_config
from eagleflow.hosts import HostBusy
from eagleflow.hosts.ssh import SshHost
from infra.bootstrap import WHEEL_MARKER, BootstrapError, bootstrap
from tests.conftest import ROOT
from tests.sshd import start_sshd

DEMO = ROOT / "configs" / "demo.yaml"


def visible_gpus() -> list[str]:
    """The GPUs nvidia-smi lists here (none where it is missing): what the host's facts must report."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def host_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bootstrap-host")


def overrides(sshd, host_dir: Path, venv: str = "venv") -> dict[str, object]:
    return sshd.host_overrides(
        **{"host.work_root": str(host_dir / "runs"), "host.python": str(host_dir / venv / "bin" / "python")}
    )


def config_for(sshd, host_dir: Path, venv: str = "venv") -> RunConfig:
    return load_config(DEMO, overrides(sshd, host_dir, venv))


@pytest.fixture(scope="module")
def bootstrapped(sshd, host_dir) -> tuple[RunConfig, dict, dict, list[str]]:
    """Bootstrap twice into the same fresh venv: (config, first result, second result, second run's log)."""
    config = config_for(sshd, host_dir)
    first = bootstrap(config, packages=[], log=print)
    second_log: list[str] = []
    second = bootstrap(config, packages=[], log=second_log.append)
    return config, first, second, second_log


def test_first_bootstrap_creates_the_venv_installs_the_wheel_and_reports_the_host(sshd, bootstrapped):
    config, first, _, _ = bootstrapped
    venv = str(Path(config.host.python).parents[1])
    assert (first["created_venv"], first["installed_wheel"], first["installed_packages"]) == (True, True, False)
    assert first["venv"] == venv and first["host"] == "loopback"

    with SshHost(config.host) as host:  # what `python3` on the host's login PATH is, asked directly
        rc, base_version, _ = host.exec(["python3", "-c", "import platform; print(platform.python_version())"])
        assert rc == 0
        # A real install into the venv, not the checkout: imported from a neutral directory.
        rc, module_path, err = host.exec(
            [config.host.python, "-c", "import os; os.chdir('/'); import eagleflow; print(eagleflow.__file__)"]
        )
        assert rc == 0, err
        marker = host.read_text(f"{venv}/{WHEEL_MARKER}").strip()
        assert host.exists(f"{config.host.work_root}/.eagleflow/wheels/{first['wheel']['file']}")
    assert first["python"] == {"version": base_version.strip(), "executable": config.host.python}
    assert module_path.strip().startswith(f"{venv}/lib/")
    assert marker == first["wheel"]["sha256"]
    assert first["eagleflow"] == eagleflow.__version__
    assert first["torch"] is None and first["transformers"] is None
    assert first["engines"] == {"vllm": None, "sglang": None}
    assert len(first["gpus"]) == len(visible_gpus())  # the machine's own count, not an assumption of none
    assert first["disk"]["free_bytes"] > 0 and first["disk"]["total_bytes"] >= first["disk"]["free_bytes"]
    assert first["disk"]["path"] == config.host.work_root  # created by the wheel's upload
    assert first["errors"] == {}


def test_second_bootstrap_installs_nothing_and_says_so(bootstrapped):
    _, first, second, log = bootstrapped
    assert (second["created_venv"], second["installed_wheel"], second["installed_packages"]) == (False, False, False)
    assert second["wheel"] == first["wheel"]  # the same code builds the same content digest
    assert any("already installed" in line and "nothing to install" in line for line in log), log
    assert not any(line.startswith(("creating", "sending", "installed")) for line in log), log


def test_a_missing_base_interpreter_is_named_and_nothing_is_created(sshd, host_dir):
    config = config_for(sshd, host_dir, venv="other-venv")
    with pytest.raises(BootstrapError) as err:
        bootstrap(config, packages=[], log=print, base_python="/nonexistent/python3.99")
    message = str(err.value)
    assert "/nonexistent/python3.99" in message and "loopback" in message and "--base-python" in message
    assert not (host_dir / "other-venv").exists()


def test_a_system_interpreter_is_refused(sshd, host_dir):
    config = load_config(DEMO, {**overrides(sshd, host_dir), "host.python": "/usr/bin/python3"})
    with pytest.raises(BootstrapError, match="not in a virtual environment"):
        bootstrap(config, packages=[], log=print)


def test_an_environment_in_use_is_not_touched(sshd, bootstrapped):
    config = bootstrapped[0]
    with SshHost(config.host) as host, host.lease("pipeline-run-1", "pipeline e2e"):
        with pytest.raises(HostBusy, match="pipeline e2e"):
            bootstrap(config, packages=[], log=print)


def test_the_flow_reports_the_host_and_publishes_its_facts(prefect_server, sshd, host_dir, bootstrapped):
    sets = [f"--set={key}={value}" for key, value in overrides(sshd, host_dir).items()]
    proc = subprocess.run(
        [sys.executable, "-m", "flows.bootstrap", str(DEMO), "--no-packages", *sets],
        cwd=ROOT,
        env={**os.environ, **prefect_server},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "already installed" in proc.stdout and f"eagleflow     {eagleflow.__version__}" in proc.stdout
    found = httpx.post(
        f"{prefect_server['PREFECT_API_URL']}/artifacts/filter",
        json={"artifacts": {"key": {"any_": ["bootstrap-loopback"]}}},
        timeout=10,
    ).json()
    assert found, "no bootstrap-loopback artifact"
    assert f"| eagleflow | {eagleflow.__version__} (" in found[0]["data"]
    assert "| gpus | none (no nvidia-smi) |" in found[0]["data"]
