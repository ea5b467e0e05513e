"""The promotion gate as a Prefect task (tasks.promotion) under a real Prefect server, on the report of
the session's demo pipeline run (`first_run`, tests/e2e/conftest.py): the promoted record on the host
is written only for a better drafter, and read back as the bar for the next one. The rule itself is
tests/unit/nightly/test_promotion.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

PROMOTE_SCRIPT = """
import json, sys
from prefect import flow
from eagleflow.config import load_config
from eagleflow.hosts import make_host
from eagleflow.nightly.promotion import PromotionGate
from eagleflow.reporting.report import Report
from tasks.promotion import promote

@flow
def gate(path: str, report: dict) -> bool:
    config = load_config(path)
    with make_host(config.host) as host:
        return promote(host, config, Report.model_validate(report),
                       PromotionGate(min_speedup=1.0, min_acceptance_length=1.5)).promote

print("PROMOTED", gate(sys.argv[1], json.loads(sys.argv[2])))
"""


def test_promotion_gate_keeps_the_better_drafter(first_run, prefect_server, e2e_config, e2e_workdir):
    env = {**os.environ, **prefect_server}

    def gate(al: float, speedup: float, **extra) -> bool:
        # the planted AL and speedup without the run's own intervals (the gate reads an interval where there is one,
        # and the verdict's paired speedup before the report's point)
        verdict = extra.pop("verdict", first_run["verdict"])
        head = verdict.get("headline") or {"temperature": 0.0, "concurrency": 1}
        report = {
            **first_run,
            "speedup": speedup,
            "drafter": {**first_run["drafter"], "mean_acceptance_length": al, "al_interval": None},
            "verdict": {
                **verdict,
                "headline": {**head, "drafter_vs_baseline": speedup, "drafter_vs_baseline_ci": None},
            },
            **extra,
        }
        proc = subprocess.run(
            [sys.executable, "-c", PROMOTE_SCRIPT, str(e2e_config), json.dumps(report)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return "PROMOTED True" in proc.stdout

    record = e2e_workdir / "runs" / "promoted" / "e2e.json"
    assert gate(3.0, 1.2) and json.loads(record.read_text())["mean_acceptance_length"] == 3.0
    assert json.loads(record.read_text())["drafter_dir"] == first_run["drafter_dir"]
    assert not gate(2.5, 1.3)  # worse than the promoted drafter
    assert not gate(3.5, 0.9)  # slower than no speculation
    suspect = {**first_run["verdict"], "integration_suspect": True}
    assert not gate(3.6, 1.3, verdict=suspect)  # the engine, not the drafter, is in doubt
    faster = {**first_run["drafter"], "variant": "current", "output_tok_s": first_run["drafter"]["output_tok_s"] * 2}
    assert not gate(3.6, 1.3, current=faster)  # production's drafter served faster in the same benchmark
    assert gate(3.2, 1.1) and json.loads(record.read_text())["mean_acceptance_length"] == 3.2
    # Every promotion, oldest first: what a rollback to the previous drafter reads.
    history = json.loads((record.parent / "e2e.history.json").read_text())
    assert [h["mean_acceptance_length"] for h in history] == [3.0, 3.2]
