"""The train stage as a Prefect task (upstream: extract)."""

from __future__ import annotations

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.hosts import Host
from eagleflow.manifest import Manifest
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


@task(name="train", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="train")
def train(host: Host, config: RunConfig, upstream: dict[str, Manifest],
        env: dict[str, str] | None = None) -> Manifest:
    return dispatch("train", host, config, upstream, env=env)
