"""An engine's Prometheus `/metrics` page: counters and latency histograms, diffed around a window.

vLLM and SGLang export the same latency histogram names under their own prefix ("vllm:", "sglang:");
TTFT, inter-token latency and time per output token are taken from the engine's own histograms, so
no client lag is in them.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from eagleflow.util import http

# The engines' latency histograms (seconds), as `<prefix><name>`; vLLM and SGLang share these names.
LATENCY_HISTOGRAMS = {
    "ttft_ms": "time_to_first_token_seconds",
    "itl_ms": "inter_token_latency_seconds",
    "tpot_ms": "request_time_per_output_token_seconds",
    "e2e_ms": "e2e_request_latency_seconds",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Counters (`name`, without `_total`; `name{position=i}` for per-position ones) and histogram
    `name_sum` / `name_count` of a Prometheus text page, each summed over its other labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                name = sample.name[: -len("_total")]
                if "position" in sample.labels:
                    name = f"{name}{{position={sample.labels['position']}}}"
            elif family.type == "histogram" and sample.name.endswith(("_sum", "_count")):
                name = sample.name
            else:
                continue
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def parse_samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page by its name (`_total`, `_sum`, `_count` kept; gauges such as
    `process_start_time_seconds` too), each summed over its labels (engines, models, finish reasons)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def latency_from_deltas(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, float | None]:
    """Mean of each latency histogram over the window (delta sum / delta count), in ms."""
    out: dict[str, float | None] = {}
    for key, hist in LATENCY_HISTOGRAMS.items():
        n = after.get(f"{prefix}{hist}_count", 0.0) - before.get(f"{prefix}{hist}_count", 0.0)
        total = after.get(f"{prefix}{hist}_sum", 0.0) - before.get(f"{prefix}{hist}_sum", 0.0)
        out[key] = 1000.0 * total / n if n > 0 else None
    return out


def metrics_at(base_url: str, api_key: str | None = None, none_ok: bool = False) -> dict[str, float]:
    """A server's /metrics, parsed. none_ok: a 404 reads as no counters (SGLang serves the page only with
    --enable-metrics, and its answers carry the acceptance); any other answer is parsed as it comes."""
    r = http.get(f"{base_url.rstrip('/')}/metrics", headers=http.bearer(api_key), timeout=30.0)
    return {} if none_ok and r.status_code == 404 else parse_metrics(r.text)
