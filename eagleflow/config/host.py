"""Where the heavy stages run and what they serve: the host, the target model, the engine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagleflow.config.base import _Strict


class HostConfig(_Strict):
    """Where the heavy stages run: this machine, or a GPU host reached over SSH."""

    kind: Literal["local", "ssh"] = Field(
        "local", description="'local' runs stages as subprocesses here; 'ssh' runs them as detached jobs on `address`."
    )
    name: str = Field(
        "localhost",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Host name, used in logs, the Prefect concurrency limit and the host lock.",
    )
    work_root: str = Field(description="Directory on the host under which every stage writes its outputs.")
    python: str = Field(description="Python of the host environment (torch, transformers, the engine, eagleflow).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for every stage process.")
    # SSH only.
    address: str | None = Field(None, description="SSH: host name or IP to connect to.")
    port: int = Field(22, ge=1, le=65535, description="SSH: port of the host's sshd.")
    user: str | None = Field(None, description="SSH: login user (default: the local user).")
    key_path: str | None = Field(
        None, description="SSH: private key file on the control machine; without it the SSH agent's keys are used."
    )
    known_hosts: str = Field(
        "~/.ssh/known_hosts",
        description="SSH: known_hosts file that must already hold the host's key (unknown keys are refused, never "
        "added).",
    )
    connect_timeout_s: float = Field(15, gt=0, description="SSH: timeout of one connection attempt.")
    connect_attempts: int = Field(
        4, ge=1, le=20, description="SSH: attempts for an unreachable host, with doubling backoff (1 s, 2 s, 4 s ...)."
    )
    stage_retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Prefect retries of a stage task after a lost connection; the retry re-attaches to the running "
        "job.",
    )

    @model_validator(mode="after")
    def _ssh(self) -> HostConfig:
        if self.kind == "ssh":
            if not self.address:
                raise ValueError("host.address is required when host.kind is 'ssh' (the GPU host's name or IP)")
            for field in ("work_root", "python"):
                if not getattr(self, field).startswith("/"):
                    raise ValueError(
                        f"host.{field} must be an absolute path on the SSH host, got {getattr(self, field)!r}"
                    )
        return self


class TargetConfig(_Strict):
    """The served model the drafter is trained for."""

    model_path: str = Field(description="HF-format checkpoint directory of the target on the host.")
    served_model_name: str | None = Field(None, description="Name the engine serves it under (default: the path).")
    aux_layer_ids: list[int] = Field(
        description="Auxiliary layers in vLLM's convention (the input to decoder layer k == HF hidden_states[k]); "
        "for an L-layer target vLLM's default is [2, L//2, L-3].",
        min_length=3,
        max_length=3,
    )
    final_layer_id: int = Field(ge=1, description="The final state's id: the number of decoder layers L.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Weights dtype when serving and extracting."
    )
    thinking_start: str = Field("<think>", min_length=1, description="The target's own marker opening reasoning.")
    thinking_end: str = Field("</think>", min_length=1, description="The target's own marker closing reasoning.")

    @model_validator(mode="after")
    def _layer_ids(self) -> TargetConfig:
        ids = self.aux_layer_ids
        if sorted(set(ids)) != ids:
            raise ValueError(f"aux_layer_ids must be strictly increasing, got {ids}")
        if ids[0] < 1 or ids[-1] >= self.final_layer_id:
            raise ValueError(
                f"aux_layer_ids {ids} must lie in [1, final_layer_id - 1] = [1, {self.final_layer_id - 1}] "
                "(vLLM convention: id k is the input to decoder layer k; the final state is final_layer_id)"
            )
        return self


class EngineConfig(_Strict):
    """How the serving engine is launched (the same settings production uses)."""

    kind: Literal["vllm", "sglang"] = Field(
        "vllm", description="Serving engine: 'vllm' (GPU or CPU build) or 'sglang'. Generation and benchmark use it."
    )
    host: str = Field("127.0.0.1", description="Address the engine binds to on the host.")
    port: int = Field(8000, ge=1024, le=65535, description="Port the engine listens on; must be free.")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM --tensor-parallel-size / SGLang --tp-size.")
    max_model_len: int = Field(4096, ge=64, description="vLLM --max-model-len / SGLang --context-length.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM --gpu-memory-utilization / SGLang --mem-fraction-static (GPU only)."
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="vLLM --kv-cache-memory-bytes, in GiB: the KV cache's size instead of the engine's own choice (a "
        "share of GPU memory; on a CPU build VLLM_CPU_KVCACHE_SPACE or a share of RAM). An engine fills what it is "
        "given before it serves: the demo's 2M-parameter target needs 32 MiB at 1,024 tokens x 32 requests, and a "
        "CPU engine's start took 1.3 CPU-seconds more with 1 GiB than with 0.25 (22.3 against 21.0, and 0.75 GiB of "
        "RAM: docs/benchmarks.md). SGLang sizes its cache by --mem-fraction-static (gpu_memory_utilization) and "
        "refuses this.",
    )
    reasoning_parser: str | None = Field(None, description="--reasoning-parser, e.g. deepseek_r1 or kimi_k2.")
    tool_call_parser: str | None = Field(None, description="--tool-call-parser, e.g. kimi_k2.")
    enforce_eager: bool | Literal["auto"] = Field(
        "auto",
        description="vLLM --enforce-eager / SGLang --disable-cuda-graph: no graph capture. 'auto': eager on a CPU "
        "build "
        "of vLLM, where capture only costs start-up (the demo target: healthy in ~40 s instead of ~130 s on 2 cores), "
        "CUDA graphs on GPUs, where eager costs every decode step (the demo drafter on an H200: ~300 tok/s eager, "
        "800-1000 with graphs; docs/benchmarks.md). true / false: as given everywhere, to serve as production does.",
    )
    trust_remote_code: bool = Field(False, description="--trust-remote-code.")
    load_strategy: Literal["engine", "lazy", "eager", "prefetch"] = Field(
        "engine",
        description="vLLM --safetensors-load-strategy. 'engine': no flag, vLLM's own choice (lazy mmap, prefetch by "
        "itself on NFS and Lustre), the fastest measured from a local disk (docs/benchmarks.md 'Engine loads': "
        "prefetch 19.1 s against lazy 17.3 s cold for 26 GB, eager 44 s); 'prefetch' for other network storage.",
    )
    compile_cache: bool = Field(
        True,
        description="vLLM: keep torch.compile's cache across starts under <work_root>/cache/vllm/<drafter shape> "
        "(VLLM_CACHE_ROOT), one per drafter architecture: vLLM's cache key names the speculative method but not "
        "the drafter, so two drafter shapes never share one. An eager engine (CPU builds) compiles nothing and "
        "keeps vLLM's default cache root.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More engine arguments, passed as given.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine environment, e.g. VLLM_CPU_KVCACHE_SPACE.")
    startup_timeout_s: float = Field(1800, gt=0, description="Give up if not healthy after this many seconds.")
    stall_timeout_s: float | None = Field(
        None,
        gt=0,
        description="While starting: give up when the engine log has not grown for this many seconds (a hung load). "
        "None: only startup_timeout_s applies.",
    )
    fatal_patterns: list[str] = Field(
        default_factory=list,
        description="Extra regular expressions that, on an engine log line while starting, fail the launch at once "
        "(built in: worker/EngineCore death, CUDA out of memory, NCCL errors, engine core initialization failure).",
    )
    request_timeout_s: float = Field(600, gt=0, description="Timeout of one chat request.")
    preflight: bool = Field(
        True, description="Check engine, target and drafters in seconds before any weights load (benchmark stage)."
    )
    preflight_cache: bool = Field(
        True,
        description="Preflight: keep the engine's findings under <work_root>/cache/preflight (or the directory in "
        "EAGLEFLOW_PREFLIGHT_CACHE) by the engine install, its settings, the target and the drafter layout, and reuse "
        "them while those are unchanged, so a benchmark of tonight's drafter of the same shape imports no engine to "
        "check; disk and GPU memory are checked every time. false: every benchmark checks from scratch.",
    )
    min_free_disk_gib: float = Field(1.0, ge=0, description="Preflight: free space needed under host.work_root.")
    min_free_gpu_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Preflight: the fraction of each visible GPU's memory that must be free before launching "
        "(default 0: taken from gpu_memory_utilization when set).",
    )


class TrainNodesConfig(_Strict):
    """Training across hosts: `host` is node 0, each of `hosts` is node 1, 2, ... of one torchrun job.

    Every node runs the train stage as a detached job over SSH, under torchrun with a static rendezvous
    (fixed node ranks) at `master_addr`:`master_port` on node 0, `train.nproc` ranks a node: rank 0, on `host`,
    writes the checkpoints and the manifest. The nodes read the extract stage's states and write checkpoints
    at the same paths as `host`: `host.work_root` must be one filesystem every node mounts at the same path."""

    hosts: list[HostConfig] = Field(
        default_factory=list,
        description="The other nodes (SSH hosts), in node-rank order. Each keeps its jobs' own state (pids, locks, "
        "logs) under its own work_root, never on the filesystem shared with node 0. Empty: train on `host` alone.",
    )
    master_addr: str | None = Field(
        None,
        description="Address at which the other nodes reach node 0 (`host`) for the rendezvous and the "
        "collectives; default host.address.",
    )
    master_port: int = Field(29500, ge=1024, le=65535, description="Port of torchrun's rendezvous store on node 0.")
