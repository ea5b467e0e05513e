"""A served engine's acceptance and answers, measured through its endpoint: the prompts one at a time, greedy,
`max_tokens` each (`ignore_eos`: equal work per drafter), and the engine's own /metrics counters read around
them. The production canary's measurement (eagleflow.production.canary) and the pause's probe
(eagleflow.production.pause).
"""

from __future__ import annotations

import re
import time
from typing import Any

from eagleflow.engines.chat import ChatClient
from eagleflow.engines.metrics import parse_metrics
from eagleflow.engines.vllm import SPEC_ACCEPTED_PER_POS, acceptance_from_deltas
from eagleflow.util import http

WARMUP_REQUESTS = 1


def speculative_positions(metrics: dict[str, float]) -> int:
    """k: how many per-position acceptance counters production exports (0 when it serves no drafter)."""
    pattern = re.compile(re.escape(SPEC_ACCEPTED_PER_POS) + r"\{position=(\d+)\}")
    pos = [int(m.group(1)) for name in metrics if (m := pattern.match(name))]
    return max(pos) + 1 if pos else 0


def measure(
    url: str,
    model: str,
    prompts: list[list[dict[str, Any]]],
    max_tokens: int,
    api_key: str | None = None,
    keep_answers: bool = False,
) -> dict[str, Any]:
    """Send the prompts to production (one in flight) and read its counters around them; with keep_answers, the
    answers too (in prompt order)."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def metrics() -> dict[str, float]:
        return parse_metrics(http.get(f"{base}/metrics", headers=headers, timeout=30.0).text)

    extra = {"ignore_eos": True}
    with ChatClient(base, model, max_concurrency=1, api_key=api_key) as client:
        client.chat(prompts[:WARMUP_REQUESTS], max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        before = metrics()
        results, wall_s = client.chat(prompts, max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        after = metrics()
    k = speculative_positions(after)
    if k == 0:
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
