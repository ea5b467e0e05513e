"""Prompt sets: JSONL, one chat per line, validated line by line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from eagleflow import EagleflowError

Messages = list[dict[str, Any]]


class PromptError(EagleflowError, ValueError):
    """The prompt file is missing, empty or malformed; the message names the path and line."""


def load_prompts(path: str | Path) -> list[Messages]:
    """Each line is {"messages": [{"role", "content"}, ...]} or {"prompt": "..."} (one user turn)."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"prompt file {path} does not exist (generate.prompts_path); point it at a JSONL file")
    out: list[Messages] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                messages: Messages = [{"role": "user", "content": obj["prompt"]}]
            elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                messages = obj["messages"]
            else:
                raise PromptError(
                    f"{path}:{lineno}: expected an object with 'messages' (a list) or 'prompt' (a string)"
                )
            if not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            ):
                raise PromptError(f"{path}:{lineno}: every message needs a string 'role' and a string 'content'")
            if messages[-1]["role"] != "user":
                raise PromptError(f"{path}:{lineno}: the last message must be the user's (role 'user')")
            if not messages[-1]["content"].strip():
                raise PromptError(f"{path}:{lineno}: the user message is empty")
            out.append(messages)
    if not out:
        raise PromptError(f"prompt file {path} holds no prompts (generate.prompts_path); it needs at least one line")
    return out


def split_indices(n_available: int, num_samples: int, holdout: int, seed: int) -> tuple[list[int], list[int]]:
    """Choose num_samples prompts with a seeded shuffle; the first `holdout` of them are held out."""
    if num_samples > n_available:
        raise PromptError(
            f"generate.num_samples is {num_samples} but the prompt file has only {n_available} prompts; "
            "lower num_samples or add prompts"
        )
    order = list(range(n_available))
    random.Random(seed).shuffle(order)
    chosen = order[:num_samples]
    return chosen[holdout:], chosen[:holdout]


def holdout_prompts(
    path: str | Path, num_samples: int, holdout: int, seed: int, n: int | None = None
) -> list[Messages]:
    """The held-out prompts in sample order (the generate stage's holdout split, the benchmark's prompts):
    the first `n` of them, all when n is None. Needs no generate output: the split is a function of
    the file, num_samples, holdout and seed."""
    prompts = load_prompts(path)
    _, held = split_indices(len(prompts), num_samples, holdout, seed)
    return [prompts[i] for i in held[:n]]


def run_holdout(g: Any, n: int | None) -> list[Messages]:
    """The held-out prompts of a run config's `generate` section `g`, the first `n`: the same seeded split the
    generate stage holds out (so measuring a drafter needs no generate stage), or the nightly pool's fixed
    held-out file in its order. The benchmark's prompts, and the production canary's."""
    if g.split == "holdout":
        return load_prompts(g.prompts_path)[:n]
    return holdout_prompts(g.prompts_path, g.num_samples, g.holdout, g.seed, n)
