"""The extract stage as a Prefect task (upstream: generate)."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


@task(name="extract", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="extract")
def extract(
    host: Host, config: RunConfig, upstream: dict[str, Manifest], env: dict[str, str] | None = None
) -> Manifest:
    return dispatch("extract", host, config, upstream, env=env)
