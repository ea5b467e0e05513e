"""Faults planted inside a real vLLM, for the benchmark triage's tests (never installed outside them).

Each is a vLLM *general plugin* (entry point group `vllm.general_plugins`): vLLM calls it in every
process it starts (API server, engine core, workers) before the model loads. `tests/vllm_faults/install.py`
puts this module and its entry points on a directory the test engine gets on PYTHONPATH; a plugin acts
only when `VLLM_PLUGINS` names it, so an engine that does not ask for a fault gets none (vLLM itself
loads every installed plugin when `VLLM_PLUGINS` is unset).

- `eagleflow_fault_shift_aux`: the engine captures the layer before each auxiliary layer it is asked
  for (id k -> k - 1; the final layer's id stays), for EAGLE-3 and for `extract_hidden_states` alike: a
  one-layer convention slip in the engine's hidden-state plumbing.
- `eagleflow_fault_verify`: the verify step scores each draft token with the target's logits of the
  position after it (as a verify block without its causal mask lets a position see the drafts after
  it): drafts are mostly rejected, and what the engine emits is no longer the target's greedy text.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("eagleflow.vllm_faults")


def _asked(name: str) -> bool:
    return name in [p.strip() for p in os.environ.get("VLLM_PLUGINS", "").split(",")]


def shift_aux() -> None:
    if not _asked("eagleflow_fault_shift_aux"):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._get_eagle3_aux_layers_from_config
    if getattr(original, "eagleflow_fault", False):
        return

    def shifted(self):  # noqa: ANN001, ANN202 - vLLM's own signature
        layers = original(self)
        if not layers:
            return layers
        n = self.model_config.hf_text_config.num_hidden_layers
        out = tuple(k - 1 if 0 < k < n else k for k in layers)
        print(
            f"eagleflow fault (eagleflow_fault_shift_aux): auxiliary layers {tuple(layers)} captured as {out}",
            flush=True,
        )
        return out

    shifted.eagleflow_fault = True  # type: ignore[attr-defined]
    GPUModelRunner._get_eagle3_aux_layers_from_config = shifted


def corrupt_verify() -> None:
    if not _asked("eagleflow_fault_verify"):
        return
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    original = RejectionSampler.forward
    if getattr(original, "eagleflow_fault", False):
        return

    def forward(self, metadata, draft_probs, logits, sampling_metadata):  # noqa: ANN001, ANN202
        # logits: [num_draft_tokens + batch, vocab], each request's draft positions then its bonus position.
        # Draft position j is scored with row j + 1: the next draft position's, or the bonus one's.
        idx = metadata.target_logits_indices
        logits = logits.clone()
        logits[idx] = logits[idx + 1]
        return original(self, metadata, draft_probs, logits, sampling_metadata)

    forward.eagleflow_fault = True  # type: ignore[attr-defined]
    RejectionSampler.forward = forward
    print(
        "eagleflow fault (eagleflow_fault_verify): draft tokens verified against the next position's logits", flush=True
    )
