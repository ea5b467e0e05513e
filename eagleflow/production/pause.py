"""Production paused instead of stopped: vLLM's sleep mode, through production's own endpoint.

A stopped production costs a whole engine load to come back (minutes at Kimi-K2.5's size, the reference run
saw 22-40). Asleep, it gives the GPUs up in a fraction of a second and takes them back as fast (measured on an
H200 with vLLM 0.26: docs/benchmarks.md, "Sleep, wake and a drafter swapped in"):

    level 1   the weights to host RAM (pinned), the KV cache dropped: needs host RAM for production's weights
    level 2   everything dropped, the weights read again from disk at the wake: where host RAM is short

Production must be launched with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1` (the /sleep,
/wake_up and /is_sleeping routes). Nothing here is trusted on the engine's word alone: a sleep is
checked by /is_sleeping and the GPU memory given up, a wake by /is_sleeping, health and a probe judged
against the one taken before the sleep (`probe`, `judge`: the target's answers, the drafter's acceptance),
because a level-2 wake on vLLM 0.26 leaves the drafter accepting nothing (vllm#52479) while the target
answers as before. Whatever fails falls back to what always works: stop and start.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from eagleflow import EagleflowError
from eagleflow.config.production import choose_sleep_level
from eagleflow.util import http

SLEEP_ROUTES = ("/sleep", "/wake_up", "/is_sleeping")
SLEEP_MODE = "wait"  # in-flight requests finish first; new ones queue until the wake (vLLM's PauseMode)
MIN_FREED_FRACTION = 0.5  # asleep, production must have given up at least this much of its GPU memory
CALL_TIMEOUT_S = 600.0  # one /sleep or /wake_up: a level-2 wake reads the weights from disk
PROBE_MAX_TOKENS = 64
PROBE_MIN_ACCEPTANCE = 0.01  # accepted per draft token below this: a drafter whose weights are not in use
# Generic prompts: the probe asks whether the drafter drafts at all, not how well (the canary and the
# benchmark judge that on the held-out prompts); it needs no data of the run's.
PROBE_PROMPTS = [
    [{"role": "user", "content": "Explain in a few sentences how a hash table handles collisions."}],
    [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}],
    [{"role": "user", "content": "List the steps to make a cup of tea, one per line."}],
    [{"role": "user", "content": "What is the difference between a process and a thread?"}],
]


class PauseError(EagleflowError):
    """A sleep, wake or probe that did not do what it said; the caller falls back to stop and start."""


@dataclass
class PausePlan:
    """What the preflight found: whether production can be paused, at which level, and why (not)."""

    ok: bool
    why: str
    level: int | None = None
    base_url: str | None = None
    gpu_used_mib: int | None = None
    host_available_mib: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def base_url(url: str | None, health_url: str | None) -> str | None:
    """Production's API root: production.url, or health_url without its path."""
    if url:
        return url.rstrip("/")
    if not health_url:
        return None
    p = urlsplit(health_url)
    return f"{p.scheme}://{p.netloc}"


def gpu_used_mib() -> int | None:
    """GPU memory in use on the GPUs this process sees (nvidia-smi), summed; None without nvidia-smi."""
    argv = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        argv.insert(1, f"--id={os.environ['CUDA_VISIBLE_DEVICES']}")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sum(int(x) for x in out.stdout.split() if x.strip().isdigit())


def host_available_mib() -> int | None:
    """MemAvailable of /proc/meminfo, in MiB."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _headers(api_key: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


def is_sleeping(base: str, api_key: str | None = None) -> bool:
    r = http.get(f"{base}/is_sleeping", headers=_headers(api_key), timeout=30.0)
    if r.status_code != 200:
        raise PauseError(f"GET {base}/is_sleeping answered {r.status_code}: {r.text[:300]}")
    return bool(r.json().get("is_sleeping"))


def served_routes(base: str, api_key: str | None = None) -> set[str]:
    """The routes production serves, from its /openapi.json (empty when it has none); httpx errors propagate."""
    r = http.get(f"{base}/openapi.json", headers=_headers(api_key), timeout=30.0)
    return set(r.json().get("paths", {})) if r.status_code == 200 else set()


def preflight(
    mode: str, configured_level: int | None, url: str | None, health_url: str | None, api_key: str | None = None
) -> PausePlan:
    """Can production be paused? Asks production itself which routes it serves and whether it is awake."""
    if mode != "sleep":
        return PausePlan(False, "production.pause is 'stop'")
    base = base_url(url, health_url)
    if not base:
        return PausePlan(False, "production.url and production.health_url are unset: nothing to ask")
    try:
        routes = served_routes(base, api_key)
        missing = [p for p in SLEEP_ROUTES if p not in routes]
        if missing:
            return PausePlan(
                False,
                f"production at {base} serves no {', '.join(missing)}: launch it with "
                "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, or set production.pause 'stop'",
                base_url=base,
            )
        if is_sleeping(base, api_key):
            return PausePlan(
                False,
                f"production at {base} is already asleep: someone else paused it; "
                "eagleflow does not take over a sleep it did not start",
                base_url=base,
            )
    except (httpx.HTTPError, ValueError, PauseError) as exc:
        return PausePlan(False, f"production at {base} did not answer the sleep preflight: {exc}", base_url=base)
    gpu, host = gpu_used_mib(), host_available_mib()
    level, why = choose_sleep_level(configured_level, gpu, host)
    return PausePlan(True, why, level, base, gpu, host)


def _post(base: str, path: str, api_key: str | None, **kw: Any) -> float:
    t0 = time.monotonic()
    try:
        r = http.client().post(f"{base}{path}", headers=_headers(api_key), timeout=CALL_TIMEOUT_S, **kw)
    except httpx.HTTPError as exc:
        raise PauseError(f"POST {base}{path}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise PauseError(f"POST {base}{path} answered {r.status_code}: {r.text[:500]}")
    return time.monotonic() - t0


def sleep(base: str, level: int, api_key: str | None = None, gpu_before_mib: int | None = None) -> dict[str, Any]:
    """Put production to sleep; checked by /is_sleeping. Returns seconds and GPU memory around it (before: the
    preflight's figure when given, nvidia-smi is not asked twice)."""
    before = gpu_before_mib if gpu_before_mib is not None else gpu_used_mib()
    took = _post(base, f"/sleep?level={level}&mode={SLEEP_MODE}", api_key)
    if not is_sleeping(base, api_key):
        raise PauseError(f"POST {base}/sleep?level={level} answered 200 but /is_sleeping says awake")
    return {
        "level": level,
        "sleep_s": round(took, 3),
        "gpu_used_mib_before": before,
        "gpu_used_mib_asleep": gpu_used_mib(),
    }


def wake(
    base: str, level: int, api_key: str | None = None, between: Callable[[], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Wake production: the weights first, then `between` (a drafter swap: the GPUs still have the KV cache's
    room for the sender's copy), then the KV cache. Level 2 reloads the weights from disk after their wake."""
    out: dict[str, Any] = {"wake_weights_s": round(_post(base, "/wake_up", api_key, params={"tags": "weights"}), 3)}
    if level == 2:
        out["reload_weights_s"] = round(_post(base, "/collective_rpc", api_key, json={"method": "reload_weights"}), 3)
    if between is not None:
        out.update(between())
    out["wake_kv_cache_s"] = round(_post(base, "/wake_up", api_key, params={"tags": "kv_cache"}), 3)
    if is_sleeping(base, api_key):
        raise PauseError(f"production at {base} still says it is asleep after /wake_up")
    out["gpu_used_mib_awake"] = gpu_used_mib()
    return out


class NeedsKey(PauseError):
    """Production's /v1 answers 401: the probe has no key (it is never written where the guardian reads)."""


def served_model(base: str, api_key: str | None = None) -> str:
    r = http.get(f"{base}/v1/models", headers=_headers(api_key), timeout=30.0)
    if r.status_code == 401:
        raise NeedsKey(f"{base}/v1 wants an API key")
    if r.status_code != 200 or not r.json().get("data"):
        raise PauseError(f"GET {base}/v1/models answered {r.status_code}: {r.text[:300]}")
    return str(r.json()["data"][0]["id"])


def probe(base: str, api_key: str | None = None) -> dict[str, Any]:
    """Production's answers and its drafter's acceptance on a few generic greedy requests (its /metrics counters
    around them), taken before the sleep and after the wake and compared by `judge`."""
    from eagleflow.engines.acceptance import (
        measure,  # the canary's measurement; imported here, the guardian's start stays light
    )

    try:
        model = served_model(base, api_key)
    except NeedsKey as exc:
        return {"probe": f"skipped: {exc}; the canary or the benchmark on production measures its acceptance"}
    try:
        m = measure(base, model, PROBE_PROMPTS, PROBE_MAX_TOKENS, api_key, keep_answers=True)
    except (httpx.HTTPError, RuntimeError) as exc:
        raise PauseError(f"the probe on {base} failed: {type(exc).__name__}: {exc}") from exc
    if m["errors"]:
        raise PauseError(f"the probe's requests failed on {base}: {m['first_error']}")
    out: dict[str, Any] = {"probe_answers": m["answers"], "probe_tok_s": m["output_tok_s"]}
    per_pos = m["per_position_acceptance"]
    if per_pos:
        out.update(probe_al=m["mean_acceptance_length"], probe_per_position=per_pos)
    else:
        out["probe"] = "production serves no drafter (no speculative-decoding counters)"
    return out


def drafts(p: dict[str, Any]) -> bool:
    """Whether a probe saw the drafter accept anything (a mean per-position acceptance of at least 1%)."""
    per_pos = p.get("probe_per_position") or []
    return bool(per_pos) and sum(per_pos) / len(per_pos) >= PROBE_MIN_ACCEPTANCE


def judge(after: dict[str, Any], before: dict[str, Any] | None, swapped: bool = False) -> str | None:
    """Why production is not back whole (None: it is): the target answers otherwise than before the sleep (a
    reload that went wrong, a quantized one included), or a drafter that drafted before accepts nothing now."""
    before = before or {}
    if before.get("probe_answers") and after.get("probe_answers"):
        same = sum(a == b for a, b in zip(after["probe_answers"], before["probe_answers"]))
        if same < math.ceil(len(before["probe_answers"]) / 2):
            return (
                f"production answers otherwise after the wake: {same} of {len(before['probe_answers'])} greedy "
                "answers as before the sleep (its weights did not come back whole)"
            )
    if "probe_per_position" in after and not drafts(after) and (swapped or drafts(before)):
        return (
            f"production's drafter accepts nothing after the wake (AL {after['probe_al']:.3f}, per position "
            f"{after['probe_per_position']}): "
            + (
                "the drafter swapped in does not draft for this target, or its weights did not arrive"
                if swapped
                else "its weights are not in use (vllm#52479 after a level-2 wake)"
            )
        )
    return None
