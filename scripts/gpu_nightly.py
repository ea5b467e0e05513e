#!/usr/bin/env python3
"""Kimi's nightly as the product runs it, on one GPU host: a Prefect server and a process worker there, the
config's `NAME-nightly` deployment, and production a vLLM server of a target of Kimi-K2.5's architecture
(scripts/build_kimi_shaped_target.py) that the nightly puts to sleep, swaps tonight's drafter into over CUDA
IPC, wakes and probes (`production.pause: sleep`, `swap_drafter: true`, `promote: serve`).

    python3 scripts/gpu_nightly.py up            build the target and an untrained drafter production serves first
                                                  (adopted, as an operator does once), write the config, start
                                                  production, its health log (twice a second), the Prefect server,
                                                  the deployments and a worker; each in a process session of its own
    python3 scripts/gpu_nightly.py night N [--plant] [--timeout S]
                                                  append night N's prompts to the source, start a run of the nightly
                                                  deployment for the worker (`eagleflow trigger nightly`) and follow
                                                  it; --plant: once the train stage has written its manifest, every
                                                  checkpoint of it gets random weights of the same shapes (a drafter
                                                  that must be refused: caught, rolled back)
    python3 scripts/gpu_nightly.py wait [--timeout S]
                                                  follow the last night's run again: exit 75 while it still runs
    python3 scripts/gpu_nightly.py advance [--budget S] [--plant-night N] [--last N]
                                                  follow the running night, start the next when it ended (night 3
                                                  planted), for S seconds; then the table so far (one command for
                                                  every call of a chain)
    python3 scripts/gpu_nightly.py table         per night: the stages' seconds, production down as the report says
                                                  and as the health log saw it, probe AL against canary AL, the
                                                  decision, and what production serves at the end (markdown)
    python3 scripts/gpu_nightly.py down          stop what `up` started (its own pid files only)

State lives in $GN_HOME (default ~/gpu-nightly), so the nights can run in separate calls of at most 10 minutes while
the machine stays up. On a GPU host without network (Python 3.12, torch; scripts/gpu_nightly.sh stages the rest):
the host environment is python3 with the checkout and a vLLM site ($VLLM_SITE, default ~/site) on its path; the
control environment is python3 with Prefect's wheels unpacked in $GN_HOME/control. --host-python and
--control-python name other interpreters (a rehearsal on a CPU machine: .hostenv/bin/python and .venv/bin/python).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("GN_HOME", Path.home() / "gpu-nightly"))
NIGHTS = HOME / "nights.json"  # the nights started so far: run id, start, end, state, planted or not
NAME = "kimi-shaped"
STATE = HOME / "state.json"
PRODSERVICE = str(ROOT / "tests" / "prodservice.py")
NIGHT_PROMPTS = (200, 80, 80)  # night 1's includes the held-out split (`up --night-prompts` sets others)
HOLDOUT = 24


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_state() -> dict:
    return json.loads(STATE.read_text())


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    say("$ " + shlex.join(argv))
    return subprocess.run(argv, check=True, **kw)


def wrapper(path: Path, python: str, pythonpath: list[str], env: dict[str, str]) -> str:
    """A python that carries its environment: what a stage process, the worker's flow run and production start
    with, whoever starts them."""
    lines = ["#!/bin/sh", f"export PYTHONPATH={shlex.quote(os.pathsep.join(pythonpath))}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(f'exec {shlex.quote(python)} "$@"')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def add_python_args(ap: argparse.ArgumentParser) -> None:
    """The options `pythons` reads: other interpreters than python3 with the staged sites (a CPU rehearsal)."""
    ap.add_argument("--host-python", help="the host environment's python (default: python3 with $VLLM_SITE)")
    ap.add_argument("--control-python", help="the control environment's python (default: python3 with Prefect's site)")


def pythons(args: argparse.Namespace) -> tuple[str, str]:
    """(control, host) interpreters."""
    bin_dir = HOME / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    vllm_env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    if args.host_python:  # absolute: the wrapper runs from any directory
        host = wrapper(bin_dir / "host-python", os.path.abspath(args.host_python), [str(ROOT)], {})
    else:
        # vLLM 0.26's ipc weight-transfer module imports ray and requests at the top; only its sending side (not
        # production's) uses them: empty stand-ins where the host has neither
        stubs = HOME / "stubs"
        for m in ("ray", "requests"):
            probe = subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True)
            if probe.returncode != 0:
                (stubs / m).mkdir(parents=True, exist_ok=True)
                (stubs / m / "__init__.py").write_text("")
        site = os.environ.get("VLLM_SITE", str(Path.home() / "site"))
        host = wrapper(bin_dir / "host-python", sys.executable, [str(ROOT), site, str(stubs)], vllm_env)
    control = os.path.abspath(args.control_python) if args.control_python else sys.executable
    control_path = [str(ROOT)] if args.control_python else [str(HOME / "control"), str(ROOT)]
    ctl = wrapper(bin_dir / "control-python", control, control_path, {"PREFECT_HOME": str(HOME / "prefect")})
    return ctl, host


def write_config(st: dict, args: argparse.Namespace) -> Path:
    import yaml

    data = {
        "name": NAME,
        "host": {"kind": "local", "name": "gpu-host", "work_root": str(HOME / "work"), "python": st["host_python"]},
        "target": {
            "model_path": st["target"],
            "served_model_name": NAME,
            "aux_layer_ids": [1, 2, 3],
            "final_layer_id": 4,
            "dtype": "bfloat16",
        },
        "engine": {
            "kind": "vllm",
            "port": st["engine_port"],
            "max_model_len": 1024,
            "kv_cache_gib": args.kv_cache_gib,
            "reasoning_parser": args.reasoning_parser,
            # production's engine and one of the nightly's share the GPU while production sleeps (level 1 keeps ~1 GB)
            **({} if args.cpu else {"gpu_memory_utilization": 0.45}),
            "startup_timeout_s": 600,
            **({"extra_args": ["--compilation-config", '{"custom_ops": ["-rotary_embedding"]}']} if args.cpu else {}),
        },
        "generate": {
            "prompts_path": str(ROOT / "demo" / "prompts.jsonl"),
            "num_samples": st["night_prompts"][0],
            "holdout": HOLDOUT,
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "concurrency": 32,
            "shard_size": 200,
            "server": "production",
        },
        "extract": {"max_seq_len": 1024, "batch_tokens": 16384, "device": "auto", "backend": args.extract_backend},
        "train": {
            "epochs": args.epochs,
            "ttt_steps": 3,
            "draft_vocab_size": 512,
            "learning_rate": 0.002,
            "batch_tokens": 2048,
            "max_seq_len": 1024,
            "time_limit_s": 3600,
            "seed": 0,
        },
        "export": {"formats": ["vllm"]},
        "benchmark": {
            "num_prompts": HOLDOUT,
            "max_tokens": args.max_tokens,
            "num_speculative_tokens": 3,
            "warmup_requests": 2,
            "side_by_side": False,
        },
        "nightly": {
            "source": str(HOME / "source"),
            "new_samples": st["night_prompts"][1],
            "replay": 1.0,
            "train_steps": args.night_steps,
            "learning_rate": 0.0005,
        },
        "production": {
            "kind": "command",
            "start_command": st["prod_start"],
            "stop_command": [sys.executable, PRODSERVICE, "stop", "--pidfile", str(HOME / "prod.pid")],
            "status_command": [sys.executable, PRODSERVICE, "status", "--pidfile", str(HOME / "prod.pid")],
            "url": f"http://127.0.0.1:{st['prod_port']}",
            "health_url": f"http://127.0.0.1:{st['prod_port']}/health",
            "window": "pipeline",
            "promote": "serve",
            "pause": "stop" if args.cpu else "sleep",
            "swap_drafter": not args.cpu,
            "restore_timeout_s": 900,
            # Kimi's traffic (configs/kimi-k25.yaml) at greedy sampling: a random-weight target's sampled tokens are
            # noise no drafter can follow, so the sampled cells would measure nothing of the production path. At
            # concurrency 2: HOLDOUT prompts make 12 rounds (the benchmark's unit); at 8 they made 3, whose interval
            # (Student's t at 2 degrees of freedom) left the gate undecided on both nights that ran so (0.00-5.42)
            "traffic": [{"name": "greedy", "temperature": 0.0, "concurrency": 2, "share": 1.0}],
        },
        "report_dir": str(HOME / "reports"),
    }
    path = HOME / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def spawn(argv: list[str], log: Path, pidfile: Path, env: dict[str, str] | None = None) -> int:
    """Start argv in a process session of its own (it outlives this call), its pid in pidfile."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    pidfile.write_text(str(proc.pid))
    return proc.pid


def wait_http(url: str, timeout_s: float, what: str, log: Path) -> float:
    import urllib.request

    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > timeout_s:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(f"{what} not healthy at {url} after {timeout_s:.0f} s; {log}:\n{tail}")
        time.sleep(1)


def up(args: argparse.Namespace) -> int:
    HOME.mkdir(parents=True, exist_ok=True)
    (HOME / "source").mkdir(exist_ok=True)
    ctl, host = pythons(args)
    st = {"control_python": ctl, "host_python": host, "prod_port": free_port(), "engine_port": free_port()}
    st["prefect_port"] = free_port()
    st["night_prompts"] = [int(x) for x in args.night_prompts.split(",")]
    st["target"] = str(Path(args.target).resolve()) if args.target else str(HOME / "target")
    t0 = time.monotonic()
    if not args.target:
        size = ["--hidden", "256", "--heads", "2", "--experts", "4", "--top-k", "2"] if args.cpu else []
        run([host, str(ROOT / "scripts" / "build_kimi_shaped_target.py"), "--out", st["target"], *size])
    run([host, str(ROOT / "tests" / "make_drafter.py"), str(HOME / "untrained"), "--seed", "3",
         "--target", st["target"], "--draft-vocab-size", "512"])  # fmt: skip
    served_dir = HOME / "work" / "production" / NAME
    run([host, "-m", "eagleflow.production.served", "adopt", str(served_dir), "--drafter", str(HOME / "untrained")])
    # production launched as eagleflow launches its own engine for this config, plus what sleep and the swap need
    st["prod_start"] = ["true"]  # replaced below, once the launch is known
    STATE.write_text(json.dumps(st))
    config = write_config(st, args)
    launch = (
        "import json, sys\nfrom eagleflow.config import load_config\n"
        "from eagleflow.engines.launch import target_launch\nfrom eagleflow.engines.vllm import VllmServer\n"
        "c = load_config(sys.argv[1])\n"
        "k = c.benchmark.num_speculative_tokens\n"
        "spec = {'method': 'eagle3', 'model': sys.argv[2], 'num_speculative_tokens': k}\n"
        "s = target_launch(c, spec)\ns.port = int(sys.argv[3])\n"
        "print(json.dumps({'argv': VllmServer.argv_for(s), 'env': s.engine.env}))"
    )
    got = json.loads(
        subprocess.run(
            [host, "-c", launch, str(config), str(served_dir / "drafter"), str(st["prod_port"])],
            check=True, capture_output=True, text=True,
        ).stdout.splitlines()[-1]
    )  # fmt: skip
    engine = [host, *got["argv"][1:]]
    if not args.cpu:  # vLLM's CPU build has no sleep mode: the rehearsal stops and starts production instead
        engine += ["--enable-sleep-mode", "--weight-transfer-config", '{"backend": "ipc"}']
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", **got["env"]}
    start = [sys.executable, PRODSERVICE, "start", "--pidfile", str(HOME / "prod.pid"), "--log", str(HOME / "prod.log")]
    start += [
        "--port",
        str(st["prod_port"]),
        *[a for kv in env.items() for a in ("--env", "=".join(kv))],
        "--",
        *engine,
    ]
    st["prod_start"] = start
    STATE.write_text(json.dumps(st))
    config = write_config(st, args)

    prefect_env = {
        "PREFECT_API_URL": f"http://127.0.0.1:{st['prefect_port']}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_PORT": str(st["prefect_port"]),
    }
    spawn([ctl, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(st["prefect_port"])],
          HOME / "prefect-server.log", HOME / "prefect-server.pid", prefect_env)  # fmt: skip
    run(start)
    spawn([sys.executable, __file__, "health-log", f"http://127.0.0.1:{st['prod_port']}"], HOME / "health.log",
          HOME / "health.pid")  # fmt: skip
    api = prefect_env["PREFECT_API_URL"]
    say(f"Prefect server healthy after {wait_http(api + '/health', 300, 'Prefect', HOME / 'prefect-server.log'):.0f} s")
    run([ctl, "-m", "deployments.deploy", str(config)], env={**os.environ, **prefect_env}, cwd=ROOT)
    spawn([ctl, "-m", "prefect", "worker", "start", "--pool", "eagleflow"], HOME / "worker.log", HOME / "worker.pid",
          {**prefect_env, "PREFECT_WORKER_QUERY_SECONDS": "2"})  # fmt: skip
    healthy = wait_http(f"http://127.0.0.1:{st['prod_port']}/health", 900, "production", HOME / "prod.log")
    say(f"production healthy {healthy:.0f} s after its start was checked; up in {time.monotonic() - t0:.0f} s")
    st["prefect_env"] = prefect_env
    STATE.write_text(json.dumps(st))
    return 0


def health_log(url: str) -> int:
    """Production as a person sees it, twice a second: `up` (answers /health and is awake), `asleep`, `down`
    (refused or an error), or `slow` (no answer within 2 s: neither starts nor ends a down spell), one JSON line
    each."""
    import urllib.error
    import urllib.request

    def ask(path: str) -> str | None:
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                return r.read().decode() if r.status == 200 else None
        except urllib.error.HTTPError:
            return None

    while True:
        t = time.time()
        try:
            state = "down" if ask("/health") is None else "up"
            if state == "up" and "true" in (ask("/is_sleeping") or "").lower():
                state = "asleep"
        except TimeoutError:
            state = "slow"
        except OSError:
            state = "down"
        print(json.dumps({"t": round(t, 2), "state": state}), flush=True)
        time.sleep(max(0.0, 0.5 - (time.time() - t)))


def plant_watch(since: float, out: Path) -> None:
    """Night 3's fault: the first train stage to finish after `since` gets random weights of the same shapes in
    every checkpoint (floating matrices ~ N(0, 0.02); norms and the vocabulary maps kept), before export reads it."""
    import torch
    from safetensors.torch import load_file, save_file

    work = HOME / "work"
    while True:
        done = [m for m in work.glob("**/train/*/manifest.json") if m.stat().st_mtime > since]
        if done:
            break
        time.sleep(0.05)
    stage = done[0].parent
    t = time.time()
    gen = torch.Generator().manual_seed(11)
    files = sorted(stage.glob("checkpoints/*/model.safetensors"))
    for f in files:
        tensors = load_file(str(f))
        for k, v in tensors.items():
            if v.is_floating_point() and v.dim() >= 2:
                tensors[k] = (torch.randn(v.shape, generator=gen) * 0.02).to(v.dtype)
        save_file(tensors, str(f), metadata={"format": "pt"})
    exported = [e for e in work.glob("**/export/*/request.json") if e.stat().st_mtime > since]
    out.write_text(
        json.dumps(
            {
                "train_stage": str(stage),
                "checkpoints": len(files),
                "seconds_after_train_manifest": round(time.time() - done[0].stat().st_mtime, 2),
                "planted_in": round(time.time() - t, 2),
                "export_started_before_plant": bool(exported),
            }
        )
    )


def night(args: argparse.Namespace) -> int:
    """Append night N's prompts, start the nightly deployment's run (as its schedule would), then `wait` for it."""
    st = load_state()
    n = args.n
    lines = (ROOT / "demo" / "prompts.jsonl").read_text().splitlines(keepends=True)
    counts = st["night_prompts"] + st["night_prompts"][-1:] * max(0, n - len(st["night_prompts"]))  # then as the last
    start = sum(counts[: n - 1])
    (HOME / "source" / f"prompts-{n}.jsonl").write_text("".join(lines[start : start + counts[n - 1]]))
    began = time.time()
    if args.plant:  # in a session of its own, like the run: both outlive this call
        spawn([sys.executable, __file__, "plant-watch", str(began), str(HOME / f"plant-{n}.json")],
              HOME / f"plant-{n}.log", HOME / f"plant-{n}.pid")  # fmt: skip
    trigger = [st["control_python"], "-m", "cli.trigger", "nightly", str(HOME / f"{NAME}.yaml")]
    out = subprocess.run(
        trigger, env={**os.environ, **st["prefect_env"]}, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    print(out.stdout + out.stderr, flush=True)
    if out.returncode != 0:
        return out.returncode
    run_id = out.stdout.strip().rsplit("/", 1)[-1]
    nights = read_nights()
    nights.append({"night": n, "run": run_id, "began": began, "ended": None, "state": None, "plant": args.plant})
    NIGHTS.write_text(json.dumps(nights, indent=1))
    return wait(args)


FOLLOW = """
import sys
from prefect.client.orchestration import get_client
from cli.trigger import FINAL, follow
with get_client(sync_client=True) as client:
    rc = follow(client, sys.argv[1], "eagleflow", float(sys.argv[2]))
    state = client.read_flow_run(sys.argv[1]).state.type.value
print("flow run state:", state)
sys.exit(rc if state in FINAL else 75)
"""


def wait(args: argparse.Namespace) -> int:
    """Follow the last night's run (its stages and progress) until it ends, or for --timeout seconds: exit 75
    while it still runs (call again), else 0 when it completed."""
    st = load_state()
    nights = read_nights()
    if not nights:
        say("no night started yet: `night 1` (or `advance`) starts one")
        return 1
    last = nights[-1]
    if last["ended"] is None:
        rc = subprocess.run(
            [st["control_python"], "-c", FOLLOW, last["run"], str(args.timeout)],
            env={**os.environ, **st["prefect_env"]},
            cwd=ROOT,
        ).returncode
        if rc == 75:
            say(f"night {last['night']} still runs after this call's {args.timeout:.0f} s: call `wait` again")
            return 75
        last.update(ended=time.time(), state="COMPLETED" if rc == 0 else "not completed")
        NIGHTS.write_text(json.dumps(nights, indent=1))
    say(f"night {last['night']}: {last['state']} in {last['ended'] - last['began']:.0f} s")
    return 0 if last["state"] == "COMPLETED" else 1


def advance(args: argparse.Namespace) -> int:
    """One call's worth of the three nights, for a GPU host reached in calls of a few minutes: follow the night
    that runs, start the next once it ended (night 3 with --plant), until --budget seconds are spent; then the
    table so far. Every call is the same command."""
    deadline = time.monotonic() + args.budget
    while deadline - time.monotonic() > 30:
        nights = read_nights()
        args.timeout = deadline - time.monotonic() - 20
        if nights and nights[-1]["ended"] is None:
            if wait(args) == 75:
                break
            continue
        if len(nights) >= args.last:
            break
        args.n, args.plant = len(nights) + 1, len(nights) + 1 == args.plant_night
        rc = night(args)
        if rc == 75 or len(read_nights()) == len(nights):
            break  # still running, or the run could not be started (its trigger's output above says why)
    return table(args)


def read_nights() -> list[dict]:
    return json.loads(NIGHTS.read_text()) if NIGHTS.exists() else []


def down_spells(began: float, ended: float) -> list[tuple[float, float, str]]:
    """The health log's spells in which production did not serve (down or asleep) within [began, ended]."""
    spells, start, why = [], None, ""
    for line in (HOME / "health.log").read_text().splitlines():
        try:
            s = json.loads(line)
        except ValueError:
            continue
        if not began <= s["t"] <= ended or s["state"] == "slow":
            continue
        if s["state"] in ("down", "asleep") and start is None:
            start, why = s["t"], s["state"]
        elif s["state"] == "up" and start is not None:
            spells.append((start, s["t"], why))
            start = None
    if start is not None:
        spells.append((start, ended, why + ", to the end"))
    return spells


def table(args: argparse.Namespace) -> int:
    import calendar

    nights = read_nights()
    if not nights:
        say(f"no nights in {NIGHTS}: nothing to tabulate yet")
        return 1
    reports = sorted((HOME / "reports").glob("**/report.json"), key=lambda p: p.stat().st_mtime)
    served_dir = HOME / "work" / "production" / NAME
    events = json.loads((served_dir / "history.json").read_text())["events"]
    for e in events:
        e["t"] = calendar.timegm(time.strptime(e["at"], "%Y-%m-%dT%H:%M:%SZ"))
    rows = [
        "| night | state | stages, seconds (cached: c) | production down: report / health log (s) "
        "| wake probe: AL [95%] vs expected, decision | production's drafters (event: seq, canary AL) |",
        "|---|---|---|---|---|---|",
    ]
    copies: list[tuple[Path, str]] = []
    for n in nights:
        ended = n["ended"] or time.time()
        within = lambda t, n=n, ended=ended: n["began"] - 1 <= t <= ended + 5  # noqa: E731
        path = next((p for p in reports if within(p.stat().st_mtime)), None)
        rep = json.loads(path.read_text()) if path else {}
        if path and (path.parent / "report.md").exists():
            copies.append((path.parent / "report.md", f"report-night-{n['night']}.md"))
        closed = [json.loads(p.read_text()) for p in (HOME / "work").glob("**/window.closed.json")]
        closed = sorted((w for w in closed if within(w.get("back_at") or 0)), key=lambda w: w["back_at"])
        stages = ", ".join(
            f"{k} {v['seconds']:.0f}{' c' if v['cached'] else ''}" for k, v in rep.get("stages", {}).items()
        )
        reported = sum(w.get("down_s") or 0 for w in rep.get("production_windows", []))
        spells = down_spells(n["began"], ended)
        polled = sum(b - a for a, b, _ in spells)
        probes = []
        for w in closed:
            p = w.get("wake_probe") or {}
            if p.get("probe_al_interval"):
                lo, hi = p["probe_al_interval"]
                probes.append(
                    f"{p['probe_al']:.2f} [{lo:.2f}, {hi:.2f}] vs {p.get('expected_al') or 0:.2f}: {p['decision']}"
                )
            elif p:
                probes.append(str(p.get("decision")))
        acts = []
        for e in (e for e in events if within(e["t"])):
            al = (e.get("canary") or {}).get("mean_acceptance_length")
            acts.append(f"{e['action']} {e.get('seq', '')}" + (f" ({al:.2f})" if al else ""))
        rows.append(
            f"| {n['night']}{' (planted)' if n['plant'] else ''} | {n['state']} | {stages} | "
            f"{reported:.1f} / {polled:.1f} ({len(spells)} spells) | {'; '.join(probes) or '-'} | {'; '.join(acts)} |"
        )
    link = os.readlink(served_dir / "drafter")
    text = "\n".join(rows) + f"\n\nproduction serves {link} at the end\n"
    for n in nights:
        plant = HOME / f"plant-{n['night']}.json"
        if plant.exists():
            text += f"night {n['night']}'s plant: {plant.read_text()}\n"
    print(text)
    out = Path(os.environ.get("OUT", HOME))
    (out / "gpu-nightly.md").write_text(text)
    for src, name in [(HOME / "health.log", "health.log"), (NIGHTS, "nights.json"), *copies]:
        (out / name).write_bytes(src.read_bytes())
    for log in ("worker", "prod"):  # what to read when a night failed: the last 256 KiB of each
        if (HOME / f"{log}.log").exists():
            (out / f"{log}-tail.log").write_bytes((HOME / f"{log}.log").read_bytes()[-262144:])
    return 0


def down(args: argparse.Namespace) -> int:
    import signal

    for name in ("worker", "health", "prefect-server", *(p.stem for p in HOME.glob("plant-*.pid"))):
        pidfile = HOME / f"{name}.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text())
            try:
                os.killpg(pid, signal.SIGTERM)  # the session `spawn` started for it, and nothing else
            except ProcessLookupError:
                pass
            pidfile.unlink()
    st = load_state()
    subprocess.run([sys.executable, PRODSERVICE, "stop", "--pidfile", str(HOME / "prod.pid")], check=False)
    say(f"stopped what up started ({st['prod_port']}, {st['prefect_port']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    add_python_args(u)
    u.add_argument(
        "--cpu",
        action="store_true",
        help="a CPU rehearsal: a narrow target; production stopped and started instead of asleep",
    )
    u.add_argument(
        "--target",
        help="serve this target instead of building one of Kimi's architecture with random weights (e.g. "
        "demo/target-mla: Kimi's latent KV shape, trained, so its drafter learns something)",
    )
    u.add_argument("--reasoning-parser", help="engine.reasoning_parser (deepseek_r1 for the demo targets)")
    u.add_argument(
        "--night-prompts",
        default=",".join(map(str, NIGHT_PROMPTS)),
        help="new prompts per night, night 1's including the held-out split",
    )
    u.add_argument("--kv-cache-gib", type=float, default=2.0)
    u.add_argument(
        "--extract-backend",
        choices=("vllm", "hf"),
        default="vllm",
        help="extract.backend: vllm as the Kimi config (an engine start per extract stage), or hf (transformers)",
    )
    u.add_argument("--max-tokens", type=int, default=128)
    u.add_argument("--epochs", type=int, default=6)
    u.add_argument("--night-steps", type=int, default=40)
    ng = sub.add_parser("night")
    ng.add_argument("n", type=int, choices=(1, 2, 3))
    ng.add_argument("--plant", action="store_true")
    ng.add_argument("--timeout", type=float, default=3600, help="follow the run this long (then `wait` again)")
    w = sub.add_parser("wait")
    w.add_argument("--timeout", type=float, default=3600)
    a = sub.add_parser("advance")
    a.add_argument("--budget", type=float, default=540, help="seconds this call may spend")
    a.add_argument("--plant-night", type=int, default=3, help="the night whose drafter is planted")
    a.add_argument("--last", type=int, default=3, help="the last night to start")
    sub.add_parser("table")
    sub.add_parser("down")
    h = sub.add_parser("health-log")
    h.add_argument("url")
    p = sub.add_parser("plant-watch")
    p.add_argument("since", type=float)
    p.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "health-log":
        return health_log(args.url)
    if args.cmd == "plant-watch":
        plant_watch(args.since, args.out)
        return 0
    return {"up": up, "night": night, "wait": wait, "advance": advance, "table": table, "down": down}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
