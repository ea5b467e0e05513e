"""Measurements the benchmark reuses across runs: the baseline's, and the current drafter's.

A nightly measures only what changed: the new drafter. No speculation and production's drafter read
the same on the same engine, target, settings and prompts, so every measured variant's windows are kept
on the host at `<work_root>/measurements/{baseline,drafter}/<key>.json` (written atomically, after the
whole variant was measured) and reused for `benchmark.reuse_for_h` hours: the baseline, and a drafter
measured before as 'current' or as a night's new drafter (promoted, it is the next night's current).
The new drafter itself is always measured. The key hashes everything that determines them:

- the engine: its distribution and installed version on the host, and every launch setting (flags,
  environment, parallelism, graphs: all change speed), `host.env` (every stage process's environment, which
  the engines inherit: a plugin or an attention backend named there changes them), the target, and the dtype;
- the benchmark settings a window is made of (max_tokens, temperatures, concurrencies, top_p, warm-up,
  num_prompts; for a drafter also k, its attention backend and how its drafts are sampled; not the stopping
  rule: a kept window stands with the interval it reached);
- the held-out prompts themselves (their content, not their path);
- for a drafter: the sha256 of each of its files (its identity, wherever it lies).

A record holds each window's figures with their rounds (for pairing), the temperature-0 answers (the
triage's lossless check), for the baseline the verify probe's copy-prompt reference, and what else kept the host
busy before its engine started (`HostLoad`). The key cannot hold the host's load: a record is measured again when
the host is busier or idler than it was by more than `benchmark.reuse_max_load_change` (the share of its CPUs busy,
its GPUs' utilization), or its GPUs' clocks differ. A ratio against a reused window is never called paired
(eagleflow.measure.verdict): the same prompts, not the same hour.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import Measurement
from eagleflow.contracts.manifest import sha256_file, stage_settings
from eagleflow.contracts.prompts import Messages
from eagleflow.hosts.facts import ENGINE_DISTRIBUTIONS, busy_share, gpu_load, version_of
from eagleflow.util.files import write_json_atomic

# Bump when a record's windows change meaning: every record is then measured again. 2: every setting warmed before
# its first round (a baseline warmed at concurrency 1 alone paid a GPU engine's kernel compiles in its measured rounds).
MEASUREMENT_VERSION = "2"


class HostLoad(BaseModel):
    """What kept the host busy, read before a benchmark's engines started (none of them in it)."""

    model_config = ConfigDict(extra="forbid")

    cpu_busy: float = Field(description="Share of the host's CPUs busy over a second (0-1).")
    gpu_utilization: float | None = Field(None, description="The GPUs' mean utilization (0-1); None without GPUs.")
    gpu_max_sm_clock_mhz: float | None = Field(None, description="The GPUs' lowest maximum SM clock (MHz).")

    @classmethod
    def now(cls) -> HostLoad:
        gpu = gpu_load() or {}
        return cls(
            cpu_busy=round(busy_share(), 3),
            gpu_utilization=gpu.get("utilization"),
            gpu_max_sm_clock_mhz=gpu.get("max_sm_clock_mhz"),
        )

    def differs(self, now: HostLoad, bound: float) -> str | None:
        """Why a measurement made under this load does not stand for one made `now`, or None."""
        if abs(now.cpu_busy - self.cpu_busy) > bound:
            return f"the host's CPUs were {self.cpu_busy:.0%} busy then, {now.cpu_busy:.0%} now"
        if self.gpu_utilization is not None and now.gpu_utilization is not None:
            if abs(now.gpu_utilization - self.gpu_utilization) > bound:
                return f"its GPUs were {self.gpu_utilization:.0%} busy then, {now.gpu_utilization:.0%} now"
        then, clock = self.gpu_max_sm_clock_mhz, now.gpu_max_sm_clock_mhz
        if then and clock and abs(clock - then) / then > 0.02:
            return f"its GPUs' maximum SM clock was {then:.0f} MHz then, {clock:.0f} MHz now"
        return None


class VariantRecord(BaseModel):
    """One variant's measured windows, kept for reuse by later runs on the same host."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="What determines the measurement, hashed (see the module doc).")
    variant: str = Field(description="The variant it was measured as: 'baseline', 'current' or 'drafter'.")
    drafter: str | None = Field(None, description="The drafter directory when it was measured (None: baseline).")
    measured_at: float = Field(description="Unix time the measurement ended.")
    stage_dir: str = Field(description="The benchmark stage directory that measured it (its engine log is there).")
    engine_version: str | None = Field(None, description="The engine's distribution and version, e.g. 'vllm 0.26.0'.")
    host_load: HostLoad | None = Field(None, description="What else kept the host busy before its engine started.")
    windows: list[Measurement] = Field(description="Every temperature x concurrency, with their rounds.")
    answers_t0: list[str] | None = Field(None, description="Temperature-0 answers in prompt order (lossless check).")
    copy_reference: dict[str, Any] | None = Field(
        None,
        description="baseline: the verify probe's copy prompts and the answers without speculation "
        "(eagleflow.triage.verify.CopyReference).",
    )
    copy_settings: dict[str, Any] | None = Field(
        None,
        description="The triage settings the copy reference was made with (num_prompts, max_tokens): "
        "another run uses it only with the same.",
    )

    def age_h(self, now: float | None = None) -> float:
        return ((now or time.time()) - self.measured_at) / 3600


def engine_version(kind: str) -> str | None:
    """'<distribution> <version>' of the engine installed in this environment, None when not installed."""
    for dist in ENGINE_DISTRIBUTIONS.get(kind, ()):
        v = version_of(dist)
        if v:
            return f"{dist} {v}"
    return None


def drafter_identity(drafter_dir: str) -> dict[str, str]:
    """sha256 of every file the engine loads from a drafter directory (config, weights, vocab maps)."""
    d = Path(drafter_dir)
    return {
        p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.is_file() and p.suffix in (".json", ".safetensors")
    }


def prompts_hash(prompts: list[Messages]) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def measurement_key(
    cfg: RunConfig, variant: str, drafter_dir: str | None, prompts: list[Messages], version: str | None
) -> str:
    """16 hex chars: what determines a variant's windows (the module doc lists it)."""
    settings = stage_settings("benchmark", cfg)
    b = settings["benchmark"]
    window = {
        k: b.get(k)
        for k in ("max_tokens", "temperatures", "concurrencies", "warmup_requests", "num_prompts", "side_by_side")
    }
    if b.get("top_p", 1.0) != 1.0:  # only when set: every key measured before top_p existed stays valid
        window["top_p"] = b["top_p"]
    if drafter_dir is not None:
        # not the stopping rule: a window measured to any precision stands with its own interval
        window.update({k: b.get(k) for k in ("num_speculative_tokens", "draft_attention_backend")})
        if b.get("draft_sample_method"):  # only when set: keys kept before it existed stay valid
            window["draft_sample_method"] = b["draft_sample_method"]
    payload: dict[str, Any] = {
        "variant": "baseline" if drafter_dir is None else "drafter",
        "engine": settings["engine"],
        "engine_version": version,
        "target": settings["target"],
        "window": window,
        "prompts": prompts_hash(prompts),
        "drafter": drafter_identity(drafter_dir) if drafter_dir else None,
        "code": MEASUREMENT_VERSION,
    }
    if cfg.host.env:  # every stage process's environment, the engines' too (only when set: earlier keys stay)
        payload["host_env"] = cfg.host.env
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def record_path(work_root: str, kind: str, key: str) -> Path:
    """kind: 'baseline', or 'drafter' for any drafter (tonight's new drafter is tomorrow's current one)."""
    return Path(work_root) / "measurements" / kind / f"{key}.json"


def kind_of(drafter_dir: str | None) -> str:
    return "baseline" if drafter_dir is None else "drafter"


def load_reusable(work_root: str, kind: str, key: str, max_age_h: float) -> VariantRecord | None:
    """The kept record for `key` while younger than `max_age_h`; None when absent, stale or unreadable
    (a record from an older eagleflow is measured again, never half-trusted)."""
    path = record_path(work_root, kind, key)
    if max_age_h <= 0 or not path.is_file():
        return None
    try:
        rec = VariantRecord.model_validate_json(path.read_text())
    except ValueError:
        return None
    return rec if rec.key == key and rec.age_h() <= max_age_h else None


def save(work_root: str, record: VariantRecord) -> Path:
    path = record_path(work_root, kind_of(record.drafter), record.key)
    write_json_atomic(path, record.model_dump(mode="json"))
    return path
