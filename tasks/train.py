"""The train stage as a Prefect task (upstream: extract)."""

from __future__ import annotations

import contextlib

from prefect import task

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host, make_host
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


@task(name="train", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="train")
def train(host: Host, config: RunConfig, upstream: dict[str, Manifest], env: dict[str, str] | None = None) -> Manifest:
    with contextlib.ExitStack() as stack:  # the other nodes of a training across hosts: a connection each
        nodes = [stack.enter_context(make_host(n)) for n in config.train_nodes.hosts]
        return dispatch("train", host, config, upstream, env=env, nodes=nodes)
