"""The select stage (eagleflow.stages.select) when a night failed: a batch whose night was never recorded in
nights.json is not used. The next night drops it from the ledger and takes its prompts again as new, so a failed
first night still gets its full first batch, and a failed later night's prompts are trained on once its rerun
finishes. A night that was recorded keeps its prompts used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eagleflow.config import RunConfig, load_config
from eagleflow.contracts.manifest import Manifest, read_manifest, stage_key
from eagleflow.contracts.request import StageRequest
from eagleflow.contracts.stage_records import SelectOutputs
from eagleflow.nightly.pool import NIGHTS, read_ledger
from tests.conftest import ROOT


def config(tmp: Path) -> RunConfig:
    source = tmp / "source.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(30)))
    return load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp / "work"),
            "nightly.source": str(source),
            "generate.num_samples": 16,
            "generate.holdout": 4,
            "benchmark.num_prompts": 4,
            "nightly.new_samples": 5,
        },
    )


def select(cfg: RunConfig, run_id: str, name: str) -> Manifest:
    d = Path(cfg.host.work_root) / "select" / name
    d.mkdir(parents=True)
    req = StageRequest(
        stage="select", key=stage_key("select", cfg, {}), dir=str(d), config=cfg, upstream={}, run=run_id
    )
    (d / "request.json").write_text(req.model_dump_json())
    proc = subprocess.run(
        [sys.executable, "-m", "eagleflow.stages.select", str(d / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return read_manifest(d / "manifest.json")


def enter_ledger(pool: Path, sel: SelectOutputs, run_id: str) -> None:
    """What the pool stage does with the night's batch (its data is not under test here)."""
    ledger = pool / "ledger.json"
    batches = json.loads(ledger.read_text())["batches"] if ledger.is_file() else []
    prompts = [json.loads(x)["messages"] for x in Path(sel.batch_file).read_text().splitlines()]
    from eagleflow.nightly.pool import prompt_hash

    batches.append(
        {
            "id": sel.batch_id,
            "file": str(Path(sel.batch_file).relative_to(pool)),
            "prompts": [prompt_hash(m) for m in prompts],
            "run": run_id,
        }
    )
    ledger.write_text(json.dumps({"batches": batches}))


def test_a_failed_first_night_is_taken_again_whole_and_a_recorded_night_stays_used(tmp_path):
    cfg = config(tmp_path)
    first = SelectOutputs.of(select(cfg, "run-1", "n1"))
    assert first.first_night and first.batch_count == 12
    pool = Path(first.pool_dir)
    enter_ledger(pool, first, "run-1")  # the pool stage recorded it; then the night failed (no nights.json line)

    again = SelectOutputs.of(select(cfg, "run-2", "n2"))
    assert again.first_night and again.batch_id == first.batch_id and again.batch_count == 12
    assert read_ledger(pool).batches == []  # dropped: the rerun's pool stage enters it again

    enter_ledger(pool, again, "run-2")
    (pool / NIGHTS).write_text(json.dumps([{"night": 1, "run": "run-2", "batch": again.batch_id}]))
    later = SelectOutputs.of(select(cfg, "run-3", "n3"))
    assert not later.first_night and later.batch_count == 5 and later.batch_id != again.batch_id
    assert later.pool_batches == [again.batch_id]


def test_a_retry_of_the_failed_run_itself_keeps_its_batch(tmp_path):
    cfg = config(tmp_path)
    first = SelectOutputs.of(select(cfg, "run-1", "n1"))
    enter_ledger(Path(first.pool_dir), first, "run-1")
    retry = SelectOutputs.of(select(cfg, "run-1", "n1-retry"))  # Prefect's retry of the same flow run
    assert retry.reused_batch and retry.batch_id == first.batch_id
    assert [b.id for b in read_ledger(Path(first.pool_dir)).batches] == [first.batch_id]
