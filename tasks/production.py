"""Production windows as the flow sees them: production stopped for the stages that need the GPUs.

With `production.window: pipeline` production goes down once, just before the first of them that has
work to do (a finished stage is never a reason to stop it), and comes back after the last; with
`stage`, around each. Two Prefect tasks, so a person sees in the UI when production went down and
came back: `production-down` starts the window's holder on the host
(`python -m eagleflow.production.window open`, returns once production is down) and
`production-up` releases it and waits until production answers again. Everything the benchmark's own
stop guarantees holds (eagleflow.production.window): a flow that fails gives production back in its
`finally`, a cancelled one through its hook, a killed one through the guardian on the host once the
host lease has been gone for production.orphan_grace_s.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagleflow import EagleflowError
from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import ProductionWindow
from eagleflow.contracts.failure import split_message, three_lines
from eagleflow.contracts.manifest import Manifest
from eagleflow.extraction.backends import backend_of
from eagleflow.hosts import Host
from eagleflow.production.served import link_path
from eagleflow.production.state import RESULT
from eagleflow.production.window import CLOSED
from tasks.dispatch import StageRun, is_finished, run_cached
from tasks.naming import flow_run_owner

WINDOW_CLI = "eagleflow.production.window"
POLL_S = 2.0
CLOSE_MARGIN_S = 300.0  # beyond restore_timeout_s: the holder's own waits


class ProductionWindowError(EagleflowError):
    """Production could not be stopped for the GPU stages, or is not healthy after them."""


def needs_gpus(stage: str, config: RunConfig) -> bool:
    """Whether the stage takes the GPUs production holds. 'auto' devices count: on a GPU host they pick
    CUDA, and a stage fighting production for memory fails hours in."""
    if stage == "extract":
        return backend_of(config).uses_gpus(config)
    if stage == "train":
        return config.train.device != "cpu"
    return stage == "benchmark"


@task(name="production-down", cache_policy=NO_CACHE, task_run_name="production-down: {stage}")
def stop_production(host: Host, config: RunConfig, stage: str) -> dict[str, Any]:
    """Start a window's holder on the host; return its record (token, env for the stages) once production is down."""
    owner = flow_run_owner()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    d = f"{config.host.work_root.rstrip('/')}/production/{stamp}-{owner[-8:]}-{stage}"
    settings = config.production.model_dump(mode="json")
    if config.production.promote == "serve":  # a drafter switched in the window is swapped in at the wake
        settings["drafter_link"] = link_path(config.host.work_root, config.name)
    if config.production.pause == "sleep":  # the wake's probe sends the held-out prompts the canary sends
        g = config.generate
        settings["probe_holdout"] = {
            "prompts_path": g.prompts_path,
            "split": g.split,
            "num_samples": g.num_samples,
            "holdout": g.holdout,
            "seed": g.seed,
        }
        settings["probe_max_tokens"] = config.production.canary_max_tokens or config.benchmark.max_tokens
    argv = [
        config.host.python,
        "-m",
        WINDOW_CLI,
        "open",
        d,
        "--config",
        json.dumps(settings),
        "--work-root",
        config.host.work_root,
        "--owner",
        owner,
        "--stages",
        stage,
    ]
    rc, out, err = host.exec(argv, timeout=config.production.stop_timeout_s + 180)
    lines = [x for x in out.splitlines() if x.startswith("{")]
    rec = json.loads(lines[-1]) if lines else {"error": (err or out)[-3000:]}
    if rc != 0 or "error" in rec:
        cause, fix, _ = split_message(str(rec.get("error")))
        raise ProductionWindowError(
            three_lines(f"production on {host.name} was not stopped for {stage}", cause, fix, [f"{host.name}:{d}"])
        )
    if rec.get("paused"):
        get_run_logger().info(
            "production is asleep on %s (window %s; %s, in %s s)",
            host.name,
            d,
            rec["paused"].get("why"),
            rec["paused"].get("sleep_s"),
        )
    else:
        get_run_logger().info(
            "production is down on %s (window %s; the stop took %s s)", host.name, d, rec.get("stopped_s")
        )
    return {**rec, "dir": d}


@task(name="production-up", cache_policy=NO_CACHE, task_run_name="production-up")
def restore_production(host: Host, config: RunConfig, window: dict[str, Any], stages: list[str]) -> ProductionWindow:
    """Release the window and wait until its holder says production is back (or why not)."""
    d = window["dir"]
    host.write_text(f"{d}/window.release", "")
    # twice: a deployed drafter's start that fails, then the guardian's rollback and second start
    deadline_s = 2 * config.production.restore_timeout_s + CLOSE_MARGIN_S
    deadline = time.monotonic() + deadline_s
    while True:
        # Until the window's record or its guardian's result is there it is still open: a look at two files,
        # not a Python start on the host every poll (one a second or two for the minutes production takes to load)
        status: dict[str, Any] = {}
        if host.exists(f"{d}/{CLOSED}") or host.exists(f"{d}/{RESULT}"):
            rc, out, _ = host.exec([config.host.python, "-m", WINDOW_CLI, "status", d], timeout=60)
            status = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
        if status.get("state") == "closed":
            break
        if time.monotonic() > deadline:
            raise ProductionWindowError(
                three_lines(
                    f"production on {host.name} is not back after the window of {', '.join(stages)}",
                    f"its window did not close within {deadline_s:.0f} s",
                    None,
                    [f"{host.name}:{d}/window.log", f"{host.name}:{d}/production-guardian.log"],
                )
            )
        time.sleep(POLL_S)
    record = ProductionWindow.model_validate({**status["result"], "stages": stages, "dir": d})
    get_run_logger().info(
        "production window of %s closed: %s (down %s s)", ", ".join(stages), record.summary, record.down_s
    )
    if not record.ok:
        raise ProductionWindowError(
            three_lines(
                f"production on {host.name} is NOT healthy after {', '.join(stages)}",
                record.summary,
                None,
                [f"{host.name}:{d}"],
            )
        )
    return record


class Windows:
    """The flow's production windows: opened before a GPU stage with work to do, closed per the config."""

    def __init__(self, host: Host, config: RunConfig):
        self.host, self.config = host, config
        self.records: list[ProductionWindow] = []
        self.open: dict[str, Any] | None = None
        self.stages: list[str] = []

    @property
    def active(self) -> bool:
        return self.config.production.kind != "none"

    def run(
        self,
        stage_task: Task,
        upstream: dict[str, Manifest] | None = None,
        config: RunConfig | None = None,
        label: str | None = None,
    ) -> StageRun:
        """Run a stage task, inside a window when it needs the GPUs and has work to do. `config`: the stage's own
        when it is not the flow's (a nightly pool batch); `label`: its task run's name."""
        stage, upstream, config = stage_task.name, upstream or {}, config or self.config
        if not self.active or not needs_gpus(stage, config) or is_finished(self.host, config, stage, upstream):
            if self.open is not None:
                self.stages.append(label or stage)
            return run_cached(
                stage_task, self.host, config, upstream, env=self.open["env"] if self.open else None, label=label
            )
        if self.open is None:
            self.open = stop_production(self.host, self.config, label or stage)
        self.stages.append(label or stage)
        try:
            return run_cached(stage_task, self.host, config, upstream, env=self.open["env"], label=label)
        finally:
            if self.config.production.window == "stage":
                self.close()

    def hold(self, label: str) -> str:
        """Open a window for `label` unless one is open (a deploy restarts production even when no stage ran);
        return its directory on the host."""
        if self.open is None:
            self.open = stop_production(self.host, self.config, label)
        self.stages.append(label)
        return self.open["dir"]

    def close(self) -> None:
        if self.open is not None:
            window, stages = self.open, self.stages
            self.open, self.stages = None, []
            self.records.append(restore_production(self.host, self.config, window, stages))


@contextlib.contextmanager
def production_windows(host: Host, config: RunConfig) -> Iterator[Windows]:
    """The flow's windows; whatever the stages do, the last one is closed (production given back) on the way out."""
    windows = Windows(host, config)
    try:
        yield windows
    finally:
        windows.close()
