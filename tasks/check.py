"""The host check as a Prefect task: seconds, before any stage starts work. Never cached. And what the flows take
from it: the config the extract stage runs with."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.stage_records import CAPTURES, CheckMetrics
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch, is_finished


@task(name="check", **STAGE_TASK, cache_policy=NO_CACHE, task_run_name="check")
def check(host: Host, config: RunConfig, upstream: dict[str, Manifest] | None = None) -> Manifest:
    return dispatch("check", host, config, upstream or {})


def extract_config(host: Host, config: RunConfig, checked: Manifest, upstream: dict[str, Manifest]) -> RunConfig:
    """The config the extract stage runs with. With extract.backend 'production': the run's own when its states
    are extracted or production captures; extract.fallback's backend when the check found that production cannot,
    or when states of that backend are already there (a rerun of a night that fell back keeps them)."""
    if config.extract.backend != "production" or config.extract.fallback == "none":
        return config
    if is_finished(host, config, "extract", upstream):
        return config
    fallback = config.extract.model_copy(update={"backend": config.extract.fallback})
    fallen = config.model_copy(update={"extract": fallback})
    found = CheckMetrics.of(checked).production_capture
    if found not in (None, CAPTURES):
        get_run_logger().warning(
            "production cannot capture: the states come from extract.backend %r (extract.fallback)\n%s",
            config.extract.fallback,
            found,
        )
        return fallen
    return fallen if is_finished(host, fallen, "extract", upstream) else config
