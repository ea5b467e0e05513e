"""The canary: production's own acceptance and speed, measured through production's endpoint after a deploy.

    python -m eagleflow.production.canary REQUEST.json OUT.json
        REQUEST: {"config": the run config (its held-out prompts), "n", "max_tokens"}; production's API key,
        when it has one, in the environment variable EAGLEFLOW_PRODUCTION_API_KEY (never in a file)

The held-out prompts are sent one at a time, greedy, `max_tokens` each (`ignore_eos`: equal work per drafter), and
production's /metrics counters are read around them (SGLang: each answer's meta_info, which it reports when asked;
its own k from /server_info): acceptance length and per-position acceptance as the engine counts them, output tokens
a second as a client sees them. Greedy speculative decoding gives the target's own answers, so measuring on
production changes nothing its users get; production's other traffic shares the counters, which is why the canary
judges a drafter by its acceptance first (eagleflow.nightly.promotion's `judge_canary`) and by its speed only within
a tolerance.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

from eagleflow.contracts.failure import stage_ending
from eagleflow.contracts.prompts import run_holdout
from eagleflow.contracts.request import PRODUCTION_API_KEY_ENV
from eagleflow.engines.acceptance import measure
from eagleflow.engines.launch import served_name
from eagleflow.util.files import write_json_atomic


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print(__doc__)
        return 2
    from eagleflow.config import RunConfig

    req = json.loads(Path(args[0]).read_text())
    cfg = RunConfig.model_validate(req["config"])
    if not cfg.production.url:
        print("\n".join(stage_ending("the canary has no production.url to measure", "set production.url")))
        return 1
    try:
        out = measure(
            cfg.production.url,
            served_name(cfg),
            run_holdout(cfg.generate, int(req["n"])),
            int(req["max_tokens"]),
            os.environ.get(PRODUCTION_API_KEY_ENV),
            engine=cfg.engine.kind,
            k=cfg.benchmark.num_speculative_tokens,
        )
    except (httpx.HTTPError, OSError, RuntimeError) as exc:
        # The flow's cause line reads this ending: what the canary met at production's endpoint, and what to do.
        said = f"production at {cfg.production.url} did not answer the canary: {type(exc).__name__}: {exc}"
        fix = "check that production serves at production.url and takes the API key it is given"
        print("\n".join(stage_ending(said, fix)), flush=True)
        return 1
    write_json_atomic(Path(args[1]), out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
