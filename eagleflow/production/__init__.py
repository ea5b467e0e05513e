"""The production service on the host: stopped for the benchmark, always given back.

The benchmark needs production's GPUs and port, so it stops production through the operator's own
means (a systemd unit, or the configured stop/start argv) and never signals production itself.
Giving production back must survive everything: success, failure, a cancelled stage (SIGTERM), a
SIGKILLed stage, a dead controller. So the restore is not done by the stage but by a GUARDIAN, a
small detached process started before production is stopped:

    stage                                         guardian (`python -m eagleflow.production.guardian DIR`)
    -----                                         --------
    was production healthy? (was_running)
    flock production.hold, write production.json
    start the guardian, wait for its marker  ---> flock production.watching, write {pid, token}
    stop production                               note the host lease holder (the controller)
    ... engines, each with EAGLEFLOW_TOKEN ...    wait: production.hold free, or controller gone
                                                  for orphan_grace_s -> end the stage's group
    release production.hold                 ---> end leftover engines (only processes whose
    wait for production.restored.json             environment carries the token), start
    (not on cancellation: leave at once)          production if it was running and is down, wait
                                                  healthy, write production.restored.json, exit

Files in the state dir (the benchmark's stage dir):

    production.json            the hold: config, was_running, stage pid/pgid, token, times (kept)
    production.restored.json   the guardian's result {ok, was_running, started, healthy_after_s, ...} (kept)
    production-guardian.log    the guardian's log (kept)
    production-commands.log    output of every stop/start/systemctl command run (kept)
    production.hold            flock held by the stage for the block (transient)
    production.watching        flock held by the guardian for its life, {pid, token} (transient)
    engine-<name>.pid          the engines' pids (written by VllmServer beside engine-<name>.log)

One module per part: `ownership` (which processes are ours: the token), `service` (stop, start, probe
production through the operator's means), `state` (the files above), `downtime` (the stage's side:
`production_stopped`), `guardian` (the restorer), `window` (one stop for several stages: the
pipeline's GPU stages, `python -m eagleflow.production.window`), `deployed` (the drafter production
serves: a link eagleflow switches inside a window, its copies and history, `python -m
eagleflow.production.served`; the guardian rolls a switch back when production cannot start with it,
and restores what a reboot left open: `python -m eagleflow.production.guardian --boot WORK_ROOT`). Imports only the
standard library, httpx and
eagleflow's standard-library helpers, so the guardian starts in a blink; the pydantic
ProductionConfig is only a type here (the guardian rebuilds it from production.json).
"""

from __future__ import annotations

from eagleflow.production.downtime import Downtime, production_stopped
from eagleflow.production.ownership import (
    STOP_ENV,
    TOKEN_ENV,
    WINDOW_ENV,
    end_owned,
    end_owned_group,
    owned,
    owned_pids,
)
from eagleflow.production.service import ProductionError, ProductionService

__all__ = [
    "Downtime",
    "ProductionError",
    "ProductionService",
    "STOP_ENV",
    "TOKEN_ENV",
    "end_owned",
    "end_owned_group",
    "owned",
    "owned_pids",
    "production_stopped",
    "WINDOW_ENV",
]
