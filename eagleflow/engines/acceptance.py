"""A served engine's acceptance and answers, measured through its endpoint: the prompts one at a time, greedy,
`max_tokens` each (`ignore_eos`: equal work per drafter), and the engine's own /metrics counters read around
them. The production canary's measurement (eagleflow.production.canary); the pause's probe
(eagleflow.production.pause) reads the counters around each request instead (`measure_each`), so the AL's
interval has its units and the probe can stop once that interval decides.

SGLang's production exports none of vLLM's speculative counters (its /metrics has verify calls and gauges, and
only with --enable-metrics): there each answer carries its own counts (`return_meta_info`: its verify steps,
accepted drafts and their histogram), which `measure` reads instead (engine 'sglang').
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from eagleflow.engines.chat import ChatClient, ChatResult
from eagleflow.engines.metrics import metrics_at
from eagleflow.engines.sglang import (
    acceptance_from_answers,
    acceptance_from_counters,
    drafts_per_step,
    server_info_at,
    speculative_settings,
)
from eagleflow.engines.vllm import SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS, SPEC_DRAFTS, acceptance_from_deltas

WARMUP_REQUESTS = 1


def speculative_positions(metrics: dict[str, float]) -> int:
    """k: how many per-position acceptance counters production exports (0 when it serves no drafter)."""
    pattern = re.compile(re.escape(SPEC_ACCEPTED_PER_POS) + r"\{position=(\d+)\}")
    pos = [int(m.group(1)) for name in metrics if (m := pattern.match(name))]
    return max(pos) + 1 if pos else 0


def answers_acceptance(results: Sequence[ChatResult], k: int) -> dict[str, Any]:
    """SGLang production's acceptance from its answers' meta_info: AL 1.0 where none carries drafting counts. k:
    the drafts a step production is meant to propose; its answers can only show at least as many as one step
    accepted (SGLang's histogram grows with the most accepted), so the larger of the two."""
    bodies = [r.raw for r in results]
    k = max(k, drafts_per_step(bodies))
    got = acceptance_from_answers(bodies, k) if k else None
    if got is None:
        return {
            "mean_acceptance_length": 1.0,
            "per_position_acceptance": [],
            "note": "no answer carried SGLang's speculative counts (meta_info spec_verify_ct): production serves no "
            "drafter, or an SGLang that does not report them, or something in front of it drops them",
        }
    return {**got, "per_position_acceptance": got["per_position_acceptance"] or [], "note": got["source"]}


def measure(
    url: str,
    model: str,
    prompts: list[list[dict[str, Any]]],
    max_tokens: int,
    api_key: str | None = None,
    keep_answers: bool = False,
    engine: str = "vllm",
    k: int = 0,
) -> dict[str, Any]:
    """Send the prompts to production (one in flight) and read its counters around them (engine 'vllm') or each
    answer's own (engine 'sglang', whose drafts a step `k` its answers may not all show); with keep_answers, the
    answers too (in prompt order)."""
    base = url.rstrip("/")
    sglang = engine == "sglang"
    if sglang:
        # production's own k where it says (its /server_info; unreachable raises here, as vLLM's /metrics does)
        info = server_info_at(base, api_key)
        k = (speculative_settings(info)[0] if info else 0) or k

    def metrics() -> dict[str, float]:
        return metrics_at(base, api_key, none_ok=sglang)  # SGLang's needs --enable-metrics

    extra = {"ignore_eos": True, **({"return_meta_info": True} if sglang else {})}
    with ChatClient(base, model, max_concurrency=1, api_key=api_key) as client:
        client.chat(prompts[:WARMUP_REQUESTS], max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        before = metrics()
        results, wall_s = client.chat(prompts, max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        after = metrics()
    if sglang:
        acceptance = answers_acceptance(results, k)
        counted = acceptance_from_counters(before, after, k) if acceptance.get("num_drafts") is None else None
        if counted is not None:  # answers without meta_info (a proxy that drops it), counters that moved
            acceptance = {**counted, "per_position_acceptance": [], "note": counted["source"]}
    elif (k := speculative_positions(after)) == 0:
        acceptance: dict[str, Any] = {
            "mean_acceptance_length": 1.0,
            "per_position_acceptance": [],
            "note": "production exports no speculative-decoding counters: it serves no drafter",
        }
    else:
        try:
            acceptance = acceptance_from_deltas(before, after, k)
        except Exception as exc:  # noqa: BLE001 - no drafts moved: a drafter that is loaded but never used
            acceptance = {"mean_acceptance_length": 1.0, "per_position_acceptance": [0.0] * k, "note": str(exc)}
    tokens = sum(r.completion_tokens for r in results)
    errors = [r.error for r in results if r.error]
    return {
        "requests": len(results),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "mean_acceptance_length": round(acceptance["mean_acceptance_length"], 4),
        "per_position_acceptance": [round(x, 4) for x in acceptance["per_position_acceptance"]],
        "note": acceptance.get("note"),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"answers": [r.content for r in sorted(results, key=lambda r: r.index)]} if keep_answers else {}),
    }


# Sequences of per-request (accepted drafts, drafting steps) so far -> whether they settle the question asked.
Settled = Callable[[Sequence[float], Sequence[float]], bool]


def measure_each(
    url: str,
    model: str,
    prompts: list[list[dict[str, Any]]],
    max_tokens: int,
    api_key: str | None = None,
    *,
    settled: Settled | None = None,
    min_requests: int = 1,
    max_requests: int | None = None,
    max_s: float | None = None,
) -> dict[str, Any]:
    """The prompts one at a time, greedy, the engine's counters read before and after each: per request its
    drafting steps and accepted drafts (the units of the AL's interval, eagleflow.measure.intervals). Stops once
    `settled(accepted, drafts)` holds after at least `min_requests`, or at `max_requests` or `max_s`, or when the
    prompts run out: a prompt is never sent twice (a greedy answer sent again repeats its counts and would narrow
    the interval without adding evidence). No warm-up: the counters are per request, a first slow one costs no
    figure. The answers in prompt order; the totals as `measure` gives them."""
    base = url.rstrip("/")

    def metrics() -> dict[str, float]:
        return metrics_at(base, api_key)

    cap = min(len(prompts), max_requests or len(prompts))
    drafts: list[float] = []
    accepted: list[float] = []
    answers: list[str | None] = []
    errors: list[str] = []
    tokens, wall_s, stopped = 0, 0.0, "prompts sent"
    start = before = metrics()
    t0 = time.monotonic()
    with ChatClient(base, model, max_concurrency=1, api_key=api_key) as client:
        for i in range(cap):
            results, seconds = client.chat(
                prompts[i : i + 1], max_tokens=max_tokens, temperature=0.0, concurrency=1, extra={"ignore_eos": True}
            )
            after = metrics()
            r = results[0]
            answers.append(r.content)
            tokens += r.completion_tokens
            wall_s += seconds
            if r.error:
                errors.append(r.error)
            drafts.append(after.get(SPEC_DRAFTS, 0.0) - before.get(SPEC_DRAFTS, 0.0))
            accepted.append(after.get(SPEC_ACCEPTED, 0.0) - before.get(SPEC_ACCEPTED, 0.0))
            before = after
            n = i + 1
            if n >= min_requests and settled is not None and settled(accepted, drafts):
                stopped = "settled"
                break
            if max_s is not None and n < cap and time.monotonic() - t0 >= max_s:
                stopped = f"{max_s:g} s cap"
                break
        else:
            if cap < len(prompts):
                stopped = f"{cap} requests cap"
    k = speculative_positions(before)
    per_pos: list[float] = []
    if k and sum(drafts) > 0:
        per_pos = acceptance_from_deltas(start, before, k)["per_position_acceptance"]
    elif k:
        per_pos = [0.0] * k  # a drafter is loaded but drafted nothing: acceptance 0
    return {
        "requests": len(answers),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "mean_acceptance_length": round(1.0 + sum(accepted) / sum(drafts), 4) if sum(drafts) > 0 else 1.0,
        "per_position_acceptance": [round(x, 4) for x in per_pos],
        "request_drafts": drafts,
        "request_accepted": accepted,
        "stopped": stopped,
        "note": None if k else "production exports no speculative-decoding counters: it serves no drafter",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "answers": answers,
    }
