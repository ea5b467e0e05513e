"""One pipeline at a time per GPU host, and no job left behind when a run is cancelled.

Two locks, because runs come from two places. Runs in Prefect queue on a strict global concurrency
limit named after the host (`eagleflow-host-<host.name>`, limit 1, created on first use). Anything
else, a run against another Prefect server or a stage started by hand, meets the lease on the host
itself (`<work_root>/.eagleflow/host.lock`), which fails fast and says who holds it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from eagleflow.config import RunConfig, load_config
from eagleflow.hosts import make_host


def limit_name(config: RunConfig) -> str:
    return f"eagleflow-host-{config.host.name}"


def ensure_limit(name: str) -> None:
    """Create the host's limit (1 slot) unless it exists; an operator may have raised or paused it."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it meanwhile
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


@contextlib.contextmanager
def hold_host(config: RunConfig, what: str) -> Iterator[None]:
    """Queue for the host's concurrency slot, then take the lease on the host; hold both for the block."""
    logger = get_run_logger()
    name = limit_name(config)
    ensure_limit(name)
    logger.info("waiting for host %s (Prefect global concurrency limit %r)", config.host.name, name)
    ctx = FlowRunContext.get()
    owner = str(ctx.flow_run.id) if ctx and ctx.flow_run else "unknown"
    with concurrency(name, occupy=1, strict=True):
        with make_host(config.host) as host, host.lease(owner, what, log=logger.warning):
            logger.info("holding host %s for %s", config.host.name, what)
            yield


def stop_jobs_of_run(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation / on_crashed hook: end every job this flow run still has on its host.

    The dispatch already ends the job it follows when the flow is interrupted; this is the net for a
    flow process that was killed outright (the runner calls the hook after killing it).
    """
    params = (flow_run.parameters or {}).get("params") or {}
    try:
        config = load_config(params.get("config_path", "configs/demo.yaml"), params.get("overrides") or {})
    except Exception as exc:  # noqa: BLE001 - a hook must not raise; say why nothing was stopped
        print(f"cannot stop the jobs of flow run {flow_run.id}: its config does not load: {exc}")
        return
    with make_host(config.host) as host:
        stopped = host.stop_owner(str(flow_run.id))
    print(f"flow run {flow_run.id} ended {state.name}: stopped {len(stopped)} job(s) on {config.host.name}: {stopped}")
