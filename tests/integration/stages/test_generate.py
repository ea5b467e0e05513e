"""The generate stage (eagleflow.stages.generate) fails loudly and leaves nothing that looks complete:
real vLLM (CPU), real processes. The chat client against no server is tests/integration/engines/test_chat.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.manifest import stage_dir, stage_key
from eagleflow.contracts.request import StageRequest
from eagleflow.hosts import LocalHost, StageFailed
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.integration


def run_stage(stage: str, overrides: dict, tmp_path: Path) -> tuple[Path, list[str]]:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp_path / "runs"),
            "host.python": sys.executable,
            "engine.port": free_port(),
            **overrides,
        },
    )
    key = stage_key(stage, cfg, {})
    d = stage_dir(cfg, stage, key)
    req = Path(d) / "request.json"
    req.parent.mkdir(parents=True)
    req.write_text(StageRequest(stage=stage, key=key, dir=d, config=cfg).model_dump_json())
    lines: list[str] = []
    LocalHost().run([sys.executable, "-m", f"eagleflow.stages.{stage}", str(req)], log=lines.append)
    return Path(d), lines


def test_answers_without_content_fail_the_stage_and_keep_nothing(tmp_path):
    # One output token: the target opens <think> and stops, so the server answers with neither
    # content nor reasoning.
    with pytest.raises(StageFailed) as err:
        run_stage(
            "generate",
            {"generate.max_tokens": 1, "generate.num_samples": 6, "generate.holdout": 2, "benchmark.num_prompts": 2},
            tmp_path,
        )
    msg = str(err.value)
    assert "answer with neither reasoning nor content" in msg and "generate.max_failed_fraction" in msg
    d = next((tmp_path / "runs" / "generate").iterdir())
    assert not (d / "manifest.json").exists()
    assert list((d / "data").glob("*.parquet")) == []


def test_answers_cut_at_max_tokens_are_kept_marked_and_counted(tmp_path):
    # Eight output tokens: the demo target is still thinking; the answer is its own tokens, so data.
    import pyarrow.parquet as pq

    d, _ = run_stage(
        "generate",
        {"generate.max_tokens": 8, "generate.num_samples": 6, "generate.holdout": 2, "benchmark.num_prompts": 2},
        tmp_path,
    )
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["metrics"]["failed"] == 0
    rows = pq.read_table(d / "data" / "shard-00000.parquet").to_pylist()
    assert len(rows) == 6 and manifest["metrics"]["truncated"] == sum(r["truncated"] for r in rows) >= 5
    cut = next(r for r in rows if r["truncated"])
    assert cut["reasoning"] and sum(cut["loss_mask"]) >= 8  # its answer tokens are trained on


def test_engine_that_dies_while_loading_reports_the_root_cause(tmp_path):
    bad = tmp_path / "bad-target"
    bad.mkdir()
    for f in (ROOT / "demo" / "target").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    conf = json.loads((bad / "config.json").read_text())
    conf["architectures"] = ["NoSuchModelForCausalLM"]
    (bad / "config.json").write_text(json.dumps(conf))
    with pytest.raises(StageFailed) as err:
        run_stage(
            "generate",
            {
                "target.model_path": str(bad),
                "generate.num_samples": 4,
                "generate.holdout": 2,
                "benchmark.num_prompts": 2,
            },
            tmp_path,
        )
    msg = str(err.value)
    assert "engine target exited with code" in msg and "NoSuchModelForCausalLM" in msg


def test_empty_prompt_set_fails_naming_the_path(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(StageFailed) as err:
        run_stage(
            "generate",
            {
                "generate.prompts_path": str(empty),
                "generate.num_samples": 4,
                "generate.holdout": 2,
                "benchmark.num_prompts": 2,
            },
            tmp_path,
        )
    assert str(empty) in str(err.value) and "holds no prompts" in str(err.value)
