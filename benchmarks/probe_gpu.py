"""The probe after a wake, judged against what the drafter should serve, on a GPU host with vLLM (issue 39, items 2
and 3): eagleflow's own production window (`open_window`), its guardian's wake with the drafter swapped in over CUDA
IPC, its probe and verdict, and the canary (`python -m eagleflow.production.canary`) after each window for
comparison. Production is a real vLLM server of the demo target, started and stopped only by the operator's scripts.

    python3 benchmarks/probe_gpu.py --drafter trained=A --drafter under-epoch1=B ... --random R --out $OUT

Production adopts the first drafter (seq 0) and starts with it from eagleflow's link; its canary confirms it, so
that drafter's expected AL is then its canary on production. Each later window: a level-1 sleep, the next drafter
switched in (served.switch, inside the window), the window released: the guardian wakes production with the swap,
probes it on the run's held-out prompts until the AL's interval decides against production.probe_share of the
drafter's expected AL, and keeps it or stops and starts production. Then a rollback to drafter 0, whose expected
AL is its canary; then each `--refuse` drafter (weights that serve far below the estimate their config claims:
refused against it); last the random drafter (no offline estimate: the old rule judges it). A refusal costs a
start. One JSON line per step in OUT/probe.jsonl (machine paths written as placeholders) and a table; exit 1 when a
verdict is not the expected one.

`--cpu-check` runs the same path on the CPU build of vLLM, which has no CUDA IPC: one window, nothing switched
(production's drafter 0 probed against its canary), to check the script before a GPU host's time is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config import load_config  # noqa: E402
from eagleflow.production import canary, served  # noqa: E402
from eagleflow.production.window import CLOSED, RELEASE, open_window, status  # noqa: E402
from eagleflow.util import http  # noqa: E402

START = """#!/bin/bash
# production's start: the operator's command (eagleflow only runs it); returns once launched
set -e
cd {out}
export VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 PYTHONPATH={pythonpath}
setsid {python} -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port {port} --model {target} \\
  --served-model-name demo-target --max-model-len 1024 --disable-uvicorn-access-log {engine_args} \\
  --speculative-config '{{"method": "eagle3", "model": "{link}", "num_speculative_tokens": 3}}' \\
  >> {out}/production.log 2>&1 < /dev/null &
echo $! > {out}/production.pid
"""
STOP = """#!/bin/bash
# production's stop: its process group, TERM then KILL; returns once it is gone
pid=$(cat {out}/production.pid 2>/dev/null) || exit 0
kill -TERM -- -"$pid" 2>/dev/null || exit 0
for i in $(seq 1 60); do kill -0 -- -"$pid" 2>/dev/null || exit 0; sleep 0.5; done
kill -KILL -- -"$pid" 2>/dev/null; sleep 1
"""


def stubs_dir() -> Path:
    """vLLM 0.26's ipc weight-transfer module imports ray and requests at the top; only its trainer side uses them."""
    import importlib.util

    d = Path(tempfile.mkdtemp(prefix="stubs-"))
    for m in ("ray", "requests"):
        if importlib.util.find_spec(m) is None:
            (d / m).mkdir()
            (d / m / "__init__.py").write_text(f'"""Stand-in for {m}: vLLM\'s ipc weight transfer imports it."""\n')
    return d


def window_settings(config: Any, start: Path, stop: Path, url: str, link: Path) -> dict[str, Any]:
    """Production's settings for a window, as tasks/production.py writes them for a config with pause 'sleep' and
    promote 'serve': the production section, the drafter link, the generate split the probe's prompts come from."""
    g = config.generate
    return {
        **config.production.model_dump(mode="json"),
        "kind": "command",
        "start_command": [str(start)],
        "stop_command": [str(stop)],
        "health_url": f"{url}/health",
        "url": url,
        "pause": "sleep",
        "sleep_level": 1,
        "swap_drafter": True,
        "stop_timeout_s": 60,
        "restore_timeout_s": 600,
        "drafter_link": str(link),
        "probe_holdout": {
            "prompts_path": g.prompts_path,
            "split": g.split,
            "num_samples": g.num_samples,
            "holdout": g.holdout,
            "seed": g.seed,
        },
        "probe_max_tokens": config.production.canary_max_tokens or config.benchmark.max_tokens,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", action="append", required=True, help="NAME=DIR; the first is production's at start")
    ap.add_argument("--random", type=Path, required=True, help="same shape, random weights, no offline estimate")
    ap.add_argument(
        "--refuse",
        action="append",
        default=[],
        help="NAME=DIR: a drafter whose window must be refused (e.g. weights that serve far below their own "
        "offline estimate); switched in after the rollback, before the random one",
    )
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    ap.add_argument("--canary-prompts", type=int, default=16)
    ap.add_argument("--canary-max-tokens", type=int, default=160)
    ap.add_argument("--port", type=int, default=18751)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, help="production's work root (default OUT/work)")
    ap.add_argument("--cpu-check", action="store_true", help="vLLM's CPU build: one window, nothing switched")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or out / "work").resolve()
    url = f"http://127.0.0.1:{args.port}"
    config = load_config(args.config, {"production.url": url})
    dep = Path(served.served_dir(str(work), config.name))
    link = dep / served.LINK
    drafters = [(n, Path(p).resolve()) for n, p in (d.split("=", 1) for d in args.drafter)]
    home = str(Path.home())
    places = [(str(work), "<work root>"), (str(out), "<results dir>"), (str(ROOT), "<repository root>"), (home, "~")]
    failed: list[str] = []
    rows: list[dict[str, Any]] = []

    def clean(x: Any) -> Any:
        text = json.dumps(x)
        for path, name in places:
            text = text.replace(path, name)
        return json.loads(text)

    def emit(rec: dict[str, Any]) -> None:
        rec = clean({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **rec})
        print(json.dumps(rec), flush=True)
        with open(out / "probe.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        rows.append(rec)

    stubs = stubs_dir()
    pythonpath = os.pathsep.join([str(stubs), str(ROOT), os.environ.get("PYTHONPATH", "")])
    scripts = {}
    for name, text in (("start.sh", START), ("stop.sh", STOP)):
        scripts[name] = out / name
        scripts[name].write_text(
            text.format(
                out=shlex.quote(str(out)),
                python=shlex.quote(sys.executable),
                pythonpath=shlex.quote(pythonpath),
                port=args.port,
                target=shlex.quote(config.target.model_path),
                link=link,
                # the CPU build serves /sleep under VLLM_SERVER_DEV_MODE alone (it pauses the scheduler)
                engine_args="--enforce-eager --dtype bfloat16"
                if args.cpu_check
                else '--enable-sleep-mode --gpu-memory-utilization 0.4 --weight-transfer-config \'{"backend": "ipc"}\'',
            )
        )
        scripts[name].chmod(0o755)
    settings = window_settings(config, scripts["start.sh"], scripts["stop.sh"], url, link)

    def run_canary(label: str) -> dict[str, Any]:
        d = out / "canary" / label
        d.mkdir(parents=True, exist_ok=True)
        req = {"config": config.model_dump(mode="json"), "n": args.canary_prompts, "max_tokens": args.canary_max_tokens}
        (d / "request.json").write_text(json.dumps(req))
        rc = canary.main([str(d / "request.json"), str(d / "canary.json")])
        figures = json.loads((d / "canary.json").read_text()) if rc == 0 else {"error": f"canary exit {rc}"}
        emit({"step": f"canary: {label}", "serving": os.path.realpath(link), **figures})
        return figures

    served.adopt(dep, drafters[0][1])
    t0 = time.time()
    os.system(shlex.quote(str(scripts["start.sh"])))
    while not http.answers(f"{url}/health", 2.0):
        if time.time() - t0 > 420:
            emit({"step": "start", "error": "production not healthy in 420 s"})
            os.system(shlex.quote(str(scripts["stop.sh"])))
            return 1
        time.sleep(0.5)
    emit({"step": "production started", "drafter": drafters[0][0], "healthy_after_s": round(time.time() - t0, 1)})

    def window(name: str, action: Any, expect: str) -> None:
        d = work / "production" / f"window-{name}"
        t_open = time.time()
        rec = open_window(d, json.dumps(settings), str(work), owner="probe_gpu", stages=["swap"])
        action(d)
        (d / RELEASE).touch()
        while status(d)["state"] != "closed":
            if time.time() - t_open > 480:  # a restart included; longer is a hang: its guardian's log says where
                raise RuntimeError(f"window {name} not closed after 480 s: see {d}/production-guardian.log")
            time.sleep(0.25)
        res = json.loads((d / CLOSED).read_text())
        probe = res.get("wake_probe") or {}
        outcome = "kept" if res.get("resumed") else "stopped and started" if res.get("pause_fallback") else "?"
        emit(
            {
                "step": f"window: {name}",
                "paused": {k: (rec.get("paused") or {}).get(k) for k in ("level", "sleep_s", "why")},
                "ok": res.get("ok"),
                "outcome": outcome,
                "expected_outcome": expect,
                "verdict": probe.get("decision"),
                "probe": probe,
                "summary": res.get("summary"),
                "resumed": {k: v for k, v in (res.get("resumed") or {}).items() if k != "probe_answers"},
                "pause_fallback": res.get("pause_fallback"),
                "window_s": round(time.time() - t_open, 1),
            }
        )
        if outcome != expect or not res.get("ok"):
            failed.append(name)

    try:
        first = run_canary(f"0-{drafters[0][0]}")
        served.confirm(dep, first)  # drafter 0 measured good on production: its canary is its expected AL from now
        if args.cpu_check:
            window("asleep and woken, nothing switched", lambda d: None, "kept")
            return 1 if failed else 0
        for name, path in drafters[1:]:
            window(name, lambda d, p=path, n=name: served.switch(dep, p, run=n, window=d), "kept")
            run_canary(name)
        window(
            f"rollback-to-{drafters[0][0]}",
            lambda d: served.rollback(dep, "probe_gpu: back to drafter 0", window=d),
            "kept",
        )
        run_canary(f"rollback-to-{drafters[0][0]}")
        for name, path in (r.split("=", 1) for r in args.refuse):
            window(
                name,
                lambda d, p=Path(path).resolve(), n=name: served.switch(dep, p, run=n, window=d),
                "stopped and started",
            )
            run_canary(name)
        # last: its refusal stops and starts production, the one window that costs an engine load
        window("random", lambda d: served.switch(dep, args.random, run="random", window=d), "stopped and started")
        run_canary("random")
    finally:
        os.system(shlex.quote(str(scripts["stop.sh"])))
        log = out / "production.log"
        if log.is_file():  # the engine's own lines, for what went wrong (placeholders for the machine's paths)
            tail = log.read_text(errors="replace").splitlines()[-300:]
            (out / "production-tail.log").write_text(clean("\n".join(tail)) + "\n")
            log.unlink()
    emit({"step": "history", "deployed": served.summary(dep)})
    print("\n| window | probe AL [95% interval] | probe requests | expected AL (source) | verdict | canary AL after |")
    print("|---|---|---:|---|---|---:|")
    for i, r in enumerate(rows):
        if not r["step"].startswith("window: "):
            continue
        p = r["probe"]
        nxt = next((x for x in rows[i + 1 :] if x["step"].startswith("canary: ")), {})
        ci = p.get("probe_al_interval")
        exp = f"{p['expected_al']:.2f} ({p['expected_source']})" if p.get("expected_al") else p.get("expected_source")
        print(
            f"| {r['step'][8:]} | {p.get('probe_al')} [{ci[0]:.2f}, {ci[1]:.2f}] | {p.get('probe_requests')} | {exp} | "
            f"{r['verdict']} ({r['outcome']}) | {nxt.get('mean_acceptance_length')} |"
            if ci
            else f"| {r['step'][8:]} | {p.get('probe_al')} | {p.get('probe_requests')} | {exp} | {r['verdict']} "
            f"({r['outcome']}) | {nxt.get('mean_acceptance_length')} |"
        )
    print("FAILED: " + ", ".join(failed) if failed else "every verdict as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
