"""The benchmark stage as a Prefect task (upstream: export, unless benchmark.drafter names the drafter).

Its table and verdict become a markdown artifact, its pictures inline. When it fails, every engine's
log and the guardian's are attached as an artifact too (tasks.failures).
"""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import BenchmarkOutputs
from eagleflow.contracts.manifest import Manifest
from eagleflow.hosts import Host
from tasks.dispatch import STAGE_TASK, dispatch
from tasks.failures import attach_failure_logs
from tasks.naming import artifact_key
from tasks.pictures import data_uri, fetch_images

# The files a failed benchmark leaves that explain it, in the order a reader wants them.
FAILURE_FILES = (
    "stage.log",
    "engine-baseline.log",
    "engine-current.log",
    "engine-drafter.log",
    "engine-triage-verify.log",
    "plumbing-{key}/engine.log",  # the triage's probe engines
    "preflight.json",
    "production.json",
    "production.restored.json",
    "production-guardian.log",
    "production-commands.log",
)


@task(name="benchmark", **STAGE_TASK, cache_policy=NO_CACHE, task_run_name="benchmark")
def benchmark(
    host: Host, config: RunConfig, upstream: dict[str, Manifest], env: dict[str, str] | None = None
) -> Manifest:
    manifest = dispatch(
        "benchmark",
        host,
        config,
        upstream,
        env=env,
        on_failure=lambda d, exc: attach_failure_logs(config, host, "benchmark", d, exc, FAILURE_FILES),
    )
    outputs = BenchmarkOutputs.of(manifest)
    if outputs.report_md is None:  # benchmark.drafter_on 'none': the references only, no table of a drafter yet
        return manifest
    text = host.read_text(manifest.path(outputs.report_md))
    # The stage's report.md links its pictures as files beside it; the UI gets them inline.
    images = fetch_images(host, {n: manifest.path(f) for n, f in outputs.plots.items()})
    for name, data in images.items():
        text = text.replace(f"]({outputs.plots[name]})", f"]({data_uri(data)})")
    create_markdown_artifact(
        text,
        key=artifact_key("eagleflow", config.name, "benchmark"),
        description=f"benchmark table and verdict ({manifest.dir})",
    )
    return manifest
