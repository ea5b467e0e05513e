"""The benchmark's sequential stopping rule against today's fixed-length windows, on the same engine and drafter.

    .hostenv/bin/python benchmarks/stopping_rule.py CONFIG DRAFTER_DIR --out DIR [--num-prompts 48]
        [--precision 0.05] [--min-requests 8]

Three measurements of the same drafter against no speculation, one after the other in one run:
1. fixed: the benchmark stage as before, every window sending all --num-prompts (baseline and drafter);
2. the rule replayed on (1)'s own rounds: where it would have stopped and the intervals there (the same
   requests, so the difference is the rule alone);
3. sequential: the benchmark stage again with benchmark.precision, live: the baseline reused from (1) (the
   nightly's way), only the drafter measured, each window stopping once its paired speedup's and its AL's
   95% intervals are within the precision.
It prints, per window, the requests each used and the interval half-widths, and whether the verdicts agree:
at every setting the same answer (faster than no speculation: the interval above 1; slower: below 1; no
different: 1 inside it), and the same integration suspicion.
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
from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.benchmark_records import BenchmarkMetrics, Measurement  # noqa: E402
from eagleflow.measure.intervals import StoppingRule, acceptance_length, paired_speedup  # noqa: E402


def half(lo_hi: list[float] | None, value: float | None) -> str:
    if not lo_hi or not value:
        return "-"
    return f"+-{(lo_hi[1] - lo_hi[0]) / 2 / value:.1%}"


def verdict_class(x: dict[str, Any]) -> str:
    lo, hi = x["speedup_ci"] or (x["speedup"], x["speedup"])
    return "faster" if lo > 1 else "slower" if hi < 1 else "no different"


def replay(base: Measurement, new: Measurement, rule: StoppingRule) -> dict[str, Any]:
    """The stopping rule on `new`'s recorded rounds, paired with `base`'s: where it stops, the intervals there."""
    c = new.concurrency
    assert new.round_seconds and new.round_tokens and new.round_drafts and new.round_accepted
    assert base.round_seconds and base.round_tokens
    n = len(new.round_seconds)
    for k in range(1, n + 1):
        sp = paired_speedup(base.round_seconds, base.round_tokens, new.round_seconds[:k], new.round_tokens[:k])
        al = acceptance_length(new.round_accepted[:k], new.round_drafts[:k])
        if k == n or rule.done(k * c, [sp, al]):
            assert sp is not None and al is not None
            return {
                "requests": min(k * c, new.requests or k * c),
                "speedup": sp.value,
                "speedup_ci": [sp.low, sp.high],
                "al": al.value,
                "al_ci": [al.low, al.high],
            }
    raise AssertionError("unreachable")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("drafter")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--precision", type=float, default=0.05)
    ap.add_argument("--min-requests", type=int, default=8)
    args = ap.parse_args()
    args.out = args.out.resolve()
    common = {
        "host.work_root": str(args.out / "runs"),
        "benchmark.drafter": str(Path(args.drafter).resolve()),
        "benchmark.num_prompts": args.num_prompts,
        "benchmark.triage.when": "never",
        "benchmark.min_requests": args.min_requests,
        # The sequential run reuses the fixed run's baseline on purpose: the study compares windows against one
        # baseline, so a change in the machine's load between the two runs must not measure it again.
        "benchmark.reuse_max_load_change": 1.0,
    }
    cfg = load_config(args.config, {**common, "generate.holdout": max(args.num_prompts, 48)})
    fixed, fixed_s = run_stage("benchmark", cfg.model_dump(mode="json"), {}, args.out / "fixed")
    seq_cfg = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"precision": args.precision})})
    seq, seq_s = run_stage("benchmark", seq_cfg.model_dump(mode="json"), {}, args.out / "sequential")
    fm, sm = BenchmarkMetrics.of(fixed), BenchmarkMetrics.of(seq)
    assert "baseline" in sm.reused, "the sequential run was meant to reuse the fixed run's baseline"
    rule = StoppingRule(args.precision, args.min_requests)
    rows = []
    for w in fm.windows:
        if w.variant != "drafter":
            continue
        base = next(
            x
            for x in fm.windows
            if x.variant == "baseline" and (x.temperature, x.concurrency) == (w.temperature, w.concurrency)
        )
        live = next(
            x
            for x in sm.windows
            if x.variant == "drafter" and (x.temperature, x.concurrency) == (w.temperature, w.concurrency)
        )
        frow = next(r for r in fm.verdict.speedups if (r.temperature, r.concurrency) == (w.temperature, w.concurrency))
        srow = next(r for r in sm.verdict.speedups if (r.temperature, r.concurrency) == (w.temperature, w.concurrency))
        rows.append(
            {
                "temperature": w.temperature,
                "concurrency": w.concurrency,
                "fixed": {
                    "requests": w.requests,
                    "speedup": frow.drafter_vs_baseline,
                    "speedup_ci": frow.drafter_vs_baseline_ci,
                    "al": w.mean_acceptance_length,
                    "al_ci": w.al_interval,
                },
                "replayed": replay(base, w, rule),
                "sequential": {
                    "requests": live.requests,
                    "speedup": srow.drafter_vs_baseline,
                    "speedup_ci": srow.drafter_vs_baseline_ci,
                    "al": live.mean_acceptance_length,
                    "al_ci": live.al_interval,
                    "stopped": live.stopped,
                },
            }
        )
    print("| temp | conc | fixed: requests, speedup, AL | the rule on the same rounds | sequential, live |")
    print("|---:|---:|---|---|---|")
    for r in rows:
        cells = []
        for k in ("fixed", "replayed", "sequential"):
            x = r[k]
            cells.append(
                f"{x['requests']}: {x['speedup']:.2f}x {half(x['speedup_ci'], x['speedup'])}, "
                f"AL {x['al']:.2f} {half(x['al_ci'], x['al'])}"
            )
        print(f"| {r['temperature']:g} | {r['concurrency']} | " + " | ".join(cells) + " |")
    # The verdict at each setting: faster (the interval above 1), slower (below 1), or no different from no
    # speculation (1 inside it); the same verdict is the same answer everywhere, and the same suspicion.
    same_class = all(len({verdict_class(r[k]) for k in ("fixed", "replayed", "sequential")}) == 1 for r in rows)
    same = same_class and fm.verdict.integration_suspect == sm.verdict.integration_suspect
    for r in rows:
        print(
            f"temperature {r['temperature']:g}, concurrency {r['concurrency']}: "
            + ", ".join(f"{k} {verdict_class(r[k])}" for k in ("fixed", "replayed", "sequential"))
        )
    used = {k: sum(r[k]["requests"] for r in rows) for k in ("fixed", "replayed", "sequential")}
    print(
        f"\ndrafter requests: fixed {used['fixed']}, the rule replayed {used['replayed']}, sequential "
        f"{used['sequential']} (+ fixed's baseline "
        f"{sum(x.requests or 0 for x in fm.windows if x.variant == 'baseline')}, "
        "reused by the sequential run)"
    )
    print(f"stage wall: fixed {fixed_s:.0f} s (baseline and drafter engines), sequential {seq_s:.0f} s (drafter only)")
    print(f"verdict fixed: {fm.verdict.summary}\nverdict sequential: {sm.verdict.summary}\nsame verdict: {same}")
    (args.out / "stopping_rule.json").write_text(
        json.dumps(
            {"rows": rows, "used": used, "same_verdict": same, "fixed_s": fixed_s, "sequential_s": seq_s}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
