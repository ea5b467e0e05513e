"""The benchmark stage as a Prefect task (upstream: export, generate)."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.manifest import Manifest
from tasks.dispatch import STAGE_TASK, dispatch


@task(name="benchmark", **STAGE_TASK, task_run_name="benchmark")
def benchmark(config: RunConfig, upstream: dict[str, Manifest]) -> Manifest:
    return dispatch("benchmark", config, upstream)
