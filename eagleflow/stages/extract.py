"""extract: the generated conversations -> the target's aux-layer and final hidden states -> shards.

    python -m eagleflow.stages.extract <stage_dir>/request.json

Two backends write the same shards (`eagleflow.drafter.shards`), so training does not care which
ran: `hf`, a transformers forward (small targets, CPU, the host's GPUs), and `vllm`, the serving
engine at production's tensor parallel size (`eagleflow.extraction.vllm`). States stream to disk as
they come; a shard is cut by bytes; memory stays flat whatever the data size. Resumable by shard: a
finished shard whose record and sampled hash check out is never redone.

The index (`data/index.json`) records each shard's size, its full hash (computed while writing) and
a sampled sha256: the train stage checks size and sample before reading, in milliseconds per shard.
"""

from __future__ import annotations

import logging
import resource
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from eagleflow.capacity.planner import states_refusal
from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest, sha256_file
from eagleflow.contracts.progress import Progress
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import ExtractMetrics, ExtractOutputs, GenerateOutputs
from eagleflow.drafter.shards import ShardError, ShardPlan, ShardWriter, check_shard
from eagleflow.extraction import Capture, open_capture
from eagleflow.extraction.plan import PlannedShard, plan_shards, target_hidden_size
from eagleflow.stages.common import planned_seconds, stage_main
from eagleflow.util.files import read_json, write_json_atomic
from eagleflow.util.text import size_text

log = logging.getLogger("eagleflow.extract")


def _finished(data_dir: Path, name: str) -> dict | None:
    """The record of a shard an earlier attempt finished, if the file still matches it."""
    record = read_json(data_dir / "records" / f"{name}.json")
    if record is None:
        return None
    try:
        check_shard(data_dir / name, record)
    except ShardError as exc:
        log.warning("extracting %s again: %s", name, exc)
        return None
    return record


def _close(writer: ShardWriter, data_dir: Path, shard: PlannedShard, entry: dict) -> None:
    """Finish a shard (last writes, fsync, rename) and record it; runs beside the next shard's forward."""
    record = writer.close().__dict__
    write_json_atomic(data_dir / "records" / f"{shard.name}.json", record)
    entry.update(record)
    log.info(
        "%s: %d sequences, %d tokens, %.2f GB", shard.name, len(shard.ids), shard.num_tokens, record["bytes"] / 1e9
    )


def _refuse_if_disk_short(cfg: RunConfig, gen_shards: list[str], hidden: int, data_dir: Path) -> None:
    """Before anything is written: the exact tokens (each conversation cut at extract.max_seq_len) against
    the free disk, less what finished shards already hold; a StageError naming both numbers."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tokens = sequences = 0
    for path in gen_shards:
        lengths = pc.list_value_length(pq.read_table(path, columns=["input_ids"]).column("input_ids"))
        tokens += int(pc.sum(pc.min_element_wise(lengths, cfg.extract.max_seq_len)).as_py() or 0)
        sequences += len(lengths)
    written = sum((read_json(p) or {}).get("bytes", 0) for p in (data_dir / "records").glob("*.json"))
    refusal = states_refusal(
        tokens,
        sequences,
        hidden,
        cfg.extract.storage_dtype,
        written,
        shutil.disk_usage(data_dir).free,
        str(data_dir),
        int(cfg.engine.min_free_disk_gib * 2**30),
    )
    if refusal:
        raise StageError(refusal)
    log.info("disk: %d tokens of states fit the free disk at %s", tokens, data_dir)


def _peak_rss_mib() -> float:
    """This process's peak resident memory: VmHWM belongs to this program (ru_maxrss carries the
    parent's peak across fork and exec, so a big parent would hide a small stage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    gen = request.upstream["generate"]
    try:
        hidden = target_hidden_size(cfg.target.model_path)
    except (FileNotFoundError, ValueError) as exc:
        raise StageError(str(exc)) from None
    bytes_per_token = ShardPlan(0, 0, hidden, cfg.extract.storage_dtype).state_bytes_per_token
    data_dir = request.path / "data"
    (data_dir / "records").mkdir(parents=True, exist_ok=True)
    for stale in data_dir.glob(".shard-*.tmp"):
        stale.unlink()  # a shard an earlier attempt was writing when it died: never taken as complete
    gen_shards = [gen.path(r) for r in GenerateOutputs.of(gen).shards]
    _refuse_if_disk_short(cfg, gen_shards, hidden, data_dir)
    index: list[dict] = []
    tokens, started = 0, None
    closing: Future | None = None  # one shard at a time finishes in the background
    with ExitStack() as stack:
        finisher = ThreadPoolExecutor(1, thread_name_prefix="shard-close")
        stack.callback(finisher.shutdown)
        capture: Capture | None = None  # opened at the first shard with work to do: a finished stage loads nothing
        planned = list(plan_shards(gen_shards, cfg.extract.max_seq_len, bytes_per_token, cfg.extract.shard_bytes))
        finished = {shard.name: _finished(data_dir, shard.name) for shard in planned}
        progress = Progress(
            "extract",
            "tokens",
            sum(s.num_tokens for s in planned),
            "tokens",
            start=sum(s.num_tokens for s in planned if finished[s.name] is not None),
            planned_s=planned_seconds(cfg, "extract"),
        )

        def on_add(n: int) -> None:
            progress.done += n
            if progress.due():
                progress.update(
                    figures={
                        "tok/s": round(progress.event().rate or 0),
                        "written": size_text((progress.done - progress.start) * bytes_per_token),
                    }
                )

        for shard in planned:
            entry = {
                "file": f"data/{shard.name}",
                "split": shard.split,
                "num_seqs": len(shard.ids),
                "num_tokens": shard.num_tokens,
            }
            index.append(entry)
            record = finished[shard.name]
            if record is not None:
                entry.update(record)
                continue
            if capture is None:
                capture = open_capture(cfg, request.path, stack, hidden)
                progress.restart_clock()  # the rate leaves the model's load out
            started = started or time.perf_counter()
            plan = ShardPlan(shard.num_tokens, len(shard.ids), hidden, cfg.extract.storage_dtype)
            writer = ShardWriter(data_dir / shard.name, plan, {"split": shard.split}, on_add=on_add)
            try:
                capture.extract(shard, writer)
                if closing is not None:
                    closing.result()  # the previous shard is whole before this one starts to close
            except BaseException:
                writer.abort()
                raise
            closing = finisher.submit(_close, writer, data_dir, shard, entry)
            tokens += shard.num_tokens
        if closing is not None:
            closing.result()
        progress.finish(figures={"written": size_text((progress.done - progress.start) * bytes_per_token)})
    seconds = time.perf_counter() - started if started else 0.0
    if tokens:
        log.info("extracted %d tokens in %.1f s: %.0f tok/s (%s)", tokens, seconds, tokens / seconds, capture.where)
    write_json_atomic(
        data_dir / "index.json",
        {
            "shards": index,
            "aux_layer_ids": cfg.target.aux_layer_ids,
            "final_layer_id": cfg.target.final_layer_id,
            "hidden_size": hidden,
            "dtype": cfg.extract.storage_dtype,
            "backend": cfg.extract.backend,
        },
    )
    written = sum(e["bytes"] for e in index)
    return request.manifest(
        outputs=ExtractOutputs(
            index="data/index.json",
            shards=[e["file"] for e in index],
            hidden_size=hidden,
            storage_dtype=cfg.extract.storage_dtype,
            num_bytes=written,
            num_tokens={s: sum(e["num_tokens"] for e in index if e["split"] == s) for s in ("train", "holdout")},
        ),
        # The index holds every shard's size and hashes; the manifest pins the index.
        hashes={"data/index.json": sha256_file(data_dir / "index.json")},
        metrics=ExtractMetrics(
            tok_s=tokens / seconds if tokens else None,
            device=capture.where if capture else "none",
            backend=cfg.extract.backend,
            tokens_extracted=tokens,
            peak_rss_mib=_peak_rss_mib(),
        ),
    )


if __name__ == "__main__":
    sys.exit(stage_main("extract", run))
