#!/usr/bin/env python3
"""vLLM and SGLang side by side on a GPU host, as the product measures a drafter (issue 42): the benchmark-only flow
(`python -m flows.benchmark`) once with `engine.kind: vllm` and once with `engine.kind: sglang`, the same target, the
same drafter, the same prompts and settings; then per engine and setting the accepted length (and per position where
the engine reports it), output tok/s of the drafter and of no speculation, and the engines' starts.

    python3 scripts/gpu_engines.py run --drafter DIR [--config configs/demo.yaml] [--engines vllm sglang] [--eager]
                                   [--set KEY=VALUE ...]   in a process session of its own (it outlives the call)
    python3 scripts/gpu_engines.py wait [--timeout S]      follow its log; exit 75 while it still runs, else its exit
                                                           status and the table
    python3 scripts/gpu_engines.py show                    the table again, from $GN_HOME/engines/engines.json

The drafter must be one both engines serve as trained: trained with neither `train.norm_before_fc` nor
`train.norm_before_residual` (SGLang's EAGLE-3 layer has neither), exported by eagleflow (eagle_config then names the
trained layers in SGLang's reading, the top level in vLLM's): `tests/make_drafter.py DIR --sglang` makes an untrained
one, a pipeline run with `engine.kind: sglang` (or those two fields off) a trained one. Drafts are greedy on both
engines (SGLang tests a drafter's probabilities only for one over the target's whole vocabulary).

Staged like scripts/gpu_nightly.sh (vLLM's site in $VLLM_SITE, Prefect's wheels in $GN_HOME/control) and
scripts/sglang-gpu/ (SGLang's site in $HOME/sgl-site, its env.sh): the SGLang run's host python sources env.sh, so
its stage processes and its engines see SGLang's site and compiler, not vLLM's. SGLang runs on the triton attention
backend and the PyTorch sampler (the bundle leaves out the FA3 kernels). CUDA graphs on for both (as production
serves) unless --eager: the start time then says what each engine's graph capture costs.

A run of one engine (`--engines sglang` after a fix, say) keeps the other engine's figures for the same drafter,
config and --set in engines.json; each engine's row says whether it ran eager or with CUDA graphs, and a run that
fails shows no figures of an earlier one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_nightly as gn  # noqa: E402 - the same interpreters and staging as the nightly's

from eagleflow.util.procs import group_members  # noqa: E402

OUT = gn.HOME / "engines"
SGL_SITE = Path(os.environ.get("SGL_SITE", Path.home() / "sgl-site"))
TEMPERATURES = [0.0, 1.0]  # greedy, and Kimi-K2.5's thinking setting
TOP_P = 0.95
CONCURRENCIES = [1, 8]
SGLANG_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch"]


def sglang_python(args: argparse.Namespace) -> str:
    """The host python for the SGLang run: python3 with SGLang's site and compiler (its env.sh) and the checkout."""
    if args.host_python:
        return os.path.abspath(args.host_python)
    path = gn.HOME / "bin" / "host-python-sglang"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "#!/bin/sh",
        f". {shlex.quote(str(SGL_SITE / 'env.sh'))}",
        f'export PYTHONPATH={shlex.quote(str(gn.ROOT))}:"$PYTHONPATH"',
        f'exec {shlex.quote(sys.executable)} "$@"',
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def on_sglang(data: dict[str, Any]) -> None:
    """A config's engine section for the staged SGLang: its kind, the attention and sampling backends the bundle
    carries, memory as a fraction (SGLang has no KV size in GiB), states from transformers (a benchmark-only run
    extracts nothing; gpu_pipeline.py --engine sglang sets the sglang backend), the drafter layout SGLang serves (the
    norms default off for SGLang)."""
    e = data.setdefault("engine", {})
    e.pop("kv_cache_gib", None)
    e.update(kind="sglang", gpu_memory_utilization=0.3, extra_args=list(SGLANG_ARGS))
    data.setdefault("extract", {})["backend"] = "hf"
    data.setdefault("train", {}).pop("norm_before_fc", None)
    data["train"].pop("norm_before_residual", None)


def config_for(engine: str, host: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config's run for one engine: the same target, prompts, drafter and settings; only the engine differs."""
    import yaml

    src = gn.ROOT / args.config
    data = yaml.safe_load(src.read_text())
    here = src.parent  # the config's relative paths are its own directory's
    data["name"] = f"{data['name']}-engines-{engine}"
    data["host"].update(name="gpu-host", work_root=str(OUT / engine / "runs"), python=host)
    data["target"]["model_path"] = str((here / data["target"]["model_path"]).resolve())
    data["generate"]["prompts_path"] = str((here / data["generate"]["prompts_path"]).resolve())
    e = data.setdefault("engine", {})
    e.update(kind=engine, port=gn.free_port(), startup_timeout_s=900, enforce_eager=bool(args.eager))
    if engine == "vllm":
        e.update(kv_cache_gib=4.0, extra_args=[])
    else:
        on_sglang(data)
    bench = data.setdefault("benchmark", {})
    bench.update(
        drafter=str(Path(args.drafter).resolve()),
        current_drafter=None,
        draft_sample_method="greedy",
        temperatures=TEMPERATURES,
        concurrencies=CONCURRENCIES,
        top_p=TOP_P,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        drafter_on="engine",
        k_sweep=[],
        side_by_side=False,
        remeasure_baseline=False,
    )
    bench.setdefault("triage", {})["when"] = "never"  # a comparison, not a diagnosis
    data["production"] = {"kind": "none"}
    data["report_dir"] = str(OUT / engine / "reports")
    return data


def figures(engine: str, since: float) -> dict[str, Any]:
    """The newest benchmark stage of this engine's run (made after `since`, epoch seconds: a run that failed never
    shows an earlier run's figures): per variant and setting what the engine measured."""
    made = [
        (json.loads(p.read_text()).get("created", 0), p)
        for p in (OUT / engine / "runs" / "benchmark").glob("*/manifest.json")
    ]
    manifests = [p for created, p in sorted(made) if created >= since]
    if not manifests:
        return {
            "error": f"no benchmark stage of this run under {OUT / engine / 'runs'}: see {OUT / engine / 'flow.log'}"
        }
    m = json.loads(manifests[-1].read_text())
    met = m.get("metrics", {})
    cells: dict[str, Any] = {}
    for w in met.get("windows", []):
        key = f"{w['temperature']:g}/{w.get('concurrency', 1)}"
        cells.setdefault(key, {})[w["variant"]] = {
            k: w.get(k) for k in ("mean_acceptance_length", "al_interval", "per_position_acceptance", "output_tok_s")
        }
    starts = {k: v for k, v in met.get("seconds", {}).items() if "load" in k}
    return {
        "stage": str(manifests[-1].parent),
        "cells": cells,
        "starts": starts,
        "verdict": (met.get("verdict") or {}).get("summary"),
    }


def steps(args: argparse.Namespace) -> int:
    import yaml

    control, vllm_host = gn.pythons(args)
    drafter = str(Path(args.drafter).resolve())
    record: dict[str, Any] = {"drafter": drafter, "config": args.config, "sets": list(args.set), "engines": {}}
    earlier = json.loads((OUT / "engines.json").read_text()) if (OUT / "engines.json").is_file() else {}
    if [earlier.get(k) for k in ("drafter", "config", "sets")] == [drafter, args.config, list(args.set)]:
        # a run of one engine (--engines sglang, say, after a fix) keeps the other's figures for the same drafter
        record["engines"] = {k: v for k, v in earlier.get("engines", {}).items() if k not in args.engines}
    for engine in args.engines:
        host = vllm_host if engine == "vllm" else sglang_python(args)
        (OUT / engine).mkdir(parents=True, exist_ok=True)
        config = OUT / engine / "config.yaml"
        config.write_text(yaml.safe_dump(config_for(engine, host, args), sort_keys=False))
        argv = [control, "-m", "flows.benchmark", str(config)]
        for s in args.set:
            argv += ["--set", s]
        gn.say(f"{engine}: $ {' '.join(shlex.quote(a) for a in argv)} (log {OUT / engine / 'flow.log'})")
        t0, since = time.monotonic(), time.time()
        with open(OUT / engine / "flow.log", "ab") as log:
            rc = subprocess.run(argv, cwd=gn.ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        got = figures(engine, since)
        got.update(rc=rc, wall_s=round(time.monotonic() - t0, 1), eager=bool(args.eager))
        record["engines"][engine] = got
        gn.say(f"{engine}: exit {rc} in {got['wall_s']} s")
        (OUT / "engines.json").write_text(json.dumps(record, indent=1))
    print(table(record))
    return 0 if all(e.get("rc") == 0 for e in record["engines"].values()) else 1


def table(record: dict[str, Any]) -> str:
    engines = record["engines"]
    lines = [
        "| setting (temperature / concurrency) | engine | AL (95% CI) | per position | drafter tok/s | "
        "no speculation tok/s | x no speculation |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    keys = sorted(
        {k for e in engines.values() for k in e.get("cells", {})}, key=lambda k: [float(x) for x in k.split("/")]
    )
    for key in keys:
        for name, e in engines.items():
            c = e.get("cells", {}).get(key, {})
            d, b = c.get("drafter", {}), c.get("baseline", {})
            al, ci, pos = d.get("mean_acceptance_length"), d.get("al_interval"), d.get("per_position_acceptance")
            dt, bt = d.get("output_tok_s"), b.get("output_tok_s")
            shown_al = "-" if al is None else f"{al:.2f}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
            graphs = "eager" if e.get("eager") else "CUDA graphs"
            lines.append(f"| {key} | {name} ({graphs}) | {shown_al} | ")
            lines[-1] += " / ".join(f"{p:.2f}" for p in pos) if pos else "not reported"
            lines[-1] += f" | {dt:.1f} | " if dt else " | - | "
            lines[-1] += f"{bt:.1f} | " if bt else "- | "
            lines[-1] += f"{dt / bt:.2f}x |" if dt and bt else "- |"
    lines.append("")
    for name, e in engines.items():
        starts = ", ".join(f"{k} {v:.1f} s" for k, v in e.get("starts", {}).items())
        lines.append(f"{name}: exit {e.get('rc')}, {e.get('wall_s')} s; starts: {starts or '-'}; {e.get('verdict')}")
        if e.get("error"):
            lines.append(f"  {e['error']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    pidfile = OUT / "engines.pid"
    if pidfile.is_file() and group_members(int(pidfile.read_text())):
        gn.say(f"the side by side still runs (pid {pidfile.read_text()}): `wait`")
        return 1
    if not (Path(args.drafter) / "config.json").is_file():
        gn.say(f"--drafter {args.drafter}: no config.json there; make one with tests/make_drafter.py DIR --sglang")
        return 2
    argv = list(sys.argv[1:])
    argv[argv.index("run")] = "steps"
    log = OUT / "engines.log"
    (OUT / "engines.from").write_text(str(log.stat().st_size if log.is_file() else 0))
    pid = gn.spawn([sys.executable, str(Path(__file__).resolve()), *argv], log, pidfile)
    gn.say(f"side by side: pid {pid}, log {log}")
    return 0


def wait(args: argparse.Namespace) -> int:
    pidfile, log = OUT / "engines.pid", OUT / "engines.log"
    if not pidfile.is_file():
        gn.say("no side by side started: `run` first")
        return 1
    seen = int((OUT / "engines.from").read_text()) if (OUT / "engines.from").is_file() else 0
    deadline = time.monotonic() + args.timeout
    while True:
        data = log.read_bytes()
        print(data[seen:].decode(errors="replace"), end="", flush=True)
        seen = len(data)
        if not group_members(int(pidfile.read_text())):
            return 0 if (OUT / "engines.json").is_file() else 1
        if time.monotonic() > deadline:
            gn.say("the side by side still runs")
            return 75
        time.sleep(5)


def show(args: argparse.Namespace) -> int:
    record = OUT / "engines.json"
    if not record.is_file():
        gn.say(f"no {record} yet")
        return 1
    print(table(json.loads(record.read_text())))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "steps"):
        p = sub.add_parser(name)
        p.add_argument("--drafter", required=True)
        p.add_argument("--config", default="configs/demo.yaml")
        p.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
        p.add_argument("--eager", action="store_true", help="engines without CUDA graphs (engine.enforce_eager)")
        p.add_argument("--num-prompts", type=int, default=16)
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (YAML), for both flows")
        gn.add_python_args(p)
    sub.add_parser("wait").add_argument("--timeout", type=float, default=540)
    sub.add_parser("show")
    args = ap.parse_args()
    return {"run": run, "steps": steps, "wait": wait, "show": show}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
