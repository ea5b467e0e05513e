"""Nightly retrain: fresh data (a new generation seed per night), the full pipeline, a promotion gate."""

from __future__ import annotations

import datetime as dt

from prefect import flow

from eagleflow.promotion import PromotionGate
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import RetrainParams
from flows.pipeline import run_stages
from tasks.promote import promote
from tasks.report import publish_report


@flow(name="retrain", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def retrain(params: RetrainParams = RetrainParams()) -> bool:
    # A new seed each night draws a new sample of prompts (and so new data); same night, same run.
    seed = int(dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d"))
    config = params.load({"generate.seed": seed})
    gate = PromotionGate(min_speedup=params.min_speedup, min_acceptance_length=params.min_acceptance_length)
    with host_slot(config, f"retrain {config.name}") as host:
        report = publish_report(host, config, *run_stages(host, config))
        return promote(host, config, report, gate)
