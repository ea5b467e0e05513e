"""The nightly's select and pool stages (eagleflow.stages.select, eagleflow.stages.pool) over three nights of a
source that grows, with the real extract stage (hf, the demo target) between them: the holdout fixed on the
first night, each night only new prompts, a retry of a night taking its batch again, replay sampled from older
nights into an index the trainer reads, and the oldest night's states evicted for the budget, manifest first.

The answers are token ids written as the generate stage writes them (the serving engine is not under test
here; tests/e2e/flows/test_nightly.py runs the whole night through vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from eagleflow.config import RunConfig, load_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest, stage_dir, stage_key, write_manifest  # noqa: E402
from eagleflow.contracts.prompts import load_prompts  # noqa: E402
from eagleflow.contracts.request import StageRequest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractOutputs, GenerateOutputs, PoolMetrics, SelectOutputs  # noqa: E402
from eagleflow.drafter.data import SequenceStore, read_index  # noqa: E402
from eagleflow.nightly.pool import NIGHTS, batch_config, read_ledger, whole_pool_config  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.integration


def run(stage: str, cfg: RunConfig, upstream: dict[str, Manifest], run_id: str, name: str | None = None) -> Manifest:
    key = stage_key(stage, cfg, {s: m.downstream_key for s, m in upstream.items()})
    d = Path(stage_dir(cfg, stage, name or key))
    if (d / "manifest.json").exists():
        return read_manifest(d / "manifest.json")
    d.mkdir(parents=True, exist_ok=True)
    (d / "request.json").write_text(
        StageRequest(stage=stage, key=key, dir=str(d), config=cfg, upstream=upstream, run=run_id).model_dump_json()
    )
    proc = subprocess.run(
        [sys.executable, "-m", f"eagleflow.stages.{stage}", str(d / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_manifest(d / "manifest.json")


def answered(cfg: RunConfig, split: str) -> Manifest:
    """A finished generate stage of every prompt in cfg.generate.prompts_path: random ids of the demo vocabulary."""
    n = len(load_prompts(cfg.generate.prompts_path))
    key = stage_key("generate", cfg, {})
    d = Path(stage_dir(cfg, "generate", key))
    if (d / "manifest.json").exists():
        return read_manifest(d / "manifest.json")
    (d / "data").mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(int(key[:6], 16))
    lens = torch.randint(20, 60, (n,), generator=g).tolist()
    ids = [torch.randint(0, 512, (k,), generator=g).tolist() for k in lens]
    pq.write_table(
        pa.table({"split": [split] * n, "input_ids": ids, "loss_mask": [[0] * 4 + [1] * (k - 4) for k in lens]}),
        d / "data" / "shard-00000.parquet",
    )
    out = GenerateOutputs(
        shards=["data/shard-00000.parquet"],
        num_train=n if split == "train" else 0,
        num_holdout=n if split == "holdout" else 0,
        num_tokens=sum(lens),
    )
    m = Manifest(stage="generate", key=key, dir=str(d), outputs=out.model_dump())
    write_manifest(m)
    return m


def night(cfg: RunConfig, run_id: str, name: str) -> dict[str, Manifest]:
    sel = run("select", cfg, {}, run_id, name=name)
    s = SelectOutputs.of(sel)
    held, new = batch_config(cfg, s.holdout_file, "holdout"), batch_config(cfg, s.batch_file, "train")
    x_held = run("extract", held, {"generate": answered(held, "holdout")}, run_id)
    x_new = run("extract", new, {"generate": answered(new, "train")}, run_id)
    pool = run("pool", cfg, {"select": sel, "holdout": x_held, "extract": x_new}, run_id)
    record_night(Path(s.pool_dir), run_id, s.batch_id)
    return {"select": sel, "holdout": x_held, "extract": x_new, "pool": pool}


def record_night(pool: Path, run_id: str, batch: str | None) -> None:
    """What the nightly flow does once a night has trained and measured: its line in nights.json (a night never
    recorded failed, and the next night takes its prompts again)."""
    path = pool / NIGHTS
    nights = [n for n in (json.loads(path.read_text()) if path.is_file() else []) if n["run"] != run_id]
    nights.append({"night": len(nights) + 1, "run": run_id, "date": "2026-12-04T00:00:00Z", "batch": batch})
    path.write_text(json.dumps(nights))


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("pool")
    source = tmp / "source"
    source.mkdir()
    lines = (ROOT / "demo" / "prompts.jsonl").read_text().splitlines(keepends=True)
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {
            "host.work_root": str(tmp / "runs"),
            "generate.num_samples": 16,
            "generate.holdout": 4,
            "nightly.source": str(source),
            "nightly.new_samples": 6,
            "nightly.replay": 1.0,
            "extract.device": "cpu",
            "benchmark.num_prompts": 4,
        },
    )
    (source / "a.jsonl").write_text("".join(lines[:20] + lines[:3]))  # three repeats, dropped by content
    out = {"cfg": cfg, "tmp": tmp, "1": night(cfg, "run-1", "n1")}
    (source / "b.jsonl").write_text("".join(lines[20:30]))
    out["2"] = night(cfg, "run-2", "n2")
    out["2-retry"] = night(cfg, "run-2", "n2-retry")  # the same flow run asked again: the same batch
    # What the trainer reads of night 2, before night 3 evicts the first night's states.
    m = out["2"]["pool"]
    index = read_index(m.path(ExtractOutputs.of(m).index), stage_dir=m.dir)
    out["2-read"] = {
        "train": len(SequenceStore(index.split("train"), 4096)),
        "holdout": len(SequenceStore(index.split("holdout"), 4096)),
        "replayed": [str(x.path) for x in index.split("train") if x.select is not None],
    }
    # A night with no promoted drafter to continue (a full run) indexes the whole pool instead of a replay sample.
    n2 = out["2"]
    whole = run(
        "pool",
        whole_pool_config(cfg),
        {"select": n2["select"], "holdout": n2["holdout"], "extract": n2["extract"]},
        "run-2",
    )
    w_index = read_index(whole.path(ExtractOutputs.of(whole).index), stage_dir=whole.dir)
    out["2-whole"] = {"pool": whole, "train": len(SequenceStore(w_index.split("train"), 4096))}
    one = read_ledger(Path(SelectOutputs.of(out["1"]["select"]).pool_dir)).batches[0].bytes
    budget = cfg.model_copy(update={"nightly": cfg.nightly.model_copy(update={"pool_budget_gib": 1.5 * one / 2**30})})
    out["3"] = night(budget, "run-3", "n3")
    return out


def test_the_first_night_holds_out_for_good_and_takes_the_rest_of_its_samples(nights):
    s = SelectOutputs.of(nights["1"]["select"])
    assert s.first_night and s.holdout_count == 4 and s.batch_count == 12 and s.repeats == 3
    assert s.source_prompts == 20 and s.unused_after == 4
    p = PoolMetrics.of(nights["1"]["pool"])
    assert p.replay_sequences == 0 and p.new_sequences == 12 and p.holdout_sequences == 4 and p.batches == 1


def test_later_nights_take_only_unused_prompts_and_replay_older_ones(nights):
    s1, s2 = (SelectOutputs.of(nights[k]["select"]) for k in ("1", "2"))
    assert not s2.first_night and s2.batch_count == 6 and s2.pool_batches == [s1.batch_id]
    assert s2.holdout_id == s1.holdout_id and s2.holdout_file == s1.holdout_file
    first = {json.dumps(m) for m in load_prompts(s1.batch_file)} | {
        json.dumps(m) for m in load_prompts(s1.holdout_file)
    }
    assert not first & {json.dumps(m) for m in load_prompts(s2.batch_file)}
    # the held-out stages are the same every night: the same extract stage, the same index entries
    assert nights["2"]["holdout"].dir == nights["1"]["holdout"].dir
    p2 = PoolMetrics.of(nights["2"]["pool"])
    assert p2.new_sequences == 6 and p2.replay_sequences == 6 and p2.batches == 2 and p2.samples == 18
    # The index is what the trainer reads: the new batch whole, 6 sequences of the first night, the holdout.
    read = nights["2-read"]
    assert read["train"] == 12 and read["holdout"] == 4
    assert read["replayed"] and all(p.startswith(nights["1"]["extract"].dir) for p in read["replayed"])


def test_a_night_without_a_drafter_to_continue_trains_on_the_whole_pool(nights):
    """Issue 44: a night whose full run had only tonight's batch and a replay sample trained on less than the
    first night did; with nightly.whole_pool (set by the nightly when no promoted drafter continues) every
    sequence the pool keeps is in tonight's index."""
    first = PoolMetrics.of(nights["1"]["pool"])
    sampled, whole = PoolMetrics.of(nights["2"]["pool"]), PoolMetrics.of(nights["2-whole"]["pool"])
    assert not sampled.whole_pool and sampled.replay_sequences == sampled.new_sequences  # replay 1.0: one per new
    assert whole.whole_pool and whole.replay_sequences == first.new_sequences > sampled.replay_sequences
    assert (
        nights["2-whole"]["train"]
        == whole.new_sequences + first.new_sequences
        == nights["2-read"]["train"] + (first.new_sequences - sampled.replay_sequences)
    )


def test_a_retry_of_the_same_flow_run_takes_its_batch_again(nights):
    a, b = nights["2"]["select"], nights["2-retry"]["select"]
    assert SelectOutputs.of(b).reused_batch and SelectOutputs.of(b).batch_id == SelectOutputs.of(a).batch_id
    assert b.content_key == a.content_key and nights["2-retry"]["pool"].dir == nights["2"]["pool"].dir


def test_the_oldest_night_is_evicted_for_the_budget_manifest_first(nights):
    s3 = SelectOutputs.of(nights["3"]["select"])
    assert s3.batch_count == 6 and s3.unused_after == 2
    p3 = PoolMetrics.of(nights["3"]["pool"])
    first = SelectOutputs.of(nights["1"]["select"]).batch_id
    assert p3.evicted == [first]
    assert not Path(nights["1"]["extract"].dir).exists()
    ledger = read_ledger(Path(s3.pool_dir))
    assert [b.evicted is not None for b in ledger.batches] == [True, False, False]
    # its prompts stay used; the replay now comes from the second night only
    m = nights["3"]["pool"]
    index = json.loads(Path(m.path("data/index.json")).read_text())
    assert all(nights["1"]["extract"].dir not in e["file"] for e in index["shards"])
    assert p3.replay_sequences == 6 and p3.batches == 2
