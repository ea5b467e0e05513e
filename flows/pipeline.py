"""The full pipeline: check -> generate -> extract -> train -> export -> benchmark -> report.

`python -m flows.pipeline configs/demo.yaml` runs it once and prints the report.
"""

from __future__ import annotations

import sys

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from eagleflow.config import RunConfig, load_config
from eagleflow.manifest import Manifest
from eagleflow.report import StageTiming, build_report, render_markdown, render_text, write_report
from flows.hold import hold_host, stop_jobs_of_run
from flows.params import RunParams, main_cli
from tasks.benchmark import benchmark
from tasks.check import check
from tasks.dispatch import StageRun, run_cached
from tasks.export import export
from tasks.extract import extract
from tasks.generate import generate
from tasks.train import train


@task(name="report")
def publish_report(config: RunConfig, runs: dict[str, StageRun]) -> dict:
    report = build_report(config.name, {s: r.manifest for s, r in runs.items()},
                          {s: StageTiming(r.seconds, r.cached) for s, r in runs.items()})
    path = write_report(report, config.report_dir)
    report["path"] = str(path)
    create_markdown_artifact(render_markdown(report), key=f"eagleflow-{config.name.lower().replace('_', '-').replace('.', '-')}",
                             description=f"eagleflow report {path}")
    print(render_text(report))
    print(f"report: {path}")
    return report


def train_drafter(config: RunConfig) -> dict[str, StageRun]:
    """Every stage up to the exported drafter, each taken from cache when its manifest still exists."""
    runs: dict[str, StageRun] = {}
    runs["generate"] = run_cached(generate, config)
    runs["extract"] = run_cached(extract, config, {"generate": runs["generate"].manifest})
    runs["train"] = run_cached(train, config, {"extract": runs["extract"].manifest})
    runs["export"] = run_cached(export, config, {"train": runs["train"].manifest})
    return runs


@flow(name="pipeline", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def pipeline(params: RunParams = RunParams()) -> dict:
    config = load_config(params.config_path, params.overrides)
    with hold_host(config, f"pipeline {config.name}"):
        check(config)
        runs = train_drafter(config)
        upstream: dict[str, Manifest] = {"export": runs["export"].manifest, "generate": runs["generate"].manifest}
        runs["benchmark"] = run_cached(benchmark, config, upstream)
    return publish_report(config, runs)


if __name__ == "__main__":
    sys.exit(main_cli(pipeline, __doc__))
