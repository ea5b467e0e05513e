"""The benchmark stage (eagleflow.stages.benchmark) on the real vLLM CPU build: every variant and
setting measured, production stopped and given back, the verdict over production's traffic, a dying engine
reported within seconds with its root cause.

Production here is the suite's stand-in server (it answers its health seconds after its start, as an engine that
loads), run by an operator-style start/stop script (tests/prodservice.py): what is under test is that the stage
stops it and gives it back; a real vLLM production given back is tests/e2e/flows/test_benchmark.py. The drafters
are exported by the project's own code.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eagleflow.config import RunConfig, load_config
from eagleflow.contracts.manifest import stage_dir, stage_key
from eagleflow.contracts.request import StageRequest
from eagleflow.util import http
from tests.conftest import ROOT, free_port, processes_with_env, standin_service_config
from tests.make_drafter import make_drafter

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("drafters")
    return {
        "new": make_drafter(tmp / "new", seed=0),
        "current": make_drafter(tmp / "current", seed=1),
        "newer": make_drafter(tmp / "newer", seed=2),
    }


# production.traffic (issue 40): the stage measures the traffic's cells with its top_p (on the grid below, which
# covers them), and the verdict and the report judge the mix.
TRAFFIC = [
    {"name": "chat", "temperature": 0.7, "top_p": 0.9, "concurrency": 2, "share": 0.75},
    {"name": "tools", "temperature": 0.0, "concurrency": 2, "share": 0.25},
]


def healthy(url: str) -> bool:
    try:
        return http.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def bench_config(tmp: Path, overrides: dict) -> RunConfig:
    return load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp / "runs"),
            "host.python": sys.executable,
            "engine.port": free_port(),
            "benchmark.num_prompts": 4,
            "benchmark.max_tokens": 24,
            "benchmark.warmup_requests": 1,
            "benchmark.temperatures": [0.0, 0.7],
            "benchmark.concurrencies": [1, 2],
            **overrides,
        },
    )


def start_stage(cfg: RunConfig) -> tuple[subprocess.Popen, Path]:
    key = stage_key("benchmark", cfg, {})
    d = Path(stage_dir(cfg, "benchmark", key))
    d.mkdir(parents=True)
    (d / "request.json").write_text(StageRequest(stage="benchmark", key=key, dir=str(d), config=cfg).model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagleflow.stages.benchmark", str(d / "request.json")],
        stdout=open(d / "stage.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, d


def nightly_benchmark(tmp: Path, drafter: Path, current: Path, more: dict | None = None) -> tuple[Path, dict]:
    """The benchmark stage as a nightly runs it (no production, the stopping rule on); its dir and metrics."""
    cfg = bench_config(
        tmp,
        {
            "benchmark.drafter": str(drafter),
            "benchmark.current_drafter": str(current),
            "benchmark.precision": 0.5,
            "benchmark.min_requests": 2,
            "production.traffic": TRAFFIC,  # as the first run's: the same measurements, so reusable
            # the suite's own load moves between these runs: the reuse under test is the key's (the load rule:
            # tests/unit/measure/test_reused.py)
            "benchmark.reuse_max_load_change": 1.0,
            **(more or {}),
        },
    )
    proc, d = start_stage(cfg)
    assert proc.wait(timeout=1200) == 0, (d / "stage.log").read_text()[-5000:]
    return d, json.loads((d / "manifest.json").read_text())["metrics"]


def test_every_variant_and_setting_is_measured_and_production_comes_back(tmp_path, drafters):
    port = free_port()
    production = standin_service_config(tmp_path, port, orphan_grace_s=5)
    start = subprocess.run(production["start_command"], capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        deadline = time.monotonic() + 240
        while not healthy(production["health_url"]):
            assert time.monotonic() < deadline, (tmp_path / "prod.log").read_text()[-3000:]
            time.sleep(1)
        cfg = bench_config(
            tmp_path,
            {
                "benchmark.drafter": str(drafters["new"]),
                "benchmark.current_drafter": str(drafters["current"]),
                "production": {**production, "traffic": TRAFFIC},
                "benchmark.remeasure_baseline": True,
            },
        )
        assert cfg.benchmark.top_p == 0.9  # from the traffic
        proc, d = start_stage(cfg)
        rc = proc.wait(timeout=1200)
        log = (d / "stage.log").read_text()
        assert rc == 0, log[-5000:]
        m = json.loads((d / "manifest.json").read_text())["metrics"]

        # 3 variants x 2 temperatures x 2 concurrencies, each with throughput and latency.
        windows = m["windows"]
        assert sorted({(w["variant"], w["temperature"], w["concurrency"]) for w in windows}) == sorted(
            (v, t, c) for v in ("baseline", "current", "drafter") for t in (0.0, 0.7) for c in (1, 2)
        )
        for w in windows:
            assert w["output_tokens"] == 4 * 24 and w["output_tok_s"] > 0
            assert w["ttft_ms"] > 0 and w["itl_ms"] > 0 and w["tpot_ms"] > 0 and w["e2e_ms"] > 0  # engine histograms
            assert w["client_latency_ms_p50"] >= w["e2e_ms"] * 0.5
            if w["variant"] == "baseline":  # no speculation: no acceptance figures (recorded as null)
                assert w["mean_acceptance_length"] is None and w["num_drafts"] is None
            else:
                assert w["num_drafts"] > 0 and 1.0 <= w["mean_acceptance_length"] <= 4.0
                assert len(w["per_position_acceptance"]) == 3
        # every window sent all 4 prompts in rounds of c; the paired speedup over all rounds is the throughput ratio
        assert all(w["stopped"] == "all prompts" and sum(w["round_tokens"]) == w["output_tokens"] for w in windows)
        assert all(len(w["round_seconds"]) == 4 // w["concurrency"] for w in windows)
        assert m["speedup"] == pytest.approx(m["drafter"]["output_tok_s"] / m["baseline"]["output_tok_s"])
        assert m["reused"] == {} and m["requests"] == {"baseline": 16, "current": 16, "drafter": 16}
        assert m["verdict"]["summary"] and m["offline"] == {"current": None, "drafter": None}
        assert [f for f in m["preflight"] if f["level"] == "error"] == []
        report = (d / "report.md").read_text()
        assert report.count("| current |") == 4 and "**Verdict:**" in report
        # No speculation served again last, on a fresh engine: the engine-to-engine spread, in every interval.
        spread = m["verdict"]["engine_spread"]
        assert (d / "engine-baseline-again.log").exists() and "baseline-again" not in m["requests"]
        assert spread["df"] == 4 and sorted(map(tuple, spread["settings"])) == [(0, 1), (0, 2), (0.7, 1), (0.7, 2)]
        assert all(r > 0 for r in spread["ratios"]) and spread["log_sd"] >= 0
        assert "engine to engine: no speculation served again on a fresh engine" in report
        print(f"engine to engine: {spread}")
        assert "preflight:" in log and "loading: Loading safetensors checkpoint shards" in log

        # The verdict over production's traffic: its cells, each with its top_p and share, and the whole mix, the
        # time to serve the same tokens (the cells' speedups weighted by their shares).
        mix = m["verdict"]["mix"]
        assert [(c["name"], c["top_p"], c["share"]) for c in mix["cells"]] == [
            ("chat", 0.9, 0.75),
            ("tools", 1.0, 0.25),
        ]
        rows = {(r["temperature"], r["concurrency"]): r["drafter_vs_baseline"] for r in m["verdict"]["speedups"]}
        assert mix["speedup"] == pytest.approx(1 / (0.75 / rows[(0.7, 2)] + 0.25 / rows[(0.0, 2)]))
        assert m["verdict"]["summary"].startswith(f"the new drafter serves {mix['speedup']:.2f}x the output tokens/s")
        assert "over production's traffic" in m["verdict"]["summary"]
        assert "## Production's traffic (production.traffic)" in report and "| chat | 0.7 | 0.9 | 2 | 75% |" in report

        # Production was stopped during the measurement and answers again; nothing of ours is left.
        prod = m["production"]
        assert prod["ok"] and prod["was_running"], prod
        assert healthy(production["health_url"])
        print(f"production healthy again {prod['healthy_after_s']:.1f} s after the benchmark gave it back")
        token = json.loads((d / "production.json").read_text())["token"]
        assert processes_with_env("EAGLEFLOW_TOKEN", token) == []
        assert list(d.glob("*.pid")) == []

        # The next run (a nightly) measures only the new drafter: the baseline and the current drafter come from
        # this run's kept measurements, and the drafter's windows may stop once precise enough.
        # (benchmark.remeasure_baseline needs the baseline measured in this run: with it reused, no engine for it.)
        d2, m2 = nightly_benchmark(
            tmp_path, drafters["new"], drafters["current"], {"benchmark.remeasure_baseline": True}
        )
        assert sorted(m2["reused"]) == ["baseline", "current"] and str(d) in m2["reused"]["baseline"]
        assert sorted(p.name for p in d2.glob("engine-*.log")) == ["engine-drafter.log"]  # one engine load
        assert list(m2["requests"]) == ["drafter"] and m2["requests"]["drafter"] <= 16
        first = {(w["variant"], w["temperature"], w["concurrency"]): w for w in windows}
        for w in m2["windows"]:
            if w["variant"] != "drafter":  # the very figures the first run measured
                assert (
                    w["measured"]
                    and w["round_seconds"] == first[(w["variant"], w["temperature"], w["concurrency"])]["round_seconds"]
                )
                continue
            assert w["stopped"] in ("precision", "all prompts") and len(w["round_drafts"]) == len(w["round_seconds"])
            if w["stopped"] == "precision":
                lo, hi = w["al_interval"]
                assert w["requests"] < 4 and (hi - lo) / 2 <= 0.5 * w["mean_acceptance_length"]
        # against the baseline reused from the first run: the same prompts, another hour, so not called paired
        row = m2["verdict"]["headline"]
        assert row["paired_rounds"] is None and row["unpaired"].startswith("baseline measured ")
        assert "unpaired: baseline measured" in m2["verdict"]["summary"] and m2["verdict"]["engine_spread"] is None
        assert "(reused)" in (d2 / "report.md").read_text()

        # Tonight's new drafter is tomorrow's current one: its measurement is reused under its new role. It is also
        # served at k=2 beside the configured 3 (benchmark.k_sweep): one engine more, the same windows and baseline.
        d3, m3 = nightly_benchmark(tmp_path, drafters["newer"], drafters["new"], {"benchmark.k_sweep": [2, 3]})
        assert sorted(m3["reused"]) == ["baseline", "current"] and "as variant 'drafter'" in m3["reused"]["current"]
        assert str(d2) in m3["reused"]["current"]
        assert sorted(p.name for p in d3.glob("engine-*.log")) == ["engine-drafter-k2.log", "engine-drafter.log"]
        sweep = m3["k_sweep"]
        assert sweep["over"] == "production's traffic" and [r["k"] for r in sweep["rows"]] == [2, 3]
        assert sweep["best_k"] in (2, 3) and all(r["speedup"] > 0 for r in sweep["rows"])
        k2 = sweep["rows"][0]
        assert 1.0 <= k2["mean_acceptance_length"] <= 3.0  # at most 2 drafts accepted a step, plus the target's token
        assert re.search(r"num_speculative_tokens['\"]?: 2\b", (d3 / "engine-drafter-k2.log").read_text())
        assert "## Draft tokens a step (benchmark.k_sweep)" in (d3 / "report.md").read_text()
        assert [w["variant"] for w in m3["windows"]].count("drafter-k2") == 0  # the verdict's table: its variants
        cur = [w for w in m3["windows"] if w["variant"] == "current"]
        assert [w["round_seconds"] for w in cur] == [
            w["round_seconds"] for w in m2["windows"] if w["variant"] == "drafter"
        ]
    finally:
        subprocess.run(production["stop_command"], capture_output=True, timeout=60)


def test_an_engine_that_dies_while_loading_is_reported_within_10_s_with_its_root_cause(tmp_path, drafters):
    bad = tmp_path / "bad-target"
    bad.mkdir()
    for f in (ROOT / "demo" / "target").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    shard = bad / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # the header promises what is not there
    cfg = bench_config(tmp_path, {"target.model_path": str(bad), "benchmark.drafter": str(drafters["new"])})
    proc, d = start_stage(cfg)
    engine_log = d / "engine-baseline.log"
    deadline = time.monotonic() + 300
    # The death: the first traceback reaching the engine log (the worker dying while it loads weights).
    while not (engine_log.exists() and "Traceback (most recent call last)" in engine_log.read_text(errors="replace")):
        assert proc.poll() is None, (d / "stage.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the engine never failed"
        time.sleep(0.05)
    died = time.monotonic()
    rc = proc.wait(timeout=60)
    reported = time.monotonic() - died
    log = (d / "stage.log").read_text()
    error = next(line for line in log.splitlines() if line.startswith("error:"))
    print(f"engine's worker died; the stage failed {reported:.1f} s later: {error[:300]}")
    assert rc == 1 and reported < 10
    assert (
        error.startswith("error: engine baseline") and "root cause: safetensors" in error and "SafetensorError" in error
    )
    assert "loading: Loading safetensors checkpoint shards" in log
    assert not (d / "manifest.json").exists()
