"""Nightly retrain: fresh data (a new generation seed per night), the full pipeline, a promotion gate."""

from __future__ import annotations

import datetime as dt

from prefect import flow
from pydantic import Field

from eagleflow.config import load_config
from flows.params import RunParams
from flows.pipeline import pipeline
from tasks.promote import promote


class RetrainParams(RunParams):
    min_speedup: float = Field(1.0, ge=0, description="Promote only at or above this speedup over no speculation.")
    min_acceptance_length: float = Field(1.5, ge=1, description="Promote only at or above this mean acceptance length.")


@flow(name="retrain", log_prints=True)
def retrain(params: RetrainParams = RetrainParams()) -> bool:
    # A new seed each night draws a new sample of prompts (and so new data); same night, same run.
    seed = int(dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d"))
    overrides = {"generate.seed": seed, **params.overrides}
    report = pipeline(RunParams(config_path=params.config_path, overrides=overrides))
    config = load_config(params.config_path, overrides)
    return promote(config, report, params.min_speedup, params.min_acceptance_length)
