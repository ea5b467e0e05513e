"""The nightly's continual-training recipe, measured: which learning rate, steps and replay bring a night that
continues from the promoted drafter to at least the first night's acceptance with a third of its steps, and
how that compares with a drafter trained from scratch on the whole pool.

    .hostenv/bin/python benchmarks/nightly_recipe.py REPORT_1 REPORT_2 [REPORT_3 ...] --out DIR

Each REPORT is a report.json of one night of the same nightly config (flows.retrain), oldest first. For every
night k >= 2 the train stage runs again on night k's own training index (its new batch, its replay sample
and the fixed held-out split), continuing from night k-1's drafter, once per recipe. Then one drafter is
trained from scratch (train.* as the first night) on every batch of the last night's pool. The figure is
the trainer's simulated serving AL on the held-out split: the same sequences every night, so every row
compares (offline and served AL agree when the conventions are right: docs/benchmarks.md).
Everything runs here, one stage after another, through the stages' public entry point.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.stage_run import run_stage  # noqa: E402
from eagleflow.config import RunConfig  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest, sha256_file  # noqa: E402
from eagleflow.contracts.stage_records import ExtractOutputs, TrainMetrics  # noqa: E402
from eagleflow.nightly.pool import continuing_train_config  # noqa: E402
from eagleflow.util.files import write_json_atomic  # noqa: E402

# (name, learning rate factor of train.learning_rate, steps as a share of the first night's, replay kept)
RECIPES = [
    ("lr x1, 1/3 steps", 1.0, 1 / 3, True),
    ("lr x1/4, 1/3 steps", 0.25, 1 / 3, True),
    ("lr x1/4, 1/6 steps", 0.25, 1 / 6, True),
    ("lr x1/4, 1/3 steps, no replay", 0.25, 1 / 3, False),
    ("lr x1/10, 1/3 steps", 0.1, 1 / 3, True),
]


def load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def manifest_of(report: dict[str, Any], stage: str) -> Manifest:
    return read_manifest(report["stages"][stage]["manifest"])


def index_variant(pool: Manifest, out: Path, keep: Any) -> Manifest:
    """The pool's training index with only the entries `keep(entry)` accepts, as a manifest the train stage reads."""
    raw = json.loads(Path(pool.path(ExtractOutputs.of(pool).index)).read_text())
    raw["shards"] = [e for e in raw["shards"] if keep(e)]
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "data" / "index.json", raw)
    outputs = ExtractOutputs.of(pool).model_copy(update={"shards": [e["file"] for e in raw["shards"]]})
    return Manifest(
        stage="pool",
        key=out.name,
        dir=str(out),
        outputs=outputs.model_dump(mode="json"),
        hashes={"data/index.json": sha256_file(out / "data" / "index.json")},
    )


def whole_pool(reports: list[dict[str, Any]], out: Path) -> Manifest:
    """Every night's new batch (all its sequences) and the held-out split: what a from-scratch drafter trains on."""
    entries: list[dict[str, Any]] = []
    last = manifest_of(reports[-1], "pool")
    raw = json.loads(Path(last.path("data/index.json")).read_text())
    for r in reports:
        new = manifest_of(r, "extract")
        for e in json.loads(Path(new.path("data/index.json")).read_text())["shards"]:
            if e["split"] == "train":
                entries.append({**e, "file": str(Path(new.dir) / e["file"])})
    raw["shards"] = entries + [e for e in raw["shards"] if e["split"] == "holdout"]
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "data" / "index.json", raw)
    outputs = ExtractOutputs.of(last).model_copy(update={"shards": [e["file"] for e in raw["shards"]]})
    return Manifest(
        stage="pool",
        key=out.name,
        dir=str(out),
        outputs=outputs.model_dump(mode="json"),
        hashes={"data/index.json": sha256_file(out / "data" / "index.json")},
    )


def train(config: RunConfig, data: Manifest, d: Path) -> dict[str, Any]:
    m, wall = run_stage("train", config.model_dump(mode="json"), {"extract": data}, d)
    t = TrainMetrics.of(m)
    return {"steps": t.steps, "holdout_al": t.best.acceptance_length, "seconds": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="report.json of each night, oldest first")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--recipes", nargs="*", default=None, help="names of RECIPES to run (default: all)")
    args = ap.parse_args()
    reports = [load(p) for p in args.reports]
    if len(reports) < 2:
        raise SystemExit("give at least two nights' reports")
    base = RunConfig.model_validate(
        json.loads(Path(manifest_of(reports[0], "train").dir, "request.json").read_text())["config"]
    )
    first = TrainMetrics.of(manifest_of(reports[0], "train"))
    rows: list[dict[str, Any]] = [
        {
            "night": 1,
            "recipe": "first night (train.*)",
            "steps": first.steps,
            "holdout_al": first.best.acceptance_length,
            "seconds": None,
        }
    ]
    recipes = [r for r in RECIPES if args.recipes is None or r[0] in args.recipes]
    for k in range(1, len(reports)):
        pool, prev = manifest_of(reports[k], "pool"), reports[k - 1]["drafter_dir"]
        tokens = ExtractOutputs.of(pool).num_tokens.get("train", 0)
        for j, (name, lr, share, replay) in enumerate(recipes):
            data = (
                pool
                if replay
                else index_variant(pool, args.out / f"night{k + 1}-data-noreplay", lambda e: "select" not in e)
            )
            cfg = base.model_copy(
                update={
                    "nightly": base.nightly.model_copy(
                        update={
                            "train_steps": max(1, int(first.steps * share)),
                            "learning_rate": base.train.learning_rate * lr,
                        }
                    )
                }
            )
            res = train(continuing_train_config(cfg, prev, tokens), data, args.out / f"night{k + 1}-r{j}")
            rows.append({"night": k + 1, "recipe": name, **res})
            print(json.dumps(rows[-1]), flush=True)
    scratch = train(base, whole_pool(reports, args.out / "scratch-data"), args.out / "scratch")
    rows.append({"night": len(reports), "recipe": f"from scratch on the whole pool ({len(reports)} nights)", **scratch})
    print()
    print("| night | recipe | steps | holdout AL | vs night 1 | seconds |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['night']} | {r['recipe']} | {r['steps']} | {r['holdout_al']:.3f} | "
            f"{r['holdout_al'] - first.best.acceptance_length:+.3f} | {r['seconds'] or ''} |"
        )
    (args.out / "recipe.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
