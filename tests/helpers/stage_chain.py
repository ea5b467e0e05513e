"""Host stages run in a chain as the pipeline runs them, without Prefect: the stage key and directory from
the config and the upstream manifests, request.json, `python -m eagleflow.stages.<stage>`, the manifest."""

from __future__ import annotations

import subprocess
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest, read_manifest, required_upstream, stage_dir, stage_key
from eagleflow.contracts.request import StageRequest

ROOT = Path(__file__).resolve().parents[2]
HOST_PYTHON = str(ROOT / ".hostenv" / "bin" / "python")


def run_stage(
    stage: str, cfg: RunConfig, upstream: dict[str, Manifest], python: str = HOST_PYTHON, timeout: float = 1800
) -> Manifest:
    """The finished stage's manifest (reused when this key already finished); fails with its log's end."""
    key = stage_key(stage, cfg, {s: upstream[s].key for s in required_upstream(stage, cfg) if s in upstream})
    d = Path(stage_dir(cfg, stage, key))
    if (d / "manifest.json").exists():
        return read_manifest(d / "manifest.json")
    d.mkdir(parents=True, exist_ok=True)
    (d / "request.json").write_text(
        StageRequest(stage=stage, key=key, dir=str(d), config=cfg, upstream=upstream).model_dump_json()
    )
    with open(d / "stage.log", "wb") as log:
        rc = subprocess.run(
            [python, "-m", f"eagleflow.stages.{stage}", str(d / "request.json")],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        ).returncode
    assert rc == 0, f"{stage} failed:\n" + (d / "stage.log").read_text()[-4000:]
    return read_manifest(d / "manifest.json")
