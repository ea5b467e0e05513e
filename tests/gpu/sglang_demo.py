"""The demo target on SGLang, as the GPU suite's SGLang cases serve it (tests/gpu/test_sglang_*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import free_port

# The staged bundle has no FA3 kernels (scripts/sglang-gpu/README.md); the PyTorch sampler needs no JIT build.
SGLANG_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch"]


def sglang_sets(tmp_path: Path) -> dict[str, Any]:
    """configs/demo.yaml's overrides for the demo target served by SGLang through eagleflow's adapter: without CUDA
    graphs (the capture plugin takes the final state at the norm's call, and a first graph capture compiles for
    minutes), a third of the GPU, and the hf backend (SGLang has no engine-of-ours capture)."""
    return {
        "host.work_root": str(tmp_path / "runs"),
        "engine.kind": "sglang",
        "engine.port": free_port(),
        "engine.enforce_eager": True,
        "engine.gpu_memory_utilization": 0.3,
        "engine.kv_cache_gib": None,
        "engine.extra_args": SGLANG_ARGS,
        "engine.startup_timeout_s": 600,
        "extract.backend": "hf",
    }
