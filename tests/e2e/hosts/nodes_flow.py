"""The flow of test_train_nodes.py, served as a deployment (`python tests/e2e/hosts/nodes_flow.py`): the real train
task over the run's hosts, taken as every eagleflow flow takes them, with eagleflow's cancellation hooks. Its
parameters have the shape of the project's flows' (`config_path`, `overrides`), which the hooks read."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from eagleflow.config import load_config
from eagleflow.contracts.manifest import Manifest
from flows.host_slot import host_slot, stop_jobs_of_run
from tasks.train import train

DEPLOYMENT = "train-across-hosts-test"


@flow(name="train-across-hosts", on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def train_across(params: dict, extract: dict, out: str) -> None:
    config = load_config(params["config_path"], params.get("overrides") or {})
    with host_slot(config, "train test") as host:
        manifest = train.with_options(refresh_cache=True, retries=0)(
            host, config, {"extract": Manifest.model_validate(extract)}
        )
    Path(out).write_text(manifest.model_dump_json())


if __name__ == "__main__":
    train_across.serve(name=DEPLOYMENT)
