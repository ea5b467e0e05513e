"""Drafters beside a target on a GPU host's engine, with the benchmark's triage probes: the stages as a host runs them.

    python3 benchmarks/triage_gpu.py --config configs/demo-mla.yaml --generate GEN_DIR \\
        --drafter mla=DIR --drafter llama=DIR --out DIR [--triage mla] [--set KEY=VALUE ...]

1. The extract stage (transformers forward on this host's GPU) over the generate stage in GEN_DIR (a copy of
   a finished generate stage dir: its manifest's paths are re-rooted there): the states the triage's
   plumbing probe compares the engine's own with.
2. Per drafter, the benchmark stage (`benchmark.drafter` = DIR, the extract stage as its upstream): baseline
   and drafter measured, and for the drafters named by `--triage` the triage forced on (every probe: ngram on
   copy prompts, the engine's captured states, each other attention backend at k = 1).
Prints one JSON line per drafter (served AL, per-position acceptance, tok/s, the triage's blame and figures)
and leaves each stage dir under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from stage_run import run_stage  # noqa: E402

from eagleflow.config import parse_overrides  # noqa: E402
from eagleflow.contracts.benchmark_records import BenchmarkMetrics  # noqa: E402
from eagleflow.contracts.manifest import read_manifest  # noqa: E402


def config_data(path: Path, out: Path, overrides: dict) -> dict:
    data = yaml.safe_load(path.read_text())
    base = path.parent.absolute()
    data["host"].update(work_root=str(out / "runs"), python=sys.executable)
    for section, key in (("target", "model_path"), ("generate", "prompts_path")):
        data[section][key] = str((base / data[section][key]).resolve())
    data["report_dir"] = str(out / "reports")
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--generate", type=Path, required=True, help="a finished generate stage dir (copied here)")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR", required=True)
    ap.add_argument("--triage", nargs="*", default=[], help="drafter names whose benchmark forces the triage on")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = config_data(args.config, args.out, parse_overrides(args.set))

    gen = read_manifest(args.generate / "manifest.json").model_copy(update={"dir": str(args.generate.absolute())})
    extract, secs = run_stage("extract", data, {"generate": gen}, args.out / "extract")
    print(json.dumps({"stage": "extract", "seconds": round(secs, 1), "metrics": extract.metrics}), flush=True)

    for item in args.drafter:
        name, _, path = item.partition("=")
        bench = json.loads(json.dumps(data))
        bench["benchmark"]["drafter"] = str(Path(path).absolute())
        bench["benchmark"].setdefault("triage", {})["when"] = "always" if name in args.triage else "never"
        t0 = time.perf_counter()
        manifest, _ = run_stage("benchmark", bench, {"extract": extract}, args.out / f"benchmark-{name}")
        m = BenchmarkMetrics.of(manifest)
        d, b = m.drafter, m.baseline
        tri = m.verdict.triage
        print(
            json.dumps(
                {
                    "drafter": name,
                    "seconds": round(time.perf_counter() - t0, 1),
                    "served_al": d.mean_acceptance_length,
                    "per_position": d.per_position_acceptance,
                    "offline_al": m.offline.get("drafter"),
                    "tok_s": {"baseline": round(b.output_tok_s, 1), "drafter": round(d.output_tok_s, 1)},
                    "speedup": round(m.speedup, 3),
                    "verdict": m.verdict.summary,
                    "preflight": [
                        f"{f.level} {f.check}: {f.message}"
                        for f in m.preflight
                        if f.check.startswith(("attention", "mla"))
                    ],
                    "triage": None
                    if tri is None
                    else {
                        "blame": tri.culprit,
                        "lossless": [c.model_dump() for c in tri.lossless],
                        "verify": tri.verify.model_dump() if tri.verify else None,
                        "plumbing": [x.model_dump() for x in tri.plumbing.layers] if tri.plumbing else None,
                        "backends": tri.backends.model_dump() if tri.backends else None,
                        "skipped": tri.skipped,
                        "seconds": round(tri.seconds, 1),
                    },
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
