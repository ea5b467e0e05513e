"""Production takes the promoted drafter (issue 23): the nightly deploys, the canary keeps or rolls back.

Production is a real vLLM server of the demo target (`nightly_production`, tests/e2e/conftest.py) whose launch
reads its drafter from the link eagleflow manages; the nightly (`nightly_runs`, nights through the deployment and
a worker, the first refused by its gate) runs with `production.promote: serve`. A thread asked production's health
twice a second for the whole test run.

Shown from production itself: each night it went down once and came back serving that night's drafter (the night
its gate refused: once more, back on the drafter before), which the benchmark then measured there (its process's
launch names the link, the link names a byte-identical copy, its own /metrics count the acceptance); a planted
worse drafter is rolled back by the canary; a drafter production cannot start with is rolled back by the window's
guardian, and the flow fails saying so; a drafter the canary cannot measure
(production unreachable, or down before the window) never stays on the link; `eagleflow rollback` by hand.
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
    out = subprocess.run(
        [HOSTENV_PY, "-m", "eagleflow.production.served", "show", str(nightly_production["served_dir"])],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def production_acceptance(nightly_runs, url: str, n: int = 4) -> float:
    """Production's own count: its /metrics speculative counters around n greedy requests of ours (the nightly's
    held-out prompts)."""
    from eagleflow.contracts.prompts import load_prompts
    from eagleflow.engines.metrics import parse_metrics

    held = load_prompts(nightly_runs["work"] / "runs" / "nightly" / NIGHTLY_NAME / "holdout.jsonl")[:n]

    def counters() -> dict:
        return parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)

    before = counters()
    for messages in held:
        httpx.post(
            f"{url}/v1/chat/completions",
            timeout=300,
            json={"model": "demo-target", "max_tokens": 48, "temperature": 0, "ignore_eos": True, "messages": messages},
        ).raise_for_status()
    after = counters()
    drafts = after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]
    return 1 + (after["vllm:spec_decode_num_accepted_tokens"] - before["vllm:spec_decode_num_accepted_tokens"]) / drafts


def spells_between(nightly_production, t0: float, t1: float) -> list[tuple[float, float]]:
    return [s for s in nightly_production["health"].down_spells() if t0 <= s[0] <= t1]


def test_each_night_production_comes_back_serving_its_drafter_measured_there(nightly_runs, nightly_production):
    """Each night tonight's drafter goes in before production comes back: one down spell, one load (two when the
    gate, on production's own figures, rolls it back)."""
    h = history(nightly_production)
    downtime = []
    # whether each night's drafter stayed, as the record of nights on the host keeps it (written after the report)
    kept = [
        n["promoted"]
        for n in json.loads((nightly_runs["work"] / "runs" / "nightly" / NIGHTLY_NAME / "nights.json").read_text())
    ]
    for k, (night, promoted) in enumerate(zip(nightly_runs["nights"], kept), 1):
        spells = spells_between(nightly_production, night["began"], night["ended"])
        assert len(spells) == (1 if promoted else 2), (k, promoted, spells)
        downtime.append(round(sum(b - a for a, b in spells), 1))
        windows = night["report"]["production_windows"]
        assert windows[0]["stages"][-1] == "switch" and all(w["ok"] for w in windows), windows
        assert len(windows) == (1 if promoted else 2) and night["report"]["stages"]["benchmark"]["cached"] is False
    print("production down per night (s, from the health log):", downtime, "kept:", kept)

    actions = [(e["action"], e["seq"]) for e in h["events"]]
    assert actions[0] == ("adopt", 0) and [a for a, _ in actions].count("promote") == len(nightly_runs["nights"]), (
        actions
    )
    promoted = json.loads((nightly_runs["work"] / "runs" / "promoted" / f"{NIGHTLY_NAME}.json").read_text())
    assert h["state"] == "good" and h["source"] == promoted["drafter_dir"]

    # production's launch names the link, and the link a byte-identical copy of the promoted drafter
    pid = int((nightly_production["work"] / "prod.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert str(nightly_production["served_dir"] / "drafter") in cmdline
    served = (nightly_production["served_dir"] / "drafter").resolve()
    for f in Path(promoted["drafter_dir"]).iterdir():
        assert (served / f.name).read_bytes() == f.read_bytes(), f.name
    # and production's own counters: the trained drafter is accepted (the untrained one it started with is not)
    al = production_acceptance(nightly_runs, nightly_production["url"])
    assert al >= 1.8, al
    confirmed = [e for e in h["events"] if e["action"] == "confirm" and e["seq"] == h["serving"]][-1]
    assert confirmed["canary"]["mean_acceptance_length"] >= 1.8 and confirmed["record"] == promoted
    print(
        f"production's AL on its /metrics: {al:.2f}; on the night's benchmark on production: "
        f"{confirmed['canary']['mean_acceptance_length']:.2f}"
    )


def test_a_planted_worse_drafter_is_rolled_back_by_the_canary(
    nightly_runs, nightly_production, prefect_server, tmp_path
):
    before = history(nightly_production)
    worse = tmp_path / "worse"
    shutil.copytree(before["drafter"], worse)
    # Same shapes, noise for weights: it loads and serves, and nothing it drafts is accepted.
    subprocess.run(
        [
            HOSTENV_PY,
            "-c",
            (
                "import sys, torch; from safetensors.torch import load_file, save_file; p = sys.argv[1]; "
                "w = load_file(p); torch.manual_seed(0); "
                "save_file({k: (torch.randn_like(v.float()) * 0.5).to(v.dtype) if v.is_floating_point() else v "
                "for k, v in w.items()}, p)"
            ),
            str(worse / "model.safetensors"),
        ],
        check=True,
        timeout=120,
    )
    t0 = time.time()
    proc = run_cli(prefect_server, "promote", str(nightly_runs["config"]), "--drafter", str(worse))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"rolled back to drafter {before['serving']}" in proc.stdout, proc.stdout[-2000:]
    after = history(nightly_production)
    assert after["serving"] == before["serving"] and after["state"] == "good"
    reject = next(e for e in reversed(after["events"]) if e["action"] == "reject")
    # The planted drafter's copy is the next one deployed: after the highest so far, which is not the one serving
    # when a night's drafter was rolled back.
    newest = max(e["seq"] for e in before["events"])
    assert reject["seq"] == newest + 1 and "acceptance length" in reject["why"], reject
    assert reject["canary"]["mean_acceptance_length"] < 1.3
    assert healthy(nightly_production["service"]["health_url"])
    assert production_acceptance(nightly_runs, nightly_production["url"]) >= 1.8
    spells = spells_between(nightly_production, t0, time.time())
    assert len(spells) == 2, spells  # the worse drafter's start, then the last good one's
    print("planted worse drafter: rolled back;", reject["why"], "; down (s):", [round(b - a, 1) for a, b in spells])


def test_a_drafter_production_cannot_start_with_is_rolled_back_by_the_guardian(
    nightly_runs, nightly_production, prefect_server, tmp_path
):
    before = history(nightly_production)
    broken = tmp_path / "broken"
    shutil.copytree(before["drafter"], broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)  # not a safetensors file: the engine dies loading it
    proc = run_cli(
        prefect_server,
        "promote",
        str(nightly_runs["config"]),
        "--drafter",
        str(broken),
        "--set",
        "production.restore_timeout_s=150",
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "did not come back with the drafter" in proc.stdout and "rolled it back" in proc.stdout, proc.stdout[-3000:]
    after = history(nightly_production)
    assert after["serving"] == before["serving"]
    reject = next(e for e in reversed(after["events"]) if e["action"] == "reject")
    assert "did not come back" in reject["why"]
    assert healthy(nightly_production["service"]["health_url"])
    arts = api(
        prefect_server,
        "POST",
        "/artifacts/filter",
        json={"artifacts": {"key": {"any_": [f"eagleflow-{NIGHTLY_NAME}-deployed"]}}},
    ).json()
    assert any("did not come back" in (a.get("data") or "") for a in arts)


def test_a_promote_whose_canary_cannot_measure_is_rolled_back_and_says_why(
    nightly_runs, nightly_production, prefect_server, tmp_path
):
    """The canary cannot reach production (a wrong production.url: an unreadable API key fails the same way): the
    drafter nobody measured does not stay on the link in state pending, where production's next start would serve
    it. It is rolled back to the last good one, and the flow fails in three lines naming the canary's cause."""
    before = history(nightly_production)
    same = tmp_path / "unmeasured"
    shutil.copytree(before["drafter"], same)
    t0 = time.time()
    wrong = "http://127.0.0.1:9"  # the discard port: nothing answers
    proc = run_cli(
        prefect_server,
        "promote",
        str(nightly_runs["config"]),
        "--drafter",
        str(same),
        "--set",
        f"production.url={wrong}",
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    # rolled back, and the restored drafter, behind the same wrong URL, could not be measured either: said so
    assert f"serves drafter {before['serving']} again, unmeasured" in proc.stdout, proc.stdout[-3000:]
    assert "its canary could not measure it" in proc.stdout, proc.stdout[-3000:]
    after = history(nightly_production)
    assert after["serving"] == before["serving"] and after["state"] == "good", after
    reject = next(e for e in reversed(after["events"]) if e["action"] == "reject")
    assert "canary could not measure" in reject["why"], reject
    assert healthy(nightly_production["service"]["health_url"])
    assert len(spells_between(nightly_production, t0, time.time())) == 2  # its start, then the last good one's


def test_a_promote_while_production_is_down_leaves_nothing_unmeasured_on_the_link(
    nightly_runs, nightly_production, prefect_server, tmp_path
):
    """Production was down before the window: nothing can measure the new drafter, so the link goes back to the
    last good drafter at once, production is left as it was (down: not eagleflow's to start), and the flow says
    so. The operator's next start of production serves the last good drafter."""
    before = history(nightly_production)
    same = tmp_path / "unmeasured-down"
    shutil.copytree(before["drafter"], same)
    service = nightly_production["service"]
    subprocess.run(service["stop_command"], check=True, timeout=120)
    try:
        proc = run_cli(prefect_server, "promote", str(nightly_runs["config"]), "--drafter", str(same))
        assert proc.returncode == 1, proc.stdout[-3000:]
        assert "was not serving when the switch began" in proc.stdout, proc.stdout[-3000:]
        after = history(nightly_production)
        assert after["serving"] == before["serving"] and after["state"] == "good", after
        assert not healthy(service["health_url"])  # left down, as it was
    finally:
        subprocess.run(service["start_command"], check=True, timeout=60)
        deadline = time.monotonic() + 420
        while not healthy(service["health_url"]):
            assert time.monotonic() < deadline, nightly_production["log"].read_text()[-3000:]
            time.sleep(1)


def test_rollback_by_hand_returns_to_the_drafter_before(nightly_runs, nightly_production, prefect_server):
    before = history(nightly_production)
    previous = before["last_good"]
    proc = run_cli(prefect_server, "rollback", str(nightly_runs["config"]), "--why", "the team asked")
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = history(nightly_production)
    assert after["serving"] == previous and after["events"][-2]["why"] == "the team asked"
    assert healthy(nightly_production["service"]["health_url"])
    record = nightly_runs["work"] / "runs" / "promoted" / f"{NIGHTLY_NAME}.json"
    if after["serving"] == 0:
        # Back to what production served before eagleflow managed it (every later night's drafter was rolled
        # back): no drafter of ours serves, so there is no promoted record and the next night starts afresh.
        assert not record.exists()
    else:  # the next night continues from what production serves
        assert json.loads(record.read_text())["drafter_dir"] == after["source"]
