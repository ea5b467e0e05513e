"""Run a deployment from a shell, as its Run button does in the UI: the same typed fields, the same worker.

    eagleflow trigger KIND CONFIG [--drafter PATH] [--epochs N] [...] [--set KEY=VALUE ...] [--wait]

KIND is pipeline, nightly, benchmark or bootstrap: the config's deployment `<config name>-KIND`, registered by
`eagleflow deploy CONFIG`. The typed flags are the fields of that deployment's form (flows.params), checked
against the config before anything is sent; `--set` adds dotted overrides to the ones the deployment was
registered with. The run goes to the deployment's work pool, where a worker (`prefect worker start --pool
eagleflow`) picks it up. Prints the run's page in the UI.

With --wait, follows the run to its end: each stage task as it starts and ends, its progress lines, then the
verdict and the report's path; exit status as `eagleflow run` (0 completed, 1 not, 2 bad input). Without
--wait, returns once the run is created (exit 0). `eagleflow run` and `eagleflow benchmark` run the flow in
their own process instead, no server or worker needed: for a laptop or a one-off; `trigger` is the way to
run what the team's server and workers run, and see it in the UI.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cli.status import failure_pages, run_records, task_label, ui_url, verdict_lines
from eagleflow.config import ConfigError, parse_overrides
from flows.params import (
    FIELD_KEYS,
    BenchmarkParams,
    ConfigParams,
    PlainParams,
    RetrainParams,
    RunParams,
    from_command_line,
    full_name,
)

MODELS: dict[str, type[ConfigParams]] = {
    "pipeline": RunParams,
    "nightly": RetrainParams,
    "benchmark": BenchmarkParams,
    "bootstrap": PlainParams,
}
TEXT_FIELDS = ("drafter", "current_drafter", "host_address")
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
PROGRESS = re.compile(
    r"(^|\s)progress [\w-]+: "
)  # eagleflow.contracts.progress's lines, whatever the log put before them
NO_WORKER_S = 60  # a run still scheduled this long after it was created: say that no worker may be polling its pool


def _stage_lines(client: Any, run_id: Any, seen: dict[str, str]) -> list[str]:
    """Each task run's state when it changed since the last call."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    out = []
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    for t in sorted(tasks, key=lambda t: t.expected_start_time or t.created):
        state = t.state_name or "?"
        if seen.get(str(t.id)) != state:
            seen[str(t.id)] = state
            took = (
                f" after {t.total_run_time.total_seconds():.0f} s" if state == "Completed" and t.total_run_time else ""
            )
            out.append(f"{time.strftime('%H:%M:%S')} {task_label(t)}: {state}{took}")
    return out


def _progress_lines(client: Any, run_id: Any, after: Any) -> tuple[list[str], Any]:
    """The run's log lines since `after` that are stage progress or warnings and errors."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
    if after is not None:
        flt.timestamp = LogFilterTimestamp(after_=after)
    logs = client.read_logs(log_filter=flt, sort=LogSort.TIMESTAMP_ASC, limit=200)
    lines = []
    for log in logs:
        if after is not None and log.timestamp <= after:
            continue
        after = log.timestamp
        msg = log.message.splitlines()[0] if log.message else ""
        if PROGRESS.search(msg) or log.level >= 30:
            lines.append(f"    {msg[:300]}")
    return lines, after


def follow(client: Any, run_id: Any, pool: str, timeout_s: float | None) -> int:
    """Print the run's stages and progress until it ends; its verdict and report; the exit status."""
    seen: dict[str, str] = {}
    after = None
    t0 = time.monotonic()
    warned = False
    while True:
        run = client.read_flow_run(run_id)
        for line in _stage_lines(client, run_id, seen):
            print(line, flush=True)
        lines, after = _progress_lines(client, run_id, after)
        for line in lines:
            print(line, flush=True)
        state = run.state.type.value if run.state else "?"
        if state in FINAL:
            break
        if state == "SCHEDULED" and not warned and time.monotonic() - t0 > NO_WORKER_S:
            print(
                f"the run has waited {NO_WORKER_S} s for a worker: is one polling pool {pool!r}? "
                f"(prefect worker start --pool {pool})",
                flush=True,
            )
            warned = True
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            print(f"error: still {run.state_name} after {timeout_s:.0f} s; the run goes on (eagleflow status)")
            return 1
        time.sleep(2)
    # The run's last log lines reach the server after its final state (Prefect ships logs in batches): drain them.
    for _ in range(3):
        time.sleep(1.5)
        lines, after = _progress_lines(client, run_id, after)
        for line in _stage_lines(client, run_id, seen) + lines:
            print(line, flush=True)
    if state != "COMPLETED":
        # At most three lines (eagleflow.contracts.failure): what failed, the cause, the fix and where the logs are.
        message = "\n".join((run.state.message or "").strip().splitlines()[:3]) or "no message"
        print(f"error: the flow run ended {run.state_name}: {message}")
        for page in failure_pages(client, run_id)[:1]:
            print(f"failure: {page}")
        return 1
    result = run_records(client, run_id)[1]
    if result is None:
        print(f"completed, no report: {run.state.message or 'nothing ran past the selection of new prompts'}")
        return 0
    for line in verdict_lines(result):
        print(line)
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m cli.trigger") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("kind", choices=list(MODELS), help="which of the config's deployments")
    parser.add_argument("config", help="run config (YAML): the one the deployment was registered with, or another")
    for field in sorted({f for m in MODELS.values() for f in m.typed}):
        parser.add_argument(
            f"--{field.replace('_', '-')}",
            dest=field,
            default=None,
            metavar="VALUE",
            help=f"the form's field {field} ({FIELD_KEYS[field]})"
            + ("" if field in TEXT_FIELDS else "; VALUE is YAML"),
        )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted override (YAML value)"
    )
    parser.add_argument("--wait", action="store_true", help="follow the run to its end; exit 1 unless it completes")
    parser.add_argument("--timeout", type=float, default=None, help="with --wait: give up following after this long")
    args = parser.parse_args(argv)

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    model = MODELS[args.kind]
    given = {f: getattr(args, f) for f in FIELD_KEYS if getattr(args, f, None) is not None}
    stray = sorted(set(given) - set(model.typed))
    if stray:
        print(
            f"error: the {args.kind} deployment has no field {', '.join('--' + s.replace('_', '-') for s in stray)}; "
            f"its fields: {', '.join('--' + f.replace('_', '-') for f in model.typed) or 'none'} and --set"
        )
        return 2
    try:
        # Paths and addresses stay text (a directory named `yes` is not a boolean); numbers and lists are YAML.
        typed = {f: v if f in TEXT_FIELDS else yaml.safe_load(v) for f, v in given.items()}
        config_path = str(Path(args.config).resolve())
        name = PlainParams(config_path=config_path).load().name
        with get_client(sync_client=True) as client:
            try:
                dep = client.read_deployment_by_name(full_name(name, args.kind))
            except ObjectNotFound:
                api = os.environ.get("PREFECT_API_URL") or "the local Prefect state (PREFECT_API_URL is unset)"
                print(
                    f"error: no deployment {full_name(name, args.kind)} on {api}: register it with "
                    f"`eagleflow deploy {args.config}`"
                )
                return 2
            registered = ((dep.parameters or {}).get("params") or {}).get("overrides") or {}
            params, _ = from_command_line(model, config_path, typed, parse_overrides(args.set), registered)
            run = client.create_flow_run_from_deployment(
                dep.id, parameters={"params": params.model_dump(mode="json", exclude_none=True)}
            )
            print(
                f"flow run {run.name} of {full_name(name, args.kind)} on pool {dep.work_pool_name}: "
                f"{ui_url()}/runs/flow-run/{run.id}",
                flush=True,
            )
            if not args.wait:
                return 0
            return follow(client, run.id, dep.work_pool_name or "?", args.timeout)
    except (ConfigError, ValidationError, yaml.YAMLError) as exc:
        print(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        print("stopped following; the run goes on (eagleflow status, or cancel it in the UI)")
        return 130


if __name__ == "__main__":
    sys.exit(main())
