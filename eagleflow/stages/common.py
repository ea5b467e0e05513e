"""What every host-side stage shares: reading its request, logging, writing its manifest last.

A stage runs as `python -m eagleflow.stages.<stage> <stage_dir>/request.json`. The request
(`eagleflow.contracts.request.StageRequest`) holds the validated run config, the stage key and the upstream
manifests; the stage writes its outputs under its directory and `manifest.json` last. A stage that fails exits non-zero
with its cause and fix on its last
lines (eagleflow.contracts.failure) and leaves no manifest, so nothing half-written is ever taken as complete.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.failure import stage_ending
from eagleflow.contracts.manifest import Manifest, read_manifest, stage_dir, stage_key, write_manifest
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import CheckMetrics
from eagleflow.production import ProductionError
from eagleflow.util.text import size_text

log = logging.getLogger("eagleflow")

StageFn = Callable[[StageRequest], Manifest]


def planned_seconds(cfg: RunConfig, stage: str) -> float | None:
    """What the check stage's capacity plan gave `stage` on this host (the check's manifest under host.work_root):
    the time left a progress line says before the stage's own rate is known. None when the check has not run here
    with this config, or planned nothing for the stage."""
    # The check runs every time (its dir is its key, the run's time and attempt): the newest finished one.
    base = Path(stage_dir(cfg, "check", stage_key("check", cfg, {})))
    done = sorted(base.parent.glob(f"{base.name}*/manifest.json"), key=lambda p: p.stat().st_mtime)
    try:
        plan = CheckMetrics.of(read_manifest(done[-1])).plan if done else None
    except (OSError, ValueError):
        return None
    planned = next((s for s in plan.stages if s.stage == stage), None) if plan else None
    return planned.seconds if planned and planned.seconds > 0 else None


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per HTTP request would drown the stage's own log in Prefect.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stage_main(stage: str, fn: StageFn, argv: list[str] | None = None) -> int:
    """Entry point of `python -m eagleflow.stages.<stage> request.json`."""
    argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    # SIGTERM (a cancelled task ends our process group) unwinds the stack like Ctrl-C, so `with`
    # blocks run and the engine this stage started is ended with it.
    signal.signal(signal.SIGTERM, _terminate)
    if len(argv) != 1:
        print(f"usage: python -m eagleflow.stages.{stage} <stage_dir>/request.json", file=sys.stderr)
        return 2
    request = None
    try:
        request = StageRequest.model_validate_json(Path(argv[0]).read_text())
        if request.stage != stage:
            raise StageError(f"{argv[0]} is a request for stage {request.stage!r}, not {stage!r}")
        # One line per process that ever worked on this stage dir: how a re-attached retry is told
        # apart from a second copy.
        log.info("%s %s: pid %d on %s", stage, request.key, os.getpid(), socket.gethostname())
        start = time.monotonic()
        manifest = fn(request)
        manifest.seconds = round(time.monotonic() - start, 3)
        write_manifest(manifest)
        log.info("%s done in %.1f s: %s/manifest.json", stage, manifest.seconds, manifest.dir)
        return 0
    except (StageError, ProductionError) as exc:
        print("\n".join(stage_ending(str(exc))), flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - the last lines must carry the cause for the control side
        traceback.print_exc(file=sys.stdout)
        full = disk_full(exc, request)
        print("\n".join(stage_ending(full or f"{type(exc).__name__}: {exc}")), flush=True)
        return 1


def disk_full(exc: BaseException, request: StageRequest | None) -> str | None:
    """The line for a disk that filled while the stage wrote (the OS's ENOSPC, or a writer library's wrapping of
    it), naming the disk and what to do; None for any other error. Nothing of the stage is taken as complete:
    its manifest is written last, and a finished shard is renamed into place only once whole."""
    seen, texts = exc, []
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            break
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    if seen is None and not any(
        m in t for t in texts for m in ("No space left on device", "StorageFull", "os error 28")
    ):
        return None
    where = Path(getattr(seen, "filename", None) or (request.dir if request else "."))
    while not where.exists() and where != where.parent:
        where = where.parent
    usage = shutil.disk_usage(where)
    work_root = request.config.host.work_root if request else "host.work_root"
    return (
        f"the disk holding {where} is full ({size_text(usage.free)} free of {size_text(usage.total)}) while "
        f"the stage wrote there. Nothing partial is taken as complete: finished shards stay, and a rerun resumes "
        f"after the last of them. Free space there (or point host.work_root, now {work_root}, at a larger disk) "
        "and run again"
    )
