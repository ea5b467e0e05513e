"""pool: tonight's training set from the nightly pool; the ledger; the disk budget.

    python -m eagleflow.stages.pool <stage_dir>/request.json

Upstream: `select` (tonight's batch), `extract` (its states) and `holdout` (the held-out prompts'
states, the same extract stage every night). It
1. records tonight's batch in `<work_root>/nightly/<run name>/ledger.json` (once: a rerun finds it);
2. deletes the states of the oldest batches while the pool is over nightly.pool_budget_gib (the
   extract stage's manifest first, so a later run never takes a half-deleted stage as complete;
   their prompts stay used), never tonight's batch nor the holdout;
3. writes `data/index.json`, an extract index (the train stage reads it as it reads extract's) of
   tonight's train shards, a replay sample of the older batches' sequences (nightly.replay per new
   sequence, seeded by generate.seed and this stage's key) and the held-out shards.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from eagleflow.contracts.manifest import Manifest, sha256_file
from eagleflow.contracts.prompts import load_prompts
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import ExtractOutputs, GenerateOutputs, PoolMetrics, SelectOutputs
from eagleflow.nightly.pool import PoolBatch, evict, prompt_hash, read_ledger, replay_sample, write_ledger
from eagleflow.stages.common import stage_main
from eagleflow.util.files import write_json_atomic

log = logging.getLogger("eagleflow.nightly.pool")


def _index(extract: Manifest) -> dict[str, Any]:
    path = Path(extract.path(ExtractOutputs.of(extract).index))
    if not path.is_file():
        raise StageError(f"{path} is gone: the extract stage {extract.dir} was deleted; rerun the nightly")
    raw = json.loads(path.read_text())
    for e in raw["shards"]:  # absolute: this index names the shards of several stages
        e["file"] = str(Path(extract.dir) / e["file"])
    return raw


def _seq_lens(shard: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(shard, framework="pt") as h:
        return [int(n) for n in h.get_tensor("seq_lens").tolist()]


def _drop_stage(stage_dir: str) -> None:
    """Delete a finished stage's directory, its manifest first: never a stage that looks complete but is not."""
    d = Path(stage_dir)
    (d / "manifest.json").unlink(missing_ok=True)
    shutil.rmtree(d, ignore_errors=True)


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    sel = SelectOutputs.of(request.upstream["select"])
    new, held = request.upstream["extract"], request.upstream["holdout"]
    if sel.batch_id is None or sel.batch_file is None:
        raise StageError("select chose no new prompts tonight: there is nothing for the pool to add")
    pool = Path(sel.pool_dir)
    ledger = read_ledger(pool)
    new_index, held_index = _index(new), _index(held)
    new_train = [e for e in new_index["shards"] if e["split"] == "train"]
    batch = ledger.batch(sel.batch_id)
    if batch is None:
        gen_key = new.upstream.get("generate")
        gen_dir = str(Path(cfg.host.work_root) / "generate" / gen_key) if gen_key else None
        samples = 0
        if gen_dir and (Path(gen_dir) / "manifest.json").is_file():
            samples = GenerateOutputs.of(
                Manifest.model_validate_json((Path(gen_dir) / "manifest.json").read_text())
            ).num_train
        batch = PoolBatch(
            id=sel.batch_id,
            file=str(Path(sel.batch_file).relative_to(pool)),
            prompts=[prompt_hash(m) for m in load_prompts(sel.batch_file)],
            run=request.run,
            added=time.time(),
            generate=gen_dir,
            extract=new.dir,
            samples=samples,
            sequences=sum(int(e["num_seqs"]) for e in new_train),
            tokens=sum(int(e["num_tokens"]) for e in new_train),
            bytes=sum(int(e.get("bytes", 0)) for e in new_index["shards"]),
        )
        ledger.batches.append(batch)
        log.info(
            "batch %s enters the pool: %d samples, %d train sequences, %.1f MB of states",
            batch.id,
            batch.samples,
            batch.sequences,
            batch.bytes / 1e6,
        )

    budget = int(cfg.nightly.pool_budget_gib * 2**30) if cfg.nightly.pool_budget_gib else None
    evicted = evict(ledger, budget, keep={batch.id})
    for b in evicted:
        log.info(
            "evicting batch %s (added %s, %.1f MB): the pool is over nightly.pool_budget_gib %s",
            b.id,
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(b.added)),
            b.bytes / 1e6,
            cfg.nightly.pool_budget_gib,
        )
        if b.extract:
            _drop_stage(b.extract)
        b.evicted = time.time()
    if budget is not None and sum(b.bytes for b in ledger.live()) > budget:
        log.warning(
            "tonight's batch alone (%.1f MB) exceeds nightly.pool_budget_gib; raise the budget or lower "
            "nightly.new_samples",
            batch.bytes / 1e6,
        )

    # Replay: a seeded sample of the older batches' train sequences, as many per new sequence as asked.
    older = [b for b in ledger.live() if b.id != batch.id and b.extract]
    candidates: list[tuple[str, int, int]] = []
    entries: dict[str, dict[str, Any]] = {}
    for b in older:
        m_path = Path(b.extract) / "manifest.json"
        if not m_path.is_file():
            log.warning("batch %s: its extract stage %s is gone; it is left out of the replay", b.id, b.extract)
            continue
        for e in _index(Manifest.model_validate_json(m_path.read_text()))["shards"]:
            if e["split"] != "train":
                continue
            entries[e["file"]] = e
            candidates += [(e["file"], j, n) for j, n in enumerate(_seq_lens(e["file"])) if n >= 3]
    # The whole pool (a night with no drafter to continue trains as a full run does) or a replay sample.
    want = len(candidates) if cfg.nightly.whole_pool else round(cfg.nightly.replay * batch.sequences)
    seed = cfg.generate.seed + int(request.key[:8], 16)
    picked = replay_sample(candidates, want, seed)
    by_shard: dict[str, list[int]] = {}
    for f, j, _ in picked:
        by_shard.setdefault(f, []).append(j)
    replay_entries = [{**entries[f], "select": sorted(js)} for f, js in by_shard.items()]
    held_entries = [e for e in held_index["shards"] if e["split"] == "holdout"]
    if not held_entries:
        raise StageError(f"the held-out extract stage {held.dir} has no holdout shard")
    shards = new_train + replay_entries + held_entries

    data = request.path / "data"
    write_json_atomic(
        data / "index.json",
        {
            "shards": shards,
            "aux_layer_ids": new_index["aux_layer_ids"],
            "final_layer_id": new_index["final_layer_id"],
            "hidden_size": new_index["hidden_size"],
            "dtype": new_index.get("dtype", "bfloat16"),
            "backend": new_index.get("backend"),
        },
    )
    write_ledger(pool, ledger)  # after the index: a failed stage leaves the ledger as it found it, or with tonight in
    replay_tokens = sum(n for _, _, n in picked)
    held_tokens = sum(int(e["num_tokens"]) for e in held_entries)
    log.info(
        "tonight trains on %d new sequences and %d %s from %d older batch(es); %d held out; the pool "
        "keeps %d batch(es), %.1f MB",
        batch.sequences,
        len(picked),
        "(the whole pool)" if cfg.nightly.whole_pool else "replayed",
        len(older),
        sum(int(e["num_seqs"]) for e in held_entries),
        len(ledger.live()),
        sum(b.bytes for b in ledger.live()) / 1e6,
    )
    live = ledger.live()
    return request.manifest(
        outputs=ExtractOutputs(
            index="data/index.json",
            shards=[e["file"] for e in shards],
            hidden_size=new_index["hidden_size"],
            storage_dtype=new_index.get("dtype", "bfloat16"),
            num_bytes=sum(int(e.get("bytes", 0)) for e in shards),
            num_tokens={"train": batch.tokens + replay_tokens, "holdout": held_tokens},
        ),
        hashes={"data/index.json": sha256_file(data / "index.json")},
        metrics=PoolMetrics(
            new_sequences=batch.sequences,
            new_tokens=batch.tokens,
            replay_sequences=len(picked),
            whole_pool=cfg.nightly.whole_pool,
            replay_tokens=replay_tokens,
            holdout_sequences=sum(int(e["num_seqs"]) for e in held_entries),
            batches=len(live),
            samples=sum(b.samples for b in live),
            pool_bytes=sum(b.bytes for b in live),
            budget_bytes=budget,
            evicted=[b.id for b in evicted],
        ),
    )


if __name__ == "__main__":
    sys.exit(stage_main("pool", run))
