"""The run report as a Prefect task: report.json on the control side, a markdown artifact, the table printed."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.outputs import ProductionWindow
from eagleflow.report import Report, StageTiming, build_report, render_markdown, render_text, write_report
from tasks.dispatch import StageRun
from tasks.naming import artifact_key


@task(name="report", cache_policy=NO_CACHE)
def publish_report(config: RunConfig, runs: dict[str, StageRun],
                   windows: list[ProductionWindow] | None = None) -> Report:
    report = build_report(config.name, {s: r.manifest for s, r in runs.items()},
                          {s: StageTiming(seconds=r.seconds, cached=r.cached) for s, r in runs.items()},
                          production_windows=windows or [])
    path = write_report(report, config.report_dir)
    create_markdown_artifact(render_markdown(report), key=artifact_key("eagleflow", config.name),
                             description=f"eagleflow report {path}")
    print(render_text(report))
    print(f"report: {path}")
    return report
