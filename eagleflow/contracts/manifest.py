"""Stage keys and manifests: the small records that chain the stages.

A stage writes under `<work_root>/<stage>/<key>/` and writes `manifest.json` last, atomically.
The key hashes the stage's config, the upstream manifests' keys and the code version, so a changed
setting reruns exactly the stages that depend on it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from eagleflow import __version__
from eagleflow.config import RunConfig
from eagleflow.util.files import write_json_atomic

# Bump a stage's version when its outputs change meaning: its key and every downstream key change.
STAGE_VERSIONS: dict[str, str] = {
    "check": "1",
    "generate": "1",
    "extract": "2",  # 2: shards cut by bytes, streamed, sizes and hashes in the index
    "train": "2",  # 2: bounded by steps, not the clock; typed metrics (epochs[].train / .validation)
    "export": "2",  # 2: an MLA drafter's default rotary written as YaRN with factor 1 (vLLM 0.26 loads no other)
    "benchmark": "2",
    "select": "1",  # the nightly: tonight's new prompts and the fixed holdout (eagleflow.nightly.pool)
    "pool": "1",  # the nightly: the pool's ledger, eviction, and tonight's training index
}
# The cached pipeline stages, in order; `check` runs before them every time and is never cached.
STAGES: tuple[str, ...] = ("generate", "extract", "train", "export", "benchmark")
UPSTREAM: dict[str, tuple[str, ...]] = {
    "check": (),
    "generate": (),
    "extract": ("generate",),
    "train": ("extract",),
    "export": ("train",),
    "benchmark": ("export",),
    "select": (),
    # the nightly's training set: tonight's selection, the holdout's states and the new batch's states
    "pool": ("select", "holdout", "extract"),
}

# Settings that change how a stage runs, not what it produces: they stay out of its key, so moving a
# run to more ranks, raising a timeout or logging more often reuses the finished stage.
_ENGINE_RUNTIME = (
    "host",
    "port",
    "startup_timeout_s",
    "stall_timeout_s",
    "request_timeout_s",
    "fatal_patterns",
    "preflight",
    "min_free_disk_gib",
    "min_free_gpu_fraction",
)
_EXTRACT_RUNTIME = ("spread", "concurrency", "spool_dir", "capture_dir", "fallback")
_GENERATE_RUNTIME = ("server_wait_s",)
# What of the engine's launch changes the *data* an upstream stage makes (answers, hidden states): the engine,
# the context it allows, the model code it trusts, and the flags that change what the model computes. Not its
# parallelism, memory share, graphs, environment or other flags: they change the speed and the last bits of
# bf16 arithmetic, never what a drafter learns. Only the benchmark, which measures the engine, is keyed by all.
_ENGINE_DATA = ("kind", "max_model_len", "trust_remote_code")
_ENGINE_DATA_GENERATE = _ENGINE_DATA + ("reasoning_parser",)  # it splits the answers into reasoning and content
DATA_FLAGS = (
    "--quantization",
    "-q",
    "--dtype",
    "--kv-cache-dtype",
    "--revision",
    "--code-revision",
    "--tokenizer",
    "--tokenizer-path",
    "--tokenizer-revision",
    "--tokenizer-mode",
    "--chat-template",
    "--hf-overrides",
    "--generation-config",
    "--override-generation-config",
    "--load-format",
)
_TRAIN_RUNTIME = (
    "nproc",
    "grad_accum_steps",
    "num_threads",
    "log_every_steps",
    "checkpoint_every_steps",
    "time_limit_s",
)  # a cap that fails; raised, the same stage dir resumes


def required_upstream(stage: str, config: RunConfig) -> tuple[str, ...]:
    """The upstream stages whose manifests `stage` needs; a benchmark of a given drafter needs none."""
    if stage == "benchmark" and config.benchmark.drafter:
        return ()
    return UPSTREAM[stage]


def stage_settings(stage: str, config: RunConfig) -> dict[str, Any]:
    """The part of the run config a stage's output depends on (and nothing that doesn't)."""
    c = config.model_dump(mode="json")
    engine_launch = {k: v for k, v in c["engine"].items() if k not in _ENGINE_RUNTIME}
    train = {k: v for k, v in c["train"].items() if k not in _TRAIN_RUNTIME}
    if train.get("drafter_arch") == "auto":  # resolved from the target, already in the upstream keys; and the
        del train["drafter_arch"]  # keys of runs trained before the field existed stay as they were
    if train.get("warm_start_vocab") == "keep":  # the default: keys of runs from before it existed stay
        del train["warm_start_vocab"]
    if train.get("lr_schedule") == "cosine":  # the default: keys of runs from before it existed stay
        del train["lr_schedule"]
    if train.get("optimizer") == "adamw":  # the default, whose drafter Muon's settings do not touch: keys stay
        for k in ("optimizer", "muon_momentum", "muon_weight_decay"):
            train.pop(k, None)
    data_flags = data_args(c["engine"]["extra_args"])
    prompts = {k: c["generate"][k] for k in ("prompts_path", "num_samples", "holdout", "seed")}
    if c["generate"]["split"] != "seeded":
        prompts["split"] = c["generate"]["split"]
    # fields at their defaults that did not exist before: the keys of earlier runs stay as they were
    unset = {"draft_attention_backend": None, "draft_sample_method": None, "top_p": 1.0}
    benchmark = {k: v for k, v in c["benchmark"].items() if not (k in unset and v == unset[k])}
    return {
        "check": c,
        "generate": generate_settings(
            c, {**{k: c["engine"][k] for k in _ENGINE_DATA_GENERATE}, "data_args": data_flags}
        ),
        "extract": {
            "target": c["target"],
            "engine": (
                {**{k: c["engine"][k] for k in _ENGINE_DATA}, "data_args": data_flags}
                if c["extract"]["backend"] in ("vllm", "sglang")  # an engine of the stage's own makes the states
                else None
            ),
            "extract": {k: v for k, v in c["extract"].items() if k not in _EXTRACT_RUNTIME},
        },
        "train": {"train": train},
        "export": {"export": c["export"], "aux_layer_ids": c["target"]["aux_layer_ids"]},
        "benchmark": {"engine": engine_launch, "benchmark": benchmark, "target": c["target"], "prompts": prompts},
        "select": {
            "nightly": c["nightly"],
            "generate": {k: c["generate"][k] for k in ("prompts_path", "num_samples", "holdout", "seed")},
        },
        "pool": {
            "replay": c["nightly"]["replay"],
            "budget": c["nightly"]["pool_budget_gib"],
            "seed": c["generate"]["seed"],
            # only when set: every pool stage keyed before it existed keeps its key
            **({"whole_pool": True} if c["nightly"].get("whole_pool") else {}),
        },
    }[stage]


def data_args(extra_args: list[str]) -> list[str]:
    """The engine arguments among `extra_args` that change what the model computes (DATA_FLAGS), with
    their values, in order: `--quantization fp8` and `--quantization=fp8` alike."""
    out: list[str] = []
    for i, arg in enumerate(extra_args):
        flag = arg.split("=", 1)[0]
        if flag in DATA_FLAGS:
            out.append(arg)
            if "=" not in arg and i + 1 < len(extra_args) and not extra_args[i + 1].startswith("-"):
                out.append(extra_args[i + 1])
    return out


def generate_settings(c: dict[str, Any], engine_data: dict[str, Any]) -> dict[str, Any]:
    """The answers depend on the server that gave them: our own launch (what of engine.* changes answers),
    or production at its URL (its flags are production's, not ours)."""
    g = {k: v for k, v in c["generate"].items() if k not in _GENERATE_RUNTIME}
    if g.get("split") == "seeded":  # the split of every run before pool batches existed: their keys stay
        del g["split"]
    if g.pop("server") == "own":
        return {"target": c["target"], "engine": engine_data, "generate": g}
    return {"target": c["target"], "server": {"production": c["production"]["url"]}, "generate": g}


def stage_key(stage: str, config: RunConfig, upstream_keys: dict[str, str]) -> str:
    """16 hex chars of sha256 over (stage, its settings, upstream keys, code version)."""
    needed = required_upstream(stage, config)
    missing = set(needed) - set(upstream_keys)
    if missing:
        raise ValueError(f"stage {stage!r} needs the keys of its upstream stages {sorted(missing)}")
    payload = {
        "stage": stage,
        "settings": stage_settings(stage, config),
        "upstream": {s: upstream_keys[s] for s in needed},
        "code": f"{__version__}/{STAGE_VERSIONS[stage]}",
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def stage_dir(config: RunConfig, stage: str, key: str) -> str:
    return f"{config.host.work_root.rstrip('/')}/{stage}/{key}"


class Manifest(BaseModel):
    """What a finished stage produced: paths, counts, content hashes, metrics. Small by design."""

    stage: str = Field(description="Stage name.")
    key: str = Field(description="Stage key (hash of settings, upstream keys, code version).")
    dir: str = Field(description="The stage directory on the host.")
    upstream: dict[str, str] = Field(default_factory=dict, description="Upstream stage -> its key.")
    outputs: dict[str, Any] = Field(default_factory=dict, description="Paths (relative to dir) and counts.")
    hashes: dict[str, str] = Field(default_factory=dict, description="Relative path -> sha256 of the file.")
    metrics: dict[str, Any] = Field(default_factory=dict, description="Stage metrics (loss, acceptance, tok/s).")
    seconds: float = Field(0.0, description="Wall time the stage took on the host.")
    created: float = Field(default_factory=time.time, description="Unix time the manifest was written.")
    code_version: str = Field(__version__, description="eagleflow version that wrote it.")
    content_key: str | None = Field(
        None,
        description="A stage that runs every time but whose output is a function of what it read (select: "
        "the prompts it chose): the hash of that output, which downstream keys use instead of `key`.",
    )

    @property
    def downstream_key(self) -> str:
        """What a downstream stage's key hashes: the content key when there is one, else the stage key."""
        return self.content_key or self.key

    def path(self, rel: str) -> str:
        return f"{self.dir}/{rel}"


def write_manifest(manifest: Manifest) -> Path:
    path = Path(manifest.dir) / "manifest.json"
    write_json_atomic(path, manifest.model_dump(mode="json"))
    return path


def read_manifest(path: str | Path) -> Manifest:
    return Manifest.model_validate_json(Path(path).read_text())


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
