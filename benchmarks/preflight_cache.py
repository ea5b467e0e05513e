"""The benchmark's preflight from scratch against the same preflight read from its kept findings, side by side.

    .hostenv/bin/python benchmarks/preflight_cache.py --rounds 4            (the figures in docs/benchmarks.md)

The command the benchmark stage runs (`python -m eagleflow.engines.preflight`, the demo target, a drafter of the
demo's layout, the demo's engine settings), alternately: cold (an empty cache directory: every check asks the
engine, which it imports) and kept (the cache the first cold run filled: `eagleflow.engines.preflight.cache`),
`--rounds` times each. Per run: wall seconds and the CPU seconds of the process (user + system). Prints each run
and the medians; exits non-zero when a run fails or a kept run did not read the cache. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_once(engine: dict, drafter: Path, cache: Path, out: Path) -> dict:
    argv = [
        sys.executable,
        "-m",
        "eagleflow.engines.preflight",
        "--engine-json",
        json.dumps(engine),
        "--target",
        str(ROOT / "demo" / "target"),
        "--drafter",
        f"drafter={drafter}",
        "--expected-aux",
        "drafter=1,2,3",
        "--temperatures",
        "0,0.7",
        "--disk-path",
        str(out.parent),
        "--cache-dir",
        str(cache),
        "--json",
        str(out),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"the preflight failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    findings = json.loads(out.read_text())["findings"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "kept": findings[0]["check"] == "preflight_cache"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--drafter", type=Path, help="a drafter of the demo's layout (default: one made by make_drafter)")
    args = ap.parse_args()
    engine = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["engine"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        drafter = args.drafter
        if drafter is None:
            sys.path.insert(0, str(ROOT))
            from tests.make_drafter import make_drafter

            drafter = make_drafter(work / "drafter")
        kept_cache = work / "kept"
        run_once(engine, drafter, kept_cache, work / "warm.json")  # fills the kept cache
        rows: dict[str, list[dict]] = {"cold": [], "kept": []}
        for r in range(args.rounds):
            cold = run_once(engine, drafter, work / f"cold-{r}", work / f"cold-{r}.json")
            kept = run_once(engine, drafter, kept_cache, work / f"kept-{r}.json")
            if cold["kept"] or not kept["kept"]:
                raise SystemExit(f"round {r}: the cold run read a cache or the kept run did not: {cold}, {kept}")
            rows["cold"].append(cold)
            rows["kept"].append(kept)
            print(
                f"round {r}: cold {cold['wall_s']} s wall {cold['cpu_s']} s CPU; kept {kept['wall_s']} s wall "
                f"{kept['cpu_s']} s CPU",
                flush=True,
            )
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall_s", "cpu_s")} for k, v in rows.items()}
    print(json.dumps({"rounds": args.rounds, "median": med}, indent=2))
    print(
        f"kept / cold: wall {med['kept']['wall_s'] / med['cold']['wall_s']:.2f}x, "
        f"CPU {med['kept']['cpu_s'] / med['cold']['cpu_s']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
