"""The promotion gate of the nightly retrain as a Prefect task: read the promoted record, decide, write.

The rule itself is `eagleflow.promotion.decide` (pure, unit-tested); this task only moves the record.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.hosts import Host
from eagleflow.promotion import PromotionGate, PromotionRecord, decide, promotion_record_path
from eagleflow.report import Report


@task(name="promote", cache_policy=NO_CACHE)
def promote(host: Host, config: RunConfig, report: Report, gate: PromotionGate) -> bool:
    """Write `<work_root>/promoted/<run name>.json` when the gate passes; return whether it did."""
    logger = get_run_logger()
    path = promotion_record_path(config.host.work_root, config.name)
    promoted = PromotionRecord.model_validate_json(host.read_text(path)) if host.exists(path) else None
    decision = decide(report, promoted, gate)
    if not decision.promote:
        logger.warning("not promoted: %s", "; ".join(decision.reasons))
        return False
    assert decision.record is not None
    host.write_text(path, decision.record.model_dump_json(indent=2))
    logger.info("promoted %s (AL %.2f, %.2fx) -> %s", decision.record.drafter_dir,
                decision.record.mean_acceptance_length, decision.record.speedup, path)
    return True
