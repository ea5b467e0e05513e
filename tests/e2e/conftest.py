"""A real Prefect server for the end-to-end tests, started here and ended here (our process group only),
and the one pipeline run of the demo config that several modules read (flows, tasks, deployments):
run once per session, in a work root of its own."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from eagleflow.util import http
from flows.params import FLOW_OF, deployment_name
from tests.conftest import ROOT, free_port
from tests.helpers.procs import end_group

IDLE_SERVICES = (
    "SCHEDULER",
    "LATE_RUNS",
    "FOREMAN",
    "PAUSE_EXPIRATIONS",
    "CANCELLATION_CLEANUP",
    "REPOSSESSOR",
    "CLEANUP_RECONCILER",
    "DB_VACUUM",
    "TRIGGERS",
    "EVENT_LOGGER",
)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    # The UI is served too: the browser tests (tests/e2e/ui) read the runs of every test the way an
    # operator does. Its API address must be given: the UI otherwise calls the default port 4200.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
        # The server's loop services no test reads (schedules fire no run here; nothing is late, paused, automated
        # or vacuumed): idle, the server took 1.34 CPU-s a minute with them and 0.90 without, on the 2 cores the
        # suite shares (docs/benchmarks.md). Kept: the event persister and the task-run recorder, which write what
        # the UI and the API show of a run.
        **{f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false" for s in IDLE_SERVICES},
    }
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited: {(home / 'server.log').read_text()[-2000:]}")
        try:
            if http.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("prefect server not healthy after 120 s")
        time.sleep(0.5)
    yield {"PREFECT_API_URL": url, "PREFECT_HOME": str(home)}
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def api(prefect_server: dict, method: str, path: str, **kw) -> httpx.Response:
    """One call to the test's Prefect server API; raises on an error status. A 503 is the server's own
    "busy, try again" (its SQLite database locked by a flow run's writes on these 2 cores): asked
    again, as Prefect's own client does, for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        r = http.client().request(method, prefect_server["PREFECT_API_URL"] + path, timeout=30, **kw)
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    r.raise_for_status()
    return r


def run_logs(prefect_server: dict, run_id: str) -> list[dict]:
    """Every log record of the flow run the server keeps now, oldest first. Its last lines reach the server after
    its state is final: a test that needs them waits for the one it expects."""
    logs: list[dict] = []
    while True:
        batch = api(
            prefect_server,
            "POST",
            "/logs/filter",
            json={
                "logs": {"flow_run_id": {"any_": [run_id]}},
                "sort": "TIMESTAMP_ASC",
                "limit": 200,
                "offset": len(logs),
            },
        ).json()
        logs += batch
        if len(batch) < 200:
            return logs


@contextlib.contextmanager
def deployed_worker(
    prefect_server: dict, config: Path, pool: str, log_path: Path, more: tuple[Path, ...] = ()
) -> Iterator[dict[str, dict]]:
    """The project's deployments registered for `config` (and the configs `more`, in the same deploy) on `pool`,
    and a process worker running them all (as from the UI); yields the config's deployments by kind (pipeline,
    nightly, benchmark, bootstrap: each named `<config name>-<kind>`), and every config's by its name under
    "by_config". The worker is our own process group, ended after."""
    env = {**os.environ, **prefect_server}
    deploy = subprocess.run(
        [sys.executable, "-m", "deployments.deploy", *(str(c) for c in (config, *more)), "--pool", pool],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert deploy.returncode == 0, deploy.stderr[-3000:]
    log = open(log_path, "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
        cwd=ROOT,
        # A run created through the API waits for the worker's next query (10 s by default): the suite creates
        # its runs one at a time and waits for each, so every run would wait about 5 s for nothing.
        env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        names = [yaml.safe_load(Path(c).read_text())["name"] for c in (config, *more)]
        by_name = {d["name"]: d for d in api(prefect_server, "POST", "/deployments/filter", json={}).json()}
        by_config = {n: {kind: by_name[deployment_name(n, kind)] for kind in FLOW_OF} for n in names}
        yield {"deployments": by_config[names[0]], "by_config": by_config, "worker": worker}
    finally:
        end_group(worker)
        log.close()


def wait_flow_run(prefect_server: dict, run_id: str, timeout_s: float = 900) -> dict:
    """The flow run once it is final (Completed, Failed, Crashed or Cancelled), read from the API."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = api(prefect_server, "GET", f"/flow_runs/{run_id}").json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(1)
    raise AssertionError(f"flow run {run_id} not finished after {timeout_s:.0f} s")


def newest_report(report_dir: Path, after: float) -> dict:
    """The report.json a run wrote under `report_dir` after `after` (a Unix time), the newest."""
    found = [p for p in Path(report_dir).glob("*/report.json") if p.stat().st_mtime >= after]
    assert found, f"no report.json under {report_dir} since the run started"
    return json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text())


# -- the demo pipeline, run once ------------------------------------------------------------------


@pytest.fixture(scope="session")
def e2e_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def e2e_config(e2e_workdir: Path) -> Path:
    """The demo config, small: 308 training samples, 4 epochs (bounded by epochs, never by the clock)."""
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = "e2e"
    data["host"].update(work_root=str(e2e_workdir / "runs"), python=str(ROOT / ".hostenv" / "bin" / "python"))
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    data["generate"].update(
        prompts_path=str(ROOT / "demo" / "prompts.jsonl"), num_samples=320, holdout=12, shard_size=160
    )
    data["engine"]["port"] = free_port()
    data["train"].update(epochs=4)
    # The suite's three processes swing this machine's load from run to run: the baseline a later test's run shares
    # with an earlier one is reused by its key alone (the load rule: tests/unit/measure/test_reused.py).
    data["benchmark"].update(num_prompts=6, max_tokens=64, warmup_requests=1, reuse_max_load_change=1.0)
    data["report_dir"] = str(e2e_workdir / "reports")
    path = e2e_workdir / "e2e.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_flow(
    prefect_server: dict, *args: str, module: str = "flows.pipeline", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> ARGS` against the test's Prefect server, to its end (`env`: more environment)."""
    env = {**os.environ, **prefect_server, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    print(proc.stdout[-6000:], proc.stderr[-6000:])
    return proc


def run_cli(prefect_server: dict, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`eagleflow ARGS`, the control environment's console script, against the test's Prefect server."""
    env = {**os.environ, **prefect_server, **(env or {})}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "eagleflow"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(proc.stdout[-6000:], proc.stderr[-6000:])
    return proc


def last_report(proc: subprocess.CompletedProcess) -> dict:
    """The report.json the flow printed last (`report: PATH`)."""
    line = [x for x in proc.stdout.splitlines() if x.startswith("report: ")][-1]
    return json.loads(Path(line.split("report: ", 1)[1]).read_text())


def watch_progress(prefect_server: dict, proc: subprocess.Popen, poll_s: float = 1.0) -> dict[str, list[tuple]]:
    """While `proc` runs: every distinct (progress, description) each progress artifact showed, by key,
    read from the server the way the UI reads it."""
    seen: dict[str, list[tuple]] = {}
    while proc.poll() is None:
        try:
            arts = api(
                prefect_server,
                "POST",
                "/artifacts/filter",
                json={"artifacts": {"type": {"any_": ["progress"]}}, "limit": 200},
            ).json()
        except httpx.HTTPError:
            arts = []
        for a in arts:
            shown = seen.setdefault(a["key"], [])
            value = (a["data"], a["description"])
            if not shown or shown[-1] != value:
                shown.append(value)
        time.sleep(poll_s)
    return seen


@pytest.fixture(scope="session")
def first_run_watched(prefect_server, e2e_config) -> dict:
    """The first pipeline run of e2e_config (every stage computed): its report, its output, and what
    its progress artifacts showed while it ran."""
    env = {**os.environ, **prefect_server}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline", str(e2e_config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out: dict[str, str] = {}
    # The pipes are read beside the watching, so a full pipe never stalls the run.
    readers = [
        threading.Thread(target=lambda n=n, f=f: out.__setitem__(n, f.read()), daemon=True)
        for n, f in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for t in readers:
        t.start()
    seen = watch_progress(prefect_server, proc)
    for t in readers:
        t.join()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out["stdout"], out["stderr"])
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stdout[-3000:]
    return {"report": last_report(done), "proc": done, "progress": seen}


@pytest.fixture(scope="session")
def first_run(first_run_watched) -> dict:
    """The report of the first pipeline run of e2e_config: every stage computed."""
    return first_run_watched["report"]


# -- the nightly retrain: a refused night, two promoted nights, a night with nothing new ------------------

# The source as it grows, night by night: the first night holds out 12 and trains on 88, and its gate's acceptance
# floor is out of reach (NIGHT_FLOORS), so it is refused and production keeps the drafter it had; the second, with no
# promoted drafter to continue, trains on the whole pool (88 + 40 = 128: a replay sample would be 40 + 40); the third
# continues from the second's drafter. A last night with nothing appended has nothing new.
NIGHT_PROMPTS = (100, 40, 64)
NIGHT_FLOORS = (50.0, 1.0, 1.0)  # the gate's min_acceptance_length, night by night
PLAIN_NIGHT = 2  # its prompts appended as a user writes their own: {"prompt": "..."} lines


NIGHTLY_NAME = "nightly-e2e"


@pytest.fixture(scope="session")
def nightly_production(tmp_path_factory) -> Iterator[dict]:
    """Production for the nightly: a real vLLM server of the demo target whose launch reads its drafter from the
    link eagleflow manages (<work_root>/production/<name>/drafter), started and stopped by the operator's scripts
    (tests/prodservice.py). Before the first night the link names an untrained drafter (adopted: what production
    served before eagleflow managed it). A thread asks its health twice a second for the whole session."""
    from tests.conftest import prod_service_config
    from tests.e2e.health import HealthLog, healthy

    work = tmp_path_factory.mktemp("nightly")
    hostenv = str(ROOT / ".hostenv" / "bin" / "python")
    served_dir = work / "runs" / "production" / NIGHTLY_NAME
    untrained = work / "untrained-drafter"
    subprocess.run(
        [hostenv, str(ROOT / "tests" / "make_drafter.py"), str(untrained), "--seed", "3"],
        check=True,
        timeout=300,
        capture_output=True,
    )
    subprocess.run(
        [hostenv, "-m", "eagleflow.production.served", "adopt", str(served_dir), "--drafter", str(untrained)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    spec = {"method": "eagle3", "model": str(served_dir / "drafter"), "num_speculative_tokens": 3}
    # Launched as eagleflow launches its own engine for this config (docs/production.md: the paired figures of a
    # drafter measured on production mean what they say only then): the demo's OMP_NUM_THREADS and eager mode.
    prod = prod_service_config(
        work,
        free_port(),
        hostenv,
        served_name="demo-target",
        orphan_grace_s=10,
        engine_args=("--speculative-config", json.dumps(spec)),
        restore_timeout_s=420,
        # eagleflow's capture plugin on (docs/production.md, Capture from production): each night's states come
        # from production's own forward, behind its drafter's aux layers (extract.backend 'production')
        env=("OMP_NUM_THREADS=2", f"EAGLEFLOW_CAPTURE_DIR={work / 'capture'}", "EAGLEFLOW_CAPTURE_LAYERS=1,2,3,4"),
    )
    subprocess.run(prod["start_command"], check=True, timeout=60)
    deadline = time.monotonic() + 420
    while not healthy(prod["health_url"]):
        assert time.monotonic() < deadline, (work / "prod.log").read_text()[-3000:]
        time.sleep(1)
    health = HealthLog(prod["health_url"])
    health.start()
    try:
        yield {
            "work": work,
            "service": prod,
            "health": health,
            "served_dir": served_dir,
            "untrained": untrained,
            "url": prod["health_url"].rsplit("/health", 1)[0],
            "log": work / "prod.log",
        }
    finally:
        health.done.set()
        subprocess.run(prod["stop_command"], timeout=60)


@pytest.fixture(scope="session")
def nightly_runs(prefect_server, nightly_production) -> dict:
    """The nightly deployment (`nightly-e2e-nightly`) run by a process worker, as the schedule does, on the demo with
    a prompt source (a directory of JSONL files) that grows between nights (NIGHT_PROMPTS, NIGHT_FLOORS), and
    production (`nightly_production`) taking each promoted drafter (`production.promote: serve`); then once more
    with nothing appended. The nights that trained: their reports, run ids, the held-out prompts' sha256 after
    each, and each night's start and end; the night with nothing new: its run id, final state, start and end."""
    work = nightly_production["work"]
    source = work / "source"
    source.mkdir()
    lines = (ROOT / "demo" / "prompts.jsonl").read_text().splitlines(keepends=True)
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = NIGHTLY_NAME
    data["host"].update(
        name=NIGHTLY_NAME, work_root=str(work / "runs"), python=str(ROOT / ".hostenv" / "bin" / "python")
    )
    data["target"]["model_path"] = str(ROOT / "demo" / "target")
    # Generated by production itself, which keeps serving meanwhile, as the Kimi config does: no engine of our own
    # loads for it (production's drafter changes no greedy answer).
    data["generate"].update(
        prompts_path=str(ROOT / "demo" / "prompts.jsonl"),
        num_samples=NIGHT_PROMPTS[0],
        holdout=12,
        shard_size=160,
        server="production",
    )
    data["engine"]["port"] = free_port()
    # The states from production itself while it serves: no window for extract, no engine of our own.
    # (1,023 tokens and the one a capture request asks for: production's context of 1,024)
    data["extract"].update(backend="production", capture_dir=str(work / "capture"), max_seq_len=1023)
    data["train"].update(epochs=4, max_seq_len=1023)
    data["benchmark"].update(
        num_prompts=12,
        max_tokens=64,
        warmup_requests=1,
        temperatures=[0.0],
        concurrencies=[1],
        precision=0.05,
        min_requests=6,
        # The suite's three processes make this machine's load what it is between nights: the reuse under test is
        # the key's (the load rule: tests/unit/measure/test_reused.py).
        reuse_max_load_change=1.0,
    )
    data["nightly"] = {
        "source": str(source),
        "new_samples": max(NIGHT_PROMPTS[1:]),
        "replay": 1.0,
        # A third of the first promoted night's steps at most (its 128 prompts x 4 epochs came to ~88 steps).
        "train_steps": 24,
        "learning_rate": 0.0005,
    }
    data["report_dir"] = str(work / "reports")
    # The canary's tolerance is wide: on these 2 busy cores production's tok/s moves by a third between nights.
    data["production"] = {
        **nightly_production["service"],
        "url": nightly_production["url"],
        "window": "pipeline",
        "promote": "serve",
        "canary_prompts": 6,
        "canary_max_tokens": 48,
        "canary_tolerance": 0.35,
    }
    config = work / "nightly.yaml"
    config.write_text(yaml.safe_dump(data))
    holdout = work / "runs" / "nightly" / "nightly-e2e" / "holdout.jsonl"

    def append(night: int, chunk: list[str]) -> None:
        if night == PLAIN_NIGHT:  # the same prompts, in the other form a source file may take
            chunk = [json.dumps({"prompt": json.loads(x)["messages"][0]["content"]}) + "\n" for x in chunk]
        (source / f"prompts-{night}.jsonl").write_text("".join(chunk))

    nights: list[dict] = []
    start = 0
    with deployed_worker(prefect_server, config, "eagleflow-nightly-e2e", work / "worker.log") as w:
        dep = w["deployments"]["nightly"]

        def night(floor: float) -> dict:
            began = time.time()
            run = api(
                prefect_server,
                "POST",
                f"/deployments/{dep['id']}/create_flow_run",
                json={
                    "parameters": {
                        "params": {
                            "config_path": str(config),
                            "min_speedup": 0.0,
                            "min_acceptance_length": floor,
                            "overrides": {},
                        }
                    }
                },
            ).json()
            done = wait_flow_run(
                prefect_server, run["id"], timeout_s=2700
            )  # a safety cap: ~8 min alone, 3x beside the other suites
            assert done["state"]["type"] == "COMPLETED", (done["state"], (work / "worker.log").read_text()[-5000:])
            return {"id": run["id"], "state": done["state"], "began": began, "ended": time.time()}

        for k, (count, floor) in enumerate(zip(NIGHT_PROMPTS, NIGHT_FLOORS), 1):
            append(k, lines[start : start + count])
            start += count
            ran = night(floor)
            ran["report"] = newest_report(work / "reports", ran["began"])
            ran["holdout_sha256"] = hashlib.sha256(holdout.read_bytes()).hexdigest()
            nights.append(ran)
        nothing_new = night(1.0)
    return {"config": config, "work": work, "nights": nights, "nothing_new": nothing_new}
