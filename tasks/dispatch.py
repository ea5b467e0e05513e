"""The one dispatch path every stage task shares: key, host, request, run, manifest.

Prefect caches manifests, never data. The cache key is the stage key (stage settings, upstream keys,
code version); a cache hit is honoured only while the manifest still exists on the host: otherwise
the task runs with `refresh_cache`, which overwrites the stale record.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from prefect import Task, get_run_logger
from prefect.context import TaskRunContext

from eagleflow.config import RunConfig
from eagleflow.hosts import make_host
from eagleflow.manifest import UPSTREAM, Manifest, stage_dir, stage_key
from eagleflow.stages.common import StageRequest


def _key(stage: str, config: RunConfig, upstream: dict[str, Manifest]) -> str:
    return stage_key(stage, config, {s: upstream[s].key for s in UPSTREAM[stage] if s in upstream})


def stage_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    stage = context.task.name
    return f"eagleflow-{stage}-{_key(stage, parameters['config'], parameters.get('upstream') or {})}"


# Measurements and checks are facts about now: they run every time, each in a directory of its own.
ALWAYS_RUN = ("check", "benchmark")


def dispatch(stage: str, config: RunConfig, upstream: dict[str, Manifest]) -> Manifest:
    """Run `python -m eagleflow.stages.<stage>` on the host; return the manifest it wrote last."""
    logger = get_run_logger()
    host = make_host(config.host)
    key = _key(stage, config, upstream)
    if stage in ALWAYS_RUN:
        key = f"{key}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    d = stage_dir(config, stage, key)
    manifest_path = f"{d}/manifest.json"
    if host.exists(manifest_path):
        logger.info("%s %s is already complete on %s: %s", stage, key, host.name, manifest_path)
        return Manifest.model_validate_json(host.read_text(manifest_path))
    request = StageRequest(stage=stage, key=key, dir=d, config=config, upstream=upstream)
    host.write_text(f"{d}/request.json", request.model_dump_json(indent=2))
    logger.info("running %s %s on %s (log: %s/stage.log)", stage, key, host.name, d)
    host.run([config.host.python, "-m", f"eagleflow.stages.{stage}", f"{d}/request.json"],
             log=logger.info, log_path=f"{d}/stage.log")
    return Manifest.model_validate_json(host.read_text(manifest_path))


@dataclass
class StageRun:
    """A finished stage as the flow sees it: its manifest, whether Prefect's cache served it, its time."""

    manifest: Manifest
    cached: bool
    seconds: float


def run_cached(task: Task, config: RunConfig, upstream: dict[str, Manifest] | None = None) -> StageRun:
    """Call a stage task, honouring a cache hit only if its manifest still exists on the host."""
    upstream = upstream or {}
    stage = task.name
    key = _key(stage, config, upstream)
    present = make_host(config.host).exists(f"{stage_dir(config, stage, key)}/manifest.json")
    start = time.monotonic()
    state = task.with_options(refresh_cache=not present)(config, upstream, return_state=True)
    manifest = state.result()  # raises the task's exception when it failed
    return StageRun(manifest, cached=state.name == "Cached", seconds=time.monotonic() - start)


def finished_upstream(config: RunConfig, stages: tuple[str, ...]) -> dict[str, Manifest]:
    """The manifests of `stages` (in pipeline order) for this config, read from the host, or a clear error."""
    host = make_host(config.host)
    found: dict[str, Manifest] = {}
    for stage in stages:
        key = _key(stage, config, found)
        path = f"{stage_dir(config, stage, key)}/manifest.json"
        if not host.exists(path):
            raise FileNotFoundError(
                f"no finished {stage} stage for run config {config.name!r} on {host.name} ({path}); "
                "run the full pipeline first (deployment 'eagleflow-pipeline' or make demo)"
            )
        found[stage] = Manifest.model_validate_json(host.read_text(path))
    return found
