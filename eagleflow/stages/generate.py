"""generate: prompts -> the target's server -> answers with reasoning -> Parquet shards.

The server is production's own (`generate.server: production`: its URL and key, at most
`generate.concurrency` requests in flight beside its traffic, never stopped) or an engine this stage
launches (`own`: engine.*, its tensor parallel size). Either serves the target with its reasoning
parser; the thinking comes back in `reasoning` or `reasoning_content` and is re-wrapped with the
target's own markers and chat template, so the token ids are what the target reads when it serves.

Resumable by shard: a finished shard is never redone. Against production, requests that found the
server gone (a dropped link, a restart: connection errors; a server error, such as the 500 vLLM
answers while it shuts down) are sent again once its health URL answers. With `production.replicas`
the prompts are spread over the replicas (eagleflow.engines.replicas): one that goes down is left, its
requests go to the others, and it is taken back once it answers; the manifest counts each one's
requests. An answer cut at max_tokens is data (marked `truncated`, counted); only an answer with
neither reasoning nor content, or an error, counts as failed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest, sha256_file
from eagleflow.contracts.progress import Progress
from eagleflow.contracts.prompts import Messages, PromptError, load_prompts, split_indices
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import GenerateMetrics, GenerateOutputs
from eagleflow.engines import make_server
from eagleflow.engines.chat import ChatResult, chat_all, sampling_extra
from eagleflow.engines.launch import served_name, target_launch
from eagleflow.engines.remote import RemoteServer, production_api_key
from eagleflow.engines.replicas import ReplicaCounts, Replicas, counts_record
from eagleflow.stages.common import planned_seconds, stage_main
from eagleflow.util.files import writing

log = logging.getLogger("eagleflow.generate")

SCHEMA = pa.schema(
    [
        ("sample_id", pa.int64()),
        ("split", pa.string()),
        ("messages", pa.string()),
        ("reasoning", pa.string()),
        ("content", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("truncated", pa.bool_()),  # cut at generate.max_tokens (often mid-reasoning)
    ]
)
MAX_RESEND_ROUNDS = 20  # against production: rounds of waiting and resending before an answer counts as failed


class ChatTokenizer:
    """Renders a conversation with the target's chat template and marks the assistant's tokens."""

    def __init__(self, model_path: str, thinking_start: str, thinking_end: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_path)
        if not getattr(self.tok, "chat_template", None):
            raise StageError(f"the tokenizer in {model_path} has no chat_template; the target must ship one")
        self.start, self.end = thinking_start, thinking_end

    def assistant_text(self, reasoning: str | None, content: str | None) -> str:
        # The reasoning parser partitions the raw output exactly at the markers; putting them back
        # restores what the target produced.
        if reasoning is None:
            return content or ""
        return f"{self.start}{reasoning}{self.end}{content or ''}"

    def encode(self, messages: Messages, reasoning: str | None, content: str | None) -> tuple[list[int], list[int]]:
        prompt = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = self.tok.apply_chat_template(
            messages + [{"role": "assistant", "content": self.assistant_text(reasoning, content)}],
            tokenize=False,
            add_generation_prompt=False,
        )
        if not full.startswith(prompt):
            raise StageError(
                "the chat template renders the prompt differently once the answer is appended; "
                "the loss mask cannot be placed (check the template's generation prompt)"
            )
        prompt_ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = self.tok(full[len(prompt) :], add_special_tokens=False)["input_ids"]
        # Tokenizing the two halves apart keeps the boundary exact: the answer starts where the
        # engine started generating.
        return prompt_ids + answer_ids, [0] * len(prompt_ids) + [1] * len(answer_ids)


def write_shard(path: Path, rows: list[dict[str, Any]]) -> None:
    """Temp name, then rename: a shard on disk is always complete."""
    with writing(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)


@dataclass
class Answers:
    """Where the answers come from: a base URL, and production's server when it is that one; or production's
    replicas, all of them."""

    base_url: str
    remote: RemoteServer | None = None
    replicas: Replicas | None = None


@contextmanager
def answering_server(request: StageRequest) -> Iterator[Answers]:
    cfg = request.config
    if cfg.generate.server == "production" and cfg.production.replicas:
        log.info(
            "answers from production's %d replicas (%d requests in flight at most on each); production is not stopped",
            len(cfg.production.replicas),
            cfg.generate.concurrency,
        )
        yield Answers(cfg.production.replicas[0], replicas=Replicas(cfg.production.replicas, production_api_key(cfg)))
        return
    if cfg.generate.server == "production":
        remote = RemoteServer(cfg)
        log.info(
            "answers from production at %s (%d requests in flight at most); production is not stopped",
            remote.base_url,
            cfg.generate.concurrency,
        )
        remote.wait_answering(cfg.generate.server_wait_s)
        yield Answers(remote.base_url, remote)
        return
    with make_server(target_launch(cfg), request.path / "engine.log", name="target") as server:
        yield Answers(server.base_url)


@dataclass
class Tally:
    failed: int = 0
    truncated: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    waits: int = 0
    first_error: str | None = None
    replicas: dict[str, ReplicaCounts] = field(default_factory=dict)


def answer_seeds(cfg: RunConfig, prompt_ids: list[int]) -> list[int] | None:
    """Sampled answers' seeds: generate.seed and each prompt's line, so a shard generated again, resumed or sent
    again answers the same (None when answers are greedy)."""
    g = cfg.generate
    if g.temperature == 0:
        return None
    return [(g.seed * 1_000_003 + p) % 2**31 for p in prompt_ids]


def ask(
    cfg: RunConfig,
    answers: Answers,
    convs: list[Messages],
    tally: Tally,
    progress: Progress | None = None,
    base: int = 0,
    seeds: list[int] | None = None,
) -> list[ChatResult]:
    """Every conversation answered once; against production, what found the server gone is sent again
    once it answers (a restart mid-shard loses no samples and fails nothing). `seeds`: conversation i's
    sampling seed (`answer_seeds`), the same when it is sent again."""
    g = cfg.generate
    extra = sampling_extra(g.temperature, g.top_p) or None
    answered = {"n": 0, "tokens": 0, "failed": 0}  # this shard's, for the progress line

    def on_result(r: ChatResult) -> None:
        if progress is None or r.transient:  # a transient one is sent again: counted when it comes back
            return
        answered["n"] += 1
        answered["tokens"] += r.completion_tokens
        answered["failed"] += bool(r.error)
        if progress.due():
            secs = tally.seconds + (time.perf_counter() - sent_at)
            progress.update(
                base + answered["n"],
                {
                    "output tok/s": round((tally.completion_tokens + answered["tokens"]) / max(secs, 1e-9)),
                    "failed": tally.failed + answered["failed"],
                    "truncated": tally.truncated,
                },
            )

    def send(batch: list[int]) -> list[ChatResult]:
        nonlocal sent_at
        sent_at = time.perf_counter()
        res, secs = chat_all(
            answers.base_url,
            served_name(cfg),
            [convs[k] for k in batch],
            max_tokens=g.max_tokens,
            temperature=g.temperature,
            concurrency=g.concurrency,
            timeout_s=cfg.engine.request_timeout_s,
            extra=extra,
            seed=[seeds[k] for k in batch] if seeds is not None else None,
            api_key=answers.remote.api_key if answers.remote else None,
            on_result=on_result,
        )
        tally.seconds += secs
        return res

    sent_at = time.perf_counter()
    if answers.replicas is not None:  # leaving, sending again and taking back live there
        results, secs = answers.replicas.chat(
            served_name(cfg),
            convs,
            max_tokens=g.max_tokens,
            temperature=g.temperature,
            per_replica=g.concurrency,
            timeout_s=cfg.engine.request_timeout_s,
            wait_s=g.server_wait_s,
            on_result=on_result,
            extra=extra,
            seeds=seeds,
        )
        tally.seconds += secs
        tally.replicas = answers.replicas.counts
        return results
    results = send(list(range(len(convs))))
    for _ in range(MAX_RESEND_ROUNDS if answers.remote else 0):
        pending = [k for k, r in enumerate(results) if r.transient]
        if not pending:
            break
        assert answers.remote is not None
        tally.waits += 1
        log.warning(
            "%d requests found production unreachable (%s); waiting for %s to answer, then sending them again",
            len(pending),
            results[pending[0]].error,
            answers.remote.health_url,
        )
        waited = answers.remote.wait_answering(g.server_wait_s)
        log.info("production answers again after %.0f s; sending %d requests again", waited, len(pending))
        for k, r in zip(pending, send(pending)):
            r.index = k
            results[k] = r
    return results


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    g = cfg.generate
    try:
        prompts = load_prompts(g.prompts_path)
        if g.split == "seeded":
            train_idx, holdout_idx = split_indices(len(prompts), g.num_samples, g.holdout, g.seed)
    except PromptError as exc:
        raise StageError(str(exc)) from None
    if g.split == "seeded":
        # sample_id 0..holdout-1 are held out, the rest train.
        samples = [(i, p, "holdout") for i, p in enumerate(holdout_idx)]
        samples += [(len(holdout_idx) + i, p, "train") for i, p in enumerate(train_idx)]
    else:  # a nightly pool batch: every prompt of the file, all in one split
        samples = [(i, i, g.split) for i in range(len(prompts))]
    shards = [samples[s : s + g.shard_size] for s in range(0, len(samples), g.shard_size)]
    data_dir = request.path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    shard_paths = [data_dir / f"shard-{i:05d}.parquet" for i in range(len(shards))]
    todo = [i for i, p in enumerate(shard_paths) if not p.exists()]
    log.info(
        "%d samples (%d held out) in %d shards; %d shards to generate",
        len(samples),
        sum(1 for x in samples if x[2] == "holdout"),
        len(shards),
        len(todo),
    )

    tally = Tally()
    if todo:
        chat_tok = ChatTokenizer(cfg.target.model_path, cfg.target.thinking_start, cfg.target.thinking_end)
        done_before = sum(len(s) for i, s in enumerate(shards) if i not in set(todo))
        planned = planned_seconds(cfg, "generate")
        progress = Progress("generate", "samples", len(samples), "samples", start=done_before, planned_s=planned)
        with answering_server(request) as answers:
            progress.restart_clock()  # the engine's load is not generation: its own progress line says it
            for i in todo:
                convs = [prompts[p] for _, p, _ in shards[i]]
                seeds = answer_seeds(cfg, [p for _, p, _ in shards[i]])
                results = ask(cfg, answers, convs, tally, progress, base=done_before, seeds=seeds)
                rows, errors = _rows(shards[i], convs, results, chat_tok)
                tally.failed += len(errors)
                tally.truncated += sum(1 for r in rows if r["truncated"])
                tally.completion_tokens += sum(r.completion_tokens for r in results)
                tally.first_error = tally.first_error or (errors[0] if errors else None)
                allowed = g.max_failed_fraction * len(samples)
                if tally.failed > allowed:
                    raise StageError(
                        f"{tally.failed} answers failed or came back with neither reasoning nor content, more than "
                        f"generate.max_failed_fraction ({g.max_failed_fraction}) allows; first: {tally.first_error}. "
                        "Nothing of this shard was kept."
                    )
                write_shard(shard_paths[i], rows)
                log.info(
                    "shard %d/%d: %d samples (%d cut at max_tokens), %.0f output tok/s",
                    i + 1,
                    len(shards),
                    len(rows),
                    sum(1 for r in rows if r["truncated"]),
                    tally.completion_tokens / max(tally.seconds, 1e-9),
                )
                for url, c in tally.replicas.items():
                    log.info(
                        "replica %s: %d sent, %d answered, %d sent again elsewhere, left %dx, taken back %dx",
                        url,
                        c.sent,
                        c.answered,
                        c.moved,
                        c.down,
                        c.back,
                    )
                done_before += len(shards[i])
                progress.update(
                    done_before,
                    {
                        "output tok/s": round(tally.completion_tokens / max(tally.seconds, 1e-9)),
                        "failed": tally.failed,
                        "truncated": tally.truncated,
                    },
                    force=True,
                )
        progress.finish()

    counts = {"train": 0, "holdout": 0}
    tokens = 0
    for p in shard_paths:
        t = pq.read_table(p, columns=["split", "input_ids"])
        for split in t.column("split").to_pylist():
            counts[split] += 1
        tokens += sum(len(x) for x in t.column("input_ids").to_pylist())
    needed = ("train", "holdout") if g.split == "seeded" else (g.split,)
    if any(counts[s] == 0 for s in needed):
        raise StageError(
            f"after dropping failed answers, train={counts['train']} holdout={counts['holdout']}; "
            + ("both splits need samples" if g.split == "seeded" else f"the {g.split} batch has none")
        )
    rel = [str(p.relative_to(request.path)) for p in shard_paths]
    return request.manifest(
        outputs=GenerateOutputs(
            shards=rel, num_train=counts["train"], num_holdout=counts["holdout"], num_tokens=tokens
        ),
        hashes={r: sha256_file(request.path / r) for r in rel},
        metrics=GenerateMetrics(
            failed=tally.failed,
            truncated=tally.truncated,
            completion_tokens=tally.completion_tokens,
            output_tok_s=tally.completion_tokens / tally.seconds if tally.seconds else None,
            server=g.server,
            server_waits=tally.waits,
            replicas=counts_record(tally.replicas),
        ),
    )


def _rows(
    shard: list[tuple[int, int, str]], convs: list[Messages], results: list[ChatResult], chat_tok: ChatTokenizer
) -> tuple[list[dict[str, Any]], list[str]]:
    rows, errors = [], []
    for (sample_id, _, split), messages, res in zip(shard, convs, results):
        if res.error:
            errors.append(f"sample {sample_id}: {res.error}")
            continue
        ids, mask = chat_tok.encode(messages, res.reasoning, res.content)
        rows.append(
            {
                "sample_id": sample_id,
                "split": split,
                "messages": json.dumps(messages),
                "reasoning": res.reasoning or "",
                "content": res.content or "",
                "input_ids": ids,
                "loss_mask": mask,
                "truncated": res.truncated,
            }
        )
    return rows, errors


if __name__ == "__main__":
    sys.exit(stage_main("generate", run))
