"""The generate stage as a Prefect task."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.hosts import Host
from eagleflow.manifest import Manifest
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


@task(name="generate", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="generate")
def generate(host: Host, config: RunConfig, upstream: dict[str, Manifest]) -> Manifest:
    return dispatch("generate", host, config, upstream)
