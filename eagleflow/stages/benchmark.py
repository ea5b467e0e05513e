"""benchmark: the engine without and with the new drafter, on the same held-out chat prompts.

Each variant gets its own engine launch (this stage's own process group, ended afterwards), a few
warm-up requests, then the measured window: every held-out prompt at the same temperature and a
fixed number of output tokens (`ignore_eos`, so both variants produce the same amount). Acceptance
comes from the deltas of the engine's own /metrics counters over the measured window.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from eagleflow.engines.chat import chat_all
from eagleflow.engines.vllm import VllmServer, acceptance_from_deltas
from eagleflow.manifest import Manifest
from eagleflow.stages.common import StageError, StageRequest, stage_main
from eagleflow.stages.generate import holdout_conversations, served_name, target_launch

log = logging.getLogger("eagleflow.benchmark")


def measure(request: StageRequest, variant: str, prompts: list, speculative: dict[str, Any] | None) -> dict[str, Any]:
    cfg = request.config
    b = cfg.benchmark
    send = lambda convs: chat_all(  # noqa: E731
        server.base_url, served_name(cfg), convs, max_tokens=b.max_tokens, temperature=b.temperature,
        concurrency=b.concurrency, timeout_s=cfg.engine.request_timeout_s, extra={"ignore_eos": True},
    )
    with VllmServer(target_launch(cfg, speculative), request.path / f"engine-{variant}.log") as server:
        if b.warmup_requests:
            send(prompts[: b.warmup_requests])
        before = server.metrics() if speculative else {}
        results, seconds = send(prompts)
        after = server.metrics() if speculative else {}
    errors = [r.error for r in results if r.error]
    if errors:
        raise StageError(f"{variant}: {len(errors)} of {len(results)} benchmark requests failed; first: {errors[0]}")
    tokens = sum(r.completion_tokens for r in results)
    out: dict[str, Any] = {
        "output_tok_s": tokens / seconds,
        "output_tokens": tokens,
        "seconds": seconds,
        "requests": len(results),
    }
    if speculative:
        out.update(acceptance_from_deltas(before, after, b.num_speculative_tokens))
    log.info("%s: %s", variant, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()})
    return out


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    b = cfg.benchmark
    prompts = holdout_conversations(request.upstream["generate"])[: b.num_prompts]
    if len(prompts) < b.num_prompts:
        raise StageError(f"only {len(prompts)} held-out prompts survived generation; lower benchmark.num_prompts")
    export = request.upstream["export"]
    drafter_dir = export.path(export.outputs["vllm"])
    speculative = {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": b.num_speculative_tokens}
    baseline = measure(request, "baseline", prompts, None)
    drafter = measure(request, "drafter", prompts, speculative)
    speedup = drafter["output_tok_s"] / baseline["output_tok_s"]
    return request.manifest(
        outputs={"drafter_dir": drafter_dir, "num_prompts": len(prompts)},
        metrics={"baseline": baseline, "drafter": drafter, "speedup": speedup,
                 "settings": b.model_dump(mode="json")},
    )


if __name__ == "__main__":
    sys.exit(stage_main("benchmark", run))
