"""The one dispatch path every stage task shares: key, host, request, run, manifest.

Every task gets the flow run's one `Host` (flows.host_slot), so an SSH host is connected once per
run; the same object re-connects by itself after a dropped link.

Prefect caches manifests, never data. The cache key is the stage key (stage settings, upstream keys,
code version); a cache hit is honoured only while the manifest still exists on the host: otherwise
the task runs with `refresh_cache`, which overwrites the stale record.

Retries: a stage task is retried only when the link to the host dropped (`is_transient`); the retry
runs the same job dir with the same attempt id, so an SSH host re-attaches to the job still running
there instead of starting it twice. Failures of the stage itself are never retried blindly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import Task, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.states import State

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest, required_upstream, stage_dir, stage_key
from eagleflow.contracts.request import StageRequest
from eagleflow.hosts import Host, StageFailed, is_transient
from eagleflow.hosts.nodes import check_shared, node_jobs, run_together
from tasks.failures import attach_failure_logs
from tasks.naming import flow_run_owner
from tasks.progress import ProgressArtifacts


def key_for(stage: str, config: RunConfig, upstream: dict[str, Manifest]) -> str:
    return stage_key(
        stage, config, {s: upstream[s].downstream_key for s in required_upstream(stage, config) if s in upstream}
    )


def stage_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    stage = context.task.name
    return f"eagleflow-{stage}-{key_for(stage, parameters['config'], parameters.get('upstream') or {})}"


def retry_if_transient(task: Task, task_run: TaskRun, state: State) -> bool:
    """Prefect's retry_condition_fn: retry a lost connection or an unreachable host, nothing else."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            exc = state.result(raise_on_failure=False)
        except Exception as err:  # noqa: BLE001 - the result itself may be the failure
            exc = err
    return isinstance(exc, BaseException) and is_transient(exc)


# Every stage task: retried after a dropped link (the retry re-attaches), `run_cached` sets how often.
STAGE_TASK = dict(retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient)

# Measurements and checks are facts about now: they run every time, each in a directory of its own.
ALWAYS_RUN = ("check", "benchmark", "select")


def _run_ids() -> tuple[str, str, str]:
    """(owner, attempt, stamp): the flow run that owns the job, the task run (the same across its
    retries), and a UTC stamp fixed at the task run's creation, so a retry finds the same dir."""
    owner, task_ctx = flow_run_owner(), TaskRunContext.get()
    if task_ctx is None:
        return owner, uuid.uuid4().hex, time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run = task_ctx.task_run
    created = run.expected_start_time or run.created
    stamp = created.strftime("%Y%m%dT%H%M%S") if created else time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return owner, str(run.id), stamp


def dispatch(
    stage: str,
    host: Host,
    config: RunConfig,
    upstream: dict[str, Manifest],
    on_failure: Callable[[str, StageFailed], None] | None = None,
    env: dict[str, str] | None = None,
    secret_env: dict[str, str] | None = None,
    nodes: list[Host] | None = None,
) -> Manifest:
    """Run `python -m eagleflow.stages.<stage>` on the host; return the manifest it wrote last.

    `on_failure(stage_dir, error)` runs before a failed stage's error is raised (to attach logs; by
    default its stage.log and engine.log, tasks.failures).
    `env`: added to the stage's environment (a production window's token). `secret_env`: the same,
    but handed over in memory only (an API key): never in request.json, the job spec or a log.
    `nodes`: more hosts that run the stage with this one, one job each, ended together (training across
    hosts, eagleflow.hosts.nodes).
    """
    logger = get_run_logger()
    owner, attempt, stamp = _run_ids()
    key = key_for(stage, config, upstream)
    if stage in ALWAYS_RUN:
        key = f"{key}-{stamp}-{attempt.replace('-', '')[-8:]}"  # UUIDv7: the random end
    d = stage_dir(config, stage, key)
    manifest_path = f"{d}/manifest.json"
    # Prefect's cache record can be gone (a new server, a wiped PREFECT_HOME) while the host still has
    # the finished stage: it is finished, never redone.
    if host.exists(manifest_path):
        logger.info("%s %s is already complete on %s: %s", stage, key, host.name, manifest_path)
        record_stage_dir(stage, key, host, d, "already complete")
        return Manifest.model_validate_json(host.read_text(manifest_path))
    # Atomic (temp + rename): a stage already running read its request when it started.
    request = StageRequest(stage=stage, key=key, dir=d, config=config, upstream=upstream, run=owner)
    host.write_text(f"{d}/request.json", request.model_dump_json(indent=2))
    logger.info("running %s %s on %s (log: %s/stage.log)", stage, key, host.name, d)
    record_stage_dir(stage, key, host, d, "ran")
    progress = ProgressArtifacts(config.name, stage)
    argv = [config.host.python, "-m", f"eagleflow.stages.{stage}", f"{d}/request.json"]
    say = lambda line: logger.info(progress.line(line))  # noqa: E731
    try:
        if nodes:
            check_shared(
                host, nodes, [f"{d}/request.json", config.target.model_path, *(m.dir for m in upstream.values())]
            )
            master = f"{config.train_nodes.master_addr or config.host.address}:{config.train_nodes.master_port}"
            logger.info(
                "%s on %d hosts: %s (rendezvous at %s)",
                stage,
                1 + len(nodes),
                ", ".join([host.name, *(n.name for n in nodes)]),
                master,
            )
            run_together(
                node_jobs(host, nodes, d, master, config.host.python, env),
                argv[1:],
                log=say,
                owner=owner,
                attempt=attempt,
            )
        else:
            host.run_job(d, argv, log=say, owner=owner, attempt=attempt, env=env, secret_env=secret_env)
    except StageFailed as exc:
        if on_failure is not None:
            on_failure(d, exc)
        else:
            attach_failure_logs(config, host, stage, d, exc)
        # Its cause is on the host (the message's three lines, the failure artifact): the control side's frames
        # down to the job would put 40 lines of plumbing between an operator and that cause in the run's log.
        raise exc.with_traceback(None) from None
    return Manifest.model_validate_json(host.read_text(manifest_path))


STAGE_RECORD = "eagleflow stage"  # the description that marks a stage record among a run's artifacts


def record_stage_dir(stage: str, key: str, host: Host, d: str, how: str) -> None:
    """A table artifact of the running task (or flow) run: which stage, where on which host. What
    `eagleflow status` reads back, and what the task's page shows; never the stage's end."""
    try:
        create_table_artifact(
            [{"stage": stage, "key": key, "host": host.name, "dir": d, "how": how}], description=STAGE_RECORD
        )
    except Exception as exc:  # noqa: BLE001
        get_run_logger().warning("no stage record for %s: %s", stage, exc)


@dataclass
class StageRun:
    """A finished stage as the flow sees it: its manifest, whether Prefect's cache served it, its time."""

    manifest: Manifest
    cached: bool
    seconds: float


def is_finished(host: Host, config: RunConfig, stage: str, upstream: dict[str, Manifest]) -> bool:
    """Whether the stage's manifest for these inputs is on the host: a run of it is no work."""
    return stage not in ALWAYS_RUN and host.exists(
        f"{stage_dir(config, stage, key_for(stage, config, upstream))}/manifest.json"
    )


def run_cached(
    task: Task,
    host: Host,
    config: RunConfig,
    upstream: dict[str, Manifest] | None = None,
    env: dict[str, str] | None = None,
    label: str | None = None,
) -> StageRun:
    """Call a stage task, honouring a cache hit only if its manifest still exists on the host.
    `env` (a production window's) reaches the stage process, not the cache key. `label`: the task run's
    name when a flow runs the stage more than once (the nightly's 'generate: holdout')."""
    upstream = upstream or {}
    stage = task.name
    present = host.exists(f"{stage_dir(config, stage, key_for(stage, config, upstream))}/manifest.json")
    start = time.monotonic()
    options: dict[str, Any] = {"task_run_name": label} if label else {}
    state = task.with_options(refresh_cache=not present, retries=config.host.stage_retries, **options)(
        host, config, upstream, **({"env": env} if env else {}), return_state=True
    )
    manifest = state.result()  # raises the task's exception when it failed
    cached = state.name == "Cached"
    if cached:  # the task did not run, so its dispatch said nothing: say where the stage is
        record_stage_dir(stage, manifest.key, host, manifest.dir, "from cache")
    return StageRun(manifest, cached=cached, seconds=time.monotonic() - start)


def finished_upstream(host: Host, config: RunConfig, stages: tuple[str, ...]) -> dict[str, Manifest]:
    """The manifests of `stages` (in pipeline order) for this config, read from the host, or a clear error."""
    found: dict[str, Manifest] = {}
    for stage in stages:
        key = key_for(stage, config, found)
        path = f"{stage_dir(config, stage, key)}/manifest.json"
        if not host.exists(path):
            raise FileNotFoundError(
                f"no finished {stage} stage for run config {config.name!r} on {host.name} ({path}); "
                "run the full pipeline first (the config's NAME-pipeline deployment, or make demo)"
            )
        found[stage] = Manifest.model_validate_json(host.read_text(path))
    return found
