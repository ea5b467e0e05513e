"""The benchmark stage on a drafter, as a host runs it, twice: where its time goes, part by part.

    python3 benchmarks/benchmark_stage.py --drafter DIR --out DIR [--config configs/demo.yaml] [--set KEY=VALUE ...]

1. The benchmark stage (`python -m eagleflow.stages.benchmark request.json`, `benchmark.drafter` = DIR): the
   preflight, the baseline's and the drafter's engines, their windows, the triage when it runs (with
   `benchmark.triage.when=always` and a small `benchmark.triage.max_s`, its budget cuts it short: the probes left
   are named as not run).
2. The same stage again in a stage dir of its own: the preflight read from its kept findings
   (`engine.preflight_cache`), the baseline's windows reused (`benchmark.reuse_for_h`; its engine not started),
   the new drafter measured again (a new drafter is always measured).
Prints, per run, the stage's seconds, the report's "Where the time went" and the triage's probes not run; the
stage dirs stay under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from stage_run import run_stage  # noqa: E402

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.benchmark_records import BenchmarkMetrics  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    out = args.out.resolve()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    overrides.update({"host.work_root": str(out / "runs"), "benchmark.drafter": str(args.drafter.resolve())})
    cfg = load_config(args.config, overrides).model_dump(mode="json")
    for name in ("first", "again"):
        manifest, wall = run_stage("benchmark", cfg, {}, out / name)
        m = BenchmarkMetrics.of(manifest)
        t = m.verdict.triage
        print(
            json.dumps(
                {
                    "run": name,
                    "stage_s": round(wall, 1),
                    "verdict": m.verdict.summary,
                    "reused": sorted(m.reused),
                    "preflight_kept": bool(m.preflight) and m.preflight[0].check == "preflight_cache",
                    "seconds": m.seconds,
                    "triage_not_run": t.skipped if t else None,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
