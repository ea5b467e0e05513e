"""Host preflight as a Prefect task: seconds, before any stage starts work. Never cached."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.manifest import Manifest
from tasks.dispatch import STAGE_TASK, dispatch


@task(name="check", **STAGE_TASK, task_run_name="check")
def check(config: RunConfig, upstream: dict[str, Manifest] | None = None) -> Manifest:
    return dispatch("check", config, upstream or {})
