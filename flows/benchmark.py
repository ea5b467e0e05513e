"""Benchmark only: measure a drafter on the engine again, without recomputing anything upstream.

    python -m flows.benchmark configs/demo.yaml                       # this run's exported drafter
    python -m flows.benchmark configs/demo.yaml --drafter /path/on/host/drafter-or-manifest.json

Without a drafter it takes the finished export of the run config (failing, naming the stage, when
the pipeline has not finished for this config on the host). With one (a drafter directory in the
engine's format, or an export stage's manifest.json, on the host) nothing upstream is needed.
"""

from __future__ import annotations

import sys

from prefect import flow

from eagleflow.contracts.manifest import Manifest
from eagleflow.reporting.report import Report
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import BenchmarkParams, main_cli
from tasks.benchmark import benchmark
from tasks.check import check
from tasks.dispatch import StageRun, finished_upstream, run_cached
from tasks.report import publish_report


@flow(name="benchmark", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def benchmark_only(params: BenchmarkParams = BenchmarkParams()) -> Report:
    config = params.load()
    with host_slot(config, f"benchmark {config.name}") as host:
        check(host, config)
        runs: dict[str, StageRun] = {}
        upstream: dict[str, Manifest] = {}
        if not config.benchmark.drafter:
            done = finished_upstream(host, config, ("generate", "extract", "train", "export"))
            runs = {s: StageRun(m, cached=True, seconds=0.0) for s, m in done.items()}
            upstream = {"export": done["export"], "extract": done["extract"]}
        else:
            # A given drafter needs nothing upstream; the run's own states, if they are on the host, give the
            # triage's plumbing probe its reference (they are not part of the benchmark's key).
            try:
                upstream = {"extract": finished_upstream(host, config, ("generate", "extract"))["extract"]}
            except FileNotFoundError:
                upstream = {}
        runs["benchmark"] = run_cached(benchmark, host, config, upstream)
        return publish_report(host, config, runs, "benchmark")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return main_cli(
        benchmark_only,
        __doc__,
        params_cls=BenchmarkParams,
        argv=argv,
        prog=prog,
        extra_args={
            "--drafter": "drafter directory or export manifest.json on the host (a relative path is relative to the "
            "directory you run this in; it must exist)"
        },
    )


if __name__ == "__main__":
    sys.exit(main())
