#!/usr/bin/env python3
"""The k sweep on a GPU host, as the product runs it: the benchmark-only flow (`python -m flows.benchmark`) on the
demo target with the drafter `make demo` exported, over Kimi-K2.5's traffic (configs/kimi-k25.yaml's
production.traffic: 1.0 / 0.95 thinking 70%, 0.6 / 0.95 instant 30%, 8 in flight) and temperature 0, with
`benchmark.k_sweep`: no speculation, the drafter at its k (3) and at every other k of the sweep, each on an engine of
its own, judged by the throughput over the mix.

    python3 scripts/gpu_k_sweep.py [--ks 1,2,3,4,5] [--drafter DIR] [--config CONFIG] [--set KEY=VALUE ...]

--config: the target and engine of another demo config (its relative paths are its own directory's); --set: overrides
for the benchmark flow (e.g. `benchmark.draft_sample_method=probabilistic`, what a drafter trained on sampled answers
serves with).

Staged like scripts/gpu_nightly.sh (vLLM's site in $VLLM_SITE, Prefect's wheels in $GN_HOME/control); its run
directory is $GN_HOME/k-sweep. Prints the report's k-sweep section and the verdict; the report stays there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_nightly as gn  # noqa: E402 - the same interpreters and staging as the nightly's

KIMI_TRAFFIC = [
    {"name": "thinking", "temperature": 1.0, "top_p": 0.95, "concurrency": 8, "share": 0.7},
    {"name": "instant", "temperature": 0.6, "top_p": 0.95, "concurrency": 8, "share": 0.3},
]


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,3,4,5", help="benchmark.k_sweep")
    ap.add_argument("--drafter", help="the drafter to sweep (default: runs/demo/export/*/vllm)")
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (YAML), for the flow")
    gn.add_python_args(ap)
    args = ap.parse_args()
    drafter = args.drafter or str(sorted(gn.ROOT.glob("runs/demo/export/*/vllm"))[-1])
    work = gn.HOME / "k-sweep"
    work.mkdir(parents=True, exist_ok=True)
    control, host = gn.pythons(args)
    data = yaml.safe_load((gn.ROOT / args.config).read_text())
    data["name"] = f"{data['name']}-k-sweep"
    data["host"].update(name="gpu-host", work_root=str(work / "runs"), python=host)
    here = (gn.ROOT / args.config).parent  # the config's relative paths are relative to its own directory
    data["target"]["model_path"] = str((here / data["target"]["model_path"]).resolve())
    data["generate"]["prompts_path"] = str((here / data["generate"]["prompts_path"]).resolve())
    data["engine"].update(port=gn.free_port(), kv_cache_gib=4.0, startup_timeout_s=600)
    bench = data["benchmark"]
    for follows_traffic in ("temperatures", "concurrencies"):
        bench.pop(follows_traffic, None)
    bench.update(
        drafter=drafter,
        k_sweep=[int(k) for k in args.ks.split(",")],
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        side_by_side=False,
    )
    data["production"] = {"traffic": KIMI_TRAFFIC}
    data["report_dir"] = str(work / "reports")
    config = work / f"{data['name']}.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    gn.say(f"config {config}: drafter {drafter}, k {bench['k_sweep']}")
    argv = [control, "-m", "flows.benchmark", str(config)]
    for s in args.set:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=gn.ROOT, env=os.environ.copy())
    reports = sorted((work / "reports").glob("*/report.md"))
    if reports:
        text = reports[-1].read_text()
        print(text[: text.find("**Per-position")] if "**Per-position" in text else text[:6000])
        gn.say(f"report: {reports[-1]}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
