"""The eagleflow deployments, registered on the Prefect server from this checkout.

    eagleflow deploy [CONFIG] [--pool eagleflow] [--set KEY=VALUE ...]
    .venv/bin/python -m deployments.deploy [--config configs/demo.yaml] [--pool eagleflow]

- eagleflow-pipeline:  the full run, triggered from the UI
- eagleflow-nightly:   the retrain with a promotion gate, on a cron schedule (02:00 UTC)
- eagleflow-benchmark: the benchmark alone, for a given drafter or the config's finished one
- eagleflow-bootstrap: create or update the host environment, report what the host has

The custom-run form of each shows the typed fields of its parameter model (flows.params: epochs,
samples, temperatures, drafters, host) with the config's values as their defaults, read when this
runs: re-deploy after editing the config, or the form offers the old values (a quick run and the
schedule send no typed field, and so always use the config file as it is). `--set` overrides are
stored in each deployment's parameters and reach every run of it.

They run on a `process` work pool; start a worker with `prefect worker start --pool eagleflow`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentUpdate, WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists

from eagleflow.config import ConfigError, RunConfig, parse_overrides
from flows.params import FIELD_KEYS, BenchmarkParams, ConfigParams, PlainParams, RetrainParams, RunParams

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY_CRON = "0 2 * * *"

DEPLOYMENTS: list[tuple[str, str, str | None, type[ConfigParams], str]] = [
    # (name, entrypoint, cron, parameter model, description)
    ("eagleflow-pipeline", "flows/pipeline.py:pipeline", None, RunParams,
     "Full run: generate, extract, train, export, benchmark; stages come from cache when unchanged."),
    ("eagleflow-nightly", "flows/retrain.py:retrain", NIGHTLY_CRON, RetrainParams,
     "Nightly retrain on fresh data with a promotion gate."),
    ("eagleflow-benchmark", "flows/benchmark.py:benchmark_only", None, BenchmarkParams,
     "Benchmark only: a drafter (parameter `drafter`: a directory or export manifest on the host; empty: the "
     "config's finished one) against no speculation and production's current drafter, production given back."),
    ("eagleflow-bootstrap", "flows/bootstrap.py:bootstrap", None, PlainParams,
     "Create or update the host environment and report python, torch, CUDA, engine, GPUs and disk."),
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


def deploy_all(config_path: str, pool: str, overrides: dict[str, Any] | None = None) -> list[str]:
    config = PlainParams(config_path=config_path, overrides=overrides or {}).load()  # a bad field fails first
    ensure_pool(pool)
    ids = []
    for name, entrypoint, cron, model, description in DEPLOYMENTS:
        f = flow.from_source(source=str(ROOT), entrypoint=entrypoint)
        dep_id = f.deploy(
            name=name, work_pool_name=pool, cron=cron, description=description,
            parameters={"params": {"config_path": config_path, "overrides": overrides or {}}},
            build=False, push=False, print_next_steps=False,
        )
        with get_client(sync_client=True) as client:
            schema = client.read_deployment(dep_id).parameter_openapi_schema or {}
            client.update_deployment(dep_id, DeploymentUpdate(parameter_openapi_schema=form_defaults(schema, model, config)))
        ids.append(str(dep_id))
    return ids


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config_arg", nargs="?", metavar="CONFIG", help="run config the deployments use")
    parser.add_argument("--config", default=None, help="the same, as a flag (default configs/demo.yaml)")
    parser.add_argument("--pool", default="eagleflow", help="process work pool (created when missing)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override every run of these deployments gets (VALUE is YAML)")
    args = parser.parse_args(argv)
    path = args.config_arg or args.config or str(ROOT / "configs" / "demo.yaml")
    try:
        ids = deploy_all(str(Path(path).resolve()), args.pool, parse_overrides(args.set))
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    for dep_id in ids:
        print(dep_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
