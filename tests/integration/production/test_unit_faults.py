"""production.kind systemd set up wrong: a unit systemd does not know, polkit refusing the host user, no
systemd to ask. Each is permanent: found by the check stage where it can be (before hours of generate), and
where it cannot (polkit answers only when asked to stop), the stop fails at once with systemd's own words
and the fix, in three lines a person reads (eagleflow.contracts.failure).

This machine runs no systemd (PID 1 is not systemd), so the real `systemctl` here answers "System has not
been booted with systemd" and that case is tested with it. The unit and polkit cases need a systemd that
answers; they use a stand-in `systemctl` first on PATH that prints systemd's own messages for them (its
`systemctl stop` and `show` texts: "Unit X.service not loaded.", "Interactive authentication required.").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from eagleflow.contracts.failure import stage_ending
from eagleflow.production import ProductionError, ProductionService
from eagleflow.production.service import SettingsRecord
from tests.integration.stages.test_check import run_check

pytestmark = pytest.mark.integration

# What systemctl prints for each case (systemd 252-257; stop exits 5 for an unknown unit, 1 for polkit).
STAND_IN = """#!/bin/sh
case "$1" in show) shift;; esac
case "{case}:$1" in
  no-unit:--property=LoadState) echo not-found ;;
  no-unit:*) echo "Failed to $1 vllm-prod.service: Unit vllm-prod.service not loaded." >&2; exit 5 ;;
  polkit:--property=LoadState) echo loaded ;;
  polkit:is-active) echo active ;;
  polkit:*) echo "Failed to $1 vllm-prod.service: Interactive authentication required." >&2
            echo "See system logs and 'systemctl status vllm-prod.service' for details." >&2; exit 1 ;;
esac
"""


def stand_in(tmp_path: Path, monkeypatch, case: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(STAND_IN.replace("{case}", case))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def service() -> ProductionService:
    return ProductionService(
        SettingsRecord(
            kind="systemd", unit="vllm-prod.service", health_url="http://127.0.0.1:9/health", stop_timeout_s=60
        )
    )


def three(exc: BaseException) -> list[str]:
    """The lines the stage ends with, as the control side shows them (error:, fix:)."""
    return stage_ending(str(exc))


def test_a_unit_systemd_does_not_know_is_found_by_the_check_and_fails_the_stop_at_once(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, "no-unit")
    problem = service().unit_problem()
    assert problem and "production.unit 'vllm-prod.service' is not a unit systemd knows" in problem, problem
    t0 = time.monotonic()
    with pytest.raises(ProductionError) as err:
        service().stop()
    took = time.monotonic() - t0
    lines = three(err.value)
    assert lines[-2].startswith(
        "error: stopping production failed: production.unit 'vllm-prod.service' is not a unit"
    ), lines
    assert "not loaded" in lines[-2] and lines[-1].startswith("fix: set production.unit") and took < 10, (took, lines)
    print(f"\nFAULT | production.unit unknown | {took:.2f} s | {lines[-2]} / {lines[-1]}")
    # the check stage, run as the pipeline runs it, refuses the config before any work
    proc, seconds, d = run_check(
        tmp_path,
        {
            "production.kind": "systemd",
            "production.unit": "vllm-prod.service",
            "production.health_url": "http://127.0.0.1:9/health",
        },
    )
    last = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and not (d / "manifest.json").exists(), proc.stdout[-2000:]
    assert last[-2].startswith("error: the run config does not fit this host: production.unit 'vllm-prod.service'"), (
        last[-3:]
    )
    assert last[-1].startswith("fix: set production.unit"), last[-3:]
    print(f"FAULT | production.unit unknown, check stage | {seconds:.1f} s | {last[-2]}")


def test_polkit_refusing_the_stop_fails_at_once_with_systemds_words_and_the_fix(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, "polkit")
    assert service().unit_problem() is None  # nothing to see until asked to act
    t0 = time.monotonic()
    with pytest.raises(ProductionError) as err:
        service().stop()
    took = time.monotonic() - t0
    lines = three(err.value)
    assert "the host user may not stop vllm-prod.service: polkit refused it" in lines[-2], lines
    assert "Interactive authentication required." in lines[-2] and "polkit rule" in lines[-1] and took < 10, (
        took,
        lines,
    )
    assert "Its output:" in "\n".join(lines[:-2])  # systemctl's whole output stays in the details
    print(f"\nFAULT | polkit refuses | {took:.2f} s | {lines[-2]} / {lines[-1]}")


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="no systemctl on this machine")
def test_no_systemd_to_ask_is_found_by_the_check(tmp_path):
    pid1 = Path("/proc/1/comm").read_text().strip()
    if pid1 == "systemd":
        pytest.skip("this machine runs systemd")
    problem = service().unit_problem()
    assert problem and "there is no systemd to ask" in problem and "Fix: production.kind systemd needs" in problem, (
        problem
    )
    t0 = time.monotonic()
    with pytest.raises(ProductionError) as err:
        service().stop()
    lines = three(err.value)
    assert "there is no systemd to ask" in lines[-2] and lines[-1].startswith("fix: production.kind systemd needs"), (
        lines
    )
    assert time.monotonic() - t0 < 10
    real = subprocess.run(
        ["systemctl", "show", "--property=LoadState", "--value", "x.service"], capture_output=True, text=True
    )
    print(f"\nFAULT | no systemd (PID 1 {pid1}; systemctl said {real.stderr.strip().splitlines()[:1]}) | {lines[-2]}")
