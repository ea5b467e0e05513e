"""Greedy drafts against sampled ones when production samples, on the real engine.

    .hostenv/bin/python benchmarks/sampled_drafts.py --drafter "$(ls -d runs/demo/export/*/vllm | tail -1)" \
        --prompts 16 --max-tokens 96                                                  (docs/benchmarks.md)

vLLM (0.26 on GPU, 0.32 on CPU) drafts the drafter's argmax by default (`speculative_config.draft_sample_method`
'greedy'; the rejection test treats the draft as one-hot: accepted with the target's probability of that token
after temperature and top_p). 'probabilistic' samples the draft from the drafter's distribution and tests
min(1, p / q): a drafter whose distribution is the target's is then always accepted. This serves the demo target
with the drafter both ways (an engine each, launched as the benchmark stage launches it: `target_launch` from the
config) and reads each setting's AL off the engine's own counters, the held-out prompts one at a time, the same
seed per prompt in both engines.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.prompts import load_prompts  # noqa: E402
from eagleflow.engines import make_server  # noqa: E402
from eagleflow.engines.acceptance import speculative_positions  # noqa: E402
from eagleflow.engines.chat import ChatClient  # noqa: E402
from eagleflow.engines.launch import speculative, target_launch  # noqa: E402
from eagleflow.engines.metrics import parse_metrics  # noqa: E402
from eagleflow.engines.vllm import acceptance_from_deltas  # noqa: E402
from eagleflow.util import http  # noqa: E402


def al_at(base: str, model: str, prompts: list, t: float, top_p: float, max_tokens: int) -> dict:
    def metrics() -> dict[str, float]:
        return parse_metrics(http.get(f"{base}/metrics", timeout=30.0).text)

    extra = {"ignore_eos": True, **({"top_p": top_p} if t > 0 and top_p < 1 else {})}
    with ChatClient(base, model, max_concurrency=1) as client:
        before = metrics()
        results, wall = client.chat(
            prompts, max_tokens=max_tokens, temperature=t, concurrency=1, extra=extra, seed=0 if t > 0 else None
        )
        after = metrics()
    acc = acceptance_from_deltas(before, after, speculative_positions(after))
    tokens = sum(r.completion_tokens for r in results)
    return {"al": round(acc["mean_acceptance_length"], 3), "tok_s": round(tokens / wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--drafter", required=True, help="an exported drafter (the engine's format)")
    ap.add_argument("--prompts", type=int, default=16, help="the first N prompts of the config's prompts file")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--settings", default="0:1,0.7:1,1.0:0.95", help="temperature:top_p,...")
    ap.add_argument("--methods", default="greedy,probabilistic")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (YAML)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    import yaml

    cfg = load_config(args.config, {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)})
    prompts = load_prompts(cfg.generate.prompts_path)[-args.prompts :]  # the file's end: not the demo's first samples
    settings = [tuple(float(x) for x in s.split(":")) for s in args.settings.split(",")]
    rows = []
    work = Path(tempfile.mkdtemp(prefix="sampled-drafts-"))
    for method in args.methods.split(","):
        spec = speculative(args.drafter, cfg.benchmark.num_speculative_tokens)
        spec["draft_sample_method"] = method
        server = make_server(target_launch(cfg, spec), work / f"engine-{method}.log", name=method)
        began = time.monotonic()
        server.start()
        try:
            server.wait_healthy()
            for t, top_p in settings:
                row = {"method": method, "temperature": t, "top_p": top_p}
                row.update(al_at(server.base_url, cfg.target.served_model_name, prompts, t, top_p, args.max_tokens))
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.stop()
        print(f"{method}: {time.monotonic() - began:.0f} s", flush=True)
    print("\n| temperature | top_p | " + " | ".join(f"AL ({m})" for m in args.methods.split(",")) + " |")
    print("|---:|---:|" + "---:|" * len(args.methods.split(",")))
    for t, top_p in settings:
        cells = [next(r for r in rows if r["method"] == m and r["temperature"] == t) for m in args.methods.split(",")]
        print(f"| {t:g} | {top_p:g} | " + " | ".join(f"{c['al']:.2f}" for c in cells) + " |")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
