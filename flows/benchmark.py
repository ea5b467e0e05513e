"""Benchmark only: the finished drafter of a run config, measured again on the engine.

Nothing upstream is recomputed: the flow fails, naming the stage, if the pipeline has not finished
for this config on the host.
"""

from __future__ import annotations

import sys

from prefect import flow

from eagleflow.config import load_config
from flows.hold import hold_host, stop_jobs_of_run
from flows.params import RunParams, main_cli
from flows.pipeline import publish_report
from tasks.benchmark import benchmark
from tasks.check import check
from tasks.dispatch import StageRun, finished_upstream, run_cached


@flow(name="benchmark", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def benchmark_only(params: RunParams = RunParams()) -> dict:
    config = load_config(params.config_path, params.overrides)
    with hold_host(config, f"benchmark {config.name}"):
        check(config)
        done = finished_upstream(config, ("generate", "extract", "train", "export"))
        runs = {s: StageRun(m, cached=True, seconds=0.0) for s, m in done.items()}
        runs["benchmark"] = run_cached(benchmark, config, {"export": done["export"], "generate": done["generate"]})
    return publish_report(config, runs)


if __name__ == "__main__":
    sys.exit(main_cli(benchmark_only, __doc__))
