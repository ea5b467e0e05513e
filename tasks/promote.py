"""The promotion gate of the nightly retrain: a new drafter replaces the promoted one only if it is better."""

from __future__ import annotations

import json

from prefect import get_run_logger, task

from eagleflow.config import RunConfig
from eagleflow.hosts import make_host


@task(name="promote")
def promote(config: RunConfig, report: dict, min_speedup: float, min_acceptance_length: float) -> bool:
    """Write `<work_root>/promoted/<run name>.json` when the gate passes; return whether it did."""
    logger = get_run_logger()
    host = make_host(config.host)
    record_path = f"{config.host.work_root.rstrip('/')}/promoted/{config.name}.json"
    current = json.loads(host.read_text(record_path)) if host.exists(record_path) else None
    al = report["drafter"]["mean_acceptance_length"]
    reasons = []
    if report["speedup"] < min_speedup:
        reasons.append(f"speedup {report['speedup']:.2f} < {min_speedup}")
    if al < min_acceptance_length:
        reasons.append(f"mean acceptance length {al:.2f} < {min_acceptance_length}")
    verdict = report.get("verdict") or {}
    if verdict.get("integration_suspect"):
        reasons.append("the benchmark found the engine integration suspect (serving acceptance far below the "
                       "offline estimate): fix the engine side before promoting")
    same_run = report.get("current")  # production's drafter, measured in this very benchmark
    if same_run and report["drafter"]["output_tok_s"] < same_run["output_tok_s"]:
        reasons.append(f"{report['drafter']['output_tok_s']:.1f} output tok/s < the current drafter's "
                       f"{same_run['output_tok_s']:.1f} in the same benchmark")
    if current and al < current["mean_acceptance_length"]:
        reasons.append(f"mean acceptance length {al:.2f} < the promoted drafter's {current['mean_acceptance_length']:.2f}")
    if reasons:
        logger.warning("not promoted: %s", "; ".join(reasons))
        return False
    record = {"drafter_dir": report["drafter_dir"], "mean_acceptance_length": al, "speedup": report["speedup"],
              "report": report.get("path"), "run": report["run"], "created": report["created"]}
    host.write_text(record_path, json.dumps(record, indent=2))
    logger.info("promoted %s (AL %.2f, %.2fx) -> %s", report["drafter_dir"], al, report["speedup"], record_path)
    return True
