"""The nightly's pool stage as a Prefect task (upstream: select, the holdout's and tonight's extract stages)."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


@task(name="pool", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="pool")
def pool(host: Host, config: RunConfig, upstream: dict[str, Manifest], env: dict[str, str] | None = None) -> Manifest:
    return dispatch("pool", host, config, upstream, env=env)
