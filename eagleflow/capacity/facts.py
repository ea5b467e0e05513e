"""What the capacity plan needs to know of a host, read there: `python -m eagleflow.capacity.facts CONFIG_JSON`.

Prints one JSON object: `python -m eagleflow.hosts.facts`' (GPUs, free disk under host.work_root, ...)
plus `target` (the checkpoint's config.json and the bytes of its weight files), `prompts` (their count
and mean length in tokens, counted as the check stage counts them: the target tokenizer's chat template, where
the environment has transformers, as a host's has; else characters / 4, and the plan says which), `history`
(what earlier stage runs under host.work_root measured) and `progress` (this run's stages already finished
there). Standard library and pydantic but for the tokenizer (seconds); `python -m cli.plan` runs it on the host.

CONFIG_JSON is the validated run config as one JSON argument (what `cli.plan` sends), or the path of
a stage request holding it (`{"config": {...}}`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import BenchmarkMetrics
from eagleflow.contracts.manifest import Manifest, stage_dir, stage_key
from eagleflow.contracts.plan import FinishedStages, MeasuredRun, PromptFacts, TargetFacts
from eagleflow.contracts.prompts import PromptError, load_prompts
from eagleflow.contracts.stage_records import ExtractMetrics, GenerateMetrics, GenerateOutputs, TrainMetrics
from eagleflow.hosts.facts import collect
from eagleflow.measure.intervals import round_spread

HISTORY_PER_STAGE = 20  # newest manifests read per stage
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def target_facts(model_path: str) -> TargetFacts | None:
    """The target's shape from its config.json (text_config first: multimodal targets such as Kimi-K2.5)
    and the bytes of its weight files; None without a config.json."""
    path = Path(model_path)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = {**raw, **(raw.get("text_config") or {})}
    if not isinstance(cfg.get("hidden_size"), int):
        return None
    weights = sum(f.stat().st_size for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
    keys = (
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    )
    return TargetFacts(
        model_path=str(path),
        hidden_size=cfg["hidden_size"],
        weights_bytes=weights or None,
        source=f"{path}/config.json and its weight files",
        **{k: cfg[k] for k in keys if isinstance(cfg.get(k), int)},
    )


def chat_token_counter(tok: Any) -> Callable[[list[dict]], int] | None:
    """The prompt-token count the plan and the check stage share: a prompt's messages through the target
    tokenizer's chat template, with the generation prompt (its text alone where the template refuses the chat);
    None without a tokenizer that has a chat template."""
    if tok is None or not getattr(tok, "chat_template", None):
        return None

    def count_tokens(messages: list[dict]) -> int:
        try:
            ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that refuses this chat: count its text
            ids = tok(" ".join(m["content"] for m in messages), add_special_tokens=False)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return count_tokens


def target_tokenizer(model_path: str) -> Any:
    """The target's tokenizer where this environment has transformers (a host's: the plan then counts prompts as
    the check stage does); None where it has not, or the tokenizer does not load (the check stage names why)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        return AutoTokenizer.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - any failure to load is the check stage's to report
        return None


def prompt_facts(
    path: str, count_tokens: Callable[[list[dict]], int] | None = None, sample: int = 2000
) -> PromptFacts | None:
    """Count and mean tokens of the prompts: `count_tokens(messages)` over up to `sample` evenly spaced
    prompts (the target's tokenizer, on the check stage), else characters / 4."""
    try:
        prompts = load_prompts(path)
    except PromptError:
        return None
    step = max(1, len(prompts) // sample)
    picked = prompts[::step][:sample]
    if count_tokens is not None:
        counts, method = [count_tokens(m) for m in picked], "tokenizer"
    else:
        counts, method = [sum(len(m["content"]) for m in msgs) / 4 for msgs in picked], "chars/4"
    return PromptFacts(path=path, count=len(prompts), mean_tokens=round(sum(counts) / len(counts), 1), method=method)


def _measured(stage: str, manifest: Manifest, config: dict[str, Any]) -> MeasuredRun | None:
    run = dict(
        stage=stage,
        run=f"{stage}/{manifest.key}",
        created=manifest.created,
        target=(config.get("target") or {}).get("model_path"),
        seconds=manifest.seconds or None,
    )
    if stage == "generate":
        m, o = GenerateMetrics.of(manifest), GenerateOutputs.of(manifest)
        samples = o.num_train + o.num_holdout
        return MeasuredRun(
            **run,
            tok_s=m.output_tok_s,
            answer_tokens=m.completion_tokens / samples if m.completion_tokens and samples else None,
        )
    if stage == "extract":
        m = ExtractMetrics.of(manifest)
        return MeasuredRun(**run, tok_s=m.tok_s, backend=m.backend)
    if stage == "train":
        return MeasuredRun(**run, tok_s=TrainMetrics.of(manifest).tokens_per_s)
    if stage == "benchmark":
        return MeasuredRun(**run, settings=config.get("benchmark"), round_cv=_round_cv(BenchmarkMetrics.of(manifest)))
    return MeasuredRun(**run)


def _round_cv(m: BenchmarkMetrics) -> float | None:
    """The new drafter's per-round spread at the first setting (a reused baseline's rounds pair it too)."""
    head = m.windows[0] if m.windows else None
    base = next(
        (
            w
            for w in m.windows
            if w.variant == "baseline"
            and head
            and (w.temperature, w.concurrency) == (head.temperature, head.concurrency)
        ),
        None,
    )
    new = next(
        (
            w
            for w in m.windows
            if w.variant == "drafter"
            and base
            and (w.temperature, w.concurrency) == (base.temperature, base.concurrency)
        ),
        None,
    )
    if not (
        base
        and new
        and base.round_seconds
        and base.round_tokens
        and new.round_seconds
        and new.round_tokens
        and new.round_accepted
        and new.round_drafts
    ):
        return None
    return round_spread(
        base.round_seconds, base.round_tokens, new.round_seconds, new.round_tokens, new.round_accepted, new.round_drafts
    )


def run_history(work_root: str) -> list[MeasuredRun]:
    """What the newest finished runs of each stage under work_root measured; a manifest this code cannot
    read (an older layout) is skipped."""
    found: list[MeasuredRun] = []
    for stage in ("generate", "extract", "train", "export", "benchmark"):
        manifests = sorted(
            Path(work_root, stage).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for path in manifests[:HISTORY_PER_STAGE]:
            try:
                manifest = Manifest.model_validate_json(path.read_text())
                request = json.loads((path.parent / "request.json").read_text())
                run = _measured(stage, manifest, request.get("config") or {})
            except (OSError, ValueError, ValidationError, KeyError):
                continue
            if run is not None:
                found.append(run)
    return found


def progress(cfg: RunConfig, exists: Callable[[str], bool], read_text: Callable[[str], str]) -> FinishedStages:
    """This run's stages already finished on the host (`exists`/`read_text` are the host's file calls):
    a finished generate gives the exact token count."""
    keys: dict[str, str] = {}
    done: list[str] = []
    tokens = samples = None
    for stage, up in (("generate", None), ("extract", "generate"), ("train", "extract"), ("export", "train")):
        keys[stage] = stage_key(stage, cfg, {up: keys[up]} if up else {})
        path = f"{stage_dir(cfg, stage, keys[stage])}/manifest.json"
        if not exists(path):
            break
        done.append(stage)
        if stage == "generate":
            out = GenerateOutputs.of(Manifest.model_validate_json(read_text(path)))
            tokens, samples = out.num_tokens, out.num_train + out.num_holdout
    return FinishedStages(done=done, generate_tokens=tokens, generate_samples=samples)


def gather(cfg: RunConfig, count_tokens: Callable[[list[dict]], int] | None = None) -> dict[str, Any]:
    """The facts object for `cfg` on this host (see the module doc)."""
    facts = collect(cfg.host.work_root)
    target = target_facts(cfg.target.model_path)
    prompts = prompt_facts(cfg.generate.prompts_path, count_tokens)
    facts.update(
        target=target.model_dump() if target else None,
        prompts=prompts.model_dump() if prompts else None,
        history=[r.model_dump() for r in run_history(cfg.host.work_root)],
        progress=progress(cfg, lambda p: Path(p).exists(), lambda p: Path(p).read_text()).model_dump(),
    )
    return facts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eagleflow.capacity.facts CONFIG_JSON|REQUEST.json", file=sys.stderr)
        return 2
    arg = args[0]
    data = json.loads(arg) if arg.lstrip().startswith("{") else json.loads(Path(arg).read_text())["config"]
    cfg = RunConfig.model_validate(data)
    print(json.dumps(gather(cfg, chat_token_counter(target_tokenizer(cfg.target.model_path)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
