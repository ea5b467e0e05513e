"""The nightly pool (eagleflow.nightly.pool): a source that grows is read in order with repeats dropped by content, the
holdout is a seeded choice, a night takes prompts never used, replay and eviction are deterministic, and a
continuing night's config continues from the promoted drafter for nightly.train_steps steps."""

from __future__ import annotations

import json

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.prompts import PromptError
from eagleflow.nightly.pool import (
    Ledger,
    PoolBatch,
    batch_config,
    batch_id,
    choose_holdout,
    choose_new,
    continuing_train_config,
    evict,
    prompt_hash,
    read_source,
    replay_sample,
)
from tests.conftest import ROOT


def write(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def test_a_source_directory_is_read_in_name_order_with_repeats_dropped_by_content(tmp_path):
    write(tmp_path / "2026-12-01.jsonl", ["a", "b", "a"])
    write(tmp_path / "2026-12-02.jsonl", ["c", "b"])
    (tmp_path / "notes.txt").write_text("not prompts")
    (tmp_path / "2026-12-03.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    prompts, repeats = read_source(tmp_path)
    assert [m[0]["content"] for _, m in prompts] == ["a", "b", "c"]
    assert repeats == 3  # "a" twice more ({"prompt"} and {"messages"} forms are the same prompt), "b" once
    assert prompts[0][0] == prompt_hash([{"role": "user", "content": "a"}])
    single, _ = read_source(tmp_path / "2026-12-02.jsonl")
    assert len(single) == 2
    with pytest.raises(PromptError, match="nightly.source"):
        read_source(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PromptError, match="no \\*.jsonl"):
        read_source(empty)


def test_the_holdout_is_a_seeded_choice_and_a_night_takes_unused_prompts_in_order(tmp_path):
    write(tmp_path / "p.jsonl", [f"q{i}" for i in range(20)])
    prompts, _ = read_source(tmp_path / "p.jsonl")
    held = choose_holdout(prompts, 5, seed=0)
    assert held == choose_holdout(prompts, 5, seed=0) != choose_holdout(prompts, 5, seed=1)
    assert [p for p in prompts if p in held] == held  # in source order
    with pytest.raises(PromptError, match="hold out fewer"):
        choose_holdout(prompts, 20, seed=0)
    used = {h for h, _ in held}
    first = choose_new(prompts, used, 6)
    assert len(first) == 6 and not {h for h, _ in first} & used
    second = choose_new(prompts, used | {h for h, _ in first}, 6)
    assert not {h for h, _ in second} & {h for h, _ in first}
    assert len(choose_new(prompts, used | {h for h, _ in prompts}, 6)) == 0
    assert batch_id([h for h, _ in first]) == batch_id([h for h, _ in first]) != batch_id([h for h, _ in second])


def test_replay_is_a_seeded_sample_in_order():
    cands = [("s", j, 10) for j in range(100)]
    a = replay_sample(cands, 10, seed=3)
    assert a == replay_sample(cands, 10, seed=3) and len(a) == 10 and a == sorted(a)
    assert replay_sample(cands, 10, seed=4) != a
    assert replay_sample(cands, 500, seed=3) == cands


def test_eviction_takes_the_oldest_batches_until_the_pool_fits_and_never_tonights():
    ledger = Ledger(batches=[PoolBatch(id=f"b{i}", file="", prompts=[], bytes=100) for i in range(4)])
    assert evict(ledger, None, keep={"b3"}) == []
    assert [b.id for b in evict(ledger, 250, keep={"b3"})] == ["b0", "b1"]
    ledger.batches[0].evicted = 1.0  # already gone: not counted, not evicted again
    assert [b.id for b in evict(ledger, 150, keep={"b3"})] == ["b1", "b2"]
    assert [b.id for b in evict(ledger, 0, keep={"b3"})] == ["b1", "b2"]  # tonight's stays even over the budget


def test_a_batch_config_answers_every_prompt_in_one_split_and_keeps_the_rest():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    held = batch_config(cfg, "/pool/holdout.jsonl", "holdout")
    assert held.generate.prompts_path == "/pool/holdout.jsonl" and held.generate.split == "holdout"
    assert held.train == cfg.train and held.benchmark == cfg.benchmark


def test_a_continuing_night_starts_from_the_promoted_drafter_with_a_fresh_schedule_bounded_by_steps():
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"nightly.train_steps": 30, "nightly.learning_rate": 5e-4})
    night = continuing_train_config(cfg, "/w/export/abc/vllm", train_tokens=40 * cfg.train.batch_tokens)
    t = night.train
    assert t.warm_start == "/w/export/abc/vllm" and t.max_steps == 30 and t.learning_rate == 5e-4
    assert t.warm_start_vocab == "keep" and t.epochs == 2  # 40 steps an epoch: one holds the 30, one to spare
    assert t.warmup_steps == 3
    rebuilt = continuing_train_config(
        load_config(ROOT / "configs" / "demo.yaml", {"nightly.rebuild_vocab": True}), "/d", train_tokens=10
    )
    assert rebuilt.train.warm_start_vocab == "rebuild" and rebuilt.train.learning_rate == cfg.train.learning_rate / 4
