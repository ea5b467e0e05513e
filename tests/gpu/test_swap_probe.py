"""A drafter swapped into production asleep at level 1, woken and probed, on a GPU with vLLM (issue 39, item 3).

Production is real vLLM serving the demo target with `--enable-sleep-mode`, its EAGLE-3 drafter read from the link
eagleflow manages, started and stopped by an operator's scripts (tests/prodservice.py). Two windows of eagleflow's
own (`open_window`, its guardian, `served.switch` inside the window):

    1. the trained demo drafter (what `make demo` exports) switched in for a random one: swapped in over CUDA IPC at
       the wake; the probe must pass it and serve its offline estimate (within the probe's 95% interval);
    2. the control, a random drafter of the same shape switched back in: the probe must refuse it, and production is
       stopped and started.

Skipped where torch sees no CUDA device, where vLLM is not importable (scripts/gpu_suite.sh adds a staged vLLM),
or where no trained demo drafter is in the checkout (runs/demo/export/*/vllm).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not importable"),
]
ROOT = Path(__file__).resolve().parents[2]
PRODSERVICE = str(ROOT / "tests" / "prodservice.py")
TRAINED = sorted(ROOT.glob("runs/demo/export/*/vllm"))
START_S = 600.0  # a first start compiles (about 2.5 min on an H200 with vLLM 0.26); a later one reads the cache


def wait_healthy(url: str, timeout_s: float) -> float:
    from eagleflow.util import http

    t0 = time.monotonic()
    while not http.answers(url, 2.0):
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"production at {url} not healthy after {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - t0


@pytest.fixture
def production(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Production serving a random drafter from eagleflow's link; its window settings, as tasks/production.py
    writes them for a config with pause 'sleep', swap_drafter and promote 'serve'."""
    if not TRAINED:
        pytest.skip("no trained demo drafter in the checkout (make demo exports runs/demo/export/*/vllm)")
    from eagleflow.config import load_config
    from eagleflow.production import served
    from tests.conftest import free_port
    from tests.make_drafter import make_drafter

    config = load_config(ROOT / "configs" / "demo.yaml")
    work = tmp_path / "work"
    dep = Path(served.served_dir(str(work), config.name))
    random = make_drafter(tmp_path / "random", seed=7, draft_vocab_size=config.train.draft_vocab_size)
    served.adopt(dep, random)
    # vLLM 0.26's ipc weight-transfer module imports ray and requests at the top; only its trainer side uses them
    stubs = Path(tempfile.mkdtemp(prefix="stubs-", dir=tmp_path))
    for m in ("ray", "requests"):
        if importlib.util.find_spec(m) is None:
            (stubs / m).mkdir()
            (stubs / m / "__init__.py").write_text("")
    port = free_port()
    url, pidfile = f"http://127.0.0.1:{port}", tmp_path / "prod.pid"
    engine = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        config.target.model_path,
        "--served-model-name",
        "demo-target",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        "0.4",
        "--enable-sleep-mode",
        "--weight-transfer-config",
        '{"backend": "ipc"}',
        "--speculative-config",
        json.dumps({"method": "eagle3", "model": str(dep / served.LINK), "num_speculative_tokens": 3}),
        "--disable-uvicorn-access-log",
    ]
    pythonpath = os.pathsep.join(p for p in (str(stubs), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    start = [PRODSERVICE, "start", "--pidfile", str(pidfile), "--log", str(tmp_path / "prod.log"), "--port", str(port)]
    for kv in ("VLLM_SERVER_DEV_MODE=1", "VLLM_ALLOW_INSECURE_SERIALIZATION=1", f"PYTHONPATH={pythonpath}"):
        start += ["--env", kv]
    g = config.generate
    settings = {
        "kind": "command",
        "start_command": [sys.executable, *start, "--", *engine],
        "stop_command": [sys.executable, PRODSERVICE, "stop", "--pidfile", str(pidfile)],
        "health_url": f"{url}/health",
        "url": url,
        "pause": "sleep",
        "sleep_level": 1,
        "swap_drafter": True,
        "stop_timeout_s": 60,
        "restore_timeout_s": START_S,
        "drafter_link": str(dep / served.LINK),
        "probe_holdout": {
            "prompts_path": g.prompts_path,
            "split": g.split,
            "num_samples": g.num_samples,
            "holdout": g.holdout,
            "seed": g.seed,
        },
        "probe_max_tokens": config.benchmark.max_tokens,
    }
    subprocess.run(settings["start_command"], check=True)
    try:
        print(f"\nproduction healthy after {wait_healthy(settings['health_url'], START_S):.0f} s")
        yield {"settings": settings, "dep": dep, "work": work, "random": random, "log": tmp_path / "prod.log"}
    finally:
        subprocess.run(settings["stop_command"], check=False)


def window(p: dict[str, Any], name: str, drafter: Path) -> dict[str, Any]:
    """Production asleep at level 1, `drafter` switched in while it sleeps, the window released: the guardian's
    result once production is back (woken with the swap, or stopped and started)."""
    from eagleflow.production import served
    from eagleflow.production.window import CLOSED, RELEASE, open_window, status

    d = p["work"] / "production" / name
    rec = open_window(d, json.dumps(p["settings"]), str(p["work"]), owner="gpu-suite", stages=["swap"])
    assert (rec.get("paused") or {}).get("level") == 1, f"production was not put to sleep: {rec}"
    served.switch(p["dep"], drafter, run=name, window=d)
    (d / RELEASE).touch()
    deadline = time.monotonic() + 2 * START_S
    while status(d)["state"] != "closed":
        assert time.monotonic() < deadline, (
            f"window {name} did not close; {(d / 'production-guardian.log').read_text()}"
        )
        time.sleep(0.25)
    res = json.loads((d / CLOSED).read_text())
    print(f"\n{name}: {res['summary']}\n{json.dumps(res.get('wake_probe'))}")
    return res


def test_a_drafter_swapped_in_at_a_level_1_wake_serves_its_offline_estimate_and_a_random_one_is_refused(
    production: dict[str, Any],
) -> None:
    from eagleflow.production import served

    trained = TRAINED[-1]
    offline = served.offline_al(trained)
    assert offline is not None, f"{trained}/config.json carries no offline estimate"
    res = window(production, "w1-trained", trained)
    probe = res["wake_probe"]
    assert res["ok"] and res["resumed"], f"production was not kept woken with the trained drafter: {res}"
    assert res["resumed"]["swapped_in"].endswith("drafters/1")
    assert probe["decision"] == "pass" and probe["expected_al"] == pytest.approx(offline[0])
    assert probe["expected_source"] == "drafter 1's offline estimate (config.json)"
    lo, hi = probe["probe_al_interval"]
    assert lo <= offline[0] <= hi, f"served AL {probe['probe_al']} ({lo:.2f}-{hi:.2f}) is not its offline {offline[0]}"

    res = window(production, "w2-random", production["random"])
    probe = res["wake_probe"]
    assert res["ok"] and not res.get("resumed") and res["pause_fallback"], f"the random drafter was kept: {res}"
    assert probe["decision"] == "refuse" and "swapped in does not draft" in probe["decided_by"]
    assert probe["expected_al"] is None and "no offline estimate" in probe["expected_source"]
