#!/usr/bin/env python3
"""The whole pipeline on a GPU host, as the product runs it, then its drafter served both ways at production's
sampling: the AL table of issue 40 for a target trained there (the demo-MLA target's drafter learns from the states
of the engine that serves it, vLLM's own capture).

    python3 scripts/gpu_pipeline.py run NAME [--config configs/demo-mla.yaml] [--set KEY=VALUE ...]
                                   `python -m flows.pipeline` on the config (its work root and reports under
                                   $GN_HOME/pipeline-NAME), in a process session of its own: it outlives the call;
                                   --engine sglang: every stage on the staged SGLang (scripts/sglang-gpu/), the
                                   engine section as scripts/gpu_engines.py's SGLang run has it
    python3 scripts/gpu_pipeline.py wait NAME [--timeout S]
                                   follow its log; exit 75 while it still runs, else the flow's exit status
    python3 scripts/gpu_pipeline.py drafts NAME [--settings 0:1,0.6:0.95,1.0:0.95] [--prompts 16]
                                   benchmarks/sampled_drafts.py on the run's exported drafter: AL with greedy and
                                   with probabilistic drafts at each setting, off the engine's own counters

Staged like scripts/gpu_nightly.sh (vLLM's site in $VLLM_SITE, its MoE kernels for an MoE target, Prefect's wheels
in $GN_HOME/control). Records go to $GN_HOME/pipeline-NAME/{pipeline.log,drafts.json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_engines  # noqa: E402 - SGLang's host python and engine section
import gpu_nightly as gn  # noqa: E402 - the same interpreters and staging as the nightly's

from eagleflow.util.procs import group_members  # noqa: E402


def work_of(name: str) -> Path:
    return gn.HOME / f"pipeline-{name}"


def run(args: argparse.Namespace) -> int:
    import yaml

    work = work_of(args.name)
    work.mkdir(parents=True, exist_ok=True)
    control, host = gn.pythons(args)
    data = yaml.safe_load((gn.ROOT / args.config).read_text())
    if args.engine == "sglang":  # every stage on SGLang: its server generates and benchmarks
        host = gpu_engines.sglang_python(args)
        gpu_engines.on_sglang(data)
        data["extract"]["backend"] = "sglang"  # its own capture, eagleflow's plugin in an SGLang engine of ours
    data["name"] = f"{data['name']}-{args.name}"
    data["host"].update(name="gpu-host", work_root=str(work / "runs"), python=host)
    here = (gn.ROOT / args.config).parent  # the config's relative paths are relative to its own directory
    data["target"]["model_path"] = str((here / data["target"]["model_path"]).resolve())
    data["generate"]["prompts_path"] = str((here / data["generate"]["prompts_path"]).resolve())
    data["engine"].update(port=gn.free_port(), startup_timeout_s=900)
    if args.engine == "vllm":
        data["engine"]["kv_cache_gib"] = 4.0
    data["report_dir"] = str(work / "reports")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    argv = [control, "-m", "flows.pipeline", str(config)]
    for s in args.set:
        argv += ["--set", s]
    gn.say("$ " + " ".join(argv))
    with open(work / "pipeline.log", "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=gn.ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ.copy()
        )
    (work / "pipeline.pid").write_text(str(proc.pid))
    gn.say(f"pipeline {args.name}: pid {proc.pid}, log {work / 'pipeline.log'}")
    return 0


def wait(args: argparse.Namespace) -> int:
    work = work_of(args.name)
    pid = int((work / "pipeline.pid").read_text())
    log = work / "pipeline.log"
    seen = 0
    deadline = time.monotonic() + args.timeout
    while True:
        text = log.read_text(errors="replace")
        for line in text[seen:].splitlines():
            if any(w in line for w in ("stage", "Finished", "verdict", "Error", "error", "AL", "speedup")):
                print(line[:300], flush=True)
        seen = len(text)
        if not group_members(pid):  # the flow and every process it started (its own session: pgid = pid)
            done = "Finished in state Completed" in text or "the new drafter" in text
            gn.say(f"pipeline {args.name} ended ({'completed' if done else 'see its log'})")
            print(text[-6000:])
            return 0 if done else 1
        if time.monotonic() > deadline:
            gn.say(f"pipeline {args.name} still runs")
            return 75
        time.sleep(5)


def drafts(args: argparse.Namespace) -> int:
    work = work_of(args.name)
    exports = sorted((work / "runs").glob("export/*/vllm"))
    if not exports:
        gn.say(f"no exported drafter under {work / 'runs'}")
        return 1
    config = work / "config.yaml"
    if not config.is_file():
        gn.say(f"no {config}: `run {args.name}` first")
        return 1
    import yaml

    if (yaml.safe_load(config.read_text()).get("engine") or {}).get("kind") == "sglang":
        # sampled_drafts.py reads vLLM's counters on vLLM's python; SGLang's sampled drafts are its benchmark's
        # draft_sample_method 'probabilistic' (tests/gpu/test_sglang_serving.py)
        gn.say(f"pipeline {args.name} ran on SGLang: `drafts` measures on vLLM only")
        return 2
    _, host = gn.pythons(args)
    argv = [
        host,
        str(gn.ROOT / "benchmarks" / "sampled_drafts.py"),
        "--config",
        str(config),
        "--drafter",
        str(exports[-1]),
        "--prompts",
        str(args.prompts),
        "--max-tokens",
        str(args.max_tokens),
        "--settings",
        args.settings,
        "--set",
        f"engine.port={gn.free_port()}",
        "--json-out",
        str(work / "drafts.json"),
    ]
    for s in args.set:
        argv += ["--set", s]
    gn.say("$ " + " ".join(argv))
    rc = subprocess.run(argv, cwd=gn.ROOT).returncode
    if (work / "drafts.json").exists():
        print(json.dumps(json.loads((work / "drafts.json").read_text()), indent=1)[:4000])
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["run", "wait", "drafts"])
    ap.add_argument("name")
    ap.add_argument("--config", default="configs/demo-mla.yaml")
    ap.add_argument("--engine", choices=["vllm", "sglang"], default="vllm", help="the engine of every stage")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (YAML)")
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--settings", default="0:1,0.6:0.95,1.0:0.95")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    gn.add_python_args(ap)
    args = ap.parse_args()
    return {"run": run, "wait": wait, "drafts": drafts}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
