"""The full pipeline: check -> generate -> extract -> train -> export -> benchmark -> report.

`python -m flows.pipeline configs/demo.yaml` runs it once and prints the report. With a production
service on the host, the stages that need its GPUs run in production windows (tasks.production):
once for all of them (`production.window: pipeline`) or one each (`stage`); generate never stops it.
"""

from __future__ import annotations

import sys
import time

from prefect import flow

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import ProductionWindow
from eagleflow.hosts import Host
from eagleflow.reporting.report import Report
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import RunParams, main_cli
from tasks.benchmark import benchmark
from tasks.check import check, extract_config
from tasks.dispatch import StageRun, run_cached
from tasks.export import export
from tasks.extract import extract
from tasks.generate import generate
from tasks.production import production_windows
from tasks.report import publish_report
from tasks.train import train


def run_stages(host: Host, config: RunConfig) -> tuple[dict[str, StageRun], list[ProductionWindow]]:
    """Every stage in order on the run's host; each cached one is taken from cache while its manifest
    still exists there. The benchmark always measures again. Also returns the production windows."""
    start = time.monotonic()
    runs: dict[str, StageRun] = {"check": StageRun(check(host, config), cached=False, seconds=time.monotonic() - start)}
    with production_windows(host, config) as windows:
        runs["generate"] = run_cached(generate, host, config)
        up = {"generate": runs["generate"].manifest}
        runs["extract"] = windows.run(extract, up, config=extract_config(host, config, runs["check"].manifest, up))
        runs["train"] = windows.run(train, {"extract": runs["extract"].manifest})
        runs["export"] = windows.run(export, {"train": runs["train"].manifest})
        # extract rides along (not in the benchmark's key): the triage compares the engine's states with it
        runs["benchmark"] = windows.run(
            benchmark, {"export": runs["export"].manifest, "extract": runs["extract"].manifest}
        )
    return runs, windows.records


@flow(name="pipeline", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def pipeline(params: RunParams = RunParams()) -> Report:
    config = params.load()
    with host_slot(config, f"pipeline {config.name}") as host:
        runs, windows = run_stages(host, config)
        return publish_report(host, config, runs, "pipeline", windows)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return main_cli(pipeline, __doc__, argv=argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
