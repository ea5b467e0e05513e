"""The run report as a Prefect task: report.json and report.md (with its pictures) on the control side,
a markdown artifact with the pictures inline, the table printed."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import ProductionWindow
from eagleflow.contracts.stage_records import NightRecord
from eagleflow.hosts import Host
from eagleflow.reporting.report import Report, StageTiming, build_report, render_markdown, render_text, write_report
from tasks.dispatch import StageRun
from tasks.naming import artifact_key
from tasks.pictures import data_uri, fetch_images

RUN_RECORD = "eagleflow run result"  # the description that marks the run's result among its artifacts


@task(name="report", cache_policy=NO_CACHE)
def publish_report(
    host: Host,
    config: RunConfig,
    runs: dict[str, StageRun],
    kind: str,
    windows: list[ProductionWindow] | None = None,
    nights: list[NightRecord] | None = None,
    plots: dict[str, str] | None = None,
) -> Report:
    """`kind`: what ran (pipeline, benchmark, nightly); `nights`: the nightly's record of nights; `plots`: more
    pictures on the host (name -> path)."""
    report = build_report(
        config.name,
        {s: r.manifest for s, r in runs.items()},
        {s: StageTiming(seconds=r.seconds, cached=r.cached) for s, r in runs.items()},
        production_windows=windows or [],
        nights=nights,
        plots_on_host=plots,
        kind=kind,
    )
    images = fetch_images(host, report.plots)
    path = write_report(report, config.report_dir, images)
    create_markdown_artifact(
        render_markdown(report, {n: data_uri(b) for n, b in images.items()}),
        key=artifact_key("eagleflow", config.name),
        description=f"eagleflow report {path}",
    )
    # What `eagleflow status` and `eagleflow trigger --wait` read back: the whole verdict (its line and every finding,
    # as report.md says them) and where the report is.
    create_table_artifact(
        [
            {
                "kind": kind,
                "verdict": report.verdict.summary if report.verdict else None,
                "findings": list(report.verdict.findings) if report.verdict else [],
                "speedup": report.speedup,
                "report": str(path),
            }
        ],
        description=RUN_RECORD,
    )
    print(render_text(report))
    if images:
        print(f"pictures: {', '.join(f'{n}.png' for n in images)} beside report.md in {path.parent}")
    print(f"report: {path}")
    return report
