"""The full pipeline: check -> generate -> extract -> train -> export -> benchmark -> report.

`python -m flows.pipeline configs/demo.yaml` runs it once and prints the report.
"""

from __future__ import annotations

import sys

from prefect import flow

from eagleflow.config import RunConfig, load_config
from eagleflow.hosts import Host
from eagleflow.report import Report
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import RunParams, main_cli
from tasks.benchmark import benchmark
from tasks.check import check
from tasks.dispatch import StageRun, run_cached
from tasks.export import export
from tasks.extract import extract
from tasks.generate import generate
from tasks.report import publish_report
from tasks.train import train


def run_stages(host: Host, config: RunConfig) -> dict[str, StageRun]:
    """Every stage in order on the run's host; each cached one is taken from cache while its manifest
    still exists there. The benchmark always measures again."""
    check(host, config)
    runs: dict[str, StageRun] = {}
    runs["generate"] = run_cached(generate, host, config)
    runs["extract"] = run_cached(extract, host, config, {"generate": runs["generate"].manifest})
    runs["train"] = run_cached(train, host, config, {"extract": runs["extract"].manifest})
    runs["export"] = run_cached(export, host, config, {"train": runs["train"].manifest})
    runs["benchmark"] = run_cached(benchmark, host, config, {"export": runs["export"].manifest})
    return runs


@flow(name="pipeline", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def pipeline(params: RunParams = RunParams()) -> Report:
    config = load_config(params.config_path, params.overrides)
    with host_slot(config, f"pipeline {config.name}") as host:
        runs = run_stages(host, config)
    return publish_report(config, runs)


if __name__ == "__main__":
    sys.exit(main_cli(pipeline, __doc__))
