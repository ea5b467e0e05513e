"""Where things stand: the latest flow runs of every config (or of one), what each concluded, its stages, and
where each stage's dir is on which host.

    eagleflow status [CONFIG] [--set KEY=VALUE ...] [--limit N]

From the Prefect server of PREFECT_API_URL (without one, the local ephemeral state in PREFECT_HOME,
as `make demo` leaves it): the last N eagleflow flow runs (with CONFIG, of that config only), grouped by config,
each with its state, start and length; a finished run's verdict and report path (tasks.report.RUN_RECORD), a
failed one's cause in its three lines (what failed, the cause, the fix and logs); each stage task with its state and
the stage dir its dispatch recorded
(`tasks.dispatch.record_stage_dir`).
With CONFIG, also the stages of that config as its host has them now: finished (its manifest is there)
or not yet, in pipeline order, under the keys the current settings give.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from eagleflow.config import ConfigError, RunConfig, given_on_command_line, parse_overrides
from eagleflow.hosts import HostError
from flows.params import PlainParams

FLOWS = ("pipeline", "retrain", "benchmark", "bootstrap")
PIPELINE = ("generate", "extract", "train", "export")
# Flow runs read (the server's most) to find the last --limit of one config: Prefect filters runs by no parameter.
SCAN = 200


def _when(run: Any) -> str:
    t = run.start_time or run.expected_start_time
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else "not started"


def _length(seconds: float | None) -> str:
    from eagleflow.util.text import duration_text

    return duration_text(seconds) if seconds else "-"


def config_identity(path: str | None) -> str:
    """One config, however its path was spelled (relative, absolute, through a link): the real path of its file."""
    return os.path.realpath(path) if path else "?"


def _config_of(run: Any) -> str:
    return config_identity(((run.parameters or {}).get("params") or {}).get("config_path"))


def _same_config(run: Any, config_path: str | None) -> bool:
    return config_path is None or _config_of(run) == config_identity(config_path)


def _config_label(path: str) -> str:
    """A config's name (its `name` field) and path; the path alone when it no longer loads."""
    try:
        return f"config {PlainParams(config_path=path).load().name} ({path})"
    except (ConfigError, OSError, ValueError):
        return f"config {path} (does not load now)"


def _cause(run: Any) -> list[str]:
    """A failed run's cause: its state message's three lines (eagleflow.contracts.failure: what failed, `cause: ...`,
    the
    fix and the logs) without Prefect's prefix, or the first line of any other message as `cause: ...`."""
    message = (run.state.message if run.state else None) or ""
    lines = [x.strip()[:400] for x in message.splitlines() if x.strip()]
    if not lines:
        return ["cause: no message: open the run's log"]
    first = lines[0].removeprefix("Flow run encountered an exception: ")
    if len(lines) > 1 and lines[1].startswith("cause: "):
        return [f"failed: {first}", *lines[1:3]]
    return [f"cause: {first}"]


def runs_lines(limit: int, config_path: str | None = None) -> list[str]:
    """The last `limit` eagleflow flow runs (of `config_path` only, when given), newest first, grouped by config,
    each with what it concluded, its stage tasks and their dirs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows(flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOWS))))}
        if not flows:
            return ["no eagleflow flow runs on this Prefect server yet"]
        ours = FlowFilter(name=FlowFilterName(any_=list(FLOWS)))
        # Runs that started (or wait to), newest first; the schedule's future runs are one line at the end.
        runs = client.read_flow_runs(
            flow_filter=ours,
            sort=FlowRunSort.START_TIME_DESC,
            limit=SCAN,
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=[StateType.SCHEDULED]))
            ),
        )
        scheduled = client.read_flow_runs(
            flow_filter=ours,
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=SCAN,
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )
        # A scheduled run whose time has come waits for a worker (a triggered run, a late night): it is listed with
        # the others; the first still in the future is the schedule's next.
        now = datetime.now(timezone.utc)
        due = [r for r in scheduled if r.expected_start_time and r.expected_start_time <= now]
        upcoming = [r for r in scheduled if r not in due and _same_config(r, config_path)][:1]
        runs = sorted(runs + due, key=lambda r: r.start_time or r.expected_start_time or now, reverse=True)
        runs = [r for r in runs if _same_config(r, config_path)][:limit]
        if not runs and not upcoming:
            return [f"no eagleflow flow runs{f' of {config_path}' if config_path else ''} yet"]
        by_config: dict[str, list[Any]] = {}
        for run in runs:  # newest first within a config; configs in the order of their newest run
            by_config.setdefault(_config_of(run), []).append(run)
        lines: list[str] = []
        for path, group in by_config.items():
            lines += ([""] if lines else []) + [_config_label(path)]
            for run in group:
                lines += _run_lines(client, run, flows)
        lines += [f"next scheduled: {r.name}  {flows.get(r.flow_id, '?')}  at {_when(r)}" for r in upcoming]
        return lines


def task_label(task_run: Any) -> str:
    """A task run's name without the suffix Prefect adds (`-` and its dynamic key's first 3 characters):
    `benchmark-2f1` -> `benchmark`, `production-down-0` -> `production-down`."""
    suffix = f"-{str(task_run.dynamic_key or '')[:3]}"
    return task_run.name.removesuffix(suffix) if task_run.dynamic_key else task_run.name


def ui_url() -> str:
    """The Prefect UI's address: PREFECT_UI_URL, else PREFECT_API_URL without its /api."""
    from prefect.settings import get_current_settings

    s = get_current_settings()
    ui = s.ui_url or (str(s.api.url or "").removesuffix("/api") or None)
    return (ui or "http://127.0.0.1:4200").rstrip("/")


def failure_pages(client: Any, run_id: Any) -> list[str]:
    """The pages of a failed run's failure artifacts (a failed stage's three lines, then its stage and engine logs:
    tasks.failures), newest first: where an operator should land, not at the top of a long log."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    failures = [a for a in found if (a.key or "").endswith("-failure")]
    return [f"{ui_url()}/artifacts/artifact/{a.id}" for a in sorted(failures, key=lambda a: a.created, reverse=True)]


def run_records(client: Any, run_id: Any) -> tuple[dict[str, str], dict[str, Any] | None]:
    """What a run's tasks recorded in table artifacts: where each stage's dir is (tasks.dispatch.STAGE_RECORD), and
    the run's result, kind, verdict, speedup and report path (tasks.report.RUN_RECORD; None before the report)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from tasks.dispatch import STAGE_RECORD
    from tasks.report import RUN_RECORD

    where: dict[str, str] = {}
    result = None
    for a in client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))):
        if a.description not in (STAGE_RECORD, RUN_RECORD):  # the report, progress, pictures: not ours to read
            continue
        data = json.loads(a.data) if isinstance(a.data, str) else a.data  # a table artifact's JSON
        if not (isinstance(data, list) and data):
            continue
        row = data[0]
        if a.description == STAGE_RECORD:
            where[row["stage"]] = f"{row['host']}:{row['dir']} ({row['how']})"
        else:
            result = row
    return where, result


def verdict_lines(result: dict[str, Any], indent: str = "") -> list[str]:
    """A finished run's whole verdict as report.md says it: its line, then every finding (a setting slower than no
    speculation, acceptance far below the estimate, the triage's blame), then where the report is."""
    lines = [f"{indent}verdict: {result['verdict']}"] if result.get("verdict") else []
    lines += [f"{indent}  - {f}" for f in result.get("findings") or []]
    return [*lines, f"{indent}report: {result['report']}"]


def _run_lines(client: Any, run: Any, flows: dict[Any, str]) -> list[str]:
    """One run: its line, what it concluded (verdict and report, or the cause of its failure), its stage tasks
    with their dirs."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    waiting = "  (waits for a worker on its pool)" if run.state and run.state.type.value == "SCHEDULED" else ""
    lines = [
        f"  {run.name}  {flows.get(run.flow_id, '?')}  {run.state_name or '?'}  {_when(run)}  "
        f"{_length(run.total_run_time.total_seconds() if run.total_run_time else None)}  (flow run {run.id}){waiting}"
    ]
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    where, result = run_records(client, run.id)
    if result is not None:
        lines += verdict_lines(result, "    ")
    if run.state and run.state.type.value in ("FAILED", "CRASHED"):
        lines += [f"    {line}" for line in _cause(run)]
        lines += [f"    failure: {page}" for page in failure_pages(client, run.id)[:1]]
    elif result is None and run.state and run.state.type.value == "COMPLETED" and run.state.message:
        lines.append(f"    {run.state.message.splitlines()[0][:400]}")  # a nightly with nothing new says so
    for t in sorted(tasks, key=lambda t: t.start_time or t.expected_start_time or run.created):
        stage = t.task_key.split("-")[0] if t.task_key else t.name
        name = task_label(t)
        lines.append(
            f"    {name:10} {t.state_name or '?':10} "
            f"{_length(t.total_run_time.total_seconds() if t.total_run_time else None):>8}"
            f"  {where.get(name, where.get(stage, ''))}"
        )
    return lines


def stage_lines(config: RunConfig) -> list[str]:
    """The config's stages on its host now: each finished one's dir, then the first that is not."""
    from eagleflow.contracts.manifest import Manifest, stage_dir
    from eagleflow.hosts import make_host
    from tasks.dispatch import key_for

    lines = [f"stages of {config.name} on {config.host.name} (work root {config.host.work_root}):"]
    found: dict[str, Manifest] = {}
    with make_host(config.host) as host:
        for stage in PIPELINE:
            key = key_for(stage, config, found)
            d = stage_dir(config, stage, key)
            if not host.exists(f"{d}/manifest.json"):
                lines.append(f"    {stage:10} {key}  not finished: {d}")
                lines += [f"    {later:10} (waits for {stage})" for later in PIPELINE[PIPELINE.index(stage) + 1 :]]
                break
            found[stage] = Manifest.model_validate_json(host.read_text(f"{d}/manifest.json"))
            lines.append(f"    {stage:10} {key}  finished in {_length(found[stage].seconds)}: {d}")
    return lines


def main(argv: list[str] | None = None, prog: str = "python -m cli.status") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("config", nargs="?", help="run config (YAML): also show its stages on its host")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field (VALUE is YAML)"
    )
    parser.add_argument("--limit", type=int, default=10, help="flow runs to show (newest first)")
    args = parser.parse_args(argv)
    config = None
    if args.config:
        try:
            overrides = given_on_command_line(args.config, parse_overrides(args.set), os.getcwd())
            config = PlainParams(config_path=args.config, overrides=overrides).load()
        except ConfigError as exc:
            print(f"error: {exc}")
            return 2
    print("\n".join(runs_lines(args.limit, args.config)))
    if config is not None:
        print()
        try:
            print("\n".join(stage_lines(config)))
        except HostError as exc:
            print(f"error: {exc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
