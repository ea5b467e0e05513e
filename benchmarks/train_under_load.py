"""The train stage on an idle machine and on a loaded one: the same steps, the same drafter?

    .hostenv/bin/python benchmarks/train_under_load.py [--config configs/demo.yaml] [--out DIR]
    .hostenv/bin/python benchmarks/train_under_load.py --synthetic --out DIR       # tiny data (the suite's run)

A cached stage must be a function of its key: the demo once trained on a wall-clock budget and, with
another process busy on one of the two cores, stopped after 106 optimizer steps instead of 10
epochs (AL 3.4 -> 2.37). Training is now bounded by epochs and `train.max_steps` only. This runs the
real train stage (`python -m eagleflow.stages.train request.json`) twice on the same extracted data:

    idle     nothing else started by this script
    loaded   a busy loop of ours on one core for the whole run (started here, ended here)

and prints, for each, the optimizer steps, epochs, what bounded training, the best epoch's simulated
acceptance length and the wall time, then whether the final weights are identical. Data: the
config's finished extract stage (the newest under host.work_root, e.g. after `make demo`), or with
--synthetic the tiny synthetic target and shards of benchmarks/ddp_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from stage_run import run_stage  # noqa: E402

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractOutputs, TrainMetrics, TrainOutputs  # noqa: E402


def _busy_loop() -> None:
    while True:
        pass


def newest_extract(work_root: Path) -> Manifest:
    found = sorted(work_root.glob("extract/*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no finished extract stage under {work_root}: run `make demo` first, or pass --synthetic")
    return read_manifest(found[-1])


def synthetic_extract(out: Path) -> tuple[Manifest, dict]:
    """benchmarks/ddp_gpu.py's tiny Markov-language target and shards, as an extract manifest + train config."""
    sys.path.insert(0, str(Path(__file__).parent))
    from ddp_gpu import TINY, write_extract

    root = out / "data"
    if not (root / "data" / "index.json").is_file():
        write_extract(root, TINY, torch.device("cpu"))
    index = json.loads((root / "data" / "index.json").read_text())
    outputs = ExtractOutputs(
        index="data/index.json",
        shards=[e["file"] for e in index["shards"]],
        hidden_size=index["hidden_size"],
        num_tokens={s: sum(e["num_tokens"] for e in index["shards"] if e["split"] == s) for s in ("train", "holdout")},
    )
    (out / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    config = {
        "name": "under-load",
        "host": {"work_root": str(out), "python": sys.executable},
        "target": {"model_path": str(root / "target"), "aux_layer_ids": [1, 2, 3], "final_layer_id": 4},
        "generate": {"prompts_path": str(out / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
        "train": {**TINY.train, "epochs": 3},
    }
    return Manifest(stage="extract", key="synthetic", dir=str(root), outputs=outputs.model_dump()), config


def run_train(config_data: dict, extract: Manifest, stage_dir: Path) -> dict:
    m, wall = run_stage("train", config_data, {"extract": extract}, stage_dir)
    metrics, outputs = TrainMetrics.of(m), TrainOutputs.of(m)
    return {
        "steps": metrics.steps,
        "epochs": len(metrics.epochs),
        "complete_epochs": sum(e.complete for e in metrics.epochs),
        "bounded_by": metrics.bounded_by,
        "best_epoch": metrics.best_epoch,
        "acceptance_length_sim": metrics.best.acceptance_length,
        "wall_s": round(wall, 1),
        "tokens_per_s": metrics.tokens_per_s,
        "weights": str(stage_dir / outputs.checkpoints[-1] / "model.safetensors"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "under-load")
    p.add_argument("--synthetic", action="store_true", help="tiny synthetic data instead of the config's extract")
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.synthetic:
        extract, config_data = synthetic_extract(out)
    else:
        config = load_config(args.config)
        extract = newest_extract(Path(config.host.work_root))
        config_data = config.model_dump(mode="json")
    results = {"idle": run_train(config_data, extract, out / "idle")}
    burner = multiprocessing.Process(target=_busy_loop, daemon=True)
    burner.start()
    try:
        results["loaded"] = run_train(config_data, extract, out / "loaded")
    finally:
        burner.terminate()  # our own child, by its handle
        burner.join()
    a, b = (load_file(results[k]["weights"]) for k in ("idle", "loaded"))
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(f"{'run':8}{'steps':>7}{'epochs':>8}{'bounded by':>12}{'best AL':>9}{'wall s':>8}{'tok/s':>9}")
    for name, r in results.items():
        print(
            f"{name:8}{r['steps']:>7}{r['epochs']:>8}{r['bounded_by']:>12}{r['acceptance_length_sim'] or 0:>9.3f}"
            f"{r['wall_s']:>8}{r['tokens_per_s']:>9.0f}"
        )
    print(f"final weights identical: {same}")
    (out / "under_load.json").write_text(json.dumps({**results, "weights_identical": same}, indent=1))
    ok = results["idle"]["steps"] == results["loaded"]["steps"] and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
