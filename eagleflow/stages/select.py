"""select: tonight's new prompts for the nightly pool, and the held-out prompts fixed on the first night.

    python -m eagleflow.stages.select <stage_dir>/request.json

Reads the prompt source (nightly.source, else generate.prompts_path: a JSONL file or a directory of
JSONL files), drops repeats by content, and writes under `<work_root>/nightly/<run name>/`:
- `holdout.jsonl` on the first night only (nightly.holdout prompts, a sample seeded by generate.seed):
  every later night reads it as it is, so the held-out split is byte-identical across nights;
- `batches/<id>.jsonl`: the first prompts in source order that are neither held out nor in any batch
  of the ledger (the first night: generate.num_samples less the held-out ones; later nights:
  nightly.new_samples). A retry of the same flow run whose batch already entered the ledger takes that
  batch again instead of new prompts.

Runs every night (the source grows); its manifest's content key is a hash of what it chose, so the
stages downstream are cache hits when nothing new came in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys

from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.prompts import PromptError, load_prompts
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import SelectOutputs
from eagleflow.nightly.pool import (
    batch_id,
    choose_holdout,
    choose_new,
    drop_unfinished,
    pool_dir,
    prompt_hash,
    read_ledger,
    read_source,
    recorded_batches,
    write_ledger,
    write_prompts,
)
from eagleflow.stages.common import stage_main

log = logging.getLogger("eagleflow.select")


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    n = cfg.nightly
    source = n.source or cfg.generate.prompts_path
    pool = pool_dir(cfg.host.work_root, cfg.name)
    ledger = read_ledger(pool)
    try:
        prompts, repeats = read_source(source)
        holdout_path = pool / "holdout.jsonl"
        if holdout_path.is_file():
            held = [(prompt_hash(m), m) for m in load_prompts(holdout_path)]
        else:
            held = choose_holdout(prompts, n.holdout or cfg.generate.holdout, cfg.generate.seed)
            write_prompts(holdout_path, [m for _, m in held])
            log.info("held out %d prompts for every night: %s", len(held), holdout_path)
    except PromptError as exc:
        raise StageError(str(exc)) from None
    failed = drop_unfinished(ledger, recorded_batches(pool), request.run)
    if failed:
        write_ledger(pool, ledger)
        log.warning(
            "batch(es) %s of night(s) that failed before they were recorded (runs %s): their %d prompts are new "
            "again, taken in source order as any unused prompt",
            ", ".join(b.id for b in failed),
            ", ".join(sorted({b.run for b in failed})),
            sum(len(b.prompts) for b in failed),
        )
    first = not ledger.batches
    mine = next((b for b in ledger.batches if request.run and b.run == request.run), None)
    if mine is not None:  # this flow run chose it before (a retry): the same prompts, the same cached stages
        log.info(
            "this flow run already added batch %s (%d prompts) to the pool: taking it again", mine.id, len(mine.prompts)
        )
        chosen_ids, batch_file = mine.prompts, pool / mine.file
        first = ledger.batches[0].id == mine.id
    else:
        want = max(cfg.generate.num_samples - len(held), 1) if first else n.new_samples
        new = choose_new(prompts, {h for h, _ in held} | ledger.used(), want)
        chosen_ids = [h for h, _ in new]
        batch_file = pool / "batches" / f"{batch_id(chosen_ids)}.jsonl" if new else None
        if batch_file is not None and not batch_file.is_file():
            write_prompts(batch_file, [m for _, m in new])
    used = {h for h, _ in held} | ledger.used() | set(chosen_ids)
    unused = sum(1 for h, _ in prompts if h not in used)
    bid = batch_id(chosen_ids) if chosen_ids else None
    log.info(
        "source %s: %d distinct prompts (%d repeats dropped); %d held out; tonight %s; %d unused after tonight",
        source,
        len(prompts),
        repeats,
        len(held),
        f"{len(chosen_ids)} new prompts (batch {bid})" if bid else "no unused prompt: nothing new to train on",
        unused,
    )
    outputs = SelectOutputs(
        pool_dir=str(pool),
        holdout_file=str(pool / "holdout.jsonl"),
        holdout_id=batch_id([h for h, _ in held]),
        holdout_count=len(held),
        batch_file=str(batch_file) if bid else None,
        batch_id=bid,
        batch_count=len(chosen_ids),
        first_night=first,
        reused_batch=mine is not None,
        source_prompts=len(prompts),
        repeats=repeats,
        unused_after=unused,
        pool_batches=[b.id for b in ledger.live() if b.id != bid],
    )
    # What downstream depends on: the prompts chosen and the older batches still kept, not when it ran.
    content = {"holdout": outputs.holdout_id, "batch": bid, "pool": outputs.pool_batches}
    content_key = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    return request.manifest(outputs=outputs, content_key=content_key)


if __name__ == "__main__":
    sys.exit(stage_main("select", run))
