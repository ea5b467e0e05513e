"""The nightly's select stage as a Prefect task: runs every night (the prompt source grows), never cached."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch


@task(name="select", **STAGE_TASK, cache_policy=NO_CACHE, task_run_name="select")
def select(host: Host, config: RunConfig, upstream: dict[str, Manifest] | None = None) -> Manifest:
    return dispatch("select", host, config, upstream or {})
