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

The drafter is judged against what it should serve (`Expected`: its canary on production, else its offline
estimate), not against "accepts anything": on an H200 a probe of 4 short answers read AL 1.08 for a drafter
whose canary then read 2.53, and passed it, as it would have passed a drafter that really served 1.08. So the
probe after the wake sends request after request until the 95% interval of its AL (eagleflow.measure.intervals,
as the benchmark computes it) lies wholly above or below the bar, `production.probe_share` of the expected
accepted drafts per step, within `production.probe_max_requests` and `probe_max_s`.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from eagleflow import EagleflowError
from eagleflow.config.production import PROBE_SHARE, choose_sleep_level
from eagleflow.contracts.prompts import Messages, PromptError, run_holdout
from eagleflow.measure.intervals import Estimate, acceptance_length
from eagleflow.util import http

SLEEP_ROUTES = ("/sleep", "/wake_up", "/is_sleeping")
SLEEP_MODE = "wait"  # in-flight requests finish first; new ones queue until the wake (vLLM's PauseMode)
MIN_FREED_FRACTION = 0.5  # asleep, production must have given up at least this much of its GPU memory
CALL_TIMEOUT_S = 600.0  # one /sleep or /wake_up: a level-2 wake reads the weights from disk
PROBE_MAX_TOKENS = 64  # a window that does not know the canary's answer length (SettingsRecord.probe_max_tokens)
PROBE_MIN_ACCEPTANCE = 0.01  # accepted per draft token below this: a drafter whose weights are not in use
# The first prompts, sent before the sleep and first after the wake: their greedy answers must come back the same.
# Also the fewest requests the wake's probe decides on: Student's t with 3 degrees of freedom is 3.18, so an
# interval of fewer is too wide to separate anything but a drafter that accepts nothing.
PROBE_ANSWERS = 4
# Generic prompts, where the window does not know the run's held-out ones (a window opened by hand): no data of
# the run's is needed, but the drafter's figures on them are further from its offline estimate and its canary,
# both measured on the held-out prompts. 16, so the sequential probe has distinct prompts to send (a greedy answer
# sent twice repeats its counts: no new evidence).
PROBE_PROMPTS = [
    [{"role": "user", "content": "Explain in a few sentences how a hash table handles collisions."}],
    [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}],
    [{"role": "user", "content": "List the steps to make a cup of tea, one per line."}],
    [{"role": "user", "content": "What is the difference between a process and a thread?"}],
    [{"role": "user", "content": "Describe how a bicycle's gears make climbing a hill easier."}],
    [{"role": "user", "content": "Summarise the water cycle for a ten-year-old."}],
    [{"role": "user", "content": "Write a Python function that reverses the words of a sentence."}],
    [{"role": "user", "content": "Why is the sky blue? Answer in three sentences."}],
    [{"role": "user", "content": "Give five tips for writing clear documentation."}],
    [{"role": "user", "content": "Explain what a binary search does and when it applies."}],
    [{"role": "user", "content": "Write a short poem about autumn leaves."}],
    [{"role": "user", "content": "How does a refrigerator keep food cold?"}],
    [{"role": "user", "content": "Compare a linked list with an array in a short paragraph."}],
    [{"role": "user", "content": "Plan a three-day trip to a city by the sea, one line a day."}],
    [{"role": "user", "content": "What does a compiler do, step by step?"}],
    [{"role": "user", "content": "Explain compound interest with a small example."}],
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


def is_sleeping(base: str, api_key: str | None = None) -> bool:
    r = http.get(f"{base}/is_sleeping", headers=http.bearer(api_key), timeout=30.0)
    if r.status_code != 200:
        raise PauseError(f"GET {base}/is_sleeping answered {r.status_code}: {r.text[:300]}")
    return bool(r.json().get("is_sleeping"))


def served_routes(base: str, api_key: str | None = None) -> set[str]:
    """The routes production serves, from its /openapi.json (empty when it has none); httpx errors propagate."""
    r = http.get(f"{base}/openapi.json", headers=http.bearer(api_key), timeout=30.0)
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
        r = http.client().post(f"{base}{path}", headers=http.bearer(api_key), timeout=CALL_TIMEOUT_S, **kw)
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
    r = http.get(f"{base}/v1/models", headers=http.bearer(api_key), timeout=30.0)
    if r.status_code == 401:
        raise NeedsKey(f"{base}/v1 wants an API key")
    if r.status_code != 200 or not r.json().get("data"):
        raise PauseError(f"GET {base}/v1/models answered {r.status_code}: {r.text[:300]}")
    return str(r.json()["data"][0]["id"])


def probe_prompts(holdout: dict[str, Any] | None) -> tuple[list[Messages], str]:
    """The prompts the probe sends, and which: the run's held-out prompts when the window was told its generate
    section's split (`SettingsRecord.probe_holdout`: the prompts the offline estimate and the canary were measured
    on), else the generic ones."""
    if holdout:
        try:
            got = run_holdout(_Split(**holdout), None)
        except (PromptError, OSError, TypeError, ValueError) as exc:
            return PROBE_PROMPTS, f"generic prompts (the run's held-out prompts could not be read: {exc})"
        if len(got) >= PROBE_ANSWERS:
            return got, f"the run's {len(got)} held-out prompts"
    return PROBE_PROMPTS, f"{len(PROBE_PROMPTS)} generic prompts"


@dataclass(frozen=True)
class _Split:
    """What `run_holdout` reads of a generate section (the window carries these fields, not the whole config)."""

    prompts_path: str
    split: str = "seeded"
    num_samples: int = 0
    holdout: int = 0
    seed: int = 0


@dataclass(frozen=True)
class Expected:
    """What the drafter production serves after the wake should serve (its AL), and where that figure comes from;
    `al` None: nothing is known (a drafter with no offline estimate and no canary), and `source` says why."""

    al: float | None
    source: str


def bar(expected: float, share: float) -> float:
    """The AL a probe must reach: `share` of the expected accepted drafts per step, plus the target's own token.
    On AL - 1, not AL, as the benchmark's suspect_ratio: AL never falls below 1, so a share of AL would pass a
    drafter that accepts nothing wherever the expected AL is under 1 / share (2 at a share of 0.5)."""
    return 1.0 + share * (expected - 1.0)


def interval(p: dict[str, Any]) -> Estimate | None:
    """The probe's AL with its 95% interval, over its requests (each request a unit: eagleflow.measure.intervals)."""
    return acceptance_length(p.get("probe_request_accepted") or [], p.get("probe_request_drafts") or [])


def settles(at: float) -> Callable[[Sequence[float], Sequence[float]], bool]:
    """Whether the requests so far decide the drafter against the bar `at`: the AL's interval wholly above it or
    wholly below it (at least PROBE_ANSWERS requests: engines.acceptance.measure_each asks no sooner)."""

    def settled(accepted: Sequence[float], drafts: Sequence[float]) -> bool:
        est = acceptance_length(accepted, drafts)
        return est is not None and (est.low >= at or est.high < at)

    return settled


def probe(
    base: str,
    api_key: str | None = None,
    prompts: list[Messages] | None = None,
    expected: Expected | None = None,
    share: float = PROBE_SHARE,
    max_requests: int = PROBE_ANSWERS,
    max_s: float = 60.0,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """Production's answers and its drafter's acceptance on greedy requests, the /metrics counters read around each,
    taken before the sleep and after the wake and compared by `judge`. With an expected AL, requests go on, one at
    a time, until the AL's interval decides against `bar(expected.al, share)` or `max_requests` / `max_s` is
    reached; without one, PROBE_ANSWERS requests (before the sleep: the answers and whether it drafts)."""
    from eagleflow.engines.acceptance import (
        measure_each,  # the counters around each request; imported here, the guardian's start stays light
    )

    prompts = prompts or PROBE_PROMPTS
    try:
        model = served_model(base, api_key)
    except NeedsKey as exc:
        return {"probe": f"skipped: {exc}; the canary or the benchmark on production measures its acceptance"}
    at = bar(expected.al, share) if expected is not None and expected.al is not None else None
    try:
        m = measure_each(
            base,
            model,
            prompts,
            max_tokens or PROBE_MAX_TOKENS,
            api_key,
            settled=settles(at) if at is not None else None,
            min_requests=PROBE_ANSWERS,
            max_requests=max(max_requests, PROBE_ANSWERS) if at is not None else PROBE_ANSWERS,
            max_s=max_s,
        )
    except (httpx.HTTPError, RuntimeError) as exc:
        raise PauseError(f"the probe on {base} failed: {type(exc).__name__}: {exc}") from exc
    if m["errors"]:
        raise PauseError(f"the probe's requests failed on {base}: {m['first_error']}")
    out: dict[str, Any] = {
        "probe_answers": m["answers"][:PROBE_ANSWERS],
        "probe_tok_s": m["output_tok_s"],
        "probe_requests": m["requests"],
        "probe_s": m["wall_s"],
        "probe_stopped": m["stopped"],
    }
    per_pos = m["per_position_acceptance"]
    if per_pos:
        out.update(
            probe_al=m["mean_acceptance_length"],
            probe_per_position=per_pos,
            probe_request_drafts=m["request_drafts"],
            probe_request_accepted=m["request_accepted"],
        )
        est = interval(out)
        if est is not None and est.n >= 2:
            out["probe_al_interval"] = [round(est.low, 4), round(est.high, 4)]
    else:
        out["probe"] = "production serves no drafter (no speculative-decoding counters)"
    return out


def drafts(p: dict[str, Any]) -> bool:
    """Whether a probe saw the drafter accept anything (a mean per-position acceptance of at least 1%)."""
    per_pos = p.get("probe_per_position") or []
    return bool(per_pos) and sum(per_pos) / len(per_pos) >= PROBE_MIN_ACCEPTANCE


def verdict(
    after: dict[str, Any],
    before: dict[str, Any] | None,
    swapped: bool = False,
    expected: Expected | None = None,
    share: float = PROBE_SHARE,
) -> dict[str, Any]:
    """Whether production is back whole after the wake, as the window's record keeps it: `decision` ("pass",
    "refuse", or "not judged" where the probe read no drafter), `decided_by`, and the figures: the probe's AL with
    its interval and requests, what the drafter should serve and where that comes from, the bar.

    Refused: the target answers otherwise than before the sleep (a reload that went wrong, a quantized one
    included); a drafter that drafted before (or was swapped in) accepts nothing now; or, with an expected AL, the
    AL's interval lies below the bar (at the caps, undecided, the point decides). Without an expected AL the old
    rule stands (it accepts anything), and the record says there was none and why."""
    before = before or {}
    est = interval(after)
    rec: dict[str, Any] = {
        "probe_al": after.get("probe_al"),
        "probe_al_interval": after.get("probe_al_interval"),
        "probe_requests": after.get("probe_requests"),
        "probe_s": after.get("probe_s"),
        "probe_stopped": after.get("probe_stopped"),
        "probe_request_drafts": after.get("probe_request_drafts"),
        "probe_request_accepted": after.get("probe_request_accepted"),
        "expected_al": expected.al if expected else None,
        "expected_source": expected.source if expected else "not looked up",
        "share": share,
    }
    if before.get("probe_answers") and after.get("probe_answers"):
        same = sum(a == b for a, b in zip(after["probe_answers"], before["probe_answers"]))
        rec["answers_as_before"] = f"{same} of {len(before['probe_answers'])}"
        if same < math.ceil(len(before["probe_answers"]) / 2):
            return {
                **rec,
                "decision": "refuse",
                "decided_by": f"production answers otherwise after the wake: {same} of {len(before['probe_answers'])} "
                "greedy answers as before the sleep (its weights did not come back whole)",
            }
    if "probe_per_position" not in after:
        return {**rec, "decision": "not judged", "decided_by": after.get("probe") or "no acceptance figures"}
    # A drafter that production measured accepting nothing before (an adopted one that never drafted for this
    # target: its canary read AL 1.00) is not refused for accepting nothing now: a restart would load the same
    # drafter to the same figure. On a GPU host, each rollback to such a drafter restarted production (~30 s).
    k = len(after["probe_per_position"])
    never_drafted = expected is not None and expected.al is not None and (expected.al - 1.0) / k < PROBE_MIN_ACCEPTANCE
    if not drafts(after) and (swapped or drafts(before)) and not never_drafted:
        return {
            **rec,
            "decision": "refuse",
            "decided_by": f"production's drafter accepts nothing after the wake (AL {after['probe_al']:.3f}, per "
            f"position {after['probe_per_position']}): "
            + (
                "the drafter swapped in does not draft for this target, or its weights did not arrive"
                if swapped
                else "its weights are not in use (vllm#52479 after a level-2 wake)"
            ),
        }
    if expected is None or expected.al is None:
        mean = sum(after["probe_per_position"]) / len(after["probe_per_position"])
        rule = (
            f"it accepts anything (mean per-position acceptance {mean:.3f} >= {PROBE_MIN_ACCEPTANCE})"
            if drafts(after)
            else "it accepted nothing before the sleep either: the wake lost nothing"
        )
        return {**rec, "decision": "pass", "decided_by": f"no expected AL ({rec['expected_source']}): {rule}"}
    at = bar(expected.al, share)
    rec["bar"] = round(at, 4)
    against = (
        f"the bar {at:.2f}: {share:.0%} of the accepted drafts per step of AL {expected.al:.2f}, {expected.source}"
    )
    if est is not None and est.low >= at:
        return {
            **rec,
            "decision": "pass",
            "decided_by": f"its 95% interval {est.low:.2f}-{est.high:.2f} lies above {against}",
        }
    if est is not None and est.high < at:
        decided = f"its 95% interval {est.low:.2f}-{est.high:.2f} lies below {against}"
    else:
        # The caps came first: the point decides. A refusal costs a restart; a pass leaves the drafter to the canary.
        al = float(after["probe_al"])
        shown = f"{est.low:.2f}-{est.high:.2f}" if est is not None and est.n >= 2 else "unbounded"
        decided = (
            f"undecided after {after.get('probe_requests')} requests ({after.get('probe_stopped')}): its 95% "
            f"interval {shown} holds {against}; the point {al:.2f} decides"
        )
        if al >= at:
            return {**rec, "decision": "pass", "decided_by": decided}
    return {
        **rec,
        "decision": "refuse",
        "decided_by": f"production's drafter serves below what it should after the wake: probe AL "
        f"{after['probe_al']:.2f} over {after.get('probe_requests')} requests; {decided}"
        + (
            " (the drafter swapped in does not serve its figures, or its weights did not arrive whole)"
            if swapped
            else " (its weights did not come back whole)"
        ),
    }


def judge(
    after: dict[str, Any],
    before: dict[str, Any] | None,
    swapped: bool = False,
    expected: Expected | None = None,
    share: float = PROBE_SHARE,
) -> str | None:
    """Why production is not back whole (None: it is): `verdict`'s reason when it refuses."""
    v = verdict(after, before, swapped, expected, share)
    return v["decided_by"] if v["decision"] == "refuse" else None
