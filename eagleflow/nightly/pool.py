"""The nightly data pool: prompts that grow night by night, and the data they became.

Where it lives on the host: `<work_root>/nightly/<run name>/`
    holdout.jsonl          the held-out prompts, chosen on the first night and never rewritten: the same
                           benchmark prompts and validation sequences every night, never trained on
    batches/<id>.jsonl     each night's new prompts (<id>: the hash of their contents)
    ledger.json            the batches in the pool, oldest first: their prompts' hashes, the generate
                           and extract stages that made their data, bytes, and whether evicted
    nights.json            the record of nights (NightRecord), written when a night has trained and measured

A night (flows.retrain): the `select` stage reads the prompt source (a JSONL file, or a directory of
JSONL files the team appends to), drops repeats by content, and takes the first prompts in source order
that are neither held out nor in any batch of the ledger (evicted ones included: a prompt is used
once). A batch whose night failed before it was recorded in nights.json is not used: the next night drops it from
the ledger and takes its prompts again as new (its generate and extract stages are cache hits), so a failed night
costs the pool nothing and a failed first night still gets its full first batch. generate and extract then run on
that batch alone (their keys follow its contents, so every
earlier night's stages stay cache hits). The `pool` stage records the batch in the ledger, evicts the
oldest batches' states beyond the disk budget, and writes the night's training index: the new batch,
a seeded replay sample of older batches' sequences, and the held-out sequences.

Standard library + pydantic: the host stages (select, pool) and the control side (the nightly flow,
its record of nights) share it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.config import RunConfig
from eagleflow.contracts.prompts import Messages, PromptError, load_prompts
from eagleflow.util.files import write_json_atomic, write_text_atomic


class PoolBatch(BaseModel):
    """One night's new prompts and the data they became."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="sha256 of the batch's prompt hashes, 16 hex chars.")
    file: str = Field(description="batches/<id>.jsonl under the pool directory.")
    prompts: list[str] = Field(description="The prompts' content hashes (sha256, 16 hex chars), in batch order.")
    run: str = Field("", description="The flow run that added it (a retry of that run takes the same batch).")
    added: float = Field(0.0, description="Unix time it entered the ledger.")
    generate: str | None = Field(None, description="The generate stage directory of its answers.")
    extract: str | None = Field(None, description="The extract stage directory of its states.")
    samples: int = Field(0, description="Samples generated (failed answers dropped).")
    sequences: int = Field(0, description="Train sequences extracted.")
    tokens: int = Field(0, description="Train tokens extracted.")
    bytes: int = Field(0, description="Bytes of its extracted states.")
    evicted: float | None = Field(None, description="Unix time its states were deleted for the disk budget.")


class Ledger(BaseModel):
    """ledger.json: the pool's batches, oldest first (what each night made of them: nights.json, NightRecord)."""

    model_config = ConfigDict(extra="forbid")

    batches: list[PoolBatch] = Field(default_factory=list)

    def used(self) -> set[str]:
        return {h for b in self.batches for h in b.prompts}

    def batch(self, batch_id: str) -> PoolBatch | None:
        return next((b for b in self.batches if b.id == batch_id), None)

    def live(self) -> list[PoolBatch]:
        return [b for b in self.batches if b.evicted is None]


NIGHTS = "nights.json"  # in the pool directory: the record of nights, one NightRecord a night


def recorded_batches(pool: Path) -> set[str]:
    """The batches whose night was recorded (nights.json): the nights that trained and measured."""
    path = pool / NIGHTS
    if not path.is_file():
        return set()
    return {n["batch"] for n in json.loads(path.read_text()) if n.get("batch")}


def drop_unfinished(ledger: Ledger, recorded: set[str], run: str) -> list[PoolBatch]:
    """Take out of `ledger` the batches whose night failed (never recorded, and not this flow run's own: a retry
    of a run takes its batch again); return them. Their prompts are then unused, chosen again as new."""
    gone = [b for b in ledger.batches if b.id not in recorded and not (run and b.run == run)]
    ledger.batches = [b for b in ledger.batches if b not in gone]
    return gone


def pool_dir(work_root: str, run_name: str) -> Path:
    return Path(work_root) / "nightly" / run_name


def read_ledger(pool: Path) -> Ledger:
    path = pool / "ledger.json"
    return Ledger.model_validate_json(path.read_text()) if path.is_file() else Ledger()


def write_ledger(pool: Path, ledger: Ledger) -> None:
    write_json_atomic(pool / "ledger.json", ledger.model_dump(mode="json"))


def prompt_hash(messages: Messages) -> str:
    """A prompt's identity: its messages' content, whatever file or line it came from."""
    blob = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def batch_id(hashes: list[str]) -> str:
    return hashlib.sha256(",".join(hashes).encode()).hexdigest()[:16]


def source_files(source: str | Path) -> list[Path]:
    """A JSONL file, or every *.jsonl of a directory in name order (the order a team appends in)."""
    p = Path(source)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".jsonl" and f.is_file())
        if not files:
            raise PromptError(f"the prompt source {p} (nightly.source) holds no *.jsonl file; add one")
        return files
    if not p.is_file():
        raise PromptError(
            f"the prompt source {p} (nightly.source) does not exist; point it at a JSONL file or a directory of them"
        )
    return [p]


def read_source(source: str | Path) -> tuple[list[tuple[str, Messages]], int]:
    """(hash, messages) of each distinct prompt in source order, and how many repeats were dropped."""
    seen: set[str] = set()
    out: list[tuple[str, Messages]] = []
    repeats = 0
    for f in source_files(source):
        for m in load_prompts(f):
            h = prompt_hash(m)
            if h in seen:
                repeats += 1
                continue
            seen.add(h)
            out.append((h, m))
    return out, repeats


def write_prompts(path: Path, prompts: list[Messages]) -> None:
    """A batch or holdout file: one {"messages": ...} a line, written atomically (never half a batch)."""
    write_text_atomic(path, "".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in prompts))


def choose_holdout(prompts: list[tuple[str, Messages]], n: int, seed: int) -> list[tuple[str, Messages]]:
    """The first night's held-out prompts: a seeded sample of the source, in source order."""
    if n >= len(prompts):
        raise PromptError(
            f"the prompt source has {len(prompts)} distinct prompts, not more than the {n} to hold out "
            "(nightly.holdout or generate.holdout); add prompts or hold out fewer"
        )
    picked = set(random.Random(seed).sample(range(len(prompts)), n))
    return [p for i, p in enumerate(prompts) if i in picked]


def choose_new(prompts: list[tuple[str, Messages]], exclude: set[str], n: int) -> list[tuple[str, Messages]]:
    """The first `n` prompts in source order that were never used."""
    return [p for p in prompts if p[0] not in exclude][:n]


def replay_sample(candidates: list[tuple[str, int, int]], n: int, seed: int) -> list[tuple[str, int, int]]:
    """A seeded sample of `n` (shard path, sequence index, tokens) of older batches, in their order."""
    if n >= len(candidates):
        return list(candidates)
    keep = set(random.Random(seed).sample(range(len(candidates)), n))
    return [c for i, c in enumerate(candidates) if i in keep]


def evict(ledger: Ledger, budget_bytes: int | None, keep: set[str]) -> list[PoolBatch]:
    """The oldest live batches (never those in `keep`) whose eviction brings the pool within the budget."""
    if budget_bytes is None:
        return []
    total = sum(b.bytes for b in ledger.live())
    out = []
    for b in ledger.live():
        if total <= budget_bytes:
            break
        if b.id in keep:
            continue
        out.append(b)
        total -= b.bytes
    return out


def batch_config(config: RunConfig, prompts_file: str, split: str) -> RunConfig:
    """The run config of one pool batch: generate answers every prompt of `prompts_file`, all in `split`.
    A 'holdout' batch's config is also the benchmark's (its prompts are the benchmark's)."""
    data = config.model_dump(mode="json")
    data["generate"].update(prompts_path=prompts_file, split=split)
    return RunConfig.model_validate(data)


def continuing_train_config(config: RunConfig, promoted_dir: str, train_tokens: int) -> RunConfig:
    """A night that continues from the promoted drafter: its weights (and draft vocabulary, unless
    nightly.rebuild_vocab), a fresh optimizer and schedule, nightly.train_steps steps. Epochs are only
    enough to hold those steps (each keeps a checkpoint)."""
    n, t = config.nightly, config.train
    per_epoch = max(1, train_tokens // t.batch_tokens)
    data = config.model_dump(mode="json")
    data["train"].update(
        warm_start=promoted_dir,
        max_steps=n.train_steps,
        epochs=min(1000, -(-n.train_steps // per_epoch) + 1),
        learning_rate=n.learning_rate or t.learning_rate / 4,
        warmup_steps=min(t.warmup_steps, max(1, n.train_steps // 10)),
        warm_start_vocab="rebuild" if n.rebuild_vocab else "keep",
    )
    return RunConfig.model_validate(data)


def benchmark_on(config: RunConfig, drafter_on: str) -> RunConfig:
    """The night's benchmark measuring the new drafter where `drafter_on` says (production.promote 'serve':
    'none' inside the production window, the references only; 'production' once production serves it)."""
    data = config.model_dump(mode="json")
    data["benchmark"]["drafter_on"] = drafter_on
    return RunConfig.model_validate(data)


def whole_pool_config(config: RunConfig) -> RunConfig:
    """A night with no promoted drafter to continue: the pool stage indexes the whole pool (every batch it keeps),
    so the full run that night trains on all the data, as the first night does."""
    data = config.model_dump(mode="json")
    data["nightly"]["whole_pool"] = True
    return RunConfig.model_validate(data)


def full_length(config: RunConfig) -> RunConfig:
    """The benchmark once more, every held-out prompt and no early stop: what the promotion gate asks for when the
    night's first measurement left its intervals overlapping its bars (nightly.decision_reruns)."""
    data = config.model_dump(mode="json")
    data["benchmark"]["precision"] = None
    return RunConfig.model_validate(data)
