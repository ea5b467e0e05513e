"""The production host's two other faces (production run by tests/prodservice.py; the package's fixtures,
conftest.py, which test_downtime.py's cases share):

- one production window for several stages (eagleflow.production.window): opened through its CLI, as
  the flow does; released, production is back; its holder SIGKILLed mid-window, the guardian ends
  what carries the window's token and gives production back alone (production: the package's stand-in,
  `standin`, which answers only after a load as an engine does);
- against a real vLLM CPU server as production (`prod`): the generate stage answering from production
  (`generate.server: production`) while production is restarted mid-run: the requests that found it gone are
  sent again once it answers; nothing fails;
- the generate stage spread over two replicas (`production.replicas`: `prod` and a second real server),
  one stopped mid-stage and started again: left, its requests answered by the other, taken back; every
  sample once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from eagleflow.config import load_config
from eagleflow.contracts.manifest import stage_dir, stage_key
from eagleflow.contracts.request import StageRequest
from tests.conftest import ROOT
from tests.conftest import free_port as any_free_port
from tests.integration.production.test_downtime import (
    PY,
    Prod,
    alive,
    carrying,
    healthy,
    standin_engine,
    vllm_prod,
    wait_healthy,
)

pytestmark = pytest.mark.integration
WINDOW = [PY, "-m", "eagleflow.production.window"]


def open_window(prod: Prod, d: Path, work_root: Path, owner: str) -> dict:
    out = subprocess.run(
        [
            *WINDOW,
            "open",
            str(d),
            "--config",
            prod.cfg().model_dump_json(),
            "--work-root",
            str(work_root),
            "--owner",
            owner,
            "--stages",
            "extract,train",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def status(d: Path) -> dict:
    return json.loads(
        subprocess.run([*WINDOW, "status", str(d)], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    )


def wait_closed(d: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while (s := status(d))["state"] != "closed":
        assert time.monotonic() < deadline, f"window {d} not closed within {timeout_s:.0f} s: {s}"
        time.sleep(0.5)
    return s["result"]


def test_window_released_by_its_owner_gives_production_back(standin: Prod, tmp_path: Path) -> None:
    d = tmp_path / "production" / "w1"
    rec = open_window(standin, d, tmp_path, owner="flow-run-1")
    assert rec["was_running"] and not healthy(standin.health_url)
    assert rec["env"]["EAGLEFLOW_PRODUCTION_WINDOW"] == str(d) and rec["env"]["EAGLEFLOW_TOKEN"] == rec["token"]
    # Another flow run's release touches nothing; the owner's releases this window.
    other = subprocess.run([*WINDOW, "release-owner", str(tmp_path), "flow-run-2"], capture_output=True, text=True)
    assert json.loads(other.stdout)["released"] == [] and status(d)["state"] == "open"
    mine = subprocess.run([*WINDOW, "release-owner", str(tmp_path), "flow-run-1"], capture_output=True, text=True)
    assert json.loads(mine.stdout)["released"] == [str(d)]
    result = wait_closed(d, 180)
    assert result["ok"] and result["was_running"] and result["down_s"] > 0
    assert result["stages"] == ["extract", "train"]
    assert healthy(standin.health_url)


def test_window_holder_killed_guardian_ends_its_stages_and_restores(standin: Prod, tmp_path: Path) -> None:
    d = tmp_path / "production" / "w2"
    rec = open_window(standin, d, tmp_path, owner="flow-run-3")
    engine = standin_engine(rec["env"])  # a stage's engine inside the window
    time.sleep(0.3)
    os.kill(rec["pid"], signal.SIGKILL)  # the holder dies without a word
    result = wait_closed(d, 180)
    assert result["ok"] and "guardian" in result["summary"]
    assert healthy(standin.health_url)
    engine.wait(timeout=30)
    assert carrying(rec["token"]) == [] and not alive(rec["pid"])


def _start_generate(
    prod: Prod, tmp_path: Path, n: int, concurrency: int, sampling: dict | None = None, **production: object
) -> tuple[Path, subprocess.Popen]:
    """The generate stage of the demo config answered by production (`production`: its url or its replicas), started
    as its own process, its output in <stage dir>/stage.log: (stage dir, process). `sampling`: generate.* fields."""
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp_path / "runs"),
            "host.python": sys.executable,
            "engine.port": any_free_port(),
            "target.served_model_name": "prod",
            "generate.server": "production",
            "generate.num_samples": n,
            "generate.holdout": 4,
            "generate.shard_size": 16,
            "generate.concurrency": concurrency,
            "generate.max_tokens": 96,
            "generate.server_wait_s": 240,
            "benchmark.num_prompts": 4,
            "production": {**prod.cfg().model_dump(), **production},
            **{f"generate.{k}": v for k, v in (sampling or {}).items()},
        },
    )
    key = stage_key("generate", cfg, {})
    d = Path(stage_dir(cfg, "generate", key))
    d.mkdir(parents=True)
    (d / "request.json").write_text(StageRequest(stage="generate", key=key, dir=str(d), config=cfg).model_dump_json())
    log = open(d / "stage.log", "w")
    return d, subprocess.Popen(
        [sys.executable, "-m", "eagleflow.stages.generate", str(d / "request.json")],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def _start_again(p: Prod) -> None:
    """The operator's start script once more; the old server's port can stay in TIME_WAIT a moment, and the
    script refuses until it is free."""
    deadline = time.monotonic() + 60
    while subprocess.run(p.start_command).returncode != 0 and time.monotonic() < deadline:
        time.sleep(1)


def _answers(d: Path) -> dict[int, str]:
    manifest = json.loads((d / "manifest.json").read_text())
    rows = [r for s in manifest["outputs"]["shards"] for r in pq.read_table(d / s).to_pylist()]
    return {r["sample_id"]: r["reasoning"] + "\x00" + r["content"] for r in rows}


def test_generate_from_production_survives_a_restart(prod: Prod, tmp_path: Path) -> None:
    """Sampled as production samples (temperature 1.0, top_p 0.95): the requests sent again after the restart carry
    their samples' seeds, so the stage run again answers the same."""
    sampled = {"temperature": 1.0, "top_p": 0.95}
    url = prod.health_url.rsplit("/health", 1)[0]
    d, stage = _start_generate(prod, tmp_path, 64, 4, sampled, url=url)
    restarted = threading.Event()

    def restart_after_first_shard() -> None:
        while not (d / "data" / "shard-00000.parquet").exists() and stage.poll() is None:
            time.sleep(0.05)
        subprocess.run(prod.stop_command, check=True)  # production restarts under the stage's feet
        _start_again(prod)
        restarted.set()

    t = threading.Thread(target=restart_after_first_shard)
    t.start()
    rc = stage.wait(timeout=600)
    t.join()
    text = (d / "stage.log").read_text()
    assert rc == 0, text[-3000:]
    assert restarted.is_set() and healthy(prod.health_url)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["metrics"]["server"] == "production" and manifest["metrics"]["failed"] == 0
    assert manifest["metrics"]["server_waits"] >= 1 and "production answers again" in text
    rows = sum(pq.read_metadata(d / s).num_rows for s in manifest["outputs"]["shards"])
    assert rows == 64
    wait_healthy(prod.health_url, max(60.0, 3 * prod.first_start_s))  # a restart, bounded by the first start

    again, stage = _start_generate(prod, tmp_path / "again", 64, 4, sampled, url=url)
    assert stage.wait(timeout=600) == 0, (again / "stage.log").read_text()[-3000:]
    first, second = _answers(d), _answers(again)
    assert first.keys() == second.keys()
    same = sum(first[k] == second[k] for k in first)
    # Unseeded answers at temperature 1 never repeat whole; seeded ones do, but for a rare token where another
    # batch's kernels move a logit (the engine batches the requests differently each time).
    assert same >= 0.85 * len(first), f"{same} of {len(first)} sampled answers repeated"
    assert len(set(first.values())) > len(first) // 2  # answers, not one answer repeated


def _served(metrics_url: str) -> float:
    """Requests a vLLM server has finished since it started (its own counter, read here, not by the stage)."""
    text = httpx.get(metrics_url, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


def test_generate_spreads_over_replicas_leaves_a_stopped_one_and_takes_it_back(prod: Prod, tmp_path: Path) -> None:
    """production.replicas: `prod` (a) and a second real vLLM CPU server (b), two requests in flight on each. b is
    stopped once the first shard is written and started again (the stage held meanwhile, so that b's start does
    not race a's answering the rest): the requests that found b gone are answered by a, b is taken back once its
    /health answers and serves again (its own counter says so), and the shards hold every sample exactly once;
    the manifest's counts add up (sent = answered + moved; answers = samples)."""
    (tmp_path / "replica-b").mkdir()
    b = vllm_prod(tmp_path / "replica-b")
    subprocess.run(b.start_command, check=True)
    try:
        b_first_start = wait_healthy(b.health_url, 600)
        urls = [u.rsplit("/health", 1)[0] for u in (prod.health_url, b.health_url)]
        # Five shards: b is stopped after the first and left within the second (b's stop can take tens of seconds
        # on busy cores, while a answers on: the four left outlast it), taken back once the stage goes on, and the
        # rest answered by both; more samples would only prolong the same ending.
        n = 80
        d, stage = _start_generate(prod, tmp_path, n, 2, replicas=urls)
        times: dict[str, float] = {}

        def stop_b_after_first_shard_and_start_it_again() -> None:
            while not (d / "data" / "shard-00000.parquet").exists() and stage.poll() is None:
                time.sleep(0.05)
            times["served_before_stop"] = _served(f"{urls[1]}/metrics")
            subprocess.run(b.stop_command, check=True)  # replica b goes down under the stage's feet
            while "left (" not in (d / "stage.log").read_text() and stage.poll() is None:
                time.sleep(0.05)
            # The stage has left b. It is held (SIGSTOP; this test's own process) while b starts again: a vLLM
            # start on 2 busy cores can outlast a's answering the rest alone, and "taken back" must not race it.
            stage.send_signal(signal.SIGSTOP)
            try:
                times["stage_held"] = float(stage.poll() is None)
                _start_again(b)
                times["restart_s"] = wait_healthy(b.health_url, max(120.0, 5 * b_first_start))  # a safety cap
            finally:
                stage.send_signal(signal.SIGCONT)

        t = threading.Thread(target=stop_b_after_first_shard_and_start_it_again)
        t.start()
        rc = stage.wait(timeout=900)
        t.join()
        text = (d / "stage.log").read_text()
        assert rc == 0, text[-3000:]
        print(f"\nreplica b: first start {b_first_start:.1f} s, restart {times.get('restart_s', 0):.1f} s")
        assert times["served_before_stop"] > 0  # b had answered before it went down
        assert times["stage_held"], "the stage ended before b was stopped: raise n"
        m = json.loads((d / "manifest.json").read_text())["metrics"]
        assert m["failed"] == 0 and set(m["replicas"]) == set(urls), m
        a_counts, b_counts = m["replicas"][urls[0]], m["replicas"][urls[1]]
        assert b_counts["down"] >= 1 and b_counts["back"] >= 1 and b_counts["moved"] >= 1, b_counts
        for c in (a_counts, b_counts):
            assert c["sent"] == c["answered"] + c["moved"], c
        assert a_counts["answered"] + b_counts["answered"] == n  # every answer from exactly one replica
        assert _served(f"{urls[1]}/metrics") > 0  # the restarted b served again: taken back
        ids = [
            i
            for s in sorted((d / "data").glob("shard-*.parquet"))
            for i in pq.read_table(s, columns=["sample_id"]).column("sample_id").to_pylist()
        ]
        assert sorted(ids) == list(range(n))  # every sample, once
        assert "left" in text and "taken back" in text
    finally:
        subprocess.run(b.stop_command, check=False)
