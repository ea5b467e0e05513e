"""The promotion gate of the nightly retrain as a Prefect task: read the promoted record, decide, write.

The rule itself is `eagleflow.nightly.promotion.decide` (pure, unit-tested); this task only moves the record.
"""

from __future__ import annotations

import json

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.hosts import Host
from eagleflow.nightly.promotion import (
    Decision,
    PromotionGate,
    PromotionRecord,
    decide,
    decision_markdown,
    promotion_history_path,
    promotion_record_path,
)
from eagleflow.reporting.report import Report
from tasks.naming import artifact_key


@task(name="promote", cache_policy=NO_CACHE)
def promote(host: Host, config: RunConfig, report: Report, gate: PromotionGate) -> Decision:
    """Write `<work_root>/promoted/<run name>.json` when the gate passes (and append it to
    `<run name>.history.json`); return the decision. It is an artifact either way."""
    logger = get_run_logger()
    path = promotion_record_path(config.host.work_root, config.name)
    promoted = PromotionRecord.model_validate_json(host.read_text(path)) if host.exists(path) else None
    decision = decide(report, promoted, gate)
    if decision.promote:
        assert decision.record is not None
        # The history first: a promotion it lacks would be one a rollback cannot find.
        history_path = promotion_history_path(config.host.work_root, config.name)
        history = json.loads(host.read_text(history_path)) if host.exists(history_path) else []
        history.append(decision.record.model_dump(mode="json"))
        host.write_text(history_path, json.dumps(history, indent=2))
        host.write_text(path, decision.record.model_dump_json(indent=2))
        logger.info(
            "promoted %s (AL %.2f, %.2fx) -> %s",
            decision.record.drafter_dir,
            decision.record.mean_acceptance_length,
            decision.record.speedup,
            path,
        )
    else:
        logger.warning("not promoted: %s", "; ".join(decision.reasons))
    create_markdown_artifact(
        decision_markdown(report, promoted, gate, decision, path),
        key=artifact_key("eagleflow", config.name, "promotion"),
        description="the nightly retrain's promotion decision",
    )
    return decision
