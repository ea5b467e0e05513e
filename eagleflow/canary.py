"""The canary: production's own acceptance and speed, measured through production's endpoint after a deploy.

    python -m eagleflow.canary REQUEST.json OUT.json
        REQUEST: {"config": the run config (its held-out prompts), "n", "max_tokens"}; production's API key,
        when it has one, in the environment variable EAGLEFLOW_PRODUCTION_API_KEY (never in a file)

The held-out prompts are sent one at a time, greedy, `max_tokens` each (`ignore_eos`: equal work per drafter),
and production's /metrics counters are read around them: acceptance length and per-position acceptance as
the engine counts them, output tokens a second as a client sees them. Greedy speculative decoding gives the
target's own answers, so measuring on production changes nothing its users get; production's other traffic
shares the counters, which is why the canary judges a drafter by its acceptance first (eagleflow.promotion's
`judge_canary`) and by its speed only within a tolerance.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from eagleflow import httpget
from eagleflow.engines.chat import ChatClient
from eagleflow.engines.launch import served_name
from eagleflow.engines.metrics import parse_metrics
from eagleflow.engines.vllm import SPEC_ACCEPTED_PER_POS, acceptance_from_deltas
from eagleflow.files import write_json_atomic
from eagleflow.production.deployed import CANARY_KEY_ENV
from eagleflow.prompts import run_holdout

WARMUP_REQUESTS = 1


def speculative_positions(metrics: dict[str, float]) -> int:
    """k: how many per-position acceptance counters production exports (0 when it serves no drafter)."""
    pattern = re.compile(re.escape(SPEC_ACCEPTED_PER_POS) + r"\{position=(\d+)\}")
    pos = [int(m.group(1)) for name in metrics if (m := pattern.match(name))]
    return max(pos) + 1 if pos else 0


def measure(url: str, model: str, prompts: list[list[dict[str, Any]]], max_tokens: int,
            api_key: str | None = None) -> dict[str, Any]:
    """Send the prompts to production (one in flight) and read its counters around them."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def metrics() -> dict[str, float]:
        return parse_metrics(httpget.get(f"{base}/metrics", headers=headers, timeout=30.0).text)

    extra = {"ignore_eos": True}
    with ChatClient(base, model, max_concurrency=1, api_key=api_key) as client:
        client.chat(prompts[:WARMUP_REQUESTS], max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        before = metrics()
        results, wall_s = client.chat(prompts, max_tokens=max_tokens, temperature=0.0, concurrency=1, extra=extra)
        after = metrics()
    k = speculative_positions(after)
    if k == 0:
        acceptance: dict[str, Any] = {"mean_acceptance_length": 1.0, "per_position_acceptance": [],
                                      "note": "production exports no speculative-decoding counters: it serves no drafter"}
    else:
        try:
            acceptance = acceptance_from_deltas(before, after, k)
        except Exception as exc:  # noqa: BLE001 - no drafts moved: a drafter that is loaded but never used
            acceptance = {"mean_acceptance_length": 1.0, "per_position_acceptance": [0.0] * k, "note": str(exc)}
    tokens = sum(r.completion_tokens for r in results)
    errors = [r.error for r in results if r.error]
    return {"requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
            "output_tokens": tokens, "wall_s": round(wall_s, 3),
            "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
            "mean_acceptance_length": round(acceptance["mean_acceptance_length"], 4),
            "per_position_acceptance": [round(x, 4) for x in acceptance["per_position_acceptance"]],
            "note": acceptance.get("note"), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print(__doc__)
        return 2
    from eagleflow.config import RunConfig

    req = json.loads(Path(args[0]).read_text())
    cfg = RunConfig.model_validate(req["config"])
    assert cfg.production.url, "the canary needs production.url"
    out = measure(cfg.production.url, served_name(cfg), run_holdout(cfg.generate, int(req["n"])),
                  int(req["max_tokens"]), os.environ.get(CANARY_KEY_ENV))
    write_json_atomic(Path(args[1]), out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
