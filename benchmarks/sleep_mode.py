"""Sleep mode and a drafter swap on a running vLLM engine serving a target with an EAGLE-3 drafter
(issue 23, "production stays served"): what each costs, what memory it frees, and whether the
drafter still drafts afterwards.

    python3 benchmarks/sleep_mode.py --drafter DRAFTER_A --drafter-b DRAFTER_B --out $OUT     (GPU host, vLLM)

One engine: `python3 -m vllm.entrypoints.openai.api_server --model demo/target --speculative-config
'{"method": "eagle3", "model": DRAFTER_A, "num_speculative_tokens": 3}' --enable-sleep-mode
--weight-transfer-config '{"backend": "ipc"}'` with VLLM_SERVER_DEV_MODE=1 (the dev endpoints) and
VLLM_ALLOW_INSECURE_SERIALIZATION=1 (the ipc backend's pickled CUDA IPC handles over HTTP). On it, in
order, each step followed by a pass over the same prompts (temperature 0, --max-tokens each,
ignore_eos, concurrency 1; acceptance length = 1 + accepted / drafts from /metrics deltas):

    preflight     which dev endpoints the engine serves (/openapi.json), /is_sleeping, /version
    before        the drafter as loaded
    sleep L1      /sleep?level=1, then /wake_up: seconds of each, GPU memory (nvidia-smi) around them
    swap to B     /init_weight_transfer_engine, /start_draft_weight_update, /update_weights (a sender
                  process on the same GPU hands CUDA IPC handles of DRAFTER_B's tensors), /finish_weight_update
    swap to A     the same with DRAFTER_A: acceptance should be the "before" one again
    sleep L2      /sleep?level=2, then /wake_up?tags=weights, POST /collective_rpc {"method": "reload_weights"},
                  /wake_up?tags=kv_cache (the documented RLHF order)
    re-push A     DRAFTER_A pushed again through the draft weight update (a repair for vllm#52479?)

Each answer is compared with the "before" pass (same text). Prints one JSON line per step (also in
OUT/sleep_mode.jsonl; the engine's log in OUT/sleep_mode-engine.log) and a table. The engine and the
sender are this script's children; the engine is stopped by its process group.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.vllm_server import Server, gpu_used_mib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEV_ROUTES = [
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/collective_rpc",
    "/pause",
    "/resume",
    "/init_weight_transfer_engine",
    "/start_weight_update",
    "/start_draft_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/reset_prefix_cache",
]


# --------------------------------------------------------------------------------------------- sender


def send_drafter(url: str, drafter: Path) -> dict:
    """(Run in a child process.) Load the drafter's tensors onto this GPU and hand vLLM their CUDA IPC
    handles through POST /update_weights (non-packed, as vLLM's IPCWeightTransferEngine._do_send over http)."""
    import torch
    from safetensors.torch import load_file
    from torch.multiprocessing.reductions import reduce_tensor

    t0 = time.perf_counter()
    tensors = load_file(str(drafter / "model.safetensors"), device="cuda:0")
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    names, dtypes, shapes, handles, refs = [], [], [], [], []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        refs.append(t)
        names.append(name)
        dtypes.append(str(t.dtype).split(".")[-1])
        shapes.append(list(t.shape))
        handles.append({uuid: reduce_tensor(t)[1]})
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    payload = {
        "update_info": {
            "names": names,
            "dtype_names": dtypes,
            "shapes": shapes,
            "packed": False,
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
        }
    }
    r = httpx.post(url + "/update_weights", json=payload, timeout=300)
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    return {
        "status": r.status_code,
        "body": r.text[:1500],
        "tensors": len(names),
        "bytes": sum(t.numel() * t.element_size() for t in refs),
        "sender_load_s": round(t1 - t0, 3),
        "update_weights_s": round(t2 - t1, 3),
    }


# --------------------------------------------------------------------------------------------- engine


class Engine(Server):
    """The target with the drafter, sleep mode on (and the IPC weight transfer when asked)."""

    def __init__(self, args, log_path: Path) -> None:
        spec = {"method": "eagle3", "model": str(args.drafter), "num_speculative_tokens": args.k}
        cmd = [
            "--model",
            str(args.target),
            "--served-model-name",
            "target",
            "--max-model-len",
            str(args.max_model_len),
            "--gpu-memory-utilization",
            str(args.gpu_memory_utilization),
            "--speculative-config",
            json.dumps(spec),
            "--enable-sleep-mode",
            "--disable-uvicorn-access-log",
        ]
        if args.weight_transfer:
            cmd += ["--weight-transfer-config", json.dumps({"backend": "ipc"})]
        if args.eager:
            cmd.append("--enforce-eager")
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        if args.stub_dir:
            env["PYTHONPATH"] = f"{args.stub_dir}:{os.environ.get('PYTHONPATH', '')}"
        super().__init__(cmd, args.port, log_path, env)

    def post(self, path: str, **kw) -> tuple[httpx.Response, float]:
        t0 = time.perf_counter()
        r = self.client.post(self.url + path, **kw)
        return r, time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        text = self.client.get(self.url + "/metrics").text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if (
                line.startswith("vllm:spec_decode") or line.startswith("vllm:generation_tokens_total")
            ) and "_created" not in line:  # counters only, not their creation timestamps
                name, _, value = line.rpartition(" ")
                name = re.sub(r'(engine|model_name)="[^"]*",?', "", name).replace("{}", "").replace(",}", "}")
                out[name] = out.get(name, 0.0) + float(value)
        return out


def run_pass(eng: Engine, prompts: list[list[dict]], max_tokens: int) -> dict:
    m0 = eng.metrics()
    t0 = time.perf_counter()
    texts, tokens, errors = [], 0, []
    for messages in prompts:
        r = eng.client.post(
            eng.url + "/v1/chat/completions",
            json={
                "model": "target",
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=120,
        )
        if r.status_code != 200:
            errors.append(f"{r.status_code} {r.text[:200]}")
            texts.append(None)
            continue
        body = r.json()
        texts.append(body["choices"][0]["message"].get("content") or "")
        tokens += body["usage"]["completion_tokens"]
    wall = time.perf_counter() - t0
    m1 = eng.metrics()
    d = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    drafts = d.get("vllm:spec_decode_num_drafts_total", 0.0)
    acc = d.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    per_pos = (
        [
            d[k] / drafts
            for k in sorted(
                d, key=lambda k: int(re.search(r'position="(\d+)"', k).group(1)) if 'position="' in k else -1
            )
            if "accepted_tokens_per_pos" in k
        ]
        if drafts
        else []
    )
    return {
        "requests": len(prompts),
        "errors": errors,
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "tok_s": round(tokens / wall, 1) if wall else None,
        "drafts": drafts,
        "accepted": acc,
        "acceptance_length": round(1 + acc / drafts, 3) if drafts else None,
        "per_position": [round(x, 3) for x in per_pos],
        "texts": texts,
    }


def load_prompts(path: Path, n: int) -> list[list[dict]]:
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    out = []
    for r in rows[-n:]:
        if "messages" in r:
            out.append(r["messages"])
        else:
            out.append([{"role": "user", "content": r.get("prompt") or r.get("text")}])
    return out


# --------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=ROOT / "demo" / "target")
    ap.add_argument("--drafter", type=Path, help="the served EAGLE-3 drafter (vLLM layout)")
    ap.add_argument("--drafter-b", type=Path, help="a second drafter of the same shape, swapped in and out")
    ap.add_argument(
        "--prompts",
        type=Path,
        default=ROOT / "demo" / "prompts.jsonl",
        help="JSONL of {'messages': [...]} or {'prompt': ...}; the last --num-prompts are used",
    )
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=18731)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (default: torch.compile + CUDA graphs)")
    ap.add_argument(
        "--no-weight-transfer",
        dest="weight_transfer",
        action="store_false",
        help="leave out --weight-transfer-config (and the swap steps)",
    )
    ap.add_argument("--start-timeout-s", type=float, default=300)
    ap.add_argument("--send", nargs=2, metavar=("URL", "DRAFTER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    # A `timeout` (SIGTERM) still stops the engine: SystemExit runs the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.send:  # the sender child
        print("SEND " + json.dumps(send_drafter(args.send[0], Path(args.send[1]))), flush=True)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "sleep_mode.jsonl"
    rows: list[dict] = []
    ref_texts: list | None = None

    def emit(rec: dict) -> dict:
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **rec}
        if "texts" in rec:
            texts = rec.pop("texts")
            if ref_texts is not None:
                rec["answers_identical"] = sum(a == b for a, b in zip(texts, ref_texts))
                rec["answers_compared"] = len(texts)
        print(json.dumps(rec), flush=True)
        with open(jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        rows.append(rec)
        return rec

    # The ipc weight-transfer engine imports `ray` and `requests` at module level although its
    # server side uses neither; where they are missing (the GPU bundle), empty stand-ins let it import.
    args.stub_dir = None
    if args.weight_transfer:
        import importlib.util

        missing = [m for m in ("ray", "requests") if importlib.util.find_spec(m) is None]
        if missing:
            args.stub_dir = tempfile.mkdtemp(prefix="stubs-")
            for m in missing:
                (Path(args.stub_dir) / m).mkdir()
                (Path(args.stub_dir) / m / "__init__.py").write_text(
                    f'"""Stand-in: the ipc weight-transfer engine imports {m}; only its trainer side uses it."""\n'
                )
        emit({"step": "stubs", "missing_modules": missing, "stub_dir": args.stub_dir})

    prompts = load_prompts(args.prompts, args.num_prompts)
    eng = Engine(args, args.out / "sleep_mode-engine.log")
    ok = True
    try:
        try:
            health_s = eng.wait_healthy(args.start_timeout_s)
        except RuntimeError as exc:
            if not args.weight_transfer:
                raise
            # Without the weight-transfer engine the sleep steps can still be measured.
            eng.stop()
            (args.out / "sleep_mode-engine.log").rename(args.out / "sleep_mode-engine-wt-failed.log")
            emit({"step": "start with --weight-transfer-config failed", "error": str(exc)[-3000:]})
            args.weight_transfer = False
            eng = Engine(args, args.out / "sleep_mode-engine.log")
            health_s = eng.wait_healthy(args.start_timeout_s)
        routes = set(eng.client.get(eng.url + "/openapi.json").json().get("paths", {}))
        version = eng.client.get(eng.url + "/version").json()
        r = eng.client.get(eng.url + "/is_sleeping")
        emit(
            {
                "step": "preflight",
                "health_s": round(health_s, 1),
                "version": version,
                "routes": {p: p in routes for p in DEV_ROUTES},
                "is_sleeping": r.json() if r.status_code == 200 else r.status_code,
                "gpu_used_mib": gpu_used_mib(),
                "weight_transfer": args.weight_transfer,
                "eager": args.eager,
            }
        )
        run_pass(eng, prompts[:2], 16)  # warm-up
        before = run_pass(eng, prompts, args.max_tokens)
        emit({"step": "before", **before})
        ref_texts = before["texts"]

        def sleep_wake(level: int) -> dict:
            m0 = gpu_used_mib()
            r, s = eng.post(f"/sleep?level={level}&mode=abort")
            sl = eng.client.get(eng.url + "/is_sleeping").json()
            m1 = gpu_used_mib()
            rec = {
                "sleep_status": r.status_code,
                "sleep_s": round(s, 3),
                "is_sleeping": sl,
                "gpu_mib_before": m0,
                "gpu_mib_asleep": m1,
            }
            if level == 1:
                r, w = eng.post("/wake_up")
                rec.update(wake_status=r.status_code, wake_s=round(w, 3))
            else:
                r1, w1 = eng.post("/wake_up", params={"tags": "weights"})
                m_w = gpu_used_mib()
                r2, w2 = eng.post("/collective_rpc", json={"method": "reload_weights"})
                r3, w3 = eng.post("/wake_up", params={"tags": "kv_cache"})
                rec.update(
                    wake_weights_s=round(w1, 3),
                    reload_weights_s=round(w2, 3),
                    wake_kv_s=round(w3, 3),
                    wake_s=round(w1 + w2 + w3, 3),
                    gpu_mib_weights_only=m_w,
                    wake_status=[r1.status_code, r2.status_code, r3.status_code],
                    reload_weights_body=r2.text[:300],
                )
            rec["gpu_mib_awake"] = gpu_used_mib()
            rec["is_sleeping_after"] = eng.client.get(eng.url + "/is_sleeping").json()
            return rec

        def swap(drafter: Path) -> dict:
            rec: dict = {"drafter": str(drafter)}
            if not getattr(swap, "inited", False):
                r, s = eng.post("/init_weight_transfer_engine", json={"init_info": {}})
                rec.update(init_status=r.status_code, init_body=r.text[:300], init_s=round(s, 3))
                swap.inited = r.status_code == 200
            r, s = eng.post("/start_draft_weight_update")
            rec.update(start_status=r.status_code, start_body=r.text[:300], start_s=round(s, 3))
            if r.status_code != 200:
                return rec
            t0 = time.perf_counter()
            p = subprocess.run(
                [sys.executable, __file__, "--out", str(args.out), "--send", eng.url, str(drafter)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("SEND ")), None)
            rec["sender"] = json.loads(line[5:]) if line else {"rc": p.returncode, "stderr": p.stderr[-1500:]}
            rec["sender_process_s"] = round(time.perf_counter() - t0, 2)
            r, s = eng.post("/finish_weight_update")
            rec.update(finish_status=r.status_code, finish_body=r.text[:300], finish_s=round(s, 3))
            return rec

        rec = sleep_wake(1)
        emit({"step": "sleep L1", **rec, **run_pass(eng, prompts, args.max_tokens)})
        if args.weight_transfer and args.drafter_b:
            rec = swap(args.drafter_b)
            emit({"step": "swap to B", **rec, **run_pass(eng, prompts, args.max_tokens)})
            rec = swap(args.drafter)
            emit({"step": "swap to A", **rec, **run_pass(eng, prompts, args.max_tokens)})
        rec = sleep_wake(2)
        emit({"step": "sleep L2", **rec, **run_pass(eng, prompts, args.max_tokens)})
        if args.weight_transfer:
            rec = swap(args.drafter)
            emit({"step": "re-push A", **rec, **run_pass(eng, prompts, args.max_tokens)})
    except Exception as exc:
        ok = False
        emit({"step": "error", "error": repr(exc)[:2000], "engine_tail": eng.tail(40)})
    finally:
        eng.stop()
    text = (args.out / "sleep_mode-engine.log").read_text(errors="replace")
    lines = [
        ln.strip()[-300:]
        for ln in text.splitlines()
        if re.search(r"Sleep mode freed|wake up the engine|took .* seconds|Model loading took|Traceback|Error", ln)
    ]
    emit({"step": "engine log lines", "lines": lines[-40:]})

    print(
        "\n| step | AL | per position | tok/s | answers = before | sleep s | wake s | GPU MiB before / asleep / awake "
        "| swap s (start + send + finish) |"
    )
    print("|" + "---|" * 9)
    for r in rows:
        if "acceptance_length" not in r:
            continue
        swap_s = None
        if "start_s" in r:
            swap_s = round(r["start_s"] + r.get("sender_process_s", 0) + r.get("finish_s", 0), 2)
        mem = (
            " / ".join(str(r.get(k, "-")) for k in ("gpu_mib_before", "gpu_mib_asleep", "gpu_mib_awake"))
            if "gpu_mib_before" in r
            else "-"
        )
        print(
            f"| {r['step']} | {r['acceptance_length']} | {r['per_position']} | {r['tok_s']} "
            f"| {r.get('answers_identical', '-')}/{r.get('answers_compared', r['requests'])} | {r.get('sleep_s', '-')} "
            f"| {r.get('wake_s', '-')} | {mem} | {swap_s if swap_s is not None else '-'} |"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
