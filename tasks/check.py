"""The host check as a Prefect task: seconds, before any stage starts work. Never cached."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch


@task(name="check", **STAGE_TASK, cache_policy=NO_CACHE, task_run_name="check")
def check(host: Host, config: RunConfig, upstream: dict[str, Manifest] | None = None) -> Manifest:
    return dispatch("check", host, config, upstream or {})
