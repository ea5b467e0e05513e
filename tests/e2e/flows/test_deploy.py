"""Production takes the promoted drafter (issue 23): the nightly deploys, the canary keeps or rolls back.

Production is a real vLLM server of the demo target (`nightly_production`, tests/e2e/conftest.py) whose launch
reads its drafter from the link eagleflow manages; the nightly (`nightly_runs`, three nights through the
deployment and a worker) runs with `production.promote: deploy`. A thread asked production's health twice a
second for the whole session.

Shown from production itself: each night it went down once and came back serving that night's promoted
drafter (its process's launch names the link, the link names a byte-identical copy, its own /metrics count
the acceptance); a planted worse drafter is rolled back by the canary; a drafter production cannot start
with is rolled back by the window's guardian, and the flow fails saying so; `eagleflow rollback` by hand.
Production answers at the end of each.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import NIGHTLY_NAME, api, run_cli
from tests.e2e.health import healthy

pytestmark = pytest.mark.e2e
HOSTENV_PY = str(ROOT / ".hostenv" / "bin" / "python")


def history(nightly_production) -> dict:
    out = subprocess.run([HOSTENV_PY, "-m", "eagleflow.production.deployed", "show",
                          str(nightly_production["deploy_dir"])], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def production_acceptance(url: str, n: int = 4) -> float:
    """Production's own count: its /metrics speculative counters around n greedy requests of ours."""
    from eagleflow.engines.metrics import parse_metrics

    def counters() -> dict:
        return parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)

    before = counters()
    for i in range(n):
        httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": "demo-target", "max_tokens": 48, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Explain step {i} of making tea."}]}).raise_for_status()
    after = counters()
    drafts = after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]
    return 1 + (after["vllm:spec_decode_num_accepted_tokens"] - before["vllm:spec_decode_num_accepted_tokens"]) / drafts


def spells_between(nightly_production, t0: float, t1: float) -> list[tuple[float, float]]:
    return [s for s in nightly_production["health"].down_spells() if t0 <= s[0] <= t1]


def test_each_night_production_goes_down_once_and_comes_back_serving_the_promoted_drafter(nightly_runs,
                                                                                         nightly_production):
    downtime = []
    for night in nightly_runs["nights"]:
        spells = spells_between(nightly_production, night["began"], night["ended"])
        assert len(spells) == 1, (night["id"], spells)  # one window: its stages, the switch, the restart
        downtime.append(round(spells[0][1] - spells[0][0], 1))
        windows = night["report"]["production_windows"]
        assert len(windows) == 1 and windows[0]["stages"][-1] == "deploy" and windows[0]["ok"], windows
    print("production down per night (s, from the health log):", downtime)

    h = history(nightly_production)
    actions = [(e["action"], e["seq"]) for e in h["events"]]
    assert actions == [("adopt", 0), ("promote", 1), ("confirm", 1), ("promote", 2), ("confirm", 2),
                       ("promote", 3), ("confirm", 3)], actions
    promoted = json.loads((nightly_runs["work"] / "runs" / "promoted" / f"{NIGHTLY_NAME}.json").read_text())
    assert h["serving"] == 3 and h["source"] == promoted["drafter_dir"]

    # production's launch names the link, and the link a byte-identical copy of the promoted drafter
    pid = int((nightly_production["work"] / "prod.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert str(nightly_production["deploy_dir"] / "drafter") in cmdline
    served = (nightly_production["deploy_dir"] / "drafter").resolve()
    for f in Path(promoted["drafter_dir"]).iterdir():
        assert (served / f.name).read_bytes() == f.read_bytes(), f.name
    # and production's own counters: the trained drafter is accepted (the untrained one it started with is not)
    al = production_acceptance(nightly_production["url"])
    assert al >= 1.8, al
    canary = h["events"][-1]["canary"]
    assert canary["mean_acceptance_length"] >= 1.8 and canary["requests"] == 6
    print(f"production's AL on its /metrics: {al:.2f}; the last canary's {canary['mean_acceptance_length']:.2f}")


def test_a_planted_worse_drafter_is_rolled_back_by_the_canary(nightly_runs, nightly_production, prefect_server,
                                                              tmp_path):
    before = history(nightly_production)
    worse = tmp_path / "worse"
    shutil.copytree(before["drafter"], worse)
    # Same shapes, noise for weights: it loads and serves, and nothing it drafts is accepted.
    subprocess.run([HOSTENV_PY, "-c", (
        "import sys, torch; from safetensors.torch import load_file, save_file; p = sys.argv[1]; "
        "w = load_file(p); torch.manual_seed(0); "
        "save_file({k: (torch.randn_like(v.float()) * 0.5).to(v.dtype) if v.is_floating_point() else v "
        "for k, v in w.items()}, p)"), str(worse / "model.safetensors")], check=True, timeout=120)
    t0 = time.time()
    proc = run_cli(prefect_server, "promote", str(nightly_runs["config"]), "--drafter", str(worse))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"rolled back to drafter {before['serving']}" in proc.stdout, proc.stdout[-2000:]
    after = history(nightly_production)
    assert after["serving"] == before["serving"] and after["state"] == "good"
    reject = next(e for e in reversed(after["events"]) if e["action"] == "reject")
    assert reject["seq"] == before["serving"] + 1 and "acceptance length" in reject["why"], reject
    assert reject["canary"]["mean_acceptance_length"] < 1.3
    assert healthy(nightly_production["service"]["health_url"])
    assert production_acceptance(nightly_production["url"]) >= 1.8
    spells = spells_between(nightly_production, t0, time.time())
    assert len(spells) == 2, spells  # the worse drafter's start, then the last good one's
    print("planted worse drafter: rolled back;", reject["why"], "; down (s):", [round(b - a, 1) for a, b in spells])


def test_a_drafter_production_cannot_start_with_is_rolled_back_by_the_guardian(nightly_runs, nightly_production,
                                                                               prefect_server, tmp_path):
    before = history(nightly_production)
    broken = tmp_path / "broken"
    shutil.copytree(before["drafter"], broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)  # not a safetensors file: the engine dies loading it
    proc = run_cli(prefect_server, "promote", str(nightly_runs["config"]), "--drafter", str(broken),
                   "--set", "production.restore_timeout_s=150")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "did not come back with the drafter" in proc.stdout and "rolled it back" in proc.stdout, proc.stdout[-3000:]
    after = history(nightly_production)
    assert after["serving"] == before["serving"]
    reject = next(e for e in reversed(after["events"]) if e["action"] == "reject")
    assert "did not come back" in reject["why"]
    assert healthy(nightly_production["service"]["health_url"])
    arts = api(prefect_server, "POST", "/artifacts/filter",
               json={"artifacts": {"key": {"any_": [f"eagleflow-{NIGHTLY_NAME}-deployed"]}}}).json()
    assert any("did not come back" in (a.get("data") or "") for a in arts)


def test_rollback_by_hand_returns_to_the_drafter_before(nightly_runs, nightly_production, prefect_server):
    before = history(nightly_production)
    previous = before["last_good"]
    proc = run_cli(prefect_server, "rollback", str(nightly_runs["config"]), "--why", "the team asked")
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = history(nightly_production)
    assert after["serving"] == previous and after["events"][-2]["why"] == "the team asked"
    assert healthy(nightly_production["service"]["health_url"])
    promoted = json.loads((nightly_runs["work"] / "runs" / "promoted" / f"{NIGHTLY_NAME}.json").read_text())
    assert promoted["drafter_dir"] == after["source"]  # the next night continues from what production serves
