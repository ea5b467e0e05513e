"""The nightly retrain's record of nights as Prefect tasks: `nights.json` in the pool directory on the host
(eagleflow.contracts.stage_records.NightRecord, one a night) and its picture, AL by night, drawn on the host."""

from __future__ import annotations

import json

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.stage_records import NightRecord
from eagleflow.hosts import Host
from eagleflow.nightly.pool import NIGHTS

PICTURE = "al-by-night.png"


def read_nights(host: Host, pool_dir: str) -> list[NightRecord]:
    path = f"{pool_dir}/{NIGHTS}"
    return [NightRecord.model_validate(n) for n in json.loads(host.read_text(path))] if host.exists(path) else []


@task(name="record-night", cache_policy=NO_CACHE)
def record_night(
    host: Host, config: RunConfig, pool_dir: str, night: NightRecord
) -> tuple[list[NightRecord], str | None]:
    """Tonight's record into nights.json (a rerun of the same flow run replaces its own), then the picture.
    Returns every night so far and the picture's path on the host (None when it could not be drawn)."""
    nights = [n for n in read_nights(host, pool_dir) if n.run != night.run]
    night = night.model_copy(update={"night": (nights[-1].night + 1) if nights else 1})
    nights.append(night)
    host.write_text(f"{pool_dir}/{NIGHTS}", json.dumps([n.model_dump(mode="json") for n in nights], indent=2))
    picture = f"{pool_dir}/{PICTURE}"
    rc, out, err = host.exec(
        [config.host.python, "-m", "eagleflow.reporting.plots", "nights", f"{pool_dir}/{NIGHTS}", picture]
    )
    if rc != 0:
        get_run_logger().warning("AL-by-night picture not drawn: %s", (err or out)[-500:])
        return nights, None
    return nights, picture


@task(name="record-promotion", cache_policy=NO_CACHE)
def record_promotion(host: Host, pool_dir: str, run: str, promoted: bool, decided_by: str | None = None) -> None:
    nights = read_nights(host, pool_dir)
    for n in nights:
        if n.run == run:
            n.promoted, n.decided_by = promoted, decided_by
    host.write_text(f"{pool_dir}/{NIGHTS}", json.dumps([n.model_dump(mode="json") for n in nights], indent=2))
