"""Host bootstrap as a Prefect task: create or update the host environment, publish what the host has.

Never cached: it is a fact about the host now. Retried only after a dropped link (safe: every step
is idempotent, and a second pass installs nothing that is already there).
"""

from __future__ import annotations

import re
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext

from eagleflow.config import RunConfig
from infra import bootstrap as infra_bootstrap
from tasks.dispatch import retry_if_transient


def artifact_key(host_name: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "bootstrap-" + re.sub(r"[^a-z0-9-]+", "-", host_name.lower())


@task(name="bootstrap-host", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient,
      task_run_name="bootstrap-host-{config.host.name}")
def bootstrap_host(config: RunConfig, packages: list[str] | None = None, base_python: str = "python3") -> dict[str, Any]:
    """packages: pip specs; None = the project's pins, [] = only the eagleflow wheel (see infra.bootstrap)."""
    logger = get_run_logger()
    flow_ctx = FlowRunContext.get()
    owner = str(flow_ctx.flow_run.id) if flow_ctx and flow_ctx.flow_run else None
    result = infra_bootstrap.bootstrap(config, packages, log=logger.info, base_python=base_python, owner=owner)
    create_markdown_artifact(infra_bootstrap.render_markdown(result), key=artifact_key(config.host.name),
                             description=f"what host {config.host.name} has after bootstrap")
    return result
