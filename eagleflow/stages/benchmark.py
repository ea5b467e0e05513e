"""benchmark: the engine without and with the new drafter, on the same held-out chat prompts.

Each variant runs in its own engine (this stage's own process group, ended afterwards), gets a few
warm-up requests, then the measured window: every held-out prompt at the same temperature and a
fixed number of output tokens (`ignore_eos`, so both variants produce the same amount). Acceptance
comes from the deltas of the engine's own /metrics counters over the measured window.

With `benchmark.side_by_side` both engines load at once and the measured window alternates rounds
of requests between them (A B, B A, ...): on a noisy machine the ratio is then measured under the
same conditions. Otherwise the variants run one after the other, each alone on the host.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from contextlib import ExitStack
from typing import Any

from eagleflow.engines.chat import ChatResult, chat_all
from eagleflow.engines.vllm import VllmServer, acceptance_from_deltas
from eagleflow.manifest import Manifest
from eagleflow.prompts import Messages
from eagleflow.stages.common import StageError, StageRequest, stage_main
from eagleflow.stages.generate import holdout_conversations, served_name, target_launch

log = logging.getLogger("eagleflow.benchmark")


@dataclasses.dataclass
class Variant:
    """One engine configuration under test and what was measured on it."""

    name: str
    speculative: dict[str, Any] | None
    server: VllmServer | None = None
    tokens: int = 0
    seconds: float = 0.0
    requests: int = 0
    metrics_before: dict[str, float] = dataclasses.field(default_factory=dict)
    metrics_after: dict[str, float] = dataclasses.field(default_factory=dict)

    def record(self, results: list[ChatResult], seconds: float) -> None:
        errors = [r.error for r in results if r.error]
        if errors:
            raise StageError(f"{self.name}: {len(errors)} of {len(results)} benchmark requests failed; first: {errors[0]}")
        self.tokens += sum(r.completion_tokens for r in results)
        self.seconds += seconds
        self.requests += len(results)


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    b = cfg.benchmark
    prompts = holdout_conversations(request.upstream["generate"])[: b.num_prompts]
    if len(prompts) < b.num_prompts:
        raise StageError(f"only {len(prompts)} held-out prompts survived generation; lower benchmark.num_prompts")
    export = request.upstream["export"]
    drafter_dir = export.path(export.outputs["vllm"])
    variants = [
        Variant("baseline", None),
        Variant("drafter", {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": b.num_speculative_tokens}),
    ]

    def send(v: Variant, convs: list[Messages]) -> tuple[list[ChatResult], float]:
        assert v.server is not None
        return chat_all(v.server.base_url, served_name(cfg), convs, max_tokens=b.max_tokens, temperature=b.temperature,
                        concurrency=b.concurrency, timeout_s=cfg.engine.request_timeout_s, extra={"ignore_eos": True})

    rounds = [prompts[i:i + b.concurrency] for i in range(0, len(prompts), b.concurrency)]
    groups = [variants] if b.side_by_side else [[v] for v in variants]
    for group in groups:
        with ExitStack() as stack:
            for i, v in enumerate(group):
                launch = target_launch(cfg, v.speculative)
                launch.port += i  # side by side: the second engine listens on engine.port + 1
                v.server = VllmServer(launch, request.path / f"engine-{v.name}.log")
                stack.callback(v.server.stop)  # whatever happens, end what this stage started
                v.server.start()  # side by side: both load at once
            for v in group:
                v.server.wait_healthy()
                if b.warmup_requests:
                    send(v, prompts[: b.warmup_requests])
                v.metrics_before = v.server.metrics()
            for r, convs in enumerate(rounds):
                for v in group if r % 2 == 0 else group[::-1]:
                    v.record(*send(v, convs))
            for v in group:
                v.metrics_after = v.server.metrics()
    return request.manifest(
        outputs={"drafter_dir": drafter_dir, "num_prompts": len(prompts)},
        metrics=_metrics(variants, b.num_speculative_tokens) | {"settings": b.model_dump(mode="json")},
    )


def _metrics(variants: list[Variant], k: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        m: dict[str, Any] = {"output_tok_s": v.tokens / v.seconds, "output_tokens": v.tokens,
                             "seconds": v.seconds, "requests": v.requests}
        if v.speculative:
            m.update(acceptance_from_deltas(v.metrics_before, v.metrics_after, k))
        log.info("%s: %s", v.name, {key: (round(x, 4) if isinstance(x, float) else x) for key, x in m.items()})
        out[v.name] = m
    out["speedup"] = out["drafter"]["output_tok_s"] / out["baseline"]["output_tok_s"]
    return out


if __name__ == "__main__":
    sys.exit(stage_main("benchmark", run))
