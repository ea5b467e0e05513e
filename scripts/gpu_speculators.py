#!/usr/bin/env python3
"""eagleflow's drafter against vLLM's `speculators` 0.9.0 on a GPU host, on the states a pipeline run extracted there
(scripts/gpu_pipeline.py; the demo-MLA target by default), measured by vLLM through the benchmark-only flow.
Ran on a GPU host on 2026-12-07 (docs/benchmarks.md, "Against speculators on the demo-MLA target, on a GPU host").

    python3 scripts/gpu_speculators.py run NAME [--draft-sampling probabilistic greedy] [--dry-run]
                                   in a process session of its own (it outlives the call), for the finished pipeline
                                   NAME ($GN_HOME/pipeline-NAME): its states in speculators' data layout, speculators
                                   trained on them on cuda, then both drafters served; --dry-run prints the plan
    python3 scripts/gpu_speculators.py wait NAME [--timeout S]
                                   follow its log; exit 75 while it still runs, else its exit status and the table
    python3 scripts/gpu_speculators.py show NAME
                                   the table again, from $GN_HOME/speculators-NAME/speculators.json

The chain on the GPU host (staged like scripts/gpu_nightly.sh: vLLM's site in $VLLM_SITE, Prefect's wheels in
$GN_HOME/control; speculators' wheels made by `bash scripts/gpu_speculators.sh stage` where there is network, in
.stage-spec/ of the checkout copied there):

    python3 scripts/gpu_pipeline.py run mla --set 'engine.extra_args=[]' --set engine.enforce_eager=true \
        --set extract.backend=vllm --set benchmark.num_prompts=16 --set benchmark.max_tokens=96 \
        --set 'benchmark.temperatures=[0.0,0.6,1.0]' --set 'benchmark.concurrencies=[1]' --set benchmark.top_p=0.95
    python3 scripts/gpu_pipeline.py wait mla                        # again while it exits 75 (or name a pipeline
                                                                    # that ran there already: mlag, mlas)
    bash scripts/gpu_speculators.sh install                         # speculators into $GN_HOME/specsite, checked
    python3 scripts/gpu_speculators.py run mla --dry-run            # the plan, nothing started
    python3 scripts/gpu_speculators.py run mla
    python3 scripts/gpu_speculators.py wait mla                     # again while it exits 75; then the table
    python3 scripts/gpu_speculators.py run mla --draft-sampling greedy && python3 scripts/gpu_speculators.py wait mla
                                                                    # optional: greedy drafts too (two engines more)

What it runs, each step skipped when its output is there (a second `run` adds what is missing):
  1. data       benchmarks/speculators_cpu.py prepare on the extract stage's index: speculators' own layout, train
                rows first, so its validation split is eagleflow's holdout split;
  2. speculators `speculators train` through benchmarks/speculators_cpu.py train, on cuda, with its recommended
                EAGLE-3 settings (unroll = the pipeline's train.ttt_steps, KL loss, frozen target embedding, norm before
                fc, Muon + AdamW at 1e-3, bf16 autocast, 8,192-token packed rows, flex attention), one layer and the
                draft vocabulary size eagleflow's train stage resolved, for as many tokens as that stage trained on
                (--budget-tokens) and at most its epochs. Of speculators_cpu.py's workarounds only the budget and its
                schedule act on a GPU: the device, autocast and synchronize ones check for an accelerator, and its
                float32 Newton-Schulz for Muon is put back to torch's own here. Its fused Triton loss does not trace
                under torch 2.11's dynamo (benchmarks/train_gpu.py), so the loss is its eager one; should training
                fail (its compile, flex attention), it runs once more with sdpa and dynamo off, the CPU comparison's
                eager path (the JSON says which trained);
  3. benchmark  `python -m flows.benchmark` with the control python, as scripts/gpu_k_sweep.py runs it, on the
                pipeline's own run config (its work root too: the benchmark may reuse the pipeline's measurement of
                no speculation, benchmark.reuse_for_h), with `benchmark.drafter` = the pipeline's export and
                `benchmark.current_drafter` = speculators' checkpoint, temperatures 0, 0.6 and 1.0 with top_p 0.95 at
                concurrency 1, engines eager, no triage; one flow run per --draft-sampling value
                (benchmark.draft_sample_method).
GPU time, measured on one H100 for the demo-MLA pipeline's states (324k tokens, 10 epochs): the data step 18 s of
CPU work, training 207 s (157 s of steps), the flow run 288 s (two engine loads, no speculation reused): about nine
minutes for the default run; speculators.json records each step's seconds.

Records: $GN_HOME/speculators-NAME/{speculators.log, speculators.json (the table's figures, both trainers' budgets,
settings and versions), data/, speculators-<stamp>-<try>/ (checkpoints), bench-<sampling>.yaml, reports/}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_nightly as gn  # noqa: E402 - the same interpreters and staging as the nightly's

from eagleflow.util.procs import group_members  # noqa: E402

HELPER = gn.ROOT / "benchmarks" / "speculators_cpu.py"
SPECSITE = gn.HOME / "specsite"
TEMPERATURES = [0.0, 0.6, 1.0]
TOP_P = 0.95
SAMPLINGS = ("probabilistic", "greedy")
ATTENTIONS = ("simple_flex_attention", "sdpa", "eager")
# speculators' interpreter: offline, and quiet about tokenizer threads in its dataloader workers.
SPEC_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

# What the GPU host has (torch, transformers, safetensors, numpy, pyarrow, httpx and what they pulled in): never
# staged (scripts/gpu_speculators.sh), taken as present by the staging check.
HOST_HAS = tuple(
    "torch triton transformers tokenizers safetensors numpy pyarrow httpx httpcore certifi regex pyyaml packaging "
    "filelock sympy mpmath networkx jinja2 markupsafe setuptools".split()
)
HOST_HAS_PREFIXES = ("nvidia-", "cuda-")
# speculators requires these, but its training never imports them, and PyPI's builds break imports beside another torch.
LEFT_OUT = ("torchvision", "torchaudio")
# The modules that must come from the host itself, never from speculators' site.
HOST_MODULES = ("torch", "transformers", "safetensors", "numpy", "pyarrow")
# Markers as the GPU host evaluates them (the staging machine may run another Python).
HOST_MARKERS = dict(python_version="3.12", python_full_version="3.12.3", sys_platform="linux", platform_system="Linux",
                    platform_machine="x86_64", os_name="posix", implementation_name="cpython",
                    platform_python_implementation="CPython", extra="")  # fmt: skip

# Runs speculators_cpu.py's `train` with the CPU-only Muon patch undone where an accelerator is present: its float32
# Newton-Schulz was for AVX2 cores, and on a GPU speculators' own bf16 iteration is its recipe. The module's other CPU
# workarounds already check for an accelerator. argv: the benchmarks directory, then speculators_cpu.py's arguments.
GPU_TRAIN = """\
import sys
import torch
sys.path.insert(0, sys.argv.pop(1))
import speculators_cpu as sc
if torch.accelerator.current_accelerator() is not None:
    import torch.optim._muon as muon
    sc._ns_fp32 = muon._zeropower_via_newtonschulz
sys.argv[0] = sc.__file__
sys.exit(sc.main())
"""
VERSIONS = """\
import importlib.metadata as m, json, sys
out = {}
for d in sys.argv[1:]:
    try:
        out[d] = m.version(d)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


class StepFailed(SystemExit):
    """A step's process failed: its exit status and the end of its log, for the main log."""


def out_of(name: str) -> Path:
    return gn.HOME / f"speculators-{name}"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


# ----------------------------------------------------------------------------------- the pipeline's run


@dataclass
class Pipeline:
    """A finished pipeline run's stages, read as JSON (the host's python3 has no pydantic for eagleflow's records)."""

    name: str
    runs: Path
    extract_dir: Path
    train_dir: Path
    export_dir: Path
    extract: dict[str, Any]
    train: dict[str, Any]
    export: dict[str, Any]
    config: dict[str, Any]  # the train stage's whole run config: the pipeline's --set overrides are in it

    @property
    def index(self) -> Path:
        return self.extract_dir / self.extract["outputs"]["index"]

    @property
    def drafter(self) -> Path:
        return self.export_dir / self.export["outputs"]["vllm"]


def find_pipeline(name: str) -> Pipeline:
    """The newest finished export of pipeline NAME and the train and extract stages it came from."""
    runs = gn.HOME / f"pipeline-{name}" / "runs"
    exports = sorted(runs.glob("export/*/manifest.json"), key=lambda p: read_json(p).get("created", 0))
    if not exports:
        raise SystemExit(
            f"no finished export stage under {runs}: run `python3 scripts/gpu_pipeline.py run {name}` and wait for it"
        )
    export_dir = exports[-1].parent
    export = read_json(exports[-1])
    train_dir = runs / "train" / export["upstream"]["train"]
    train = read_json(train_dir / "manifest.json")
    extract_dir = runs / "extract" / train["upstream"]["extract"]
    extract = read_json(extract_dir / "manifest.json")
    storage = extract["outputs"].get("storage_dtype", "bfloat16")
    if storage != "bfloat16":  # speculators_cpu.py prepare copies bf16 states as they are; it has no fp8 scales
        raise SystemExit(f"{extract_dir} stores its states as {storage}: speculators' data step reads bfloat16 only")
    config = read_json(train_dir / "request.json")["config"]
    return Pipeline(name, runs, extract_dir, train_dir, export_dir, extract, train, export, config)


def eagleflow_summary(p: Pipeline) -> dict[str, Any]:
    """What eagleflow's train stage did: the budget speculators gets, and its own figures for the record."""
    m = p.train["metrics"]
    epochs = m["epochs"]
    best = m["best"]
    return {
        "drafter_dir": str(p.drafter),
        "tokens": sum(e["train"]["tokens"] for e in epochs),
        "epochs_started": len(epochs),
        "epochs_complete": sum(1 for e in epochs if e["complete"]),
        "train_seconds": round(sum(e["seconds"] for e in epochs), 2),
        "tokens_per_s": m["tokens_per_s"],
        "bounded_by": m["bounded_by"],
        "draft_vocab_size": m["draft_vocab_size"],
        "arch": p.train["outputs"].get("arch"),
        "offline": {k: best.get(k) for k in ("acceptance_length", "accept_pos", "acc", "epoch")},
        "settings": p.config["train"],
        "stages": {"extract": str(p.extract_dir), "train": str(p.train_dir), "export": str(p.export_dir)},
    }


# ----------------------------------------------------------------------------------- interpreters


def spec_python(args: argparse.Namespace, create: bool) -> str:
    """speculators' interpreter: python3 with its staged site first on the path. Not the vLLM site (speculators does
    not need it, and its pins are vLLM's), nor the checkout (speculators_cpu.py imports no eagleflow)."""
    if args.spec_python:
        return os.path.abspath(args.spec_python)
    path = gn.HOME / "bin" / "spec-python"
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        gn.wrapper(path, sys.executable, [str(SPECSITE)], SPEC_ENV)
    return str(path)


def interpreters(args: argparse.Namespace, create: bool) -> tuple[str, str, str]:
    """(control, host, speculators) pythons; with create=False (a dry run) their paths only, nothing written."""
    if create:
        control, host = gn.pythons(args)
    else:
        control, host = (str(gn.HOME / "bin" / f"{w}-python") for w in ("control", "host"))
    return control, host, spec_python(args, create)


def shown(argv: list[str]) -> str:
    """A command as a shell would take it, the inline training program named instead of printed."""
    return shlex.join("<GPU_TRAIN>" if a == GPU_TRAIN else a for a in argv)


# ----------------------------------------------------------------------------------- steps


def prepare_argv(spec: str, p: Pipeline, data: Path) -> list[str]:
    return [spec, str(HELPER), "prepare", "--index", str(p.index), "--out", str(data)]


def speculators_flags(
    p: Pipeline, data: Path, save: Path, ratio: float | str, attn: str, args: argparse.Namespace
) -> list[str]:
    """`speculators train` flags: its recommended EAGLE-3 settings (its defaults, spelled out, as
    benchmarks/compare_speculators.py does on CPU) with eagleflow's shape: one layer, the draft vocabulary size and
    unroll of the pipeline's train stage, the target's aux layers (vLLM's convention, as ours)."""
    cfg, t = p.config, p.config["train"]
    groups = [
        ("--verifier-name-or-path", cfg["target"]["model_path"]),
        ("--data-path", str(data)),
        ("--save-path", str(save)),
        ("--log-dir", str(save.parent / "logs")),
        ("--speculator-type", "eagle3"),
        ("--num-layers", "1"),
        ("--target-layer-ids", *map(str, cfg["target"]["aux_layer_ids"])),
        ("--draft-vocab-size", str(p.train["metrics"]["draft_vocab_size"])),
        ("--ttt-steps", str(t["ttt_steps"])),
        ("--loss-fn", args.spec_loss_fn),
        ("--norm-before-fc",),
        ("--no-embed-requires-grad",),
        ("--optimizer", "muon"),
        ("--lr", str(args.spec_lr)),
        ("--epochs", str(t["epochs"])),
        ("--seed", str(t["seed"])),
        ("--total-seq-len", str(args.spec_total_seq_len)),
        ("--loss-implementation", args.spec_loss),
        ("--draft-attn-impl", attn),
        # one full-attention layer, as eagleflow's and the CPU comparison's (its default sliding window of 2048 is
        # the same mask on these sequences, but vLLM would then serve a sliding-window layer)
        ("--full-attention-indices", "0"),
        ("--num-workers", str(args.spec_num_workers)),
        ("--train-data-ratio", str(ratio)),
        ("--on-missing", "raise"),
        ("--log-freq", "50"),
    ]
    return [a for group in groups for a in group]


def train_argv(spec: str, budget_tokens: int, report: Path, flags: list[str]) -> list[str]:
    helper = ["train", "--budget-tokens", str(budget_tokens), "--report", str(report), "--", *flags]
    return [spec, "-c", GPU_TRAIN, str(HELPER.parent), *helper]


def attempts(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """How speculators trains, in order, as (--draft-attn-impl, environment): as asked, under its own torch.compile
    (on a GPU it compiles its forward whatever the attention); should that fail, sdpa with dynamo off, the eager path
    the CPU comparison runs, which needs neither Triton nor a compile."""
    return [(args.spec_attn, {}), ("sdpa", {"TORCHDYNAMO_DISABLE": "1"})]


def bench_config(
    p: Pipeline, drafters: dict[str, str], sampling: str, host: str, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The pipeline's run config for the benchmark-only flow: both drafters on engines of their own, at production's
    sampling settings. The work root stays the pipeline's (its states are the triage's reference, and its measurement
    of no speculation is reused while it holds); the name is this comparison's, so no promotion record of the
    pipeline's stands in for benchmark.current_drafter."""
    data = json.loads(json.dumps(p.config))
    data["name"] = f"{data['name']}-speculators"
    data["host"]["python"] = host
    data["engine"].update(port=gn.free_port(), extra_args=[], enforce_eager=True)
    bench = data["benchmark"]
    bench.update(
        drafter=drafters["eagleflow"],
        current_drafter=drafters["speculators"],
        draft_sample_method=sampling,
        temperatures=TEMPERATURES,
        concurrencies=[1],
        top_p=TOP_P,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        drafter_on="engine",
        k_sweep=[],
        side_by_side=False,
        remeasure_baseline=False,
        precision=None,
    )
    bench["triage"]["when"] = "never"  # each probe is an engine load more; a comparison, not a diagnosis
    data["production"] = {"kind": "none"}  # no traffic mix: the temperatures above are the settings
    data["report_dir"] = str(out / "reports")
    return data


def bench_argv(control: str, config: Path, args: argparse.Namespace) -> list[str]:
    argv = [control, "-m", "flows.benchmark", str(config)]
    for s in args.set:
        argv += ["--set", s]
    return argv


def same_path(a: str | None, b: str) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def bench_manifest(p: Pipeline, drafters: dict[str, str], sampling: str) -> tuple[Path, dict[str, Any]]:
    """The newest benchmark stage that measured these two drafters with this draft sampling."""
    found = []
    for path in (p.runs / "benchmark").glob("*/manifest.json"):
        m = read_json(path)
        met = m.get("metrics", {})
        measured = met.get("drafters", {})
        if (
            same_path(measured.get("drafter"), drafters["eagleflow"])
            and same_path(measured.get("current"), drafters["speculators"])
            and met.get("settings", {}).get("draft_sample_method") == sampling
        ):
            found.append((m.get("created", 0), str(path), m))
    if not found:
        raise SystemExit(
            f"no benchmark stage under {p.runs / 'benchmark'} measured both drafters with {sampling} drafts"
        )
    _, path, m = max(found, key=lambda f: f[0])
    return Path(path), m


def served(m: dict[str, Any]) -> dict[str, Any]:
    """Per trainer ('baseline', 'eagleflow', 'speculators'), per temperature: what the engine measured."""
    names = {"baseline": "baseline", "drafter": "eagleflow", "current": "speculators"}
    out: dict[str, Any] = {}
    for w in m["metrics"]["windows"]:
        row = {
            k: w.get(k)
            for k in (
                "mean_acceptance_length",
                "al_interval",
                "per_position_acceptance",
                "acceptance_rate",
                "output_tok_s",
                "requests",
                "measured",
            )
        }
        out.setdefault(names.get(w["variant"], w["variant"]), {})[str(w["temperature"])] = row
    return out


# ----------------------------------------------------------------------------------- the run itself


def run_child(argv: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> float:
    """Run one step's process (its output in its own log, `env` added to ours); its wall seconds. A failure ends the
    run with the log's last lines in the main log."""
    gn.say(f"{what}: $ {' '.join(f'{k}={v}' for k, v in (env or {}).items())}{' ' if env else ''}{shown(argv)}")
    gn.say(f"{what}: log {log}")
    t0 = time.monotonic()
    with open(log, "ab") as f:
        rc = subprocess.run(
            argv,
            cwd=gn.ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        ).returncode
    seconds = round(time.monotonic() - t0, 1)
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise StepFailed(f"{what} failed (exit {rc}) after {seconds} s; the end of {log}:\n{tail}")
    gn.say(f"{what}: done in {seconds} s")
    return seconds


def versions(host: str, spec: str) -> dict[str, Any]:
    """The packages that made the figures, and the GPU."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for python, dists in ((host, ["torch", "transformers", "vllm"]), (spec, ["speculators", "datasets", "pyarrow"])):
        r = subprocess.run([python, "-c", VERSIONS, *dists], capture_output=True, text=True)
        out.update(json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {})
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
        )
        out["gpu"] = r.stdout.strip().splitlines() if r.returncode == 0 else None
    except OSError:  # no nvidia-smi: a rehearsal elsewhere
        out["gpu"] = None
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=gn.ROOT, capture_output=True, text=True).stdout.strip()
    out["eagleflow_git"] = sha or None
    return out


def prepare_data(spec: str, p: Pipeline, out: Path, seconds: dict[str, float]) -> dict[str, Any]:
    data = out / "data"
    if not (data / "eagleflow_prepare.json").is_file():
        seconds["data"] = run_child(prepare_argv(spec, p, data), out / "prepare.log", "data")
    return read_json(data / "eagleflow_prepare.json")


def train_speculators(
    spec: str, p: Pipeline, out: Path, prep: dict[str, Any], args: argparse.Namespace, seconds: dict[str, float]
) -> dict[str, Any]:
    """speculators trained once (its report kept); a fresh checkpoint directory per attempt, so a benchmark stage
    cached for an earlier checkpoint's path never stands for a new one."""
    report = out / "train_report.json"
    if report.is_file():
        return read_json(report)
    budget = eagleflow_summary(p)["tokens"]
    tries = attempts(args)
    for i, (attn, env) in enumerate(tries):
        save = out / f"speculators-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{i + 1}" / "checkpoints"
        save.parent.mkdir(parents=True)
        flags = speculators_flags(p, out / "data", save, prep["train_data_ratio"], attn, args)
        attempt = save.parent / "train_report.json"
        how = f"{attn}{', no compile' if env else ''}"
        try:
            seconds["speculators"] = run_child(
                train_argv(spec, budget, attempt, flags), save.parent / "train.log", f"speculators ({how})", env
            )
        except StepFailed as exc:
            if i == len(tries) - 1:
                raise
            gn.say(f"{exc.code}\nspeculators: training again, {tries[i + 1][0]} with dynamo off")
            continue
        r = {**read_json(attempt), "attention": how}
        write_json(report, r)
        return r
    raise AssertionError("unreachable: the last attempt raises")


def benchmark(
    p: Pipeline,
    drafters: dict[str, str],
    sampling: str,
    pythons: tuple[str, str],
    out: Path,
    args: argparse.Namespace,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """One benchmark-only flow run at one draft sampling; its figures (kept in bench-<sampling>.json)."""
    record = out / f"bench-{sampling}.json"
    if record.is_file():
        return read_json(record)
    import yaml

    control, host = pythons
    config = out / f"bench-{sampling}.yaml"
    config.write_text(yaml.safe_dump(bench_config(p, drafters, sampling, host, out, args), sort_keys=False))
    seconds[f"benchmark_{sampling}"] = run_child(
        bench_argv(control, config, args), out / f"bench-{sampling}.log", f"benchmark ({sampling} drafts)"
    )
    path, m = bench_manifest(p, drafters, sampling)
    met = m["metrics"]
    r = {
        "stage": str(path.parent),
        "config": str(config),
        "served": served(m),
        "reused": met.get("reused", {}),
        "stage_seconds": met.get("seconds", {}),
        "verdict": met.get("verdict", {}).get("summary"),
        "settings": {k: met["settings"].get(k) for k in ("num_prompts", "max_tokens", "top_p", "temperatures")},
    }
    write_json(record, r)
    return r


def steps(args: argparse.Namespace) -> int:
    """The run (what `run` starts in a session of its own): every step not done yet, then the record and table."""
    out = out_of(args.name)
    out.mkdir(parents=True, exist_ok=True)
    rc = 1
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        p = find_pipeline(args.name)
        control, host, spec = interpreters(args, create=True)
        t0 = time.monotonic()
        timing = out / "seconds.json"  # each step's seconds, from whichever run did it
        seconds: dict[str, float] = read_json(timing) if timing.is_file() else {}
        ours = eagleflow_summary(p)
        gn.say(f"pipeline {args.name}: eagleflow trained {ours['tokens']:,} tokens; its drafter {p.drafter}")
        prep = prepare_data(spec, p, out, seconds)
        theirs = train_speculators(spec, p, out, prep, args, seconds)
        write_json(timing, seconds)
        gn.say(f"speculators: {theirs['tokens']:,} tokens in {theirs['epochs_started']} epochs, {theirs['checkpoint']}")
        drafters = {"eagleflow": str(p.drafter), "speculators": theirs["checkpoint"]}
        for sampling in args.draft_sampling:
            benchmark(p, drafters, sampling, (control, host), out, args, seconds)
            write_json(timing, seconds)
        record = {
            "pipeline": args.name,
            "data": prep,
            "training": {"eagleflow": ours, "speculators": {**theirs, "data": str(out / "data")}},
            "serving": {
                s: read_json(out / f"bench-{s}.json") for s in SAMPLINGS if (out / f"bench-{s}.json").is_file()
            },
            "seconds": {**seconds, "last_run": round(time.monotonic() - t0, 1)},
            "versions": versions(host, spec),
            "argv": sys.argv,
        }
        write_json(out / "speculators.json", record)
        print(table(record), flush=True)
        gn.say(f"record: {out / 'speculators.json'}")
        rc = 0
    except SystemExit as exc:
        gn.say(str(exc.code) if not isinstance(exc.code, int) else f"exit {exc.code}")
        rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        (out / "steps.rc").write_text(str(rc))
    return rc


def table(record: dict[str, Any]) -> str:
    """AL per setting: eagleflow's drafter against speculators', each draft sampling measured."""
    lines = [
        "| drafts | temperature (top_p 0.95 above 0) | eagleflow AL | speculators AL | eagleflow / speculators | "
        "per position: eagleflow / speculators |",
        "|---|---:|---:|---:|---:|---|",
    ]
    pos = lambda w: " ".join(f"{x:.2f}" for x in (w or {}).get("per_position_acceptance") or [])  # noqa: E731
    for sampling, bench in record["serving"].items():
        s = bench["served"]
        for temp in map(str, TEMPERATURES):
            ours, theirs = s.get("eagleflow", {}).get(temp, {}), s.get("speculators", {}).get(temp, {})
            a, b = ours.get("mean_acceptance_length"), theirs.get("mean_acceptance_length")
            ratio = f"{a / b:.3f}" if a and b else "-"
            fa, fb = (f"{x:.3f}" if x else "-" for x in (a, b))
            lines.append(f"| {sampling} | {temp} | {fa} | {fb} | {ratio} | {pos(ours)} / {pos(theirs)} |")
    t = record["training"]
    lines.append(
        f"\neagleflow: {t['eagleflow']['tokens']:,} tokens, {t['eagleflow']['epochs_complete']} epochs "
        f"(offline AL {t['eagleflow']['offline']['acceptance_length']}); speculators: {t['speculators']['tokens']:,} "
        f"tokens, {t['speculators']['epochs_complete']} full epochs of {t['speculators']['epochs_started']}, "
        f"{t['speculators']['train_seconds']} s of steps, trained with {t['speculators'].get('attention')}"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- verbs


def dry_run(args: argparse.Namespace) -> int:
    """The plan, with this host's paths: the commands and the benchmark's settings; nothing started or written."""
    p = find_pipeline(args.name)
    out = out_of(args.name)
    control, host, spec = interpreters(args, create=False)
    ours = eagleflow_summary(p)
    data = out / "data"
    prepared = data / "eagleflow_prepare.json"
    ratio = read_json(prepared)["train_data_ratio"] if prepared.is_file() else "<RATIO from the data step>"
    save = out / "speculators-<stamp>-1" / "checkpoints"
    print(f"pipeline {args.name}: extract {p.extract_dir}\n  train {p.train_dir}\n  export {p.drafter}")
    print(f"eagleflow trained {ours['tokens']:,} tokens in {ours['epochs_started']} epochs ({ours['bounded_by']})")
    print(f"speculators' interpreter: {spec} (PYTHONPATH {SPECSITE})")
    print(f"\n1. data{' (done)' if prepared.is_file() else ''}:\n   {shown(prepare_argv(spec, p, data))}")
    (attn, _), (fallback, env) = attempts(args)
    print(f"\n2. speculators ({attn}; should it fail, {' '.join(f'{k}={v}' for k, v in env.items())} {fallback}):")
    flags = speculators_flags(p, data, save, ratio, attn, args)
    print(f"   {shown(train_argv(spec, ours['tokens'], save.parent / 'train_report.json', flags))}")
    drafters = {"eagleflow": str(p.drafter), "speculators": str(save.parent / "checkpoints" / "<last epoch>")}
    for sampling in args.draft_sampling:
        cfg = bench_config(p, drafters, sampling, host, out, args)
        config = out / f"bench-{sampling}.yaml"
        print(f"\n3. benchmark ({sampling} drafts), config {config} (the pipeline's, with):")
        print(f"   host.work_root {cfg['host']['work_root']}, host.python {cfg['host']['python']}")
        print(f"   engine: {json.dumps({k: cfg['engine'][k] for k in ('port', 'extra_args', 'enforce_eager')})}")
        print(f"   benchmark: {json.dumps({k: v for k, v in cfg['benchmark'].items() if k != 'triage'})}")
        print(f"   {shown(bench_argv(control, config, args))}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        return dry_run(args)
    out = out_of(args.name)
    out.mkdir(parents=True, exist_ok=True)
    pidfile = out / "speculators.pid"
    if pidfile.is_file() and group_members(int(pidfile.read_text())):
        gn.say(f"speculators {args.name} still runs (pid {pidfile.read_text()}): `wait {args.name}`")
        return 1
    find_pipeline(args.name)  # fails here, not in the log, when the pipeline has not finished
    argv = list(sys.argv[1:])
    argv[argv.index("run")] = "steps"
    (out / "steps.rc").unlink(missing_ok=True)
    log = out / "speculators.log"
    # where this run's lines start in the log (it keeps earlier runs' lines): what `wait` shows
    (out / "speculators.from").write_text(str(log.stat().st_size if log.is_file() else 0))
    pid = gn.spawn([sys.executable, str(Path(__file__).resolve()), *argv], log, pidfile)
    gn.say(f"speculators {args.name}: pid {pid}, log {out / 'speculators.log'}")
    return 0


def wait(args: argparse.Namespace) -> int:
    out = out_of(args.name)
    if not (out / "speculators.pid").is_file():
        gn.say(f"no run of {args.name} started: `run {args.name}` first")
        return 1
    pid = int((out / "speculators.pid").read_text())
    log = out / "speculators.log"
    start = out / "speculators.from"
    seen = int(start.read_text()) if start.is_file() else 0
    deadline = time.monotonic() + args.timeout
    while True:
        data = log.read_bytes()
        print(data[seen:].decode(errors="replace"), end="", flush=True)
        seen = len(data)
        if not group_members(pid):  # the run and every process it started (its own session: pgid = pid)
            rc_file = out / "steps.rc"
            rc = int(rc_file.read_text()) if rc_file.is_file() else 1
            gn.say(f"speculators {args.name} ended ({'done' if rc == 0 else f'exit {rc}; see its log'})")
            return rc
        if time.monotonic() > deadline:
            gn.say(f"speculators {args.name} still runs{step_tail(out)}")
            return 75
        time.sleep(5)


def step_tail(out: Path) -> str:
    """The last line of the newest step log: where a long step is."""
    logs = sorted(out.glob("**/*.log"), key=lambda p: p.stat().st_mtime)
    logs = [p for p in logs if p.name != "speculators.log"]
    if not logs:
        return ""
    # progress bars redraw their line with carriage returns: the last redraw is where the step is
    last = logs[-1].read_text(errors="replace").replace("\r", "\n").strip().splitlines()[-1:] or [""]
    return f"; {logs[-1].name}: {last[0][-300:]}"


def show(args: argparse.Namespace) -> int:
    record = out_of(args.name) / "speculators.json"
    if not record.is_file():
        gn.say(f"no {record} yet")
        return 1
    print(table(read_json(record)))
    return 0


# ----------------------------------------------------------------------------------- staging checks


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def on_host(name: str) -> bool:
    return name in HOST_HAS or name.startswith(HOST_HAS_PREFIXES)


def requirements(lines: list[str], env: dict[str, str]) -> list[Any]:
    """Of a distribution's Requires-Dist values, those that apply in `env` (no extras)."""
    from packaging.requirements import Requirement

    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def requires_dist(metadata: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


def unmet(reqs: dict[str, list[Any]], have: dict[str, str | None]) -> list[str]:
    """'dist: requirement (why)' for every requirement not met; a version of None (the host's, unknown here) is taken
    as meeting it."""
    out = []
    for dist, rs in sorted(reqs.items()):
        for r in rs:
            name = norm(r.name)
            if name in LEFT_OUT:
                continue
            if name not in have:
                out.append(f"{dist}: {r} (absent)")
            elif have[name] is not None and not r.specifier.contains(have[name], prereleases=True):
                out.append(f"{dist}: {r} (found {have[name]})")
    return out


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return z.read(name).decode()


def header(metadata: str, field: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith(f"{field}:"))


def check_wheels(args: argparse.Namespace) -> int:
    """Staging: every requirement of every staged wheel, as the GPU host evaluates it, is staged or the host's."""
    from packaging.markers import default_environment

    env = {**default_environment(), **HOST_MARKERS}
    have: dict[str, str | None] = {}
    reqs: dict[str, list[Any]] = {}
    for wheel in sorted(Path(args.name).glob("*.whl")):
        meta = wheel_metadata(wheel)
        name = norm(header(meta, "Name"))
        have[name] = header(meta, "Version")
        reqs[f"{name} {have[name]}"] = requirements(requires_dist(meta), env)
    if "speculators" not in have:
        print(f"no speculators wheel in {args.name}")
        return 1
    needed = {norm(r.name) for rs in reqs.values() for r in rs}
    host = sorted(n for n in needed - set(have) if on_host(n))
    for n in host:
        have[n] = None
    missing = unmet(reqs, have)
    print(f"staged: {len(reqs)} distributions; from the GPU host: {', '.join(host)}; left out: {', '.join(LEFT_OUT)}")
    for line in missing:
        print(f"unmet: {line}")
    return 1 if missing else 0


def check_site(args: argparse.Namespace) -> int:
    """On the GPU host, with PYTHONPATH=$GN_HOME/specsite: the host's own torch and transformers are the ones imported,
    every requirement of the staged set is met by what this interpreter sees, and speculators' training imports."""
    import importlib.metadata
    import importlib.util

    from packaging.markers import default_environment

    site = SPECSITE.resolve()
    if str(SPECSITE) not in sys.path and str(site) not in sys.path:
        print(f"{SPECSITE} is not on this interpreter's path: run with PYTHONPATH={SPECSITE}")
        return 1
    problems = []
    for module in HOST_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            problems.append(f"{module}: not importable (the host should have it)")
        elif Path(spec.origin).resolve().is_relative_to(site):
            problems.append(f"{module}: imported from {site}, not the host's")
    have: dict[str, str | None] = {}
    reqs: dict[str, list[Any]] = {}
    env = dict(default_environment(), extra="")
    for dist in importlib.metadata.distributions():  # in path order: the first of a name is the one imported
        name = norm(dist.metadata["Name"])
        have.setdefault(name, dist.version)
        if Path(str(dist.locate_file(""))).resolve() == site and f"{name} {dist.version}" not in reqs:
            reqs[f"{name} {dist.version}"] = requirements(dist.requires or [], env)
    problems += [f"unmet: {line}" for line in unmet(reqs, have)]
    for module in LEFT_OUT:
        if importlib.util.find_spec(module) is not None:
            print(f"note: {module} is importable here; speculators' training does not use it")
    for module in ("speculators", "speculators.train.cli", "speculators.train.vocab_mapping", "datasets"):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the import's failure is the finding
            problems.append(f"import {module}: {type(exc).__name__}: {exc}")
    print(
        f"speculators {have.get('speculators')}, torch {have.get('torch')}, transformers {have.get('transformers')}, "
        f"datasets {have.get('datasets')}, pyarrow {have.get('pyarrow')}, numpy {have.get('numpy')}; "
        f"{len(reqs)} distributions in {site}"
    )
    for line in problems:
        print(line)
    print("ok" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["run", "wait", "show", "steps", "wheels", "site"])
    ap.add_argument("name", nargs="?", default="", help="the pipeline's NAME (wheels: the staged wheels' directory)")
    ap.add_argument(
        "--draft-sampling",
        nargs="+",
        choices=SAMPLINGS,
        default=["probabilistic"],
        help="benchmark.draft_sample_method, one flow run each (greedy: two engine loads more)",
    )
    ap.add_argument("--num-prompts", type=int, default=16, help="benchmark.num_prompts (the pipeline runs' figure)")
    ap.add_argument("--max-tokens", type=int, default=96, help="benchmark.max_tokens")
    ap.add_argument("--set", action="append", default=[], help="override for the benchmark flow KEY=VALUE (YAML)")
    ap.add_argument(
        "--spec-attn",
        choices=ATTENTIONS,
        default="simple_flex_attention",
        help="speculators' --draft-attn-impl (its default; should training fail, sdpa with dynamo off is next)",
    )
    ap.add_argument(
        "--spec-loss",
        choices=["eager", "fused"],
        default="eager",
        help="speculators' --loss-implementation (fused: its Triton kernel, which torch 2.11's dynamo fails to trace)",
    )
    ap.add_argument("--spec-loss-fn", default="kl_div", help="speculators' --loss-fn (its EAGLE-3 default)")
    ap.add_argument("--spec-lr", type=float, default=1e-3, help="speculators' learning rate (its default)")
    ap.add_argument(
        "--spec-total-seq-len", type=int, default=8192, help="speculators' packed tokens per step (its default)"
    )
    ap.add_argument(
        "--spec-num-workers",
        type=int,
        default=0,
        help="speculators' dataloader workers (0: it loads in the training process; workers pass batches through "
        "/dev/shm, which a container may keep small)",
    )
    ap.add_argument("--spec-python", help="speculators' interpreter (default: python3 with $GN_HOME/specsite)")
    ap.add_argument("--timeout", type=float, default=540, help="wait: seconds to follow the run before exit 75")
    ap.add_argument("--dry-run", action="store_true", help="run: print the plan; start nothing")
    gn.add_python_args(ap)
    args = ap.parse_args()
    if not args.name and args.verb != "site":  # site checks this interpreter, no pipeline's
        ap.error(f"{args.verb} needs a NAME")
    verbs = {"run": run, "wait": wait, "show": show, "steps": steps, "wheels": check_wheels, "site": check_site}
    return verbs[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
