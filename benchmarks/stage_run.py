"""Run one real stage the way a host does (`python -m eagleflow.stages.<stage> request.json`) for the benchmarks."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from eagleflow.config import parse_config
from eagleflow.contracts.manifest import Manifest, read_manifest
from eagleflow.contracts.request import StageRequest

ROOT = Path(__file__).resolve().parents[1]


def run_stage(stage: str, config_data: dict, upstream: dict[str, Manifest], stage_dir: Path) -> tuple[Manifest, float]:
    """A fresh run of `stage` in `stage_dir` (its manifest removed first); (manifest, wall seconds).
    The stage's output goes to stage.log; a failure exits with its tail."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "manifest.json").unlink(missing_ok=True)
    req = StageRequest(
        stage=stage, key=stage_dir.name, dir=str(stage_dir), config=parse_config(config_data), upstream=upstream
    )
    (stage_dir / "request.json").write_text(req.model_dump_json(indent=1))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", f"eagleflow.stages.{stage}", str(stage_dir / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    (stage_dir / "stage.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(
            f"{stage} stage in {stage_dir} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return read_manifest(stage_dir / "manifest.json"), wall
