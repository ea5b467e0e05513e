"""Production paused instead of stopped, end to end on a GPU host with vLLM (issue 23, item 3): eagleflow's own
production window (`python -m eagleflow.production.window`), its guardian, the deployed drafter's link, and a
real vLLM server as production, started and stopped only by the operator's commands.

    python3 benchmarks/pause_gpu.py --drafter-a A --drafter-b B --drafter-bad BAD --out $OUT    (GPU host, vLLM)

Production: the demo target with drafter A through the link `<work>/production/demo/drafter`, launched by a
start script (its own session, a pid file) with --enable-sleep-mode, --weight-transfer-config ipc and
VLLM_SERVER_DEV_MODE=1, at --gpu-memory-utilization 0.5. A poller reads /health and /is_sleeping twice a
second all along: production is "down" while it does not answer healthy or says it is asleep. Windows, each
with a GPU job inside that takes 60% of the GPU (it fits only if production gave its memory up):

    w1  level 1, drafter B switched in (served.switch) during the window: woken, B swapped in, probed
    w2  level 2, nothing switched: the known fault (vllm#52479, the drafter accepts nothing after the wake)
        must be caught by the probe and fall back to stop and start
    w3  level 1, a drafter with random weights (same shape) switched in: swapped in, the probe catches it,
        production restarted; then rolled back by hand (served.rollback) in
    w4  level 1: the last good drafter (B) swapped back in

After each window the canary's measurement (eagleflow.engines.acceptance: held-out prompts, production's own
/metrics) reads production's acceptance. One JSON line per step (also OUT/pause_gpu.jsonl) and a table; exit 1 when a
window's outcome is not the expected one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.contracts.prompts import load_prompts  # noqa: E402
from eagleflow.engines.acceptance import measure  # noqa: E402
from eagleflow.production import served  # noqa: E402
from eagleflow.production.window import CLOSED, RELEASE, open_window, status  # noqa: E402
from eagleflow.util import http  # noqa: E402

START = """#!/bin/bash
# production's start: the operator's command (eagleflow only runs it); returns once launched
set -e
cd {out}
export VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 PYTHONPATH={pythonpath}
setsid {python} -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port {port} --model {target} \\
  --served-model-name target --max-model-len 1024 --gpu-memory-utilization 0.5 --enable-sleep-mode \\
  --weight-transfer-config '{{"backend": "ipc"}}' --disable-uvicorn-access-log \\
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


class Poller(threading.Thread):
    """/health and /is_sleeping twice a second; the seconds production was not serving, per window."""

    def __init__(self, url: str, path: Path):
        super().__init__(daemon=True)
        self.url, self.path, self.stop_flag = url, path, threading.Event()
        self.rows: list[tuple[float, bool]] = []

    def run(self) -> None:
        with open(self.path, "a") as f:
            while not self.stop_flag.is_set():
                t = time.time()
                ok = http.answers(f"{self.url}/health", 1.0)
                asleep = None
                if ok:
                    try:
                        asleep = http.get(f"{self.url}/is_sleeping", timeout=1.0).json().get("is_sleeping")
                    except Exception:  # noqa: BLE001 - a poll that fails counts as not serving
                        asleep = None
                serving = ok and asleep is False
                self.rows.append((t, serving))
                f.write(json.dumps({"t": round(t, 2), "healthy": ok, "asleep": asleep}) + "\n")
                f.flush()
                self.stop_flag.wait(max(0.0, 0.5 - (time.time() - t)))

    def down_s(self, since: float, until: float) -> float:
        rows = [r for r in self.rows if since <= r[0] <= until]
        return round(sum(0.5 for _, serving in rows if not serving), 1)


def gpu_job(fraction: float) -> dict:
    """Inside the window: a job that takes `fraction` of the GPU (a stand-in for extract and train)."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    t0 = time.time()
    try:
        x = torch.empty(int(fraction * total), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()
        return {
            "gpu_job": f"took {fraction:.0%} of {total / 2**30:.0f} GiB",
            "ok": True,
            "s": round(time.time() - t0, 2),
        }
    except torch.OutOfMemoryError as exc:
        return {"gpu_job": f"could not take {fraction:.0%}: {str(exc)[:200]}", "ok": False}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=ROOT / "demo" / "target")
    ap.add_argument("--drafter-a", type=Path, required=True)
    ap.add_argument("--drafter-b", type=Path, required=True)
    ap.add_argument("--drafter-bad", type=Path, required=True, help="same shape as A and B, random weights")
    ap.add_argument("--prompts", type=Path, default=ROOT / "demo" / "prompts.jsonl")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=18741)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--windows", default="w1,w2,w3,w4")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    dep = Path(served.served_dir(str(work), "demo"))
    link = dep / served.LINK
    url = f"http://127.0.0.1:{args.port}"
    rows: list[dict] = []
    failed: list[str] = []

    def emit(rec: dict) -> None:
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **rec}
        print(json.dumps(rec), flush=True)
        with open(out / "pause_gpu.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        rows.append(rec)

    # vLLM 0.26's ipc weight-transfer module imports ray and requests at the top; only its trainer side uses them.
    stubs = Path(tempfile.mkdtemp(prefix="stubs-"))
    import importlib.util

    for m in ("ray", "requests"):
        if importlib.util.find_spec(m) is None:
            (stubs / m).mkdir()
            (stubs / m / "__init__.py").write_text(f'"""Stand-in for {m}: vLLM\'s ipc weight transfer imports it."""\n')
    pythonpath = os.pathsep.join([str(stubs), str(ROOT), os.environ.get("PYTHONPATH", "")])
    for name, text in (("start.sh", START), ("stop.sh", STOP)):
        (out / name).write_text(
            text.format(
                out=shlex.quote(str(out)),
                python=shlex.quote(sys.executable),
                pythonpath=shlex.quote(pythonpath),
                port=args.port,
                target=shlex.quote(str(args.target)),
                link=link,
            )
        )
        (out / name).chmod(0o755)
    settings = {
        "kind": "command",
        "start_command": [str(out / "start.sh")],
        "stop_command": [str(out / "stop.sh")],
        "health_url": f"{url}/health",
        "url": url,
        "pause": "sleep",
        "swap_drafter": True,
        "drafter_link": str(link),
        "stop_timeout_s": 60,
        "restore_timeout_s": 600,
    }
    prompts = load_prompts(args.prompts)[-args.num_prompts :]

    def canary(step: str) -> dict:
        m = measure(url, "target", prompts, args.max_tokens)
        rec = {
            "step": step,
            "canary_al": m["mean_acceptance_length"],
            "per_position": m["per_position_acceptance"],
            "tok_s": m["output_tok_s"],
            "errors": m["errors"],
            "serving": os.path.realpath(link),
        }
        emit(rec)
        return rec

    served.adopt(dep, args.drafter_a)
    poller = Poller(url, out / "health.jsonl")
    t0 = time.time()
    os.system(shlex.quote(str(out / "start.sh")))
    while not http.answers(f"{url}/health", 2.0):
        if time.time() - t0 > 600:
            emit({"step": "start", "error": "production not healthy in 600 s"})
            return 1
        time.sleep(0.5)
    emit({"step": "production started", "healthy_after_s": round(time.time() - t0, 1)})
    poller.start()
    try:
        canary("before (drafter A)")

        def window(name: str, level: int, what: str, action, expect: str) -> dict:
            """A window: asleep at `level`, the GPU job, `action(window_dir)` (a switch or rollback), released."""
            d = work / "production" / f"window-{name}"
            cfg = {**settings, "sleep_level": level}
            t_open = time.time()
            rec = open_window(d, json.dumps(cfg), str(work), owner="pause_gpu", stages=["gpu-job"])
            paused = rec.get("paused") or {}
            job = gpu_job(0.6)
            if action is not None:
                action(d)
            (d / RELEASE).touch()
            while status(d)["state"] != "closed":
                time.sleep(0.25)
            t_closed = time.time()
            res = json.loads((d / CLOSED).read_text())
            outcome = "resumed" if res.get("resumed") else ("fallback" if res.get("pause_fallback") else "restarted")
            r = {
                "step": f"{name}: level {level}" + (f", {what}" if what else ""),
                "open_s": round(rec.get("down_at", t_open) - t_open, 2),
                "sleep": {k: paused.get(k) for k in ("level", "sleep_s", "gpu_used_mib_before", "gpu_used_mib_asleep")},
                **job,
                "ok": res.get("ok"),
                "outcome": outcome,
                "expected": expect,
                "summary": res.get("summary"),
                "resumed": res.get("resumed"),
                "pause_fallback": res.get("pause_fallback"),
                "window_s": round(t_closed - t_open, 1),
                "down_s_polled": poller.down_s(t_open, t_closed + 1),
            }
            emit(r)
            if outcome != expect or not res.get("ok") or not job["ok"]:
                failed.append(name)
            return r

        def switch(drafter: Path, name: str):
            return lambda d: served.switch(dep, drafter, run=name, window=d)

        if "w1" in args.windows:
            window("w1", 1, "switch to B", switch(args.drafter_b, "w1"), "resumed")
            served.confirm(dep, {"by": "pause_gpu"})
            canary("after w1 (B swapped in)")
        if "w2" in args.windows:
            window("w2", 2, "", None, "fallback")
            canary("after w2 (restarted)")
        if "w3" in args.windows:
            window("w3", 1, "switch to a random drafter", switch(args.drafter_bad, "w3"), "fallback")
            canary("after w3 (random drafter, restarted)")
            # as `eagleflow rollback` does: the link moved back inside a window, the last good drafter swapped in
            window(
                "w4", 1, "rollback", lambda d: served.rollback(dep, "pause_gpu: a random drafter", window=d), "resumed"
            )
            canary("after w4 (rolled back, swapped in)")
    finally:
        poller.stop_flag.set()
        os.system(shlex.quote(str(out / "stop.sh")))
    emit({"step": "history", "deployed": served.summary(dep)})
    print(
        "\n| step | outcome | sleep s | GPU MiB before / asleep | wake s | swap s | probe AL | polled down s | "
        "canary AL after |"
    )
    print("|" + "---|" * 9)
    for i, r in enumerate(rows):
        if "outcome" not in r:
            continue
        nxt = next((x for x in rows[i + 1 :] if "canary_al" in x), {})
        res = r.get("resumed") or {}
        wake = sum(res.get(k, 0) for k in ("wake_weights_s", "reload_weights_s", "wake_kv_cache_s")) if res else None
        print(
            f"| {r['step']} | {r['outcome']} | {r['sleep'].get('sleep_s')} | {r['sleep'].get('gpu_used_mib_before')} / "
            f"{r['sleep'].get('gpu_used_mib_asleep')} | {round(wake, 3) if wake is not None else '-'} | "
            f"{res.get('swap_s', '-')} | {res.get('probe_al', '-')} | {r['down_s_polled']} | {nxt.get('canary_al')} |"
        )
    print("FAILED: " + ", ".join(failed) if failed else "all windows as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
