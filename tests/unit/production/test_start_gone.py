"""Production that exits while it comes back is known then, not after production.restore_timeout_s
(eagleflow.production.service: `gone`, `wait_healthy`): a command service's status command, a systemd unit's
state and restart count. The health URL is a closed port: only the process's own state can end the wait early."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from eagleflow.config import ProductionConfig
from eagleflow.production import ProductionError, ProductionService
from eagleflow.production import service as service_mod
from tests.conftest import free_port

CLOSED = f"http://127.0.0.1:{free_port()}/health"


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(service_mod, "GONE_POLL_S", 0.05)


def command_service(status: list[str]) -> ProductionService:
    return ProductionService(
        ProductionConfig(
            kind="command", start_command=["true"], stop_command=["true"], status_command=status, health_url=CLOSED
        )
    )


def test_a_command_service_whose_status_says_gone_ends_the_wait_at_once():
    svc = command_service([sys.executable, "-c", "print('pid 4242 has exited'); raise SystemExit(3)"])
    t0 = time.monotonic()
    with pytest.raises(ProductionError) as exc:
        svc.wait_healthy(600)
    assert time.monotonic() - t0 < 60  # not the 600 s of restore_timeout_s
    msg = str(exc.value)
    assert "production exited while coming back" in msg and "exited with status 3 (pid 4242 has exited)" in msg
    assert "production.start_command by hand" in msg  # the fix


def test_a_status_that_says_running_leaves_the_decision_to_health_and_the_timeout():
    with pytest.raises(ProductionError, match=r"did not answer healthy .* within 1 s"):
        command_service([sys.executable, "-c", "pass"]).wait_healthy(1)


def test_one_gone_answer_is_not_a_death(tmp_path):
    # the first answer says gone (a status racing the start), every later one running: the wait goes on
    first = tmp_path / "asked"
    script = (
        f"import os, sys; seen = os.path.exists({str(first)!r}); open({str(first)!r}, 'a').close(); "
        "sys.exit(0 if seen else 3)"
    )
    with pytest.raises(ProductionError, match="did not answer healthy"):
        command_service([sys.executable, "-c", script]).wait_healthy(1)
    assert first.exists()


def systemctl_stand_in(tmp_path: Path, monkeypatch, state: str, restarts_after_start: int) -> None:
    """A `systemctl` first on PATH: `start` succeeds, `is-active` prints `state`, NRestarts is 0 until `start` ran,
    then `restarts_after_start` (systemd counting the restarts of a unit that keeps exiting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    started = tmp_path / "started"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in\n'
        f'  start*) touch "{started}" ;;\n'
        f"  is-active*) echo {state} ;;\n"
        f'  *NRestarts*) if [ -e "{started}" ]; then echo {restarts_after_start}; else echo 0; fi ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def systemd_service() -> ProductionService:
    return ProductionService(ProductionConfig(kind="systemd", unit="vllm-prod.service", health_url=CLOSED))


def test_a_unit_systemd_restarted_since_the_start_is_gone(tmp_path, monkeypatch):
    systemctl_stand_in(tmp_path, monkeypatch, "activating", 1)  # Restart=on-failure: it died loading, comes again
    svc = systemd_service()
    svc.start()
    with pytest.raises(
        ProductionError, match=r"vllm-prod.service exited and systemd restarted it \(NRestarts 0 -> 1\)"
    ):
        svc.wait_healthy(600)


@pytest.mark.parametrize("state", ["failed", "inactive"])
def test_a_failed_or_stopped_unit_is_gone(tmp_path, monkeypatch, state):
    systemctl_stand_in(tmp_path, monkeypatch, state, 0)
    svc = systemd_service()
    svc.start()
    with pytest.raises(ProductionError, match=f"systemd unit vllm-prod.service is {state}"):
        svc.wait_healthy(600)


def test_a_unit_still_loading_is_waited_for(tmp_path, monkeypatch):
    systemctl_stand_in(tmp_path, monkeypatch, "activating", 0)
    svc = systemd_service()
    svc.start()
    with pytest.raises(ProductionError, match="did not answer healthy"):
        svc.wait_healthy(1)


def test_a_status_command_is_for_the_command_kind():
    with pytest.raises(ValueError, match="production.status_command is for production.kind 'command'"):
        ProductionConfig(kind="systemd", unit="u", health_url=CLOSED, status_command=["true"])


def test_a_status_command_that_cannot_tell_is_named_before_any_work(tmp_path):
    # the check stage's question (eagleflow.stages.check): none of these is a production that is gone
    assert command_service([sys.executable, "-c", "pass"]).status_problem() is None
    assert command_service([]).status_problem() is None
    missing = command_service([str(tmp_path / "no-such-status")]).status_problem()
    assert missing.startswith("production.status_command cannot run on this host") and "no-such-status" in missing
    # a closed health port and a status saying gone: production is simply down, the command may be right
    assert command_service([sys.executable, "-c", "raise SystemExit(3)"]).status_problem() is None


def test_a_status_command_that_calls_a_healthy_production_gone_is_refused(tmp_path):
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        svc = ProductionService(
            ProductionConfig(
                kind="command",
                start_command=["true"],
                stop_command=["true"],
                status_command=[sys.executable, "-c", "raise SystemExit(3)"],
                health_url=f"http://127.0.0.1:{server.server_port}/",
            )
        )
        problem = svc.status_problem()
    finally:
        server.shutdown()
    assert problem is not None and "exits with status 3 (production gone) while production answers healthy" in problem
