"""The eagleflow deployments, registered on the Prefect server from this checkout.

    .venv/bin/python -m deployments.deploy [--config configs/demo.yaml] [--pool eagleflow]

- eagleflow-pipeline:  the full run, triggered from the UI (parameters: config path, overrides)
- eagleflow-nightly:   the retrain with a promotion gate, on a cron schedule (02:00 UTC)
- eagleflow-benchmark: the benchmark alone, for a given drafter or the config's finished one
- eagleflow-bootstrap: create or update the host environment, report what the host has

They run on a `process` work pool; start a worker with `prefect worker start --pool eagleflow`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY_CRON = "0 2 * * *"

DEPLOYMENTS = [
    # (name, entrypoint, cron, description)
    ("eagleflow-pipeline", "flows/pipeline.py:pipeline", None,
     "Full run: generate, extract, train, export, benchmark; stages come from cache when unchanged."),
    ("eagleflow-nightly", "flows/retrain.py:retrain", NIGHTLY_CRON,
     "Nightly retrain on fresh data with a promotion gate."),
    ("eagleflow-benchmark", "flows/benchmark.py:benchmark_only", None,
     "Benchmark only: a drafter (parameter `drafter`: a directory or export manifest on the host; empty: the "
     "config's finished one) against no speculation and production's current drafter, production given back."),
    ("eagleflow-bootstrap", "flows/bootstrap.py:bootstrap", None,
     "Create or update the host environment and report python, torch, CUDA, engine, GPUs and disk."),
]


def ensure_pool(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def deploy_all(config_path: str, pool: str) -> list[str]:
    ensure_pool(pool)
    ids = []
    for name, entrypoint, cron, description in DEPLOYMENTS:
        f = flow.from_source(source=str(ROOT), entrypoint=entrypoint)
        ids.append(str(f.deploy(
            name=name, work_pool_name=pool, cron=cron, description=description,
            parameters={"params": {"config_path": config_path, "overrides": {}}},
            build=False, push=False, print_next_steps=False,
        )))
    return ids


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="run config the deployments use")
    parser.add_argument("--pool", default="eagleflow", help="process work pool (created when missing)")
    args = parser.parse_args()
    for dep_id in deploy_all(str(Path(args.config).resolve()), args.pool):
        print(dep_id)
