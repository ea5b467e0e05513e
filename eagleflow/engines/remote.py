"""A server this stage did not start: production's own, reached at its URL, never stopped or signalled.

The generate stage sends its prompts there (`generate.server: production`) while production keeps
serving its users. The API key comes from this process's environment only: the flow run hands it over
in memory (`PRODUCTION_API_KEY_ENV`), or the operator exports `production.api_key_env` on the host; it is never
read from or written to a file, and no message here ever carries it.
"""

from __future__ import annotations

import logging
import os
import time

from eagleflow.config import RunConfig
from eagleflow.contracts.request import PRODUCTION_API_KEY_ENV, StageError
from eagleflow.engines.chat import ChatResult
from eagleflow.engines.metrics import latency_from_deltas, metrics_at
from eagleflow.engines.sglang import SglangServer, acceptance_from_answers, acceptance_from_counters
from eagleflow.engines.vllm import VllmServer, acceptance_from_deltas
from eagleflow.util import http

log = logging.getLogger("eagleflow.engine")
HEALTH_POLL_S = 2.0


class RemoteServer:
    """Production's OpenAI-compatible server: its base URL, its key, and a wait for it to answer."""

    def __init__(self, config: RunConfig):
        p = config.production
        assert p.url, "RunConfig requires production.url with generate.server 'production'"
        self.base_url = p.url.rstrip("/")
        self.health_url = p.health_url or f"{self.base_url}/health"
        self.api_key = production_api_key(config)

    def answering(self) -> bool:
        return http.answers(self.health_url, 5.0)

    def wait_answering(self, timeout_s: float) -> float:
        """Block until the health URL answers 200 (a restart, a dropped link); return the seconds waited."""
        start = time.monotonic()
        while not self.answering():
            waited = time.monotonic() - start
            if waited > timeout_s:
                raise StageError(
                    f"production at {self.health_url} has not answered for {waited:.0f} s (generate.server_wait_s); "
                    "finished shards are kept: rerun the pipeline once production serves again, it resumes there"
                )
            time.sleep(HEALTH_POLL_S)
        return time.monotonic() - start


def production_api_key(config: RunConfig) -> str | None:
    """The key from this process's environment: the flow run's hand-over first, then production.api_key_env."""
    p = config.production
    key = os.environ.get(PRODUCTION_API_KEY_ENV)
    if key:
        return key
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise StageError(
                f"production.api_key_env names {p.api_key_env}, which is not set in the environment of the flow run "
                f"nor on the host; export it where the Prefect worker runs, or use production.api_key_secret"
            )
        return key
    if p.api_key_secret:
        raise StageError(
            f"production.api_key_secret names the Prefect Secret block {p.api_key_secret!r}, but no key reached this "
            f"stage ({PRODUCTION_API_KEY_ENV} is unset): run it through the flow, which reads the block and hands the "
            f"key over"
        )
    return None


class ProductionEndpoint:
    """Production, measured where it serves: the benchmark's stand-in for an engine of its own
    (`benchmark.drafter_on: production`). Nothing here starts, stops or signals it. Its acceptance is read as its
    engine (engine.kind) reports it: vLLM's /metrics counters, SGLang's answers (each one's meta_info, asked for
    with every request), its counters where no answer carries them."""

    name = "production"

    def __init__(self, config: RunConfig):
        self.server = RemoteServer(config)
        self.base_url, self.api_key = self.server.base_url, self.server.api_key
        self.wait_s = config.generate.server_wait_s
        self.kind = config.engine.kind
        self.request_extra = SglangServer.request_extra if self.kind == "sglang" else {}
        self.metric_prefix = SglangServer.metric_prefix if self.kind == "sglang" else VllmServer.metric_prefix

    def start(self) -> None:
        """Production is up (the window that deployed the drafter gave it back): nothing to launch."""

    def stop(self, grace_s: float = 0.0) -> None:
        """Never ours to stop."""

    def wait_healthy(self) -> None:
        self.server.wait_answering(self.wait_s)

    def snapshot(self) -> dict[str, float]:
        # SGLang serves /metrics only with --enable-metrics: the answers carry the acceptance
        return metrics_at(self.base_url, self.api_key, none_ok=self.kind == "sglang")

    def answers_acceptance(self, results: list[ChatResult], k: int) -> dict | None:
        """SGLang's: from each answer's meta_info (None on vLLM, whose answers carry none: its counters then)."""
        return acceptance_from_answers([r.raw for r in results], k) if self.kind == "sglang" else None

    def acceptance(self, before: dict[str, float], after: dict[str, float], k: int) -> dict:
        if self.kind != "sglang":
            return acceptance_from_deltas(before, after, k)
        counted = acceptance_from_counters(before, after, k)
        if counted is None:
            raise StageError(
                f"SGLang production at {self.base_url} reported no acceptance: no answer carried meta_info's "
                "spec_verify_ct and its counters (sglang:spec_verify_calls) did not move; is it serving with its "
                "EAGLE3 drafter (--speculative-algorithm EAGLE3)?"
            )
        return counted

    def latency(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
        return latency_from_deltas(before, after, self.metric_prefix)

    def post_mortem(self) -> str:
        return (
            f"production at {self.base_url} (its own log is the operator's: the unit's journal or "
            "production.start_command's output)"
        )
