"""Production's traffic as its own engine counted it, beside what the config says it is.

The benchmark's cells (production.traffic: sampling, concurrency, share) are what the verdict and the promotion gate
judge; they are the operator's statement. Production's engine keeps the figures that check it on its /metrics page,
cumulative since its process started: the requests it finished, the sum of their latencies, their prompt and
generated tokens. One read gives the load over all that span without a log or a sampler:

- requests in flight, averaged over time, is the sum of the requests' latencies over the span (Little's law: each
  request is in flight for its latency); idle hours count as zero, so a busy hour runs above it;
- the mean prompt and answer, per finished request.

The check stage reads it before any stage touches production (`eagleflow.stages.check`); the run's report shows it
and says where the config stands for another load (`disagreements`). vLLM and SGLang share the latency histogram's
name under their own prefix; the token counts are vLLM's per-request histograms, else either engine's counters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx

from eagleflow.config import RunConfig
from eagleflow.config.production import TrafficCell
from eagleflow.contracts.request import StageError
from eagleflow.contracts.stage_records import ObservedTraffic
from eagleflow.engines.metrics import parse_samples
from eagleflow.engines.remote import production_api_key
from eagleflow.util import http

log = logging.getLogger("eagleflow.production")
PREFIXES = ("vllm:", "sglang:")
# Below these, production's counts say little of its load (a server started an hour ago, a quiet test host): the
# figures are recorded, the config is not judged against them.
MIN_REQUESTS = 50
MIN_SPAN_S = 600.0
MAX_RATIO = 2.0  # stated against seen concurrency, either way, before it is called another load


def observe(text: str, now: float) -> ObservedTraffic | None:
    """The traffic in a /metrics page read at `now` (Unix seconds); None where no request has finished or the page
    is no engine's."""
    s = parse_samples(text)
    prefix = next((p for p in PREFIXES if s.get(f"{p}e2e_request_latency_seconds_count")), None)
    if prefix is None:
        return None
    n = s[f"{prefix}e2e_request_latency_seconds_count"]
    started = s.get("process_start_time_seconds")
    span = now - started if started and now > started else None
    prompt = s.get(f"{prefix}request_prompt_tokens_sum", s.get(f"{prefix}prompt_tokens_total"))
    answer = s.get(f"{prefix}request_generation_tokens_sum", s.get(f"{prefix}generation_tokens_total"))
    return ObservedTraffic(
        seconds=round(span, 1) if span else None,
        requests=int(n),
        in_flight=round(s[f"{prefix}e2e_request_latency_seconds_sum"] / span, 3) if span else None,
        requests_per_s=round(n / span, 4) if span else None,
        prompt_tokens=round(prompt / n, 1) if prompt is not None else None,
        answer_tokens=round(answer / n, 1) if answer is not None else None,
        output_tok_s=round(answer / span, 2) if span and answer is not None else None,
    )


def disagreements(
    seen: ObservedTraffic, traffic: Sequence[TrafficCell], concurrencies: Sequence[int], max_tokens: int
) -> list[str]:
    """Where the config stands for another load than production served: the stated concurrency (production.traffic's,
    weighted by share; else the benchmark's concurrencies) off the seen mean in flight by more than MAX_RATIO either
    way, or the benchmark's answers under half production's mean answer. Nothing below MIN_REQUESTS or MIN_SPAN_S."""
    if seen.requests < MIN_REQUESTS or not seen.seconds or seen.seconds < MIN_SPAN_S:
        return []
    out = []
    hours = seen.seconds / 3600
    over = f"over its last {hours:.1f} h ({seen.requests:,} requests)"
    if traffic:
        stated = sum(c.concurrency * c.share for c in traffic) / sum(c.share for c in traffic)
        where = "production.traffic states concurrency"
    else:
        stated = sum(concurrencies) / len(concurrencies)
        where = "benchmark.concurrencies average"
    if seen.in_flight and not 1 / MAX_RATIO <= stated / seen.in_flight <= MAX_RATIO:
        out.append(
            f"{where} {stated:g}, but production's engine ran {seen.in_flight:.1f} requests in flight on average "
            f"{over}: the verdict is measured at a load production does not serve; set the cells' concurrency near "
            "what production runs at its busy hours"
        )
    if seen.answer_tokens and max_tokens < seen.answer_tokens / 2:
        out.append(
            f"benchmark.max_tokens is {max_tokens}, under half production's mean answer ({seen.answer_tokens:.0f} "
            f"tokens {over}): acceptance deep into long answers is not measured"
        )
    return out


def read(cfg: RunConfig, timeout_s: float = 10.0) -> ObservedTraffic | None:
    """Production's traffic from its /metrics (production.url), judged against the config; None where production has
    no url, its page does not answer or holds no finished request (said in the log: the run goes on without it)."""
    p = cfg.production
    if not p.url:
        return None
    url = f"{p.url.rstrip('/')}/metrics"
    try:
        key = production_api_key(cfg)
    except StageError:
        key = None  # /metrics is not behind vLLM's --api-key; a missing key fails where /v1 is asked
    try:
        r = http.get(url, headers=http.bearer(key), timeout=timeout_s)
        r.raise_for_status()
        seen = observe(r.text, time.time())
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("production's traffic not read: %s: %s", url, exc)
        return None
    if seen is None:
        log.info("production's traffic: %s holds no finished request yet", url)
        return None
    b = cfg.benchmark
    return seen.model_copy(update={"disagreements": disagreements(seen, p.traffic, b.concurrencies, b.max_tokens)})
