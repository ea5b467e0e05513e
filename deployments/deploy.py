"""The eagleflow deployments, registered on the Prefect server from this checkout, four for each config.

    eagleflow deploy CONFIG [CONFIG ...] [--pool eagleflow] [--set KEY=VALUE ...]
    .venv/bin/python -m deployments.deploy [--config configs/demo.yaml] [--pool eagleflow]

For a config named NAME (its `name` field):
- NAME-pipeline:  the full run, triggered from the UI or `eagleflow trigger`
- NAME-nightly:   the retrain with a promotion gate, on the config's `schedule` (cron, time zone; paused
                  unless `schedule.active`: deploying a demo config starts nothing at 02:00)
- NAME-benchmark: the benchmark alone, for a given drafter or the config's finished one
- NAME-bootstrap: create or update the host environment, report what the host has

Several configs share one Prefect server side by side: each config's deployments carry its name, so
deploying one config again replaces its four and leaves every other config's alone. Runs of configs on the
same host queue on that host's concurrency limit (flows.host_slot); runs on different hosts run at once.

The custom-run form of each shows the typed fields of its parameter model (flows.params: epochs,
samples, temperatures, drafters, host) with the config's values as their defaults, read when this
runs: re-deploy after editing the config, or the form offers the old values (a quick run and the
schedule send no typed field, and so always use the config file as it is). `--set` overrides are
stored in each deployment's parameters and reach every run of it.

They run on a `process` work pool; start a worker with `prefect worker start --pool eagleflow`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentUpdate, WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists
from prefect.schedules import Cron

from eagleflow.config import ConfigError, RunConfig, given_on_command_line, parse_overrides
from flows.params import (
    FIELD_KEYS,
    FLOW_OF,
    BenchmarkParams,
    ConfigParams,
    PlainParams,
    RetrainParams,
    RunParams,
    deployment_name,
)

ROOT = Path(__file__).resolve().parents[1]

# (kind, entrypoint, parameter model, description); a config's deployment of a kind is named `<config name>-<kind>`.
KINDS: list[tuple[str, str, type[ConfigParams], str]] = [
    (
        "pipeline",
        "flows/pipeline.py:pipeline",
        RunParams,
        "Full run: generate, extract, train, export, benchmark; stages come from cache when unchanged.",
    ),
    (
        "nightly",
        "flows/retrain.py:retrain",
        RetrainParams,
        "Nightly retrain on fresh data with a promotion gate, on the config's schedule.",
    ),
    (
        "benchmark",
        "flows/benchmark.py:benchmark_only",
        BenchmarkParams,
        "Benchmark only: a drafter (parameter `drafter`: a directory or export manifest on the host; empty: the "
        "config's finished one) against no speculation and production's current drafter, production given back.",
    ),
    (
        "bootstrap",
        "flows/bootstrap.py:bootstrap",
        PlainParams,
        "Create or update the host environment and report python, torch, CUDA, engine, GPUs and disk.",
    ),
]


def ensure_pool(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def config_value(config: RunConfig, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def form_defaults(schema: dict[str, Any], model: type[ConfigParams], config: RunConfig) -> dict[str, Any]:
    """The deployment's parameter schema with the config's value as each typed field's default (what
    the custom-run form shows; Prefect's UI reads `definitions.<Model>.properties.<field>.default`)."""
    props = schema.get("definitions", {}).get(model.__name__, {}).get("properties", {})
    for field in model.typed:
        value = config_value(config, FIELD_KEYS[field])
        if field in props and value is not None:
            props[field]["default"] = value
    return schema


@dataclass
class Deployed:
    """One registered deployment, as `eagleflow deploy` reports it."""

    name: str
    flow: str
    schedule: str
    pool: str
    config: str
    id: str

    def line(self) -> str:
        return f"{self.flow + '/' + self.name:36} {self.schedule:40} pool {self.pool}"


def deploy_config(config_path: str, pool: str, overrides: dict[str, Any] | None = None) -> list[Deployed]:
    """Register one config's four deployments (replacing its own, no one else's)."""
    config = PlainParams(config_path=config_path, overrides=overrides or {}).load()  # a bad field fails first
    ensure_pool(pool)
    out = []
    for kind, entrypoint, model, description in KINDS:
        f = flow.from_source(source=str(ROOT), entrypoint=entrypoint)
        sched = config.schedule if kind == "nightly" else None
        name = deployment_name(config.name, kind)
        # Prefect prints advice on stdout while it registers (where workers load the flow from, how to start one);
        # the operator gets one line per deployment instead.
        with contextlib.redirect_stdout(io.StringIO()):
            dep_id = f.deploy(
                name=name,
                work_pool_name=pool,
                description=f"{description} (config {config_path})",
                schedules=[Cron(sched.cron, timezone=sched.timezone, active=sched.active)] if sched else [],
                parameters={"params": {"config_path": config_path, "overrides": overrides or {}}},
                tags=["eagleflow", f"config:{config.name}", f"host:{config.host.name}"],
                build=False,
                push=False,
                print_next_steps=False,
                ignore_warnings=True,
            )
        with get_client(sync_client=True) as client:
            schema = client.read_deployment(dep_id).parameter_openapi_schema or {}
            client.update_deployment(
                dep_id, DeploymentUpdate(parameter_openapi_schema=form_defaults(schema, model, config))
            )
        out.append(
            Deployed(
                name=name,
                flow=FLOW_OF[kind],
                pool=pool,
                config=config_path,
                id=str(dep_id),
                schedule=sched.describe() if sched else "no schedule (runs when triggered)",
            )
        )
    return out


def deploy_all(config_paths: list[str], pool: str, overrides: dict[str, Any] | None = None) -> list[Deployed]:
    """Every config's deployments; every config is validated before any is registered, and two configs with the
    same name (the same deployment names) are refused."""
    configs = [PlainParams(config_path=p, overrides=overrides or {}).load() for p in config_paths]
    names: dict[str, str] = {}
    for path, config in zip(config_paths, configs):
        if config.name in names:
            raise ConfigError(
                f"{path} and {names[config.name]} are both named {config.name!r}: their deployments would "
                "replace each other; give each config its own `name`"
            )
        names[config.name] = path
    return [d for path in config_paths for d in deploy_config(path, pool, overrides)]


def worker_command(pool: str) -> str:
    """The command that starts a worker on `pool`, with this environment's own `prefect` (a fresh shell has no venv
    on its PATH): relative to the shell's directory when it is below it, as the README writes it."""
    prefect = Path(sys.executable).parent / "prefect"
    here = Path.cwd()
    shown = os.path.relpath(prefect, here) if prefect.is_relative_to(here) else str(prefect)
    return f"{shlex.quote(shown)} worker start --pool {shlex.quote(pool)}"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("configs", nargs="*", metavar="CONFIG", help="run configs, each deployed under its own name")
    parser.add_argument("--config", action="append", default=[], help="the same, as a flag (default configs/demo.yaml)")
    parser.add_argument("--pool", default="eagleflow", help="process work pool (created when missing)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override every run of these deployments gets (VALUE is YAML)",
    )
    args = parser.parse_args(argv)
    paths = [*args.configs, *args.config] or [str(ROOT / "configs" / "demo.yaml")]
    try:
        overrides = parse_overrides(args.set)
        for p in paths:  # a relative path is the shell's; refused for a config whose host is reached over SSH
            given = given_on_command_line(p, overrides, os.getcwd())
        deployed = deploy_all([str(Path(p).resolve()) for p in paths], args.pool, given)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    for d in deployed:
        print(d.line())
    print(f"start a worker: {worker_command(args.pool)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
