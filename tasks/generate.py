"""The generate stage as a Prefect task.

With `generate.server: production` the task reads production's API key (a Prefect Secret block named by
production.api_key_secret, else the variable production.api_key_env of this flow run's environment) and
hands it to the stage process in memory: it is never a task parameter, in the request, the job spec on
the host, a log line or an artifact.
"""

from __future__ import annotations

import os

from prefect import task

from eagleflow import EagleflowError
from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.request import PRODUCTION_API_KEY_ENV
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch, stage_cache_key


class MissingSecret(EagleflowError):
    """Production's API key was named in the config but is not where it says."""


def production_api_key(config: RunConfig) -> dict[str, str]:
    """{PRODUCTION_API_KEY_ENV: key} for the stage's environment, or {} when production needs no key."""
    p = config.production
    if config.generate.server != "production":
        return {}
    if p.api_key_secret:
        from prefect.blocks.system import Secret

        try:
            key = Secret.load(p.api_key_secret).get()
        except ValueError as exc:
            raise MissingSecret(
                f"production.api_key_secret: no Prefect Secret block named {p.api_key_secret!r} on "
                f"this Prefect server ({type(exc).__name__}); create it (prefect block create secret) "
                "or set production.api_key_env instead"
            ) from None
        return {PRODUCTION_API_KEY_ENV: str(key)}
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise MissingSecret(
                f"production.api_key_env names {p.api_key_env}, which is not set in this flow run's "
                "environment; export it where the Prefect worker runs, or use production.api_key_secret"
            )
        return {PRODUCTION_API_KEY_ENV: key}
    return {}


@task(name="generate", **STAGE_TASK, cache_key_fn=stage_cache_key, persist_result=True, task_run_name="generate")
def generate(host: Host, config: RunConfig, upstream: dict[str, Manifest]) -> Manifest:
    return dispatch("generate", host, config, upstream, secret_env=production_api_key(config))
