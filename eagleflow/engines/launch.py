"""What one engine launch is: the target, how it is served, optionally with a drafter.

Engine-neutral: `eagleflow.engines.vllm` and `.sglang` turn a `LaunchSpec` into their own command
line. The generate and benchmark stages build theirs from the run config with `target_launch`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from eagleflow.config import EngineConfig, RunConfig


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


def speculative(drafter_dir: str, k: int) -> dict[str, Any]:
    """EAGLE-3 with the drafter in `drafter_dir`, k draft tokens per step."""
    return {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": k}


def target_launch(config: RunConfig, speculative: dict[str, Any] | None = None, port_offset: int = 0) -> LaunchSpec:
    """The run's target as the run config serves it, in this Python (the host environment's)."""
    return LaunchSpec(
        python=sys.executable, model=config.target.model_path, served_model_name=served_name(config),
        dtype=config.target.dtype, engine=config.engine, port=config.engine.port + port_offset,
        speculative=speculative,
    )
