"""generate: prompts -> the target's own server -> answers with reasoning -> Parquet shards.

The engine serves the target with its reasoning parser; the thinking comes back in `reasoning` or
`reasoning_content` and is re-wrapped with the target's own markers and chat template, so the token
ids are what the target reads when it serves. Resumable by shard: a finished shard is never redone.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagleflow.engines import make_server
from eagleflow.engines.chat import ChatResult, chat_all
from eagleflow.engines.launch import served_name, target_launch
from eagleflow.files import writing
from eagleflow.manifest import Manifest, sha256_file
from eagleflow.outputs import GenerateMetrics, GenerateOutputs
from eagleflow.prompts import Messages, PromptError, load_prompts, split_indices
from eagleflow.request import StageError, StageRequest
from eagleflow.stages.common import stage_main

log = logging.getLogger("eagleflow.generate")

SCHEMA = pa.schema([
    ("sample_id", pa.int64()),
    ("split", pa.string()),
    ("messages", pa.string()),
    ("reasoning", pa.string()),
    ("content", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
])


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
            tokenize=False, add_generation_prompt=False,
        )
        if not full.startswith(prompt):
            raise StageError("the chat template renders the prompt differently once the answer is appended; "
                             "the loss mask cannot be placed (check the template's generation prompt)")
        prompt_ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = self.tok(full[len(prompt):], add_special_tokens=False)["input_ids"]
        # Tokenizing the two halves apart keeps the boundary exact: the answer starts where the
        # engine started generating.
        return prompt_ids + answer_ids, [0] * len(prompt_ids) + [1] * len(answer_ids)


def write_shard(path: Path, rows: list[dict[str, Any]]) -> None:
    """Temp name, then rename: a shard on disk is always complete."""
    with writing(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    g = cfg.generate
    try:
        prompts = load_prompts(g.prompts_path)
        train_idx, holdout_idx = split_indices(len(prompts), g.num_samples, g.holdout, g.seed)
    except PromptError as exc:
        raise StageError(str(exc)) from None
    # sample_id 0..holdout-1 are held out, the rest train.
    samples = [(i, p, "holdout") for i, p in enumerate(holdout_idx)]
    samples += [(len(holdout_idx) + i, p, "train") for i, p in enumerate(train_idx)]
    shards = [samples[s:s + g.shard_size] for s in range(0, len(samples), g.shard_size)]
    data_dir = request.path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    shard_paths = [data_dir / f"shard-{i:05d}.parquet" for i in range(len(shards))]
    todo = [i for i, p in enumerate(shard_paths) if not p.exists()]
    log.info("%d samples (%d held out) in %d shards; %d shards to generate", len(samples), g.holdout,
             len(shards), len(todo))

    stats = {"failed": 0, "completion_tokens": 0, "seconds": 0.0}
    first_error: str | None = None
    if todo:
        chat_tok = ChatTokenizer(cfg.target.model_path, cfg.target.thinking_start, cfg.target.thinking_end)
        with make_server(target_launch(cfg), request.path / "engine.log", name="target") as server:
            for i in todo:
                convs = [prompts[p] for _, p, _ in shards[i]]
                results, seconds = chat_all(
                    server.base_url, served_name(cfg), convs, max_tokens=g.max_tokens,
                    temperature=g.temperature, concurrency=g.concurrency, timeout_s=cfg.engine.request_timeout_s,
                )
                rows, errors = _rows(shards[i], convs, results, chat_tok)
                stats["failed"] += len(errors)
                stats["completion_tokens"] += sum(r.completion_tokens for r in results)
                stats["seconds"] += seconds
                first_error = first_error or (errors[0] if errors else None)
                allowed = g.max_failed_fraction * len(samples)
                if stats["failed"] > allowed:
                    raise StageError(
                        f"{stats['failed']} answers failed or came back empty, more than generate.max_failed_fraction "
                        f"({g.max_failed_fraction}) allows; first: {first_error}. Nothing of this shard was kept."
                    )
                write_shard(shard_paths[i], rows)
                log.info("shard %d/%d: %d samples, %.0f output tok/s", i + 1, len(shards), len(rows),
                         sum(r.completion_tokens for r in results) / max(seconds, 1e-9))

    counts = {"train": 0, "holdout": 0}
    tokens = 0
    for p in shard_paths:
        t = pq.read_table(p, columns=["split", "input_ids"])
        for split in t.column("split").to_pylist():
            counts[split] += 1
        tokens += sum(len(x) for x in t.column("input_ids").to_pylist())
    if counts["train"] == 0 or counts["holdout"] == 0:
        raise StageError(f"after dropping failed answers, train={counts['train']} holdout={counts['holdout']}; "
                         "both splits need samples")
    rel = [str(p.relative_to(request.path)) for p in shard_paths]
    return request.manifest(
        outputs=GenerateOutputs(shards=rel, num_train=counts["train"], num_holdout=counts["holdout"], num_tokens=tokens),
        hashes={r: sha256_file(request.path / r) for r in rel},
        metrics=GenerateMetrics(failed=stats["failed"], completion_tokens=stats["completion_tokens"],
                                output_tok_s=stats["completion_tokens"] / stats["seconds"] if stats["seconds"] else None),
    )


def _rows(shard: list[tuple[int, int, str]], convs: list[Messages], results: list[ChatResult],
          chat_tok: ChatTokenizer) -> tuple[list[dict[str, Any]], list[str]]:
    rows, errors = [], []
    for (sample_id, _, split), messages, res in zip(shard, convs, results):
        if res.error:
            errors.append(f"sample {sample_id}: {res.error}")
            continue
        ids, mask = chat_tok.encode(messages, res.reasoning, res.content)
        rows.append({"sample_id": sample_id, "split": split, "messages": json.dumps(messages),
                     "reasoning": res.reasoning or "", "content": res.content or "",
                     "input_ids": ids, "loss_mask": mask})
    return rows, errors


if __name__ == "__main__":
    sys.exit(stage_main("generate", run))
