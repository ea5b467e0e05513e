"""Capture from production (issue 41): what eagleflow's capture plugin costs production, and whether the states it
captures are the target's. On a GPU host with vLLM (vLLM's site on PYTHONPATH, as scripts/gpu_suite.sh stages it),
or here on the CPU build with small sizes.

    python3 benchmarks/capture_gpu.py --out DIR [--config configs/demo-mla.yaml] [--set KEY=VALUE ...]
        [--requests 64] [--concurrency 8] [--max-tokens 128] [--capture-concurrency 4] [--capture-len 512]
        [--parity 16] [--drafter DIR] [--v2-plain]

The target served as the config serves it (eagleflow's own launch: engine.*), twice, one engine after the other
(three times with --v2-plain: first a plain engine with VLLM_USE_V2_MODEL_RUNNER=1, the price a dense target pays
for the V1 runner the plugin hooks):
  plain      without the plugin: production's traffic (chat prompts of generate.prompts_path at Kimi-K2.5's
             thinking setting, temperature 1.0 / top_p 0.95, `--concurrency` in flight, `--max-tokens` each with
             ignore_eos, so every request is as long), warmed, then timed: output tok/s
  idle       launched with EAGLEFLOW_CAPTURE_DIR / EAGLEFLOW_CAPTURE_LAYERS (the plugin on), no capture request: the
             same traffic, the same measurement
  capturing  the same engine, the same traffic while the extract stage's own client (eagleflow.extraction.
             production) keeps `--capture-concurrency` capture requests of `--capture-len` tokens in flight: the
             traffic's tok/s and the capture's tok/s
Then the engines are gone and the GPU free: `--parity` captured conversations against a transformers forward of the
same target (eagleflow.extraction.hf, the hf backend's capture): cosine per layer, mean and worst token.
With --drafter, both engines serve that EAGLE-3 drafter (k = 3), as Kimi-K2.5's production does: the plugin then adds
the final layer behind the drafter's aux layers and takes it off before the drafter reads them; the drafter's
acceptance (the engine's counters over the traffic) is recorded for both engines. One JSON file
(DIR/capture_gpu.json) and a table. An entry point for the plugin is made in DIR when the environment
has none (eagleflow not pip-installed there: a dist-info directory on PYTHONPATH, what an install writes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from eagleflow.config import RunConfig, load_config, parse_overrides  # noqa: E402
from eagleflow.contracts.prompts import load_prompts  # noqa: E402
from eagleflow.engines import make_server  # noqa: E402
from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV  # noqa: E402
from eagleflow.engines.launch import target_launch  # noqa: E402

PLUGIN = "eagleflow_capture"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entry_point_env(out: Path) -> dict[str, str]:
    """PYTHONPATH with a dist-info that declares the plugin, unless this environment declares it already."""
    if any(ep.name == PLUGIN for ep in metadata.entry_points(group="vllm.general_plugins")):
        return {}
    d = out / "plugin-site" / "eagleflow_capture_plugin-0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: eagleflow-capture-plugin\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN} = eagleflow.engines.capture_plugin:register\n"
    )
    path = [str(out / "plugin-site"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def traffic(server, model: str, prompts: list, n: int, concurrency: int, max_tokens: int, k: int) -> dict:  # noqa: ANN001
    """n chat requests, `concurrency` in flight, each exactly max_tokens long: output tok/s over the wall time (and
    the drafter's acceptance over them, with one)."""
    base = server.base_url

    def one(i: int) -> int:
        body = {
            "model": model,
            "messages": prompts[i % len(prompts)],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "top_p": 0.95,
            "ignore_eos": True,
            "seed": i,
        }
        with httpx.Client(timeout=600) as c:
            r = c.post(f"{base}/v1/chat/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(concurrency)))  # warm
        before = server.snapshot()
        t0 = time.perf_counter()
        tokens = sum(pool.map(one, range(n)))
        wall = time.perf_counter() - t0
        after = server.snapshot()
    got = {"requests": n, "output_tokens": tokens, "seconds": round(wall, 2), "tok_s": round(tokens / wall, 1)}
    if k:
        acc = server.acceptance(before, after, k)
        got["mean_acceptance_length"] = acc.get("mean_acceptance_length")
    return got


class CaptureLoad:
    """The extract stage's client keeping `concurrency` capture requests in flight until stopped."""

    def __init__(self, cfg: RunConfig, vocab: int, length: int, concurrency: int) -> None:
        from eagleflow.extraction.production import ProductionStates

        self.states = ProductionStates(cfg)
        self.vocab, self.length, self.concurrency = vocab, length, concurrency
        self.stop = threading.Event()
        self.tokens = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(concurrency)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            ids = [rng.randrange(self.vocab) for _ in range(self.length)]
            self.states.collect(self.states.request(ids), ids)
            with self.lock:
                self.tokens += len(ids)

    def __enter__(self) -> CaptureLoad:
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(600)
        self.seconds = time.perf_counter() - self.t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo-mla.yaml"))
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE (YAML value) config overrides")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--capture-concurrency", type=int, default=4)
    ap.add_argument("--capture-len", type=int, default=512)
    ap.add_argument("--parity", type=int, default=16)
    ap.add_argument("--drafter", type=Path, help="an EAGLE-3 drafter both engines serve (k = 3)")
    ap.add_argument(
        "--v2-plain",
        action="store_true",
        help="first serve the plain engine once more with VLLM_USE_V2_MODEL_RUNNER=1: what a dense production "
        "gives up when it turns vLLM's V2 runner off for the plugin (run the script with it set to 0)",
    )
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    capture_dir = out / "capture"
    sets = parse_overrides(args.set)
    cfg = load_config(args.config, {"host.python": sys.executable, "engine.port": free_port(), **sets})
    layers = ",".join(str(i) for i in [*cfg.target.aux_layer_ids, cfg.target.final_layer_id])
    vocab = json.loads((Path(cfg.target.model_path) / "config.json").read_text())["vocab_size"]
    prompts = load_prompts(cfg.generate.prompts_path)[:256]
    model = cfg.target.served_model_name
    env = entry_point_env(out)
    result: dict = {
        "config": args.config,
        "sets": sets,
        "layers": layers,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    k = 3 if args.drafter else 0
    spec = {"method": "eagle3", "model": str(args.drafter.resolve()), "num_speculative_tokens": k} if k else None
    tr = (args.requests, args.concurrency, args.max_tokens, k)

    if args.v2_plain:
        say("plain, V2 runner: the target without the plugin, VLLM_USE_V2_MODEL_RUNNER=1")
        v2 = {**env, "VLLM_USE_V2_MODEL_RUNNER": "1"}
        try:
            with make_server(target_launch(cfg, spec), out / "engine-plain-v2.log", env=v2, name="plain-v2") as s:
                result["plain_v2"] = traffic(s, model, prompts, *tr)
        except Exception as e:  # noqa: BLE001 - a V2 runner that cannot serve this launch is a finding, not a stop
            result["plain_v2"] = {"error": f"{type(e).__name__}: {e}"[:500]}
        say(f"plain, V2 runner: {result['plain_v2']}")

    say("plain: the target without the plugin")
    with make_server(target_launch(cfg, spec), out / "engine-plain.log", env=env, name="plain") as s:
        result["plain"] = traffic(s, model, prompts, *tr)
    say(f"plain: {result['plain']}")

    say("with the plugin: idle, then capturing")
    on = {**env, DIR_ENV: str(capture_dir), LAYERS_ENV: layers}
    with make_server(target_launch(cfg, spec), out / "engine-capture.log", env=on, name="capture") as s:
        result["idle"] = traffic(s, model, prompts, *tr)
        say(f"idle: {result['idle']}")
        ccfg = load_config(
            args.config,
            {
                "host.python": sys.executable,
                **sets,
                "production.url": s.base_url,
                "extract.backend": "production",
                "extract.capture_dir": str(capture_dir),
                "extract.concurrency": args.capture_concurrency,
            },
        )
        with CaptureLoad(ccfg, vocab, args.capture_len, args.capture_concurrency) as load:
            result["capturing"] = traffic(s, model, prompts, *tr)
        result["capture"] = {"tokens": load.tokens, "seconds": round(load.seconds, 2)}
        result["capture"]["tok_s"] = round(load.tokens / load.seconds, 1)
        say(f"capturing: {result['capturing']}; capture {result['capture']}")
        rng = random.Random(1234)
        seqs = [[rng.randrange(vocab) for _ in range(args.capture_len)] for _ in range(args.parity)]
        captured = [load.states.collect(load.states.request(ids), ids) for ids in seqs]  # each [T, n_layers, H]
        load.states.close()
        result["left_in_capture_dir"] = sorted(os.listdir(capture_dir))

    say("parity against a transformers forward")
    import torch

    from eagleflow.extraction.hf import HfCapture

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ref = HfCapture(cfg, device)
    cos: list[list[float]] = [[] for _ in layers.split(",")]
    for ids, got in zip(seqs, captured, strict=True):
        want = ref.forward(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].float().cpu()
        for k in range(want.shape[1]):
            cos[k] += torch.nn.functional.cosine_similarity(want[:, k], got[:, k].float(), dim=-1).tolist()
    result["parity"] = [
        {"layer_id": int(lid), "cos_mean": round(sum(c) / len(c), 6), "cos_worst": round(min(c), 6)}
        for lid, c in zip(layers.split(","), cos, strict=True)
    ]
    result["idle_vs_plain"] = round(result["idle"]["tok_s"] / result["plain"]["tok_s"], 3)
    result["capturing_vs_plain"] = round(result["capturing"]["tok_s"] / result["plain"]["tok_s"], 3)
    if "tok_s" in result.get("plain_v2", {}):
        result["plain_vs_plain_v2"] = round(result["plain"]["tok_s"] / result["plain_v2"]["tok_s"], 3)
    (out / "capture_gpu.json").write_text(json.dumps(result, indent=1))
    print("\n| production's traffic | output tok/s | vs without the plugin |\n|---|---:|---:|")
    if "plain_vs_plain_v2" in result:
        v2_ratio = result["plain_v2"]["tok_s"] / result["plain"]["tok_s"]
        print(f"| without the plugin, V2 runner | {result['plain_v2']['tok_s']} | {v2_ratio:.3f}x |")
    print(f"| without the plugin | {result['plain']['tok_s']} | 1.00x |")
    print(f"| plugin on, no capture | {result['idle']['tok_s']} | {result['idle_vs_plain']:.3f}x |")
    print(
        f"| plugin on, capturing {result['capture']['tok_s']} tok/s | {result['capturing']['tok_s']} | "
        f"{result['capturing_vs_plain']:.3f}x |"
    )
    print("\n| layer id | cosine mean | cosine worst token |\n|---:|---:|---:|")
    for p in result["parity"]:
        print(f"| {p['layer_id']} | {p['cos_mean']:.5f} | {p['cos_worst']:.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
