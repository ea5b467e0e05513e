"""Host bootstrap as a Prefect task: create or update the host environment, publish what the host has.

Never cached: it is a fact about the host now. Retried only after a dropped link (safe: every step
is idempotent, and a second pass installs nothing that is already there).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from infra import bootstrap as infra_bootstrap
from infra.summary import render_markdown
from tasks.dispatch import retry_if_transient
from tasks.naming import artifact_key, flow_run_owner


@task(
    name="bootstrap-host",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=retry_if_transient,
    task_run_name="bootstrap-host-{config.host.name}",
)
def bootstrap_host(
    config: RunConfig, packages: list[str] | None = None, base_python: str = "python3"
) -> dict[str, Any]:
    """packages: pip specs; None = the project's pins, [] = only the eagleflow wheel (see infra.bootstrap)."""
    logger = get_run_logger()
    result = infra_bootstrap.bootstrap(
        config, packages, log=logger.info, base_python=base_python, owner=flow_run_owner()
    )
    create_markdown_artifact(
        render_markdown(result),
        key=artifact_key("bootstrap", config.host.name),
        description=f"what host {config.host.name} has after bootstrap",
    )
    return result
